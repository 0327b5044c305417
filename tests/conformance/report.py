"""Where mxfp4conv's modelled answers and a vLLM release's own code disagree, as a table.

    python -m tests.conformance.report --vllm 0.35.0            # a release (its wheel is fetched)
    python -m tests.conformance.report --vllm path/to/vllm-0.35.0-...whl
    python -m tests.conformance.report                          # the releases the suite runs
    python -m tests.conformance.report --vllm 0.34.0 --as 0.33  # 0.33's model against 0.34's code

For each wheel it runs the conformance suite's probes on the emulated platforms (``tests/
vllm_code``): vLLM's backend selection, experts class, round-up and environment for every case
of ``matrix.cases()`` (``compare.selection_rows``), then its weight converters on the converter
paths (``convert_compare.converter_rows``), against mxfp4conv's answers for the nearest modelled
release (``oracle.releases``; ``--as`` picks another). Each disagreement is a row: case, field,
mxfp4conv's statement, vLLM's. Modelling a new release starts from that list
(docs/oracle.md, "Modelling a new vLLM release"). ``EXTRA_CHECKS`` holds further checks by
name (the vLLM plugin's parameter equality registers there); ``--only`` picks some.

Exit status: 0 when nothing disagrees, 1 when something does, 2 on a usage error or a wheel
that cannot be had.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

TESTS = Path(__file__).resolve().parent.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from conformance.compare import Row  # noqa: E402

# name -> check(version or wheel path, extracted source, modelled release key) -> rows of
# (case, field, mxfp4conv, vLLM); "select" and "convert" are the suite's own
Check = Callable[[str, Path, str], list[tuple[str, str, object, object]]]
EXTRA_CHECKS: dict[str, Check] = {}


def select_check(version: str, src: Path, release: str) -> list[tuple[str, str, object, object]]:
    from dataclasses import replace

    from conformance.compare import selection_rows
    from conformance.matrix import cases
    from conformance.compare import probe_all

    all_cases = [replace(c, target=replace(c.target, vllm=release)) for c in cases()]
    got = probe_all(src, all_cases)
    return [(c.id, f, a, b) for c in all_cases for f, a, b in selection_rows(c, got[c.id])]


def convert_check(version: str, src: Path, release: str) -> list[tuple[str, str, object, object]]:
    from conformance.convert_compare import converter_cases, converter_rows
    from conformance.convert_compare import probe_converters

    selected = converter_cases(release)
    got = probe_converters(src, selected)
    return [(c.id, f, a, b) for c, d, r in selected for f, a, b in converter_rows(c, d, r, got[c.id])]


CHECKS: dict[str, Check] = {"select": select_check, "convert": convert_check}


def _text(v: object, n: int = 90) -> str:
    s = str(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    from conformance.matrix import release_of
    from vllm_code.harness import VllmUnavailable, versions, vllm_source

    checks = {**CHECKS, **EXTRA_CHECKS}
    p = argparse.ArgumentParser(prog="python -m tests.conformance.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm", action="append", metavar="VERSION_OR_WHEEL",
                   help="a vLLM version (its wheel is fetched into the cache) or a vllm-*.whl path; "
                        "repeatable (default: the releases the suite runs)")
    p.add_argument("--as", dest="release", metavar="R",
                   help="compare with this modelled release's answers (default: the nearest modelled)")
    p.add_argument("--only", action="append", choices=sorted(checks), help="run only these checks")
    p.add_argument("--limit", type=int, default=0, help="print at most this many rows per check (0: all)")
    args = p.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    con = Console()
    total = 0
    for version in args.vllm or list(versions()):
        try:
            src = vllm_source(version)
            release, note = release_of(version)
            if args.release:
                from mxfp4conv.oracle.releases import resolve_release
                release = resolve_release(args.release)
        except (VllmUnavailable, Exception) as e:  # noqa: BLE001 - any reason the wheel cannot be used
            con.print(f"[red]vLLM {version}: {e}[/]")
            return 2
        con.print(f"[bold]vLLM {version}[/] against mxfp4conv's model of vLLM {release}"
                  + (f" ({note.split(';')[0]})" if note and not args.release else ""))
        for name in args.only or list(checks):
            t0 = time.perf_counter()
            rows = checks[name](version, src, release)
            total += len(rows)
            cases = len({r[0] for r in rows})
            con.print(f"  {name}: {len(rows)} disagreement(s) in {cases} case(s) "
                      f"({time.perf_counter() - t0:.0f} s)")
            if rows:
                table = Table(show_lines=False)
                for col in ("case", "field", "mxfp4conv", f"vLLM {version}"):
                    table.add_column(col, overflow="fold")
                shown = rows if not args.limit else rows[: args.limit]
                for case, field, ours, theirs in shown:
                    table.add_row(case, field, _text(ours), _text(theirs))
                con.print(table)
    return 1 if total else 0


__all__ = ["CHECKS", "EXTRA_CHECKS", "Row", "main"]

if __name__ == "__main__":
    sys.exit(main())
