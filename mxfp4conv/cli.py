"""The ``mxfp4conv`` command line: a thin Typer layer over the library.

Each command lives in ``mxfp4conv/commands/<name>.py`` and exposes ``register(app)``.
Errors the library raises as ``Mxfp4convError`` become one paragraph on stderr and exit
status 1 (a traceback only with ``--debug``); usage errors, bad option values included, exit
with status 2. ``--debug`` and ``-v/--verbose`` are accepted before or after the command.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import textwrap

import typer

from mxfp4conv import __version__
from mxfp4conv.errors import Mxfp4convError

COMMANDS = ("inspect", "plan", "convert", "verify", "ranks", "example")
GLOBAL_FLAGS = ("--debug", "-v", "--verbose", "-vv")

app = typer.Typer(
    name="mxfp4conv",
    help="Convert MXFP4 mixture-of-experts checkpoints into kernel-ready layouts, offline.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help text is shown as written: org/name[@revision] stays intact
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mxfp4conv {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show Python tracebacks on errors (anywhere on the line)."),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, show_default=False,
                                help="Log what is read, fetched and written on stderr (-vv: debug detail)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    if debug:
        os.environ["MXFP4CONV_DEBUG"] = "1"
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


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


def hoist_global_flags(argv: list[str]) -> list[str]:
    """Move ``--debug`` / ``-v`` from after the command to the front, where click reads them
    (arguments after ``--`` are left alone)."""
    end = argv.index("--") if "--" in argv else len(argv)
    flags = [a for a in argv[:end] if a in GLOBAL_FLAGS]
    rest = [a for a in argv[:end] if a not in GLOBAL_FLAGS]
    return [f for f in flags if f != "-vv"] + ["-v", "-v"] * flags.count("-vv") + rest + argv[end:]


def main(argv: list[str] | None = None) -> None:
    args = hoist_global_flags(list(argv if argv is not None else sys.argv[1:]))
    debug = "--debug" in args
    try:
        # Standalone mode: click/typer handle usage errors (exit 2), typer.Exit and Ctrl-C.
        app(args=args, prog_name="mxfp4conv", standalone_mode=True)
    except Mxfp4convError as exc:
        if debug:
            raise
        report_error(exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
