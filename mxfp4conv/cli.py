"""The ``mxfp4conv`` command line: a thin Typer layer over the library.

Each command lives in ``mxfp4conv/commands/<name>.py`` and exposes ``register(app)``.
Errors the library raises as ``Mxfp4convError`` become one paragraph on stderr and exit
status 1 (a traceback only with ``--debug``); usage errors are Typer's own (status 2).
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap

import typer

from mxfp4conv import __version__
from mxfp4conv.errors import Mxfp4convError

COMMANDS = ("inspect", "plan", "convert", "verify", "example")

app = typer.Typer(
    name="mxfp4conv",
    help="Convert MXFP4 mixture-of-experts checkpoints into kernel-ready layouts, offline.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mxfp4conv {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show Python tracebacks on errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    if debug:
        os.environ["MXFP4CONV_DEBUG"] = "1"


for _name in COMMANDS:
    try:
        _mod = importlib.import_module(f"mxfp4conv.commands.{_name}")
    except ModuleNotFoundError as exc:  # a command not built yet
        if exc.name != f"mxfp4conv.commands.{_name}":
            raise
        continue
    _mod.register(app)


def report_error(exc: BaseException) -> None:
    message = " ".join(str(exc).split())
    sys.stderr.write(textwrap.fill(f"error: {message}", width=100, break_on_hyphens=False, break_long_words=False) + "\n")


def main(argv: list[str] | None = None) -> None:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        # Standalone mode: click/typer handle usage errors (exit 2), typer.Exit and Ctrl-C.
        app(args=argv, standalone_mode=True)
    except Mxfp4convError as exc:
        if debug:
            raise
        report_error(exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
