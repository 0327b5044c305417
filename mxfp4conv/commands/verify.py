"""``mxfp4conv verify OUT [--source SOURCE] [--json]``: prove a converted checkpoint right."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("verify")
    def verify_cmd(
        out: Path = typer.Argument(..., metavar="OUT", help="A converted checkpoint directory."),
        source: str = typer.Option(None, "--source", metavar="SOURCE", help="The source it was converted from: compare every byte."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
        workers: int = typer.Option(None, "--workers", min=1, metavar="N", show_default=False,
                                    help="Threads that read and compare (default: the cores, at most 16)."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
    ) -> None:
        """Check OUT's manifest, index and headers; with --source, invert every expert transform
        and compare every byte with the source."""
        from mxfp4conv.convert.verify import VerifyError, verify

        try:
            rep = verify(out, source, workers=workers, progress="none" if quiet else "auto")
        except VerifyError as exc:
            rep = exc.report
            if as_json:
                print(json.dumps(rep.to_json(), indent=2))
                sys.stderr.write(f"error: {exc}\n")
                sys.exit(1)
            for layer in rep.layers:
                print(f"  {layer['prefix']}: {layer['status']}")
            raise
        if as_json:
            print(json.dumps(rep.to_json(), indent=2))
            return
        for c in rep.checks:
            print(f"ok  {c}")
        for layer in rep.layers:
            extra = f" ({layer['bytes'] / 1e6:.1f} MB compared)" if "bytes" in layer else ""
            print(f"  {layer['prefix']}: {layer['status']}{extra}")
        print(f"verified {out}" + (f" against {source}" if source else " (structure and recorded checksums; pass --source to compare every byte with the source)"))
