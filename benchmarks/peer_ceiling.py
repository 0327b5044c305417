"""How far any kernel could get ahead of a peer, from moe_bench.py's CSVs.

A layer call must at least move its bytes (the `floor_us` column: the touched experts' weights and scales, x, y and
the intermediate, at the copy bandwidth measured in the same run). A peer that already runs at p% of that copy
bandwidth leaves any kernel at most 100 / p times its speed: where that ceiling is under a target ratio, no kernel
bound by DRAM can meet the target there. Past the decode range (T >= --compute-from) the call is bound by its math,
not its bytes, and the ceiling says nothing: those rows show TFLOP/s instead.

    python benchmarks/peer_ceiling.py benchmarks/results/moe_bench_h100_humming_uniform_1207.csv [...]
        [--peer humming|tk] [--target 1.2] [--markdown]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys

PEERS = {"humming": "humming_us", "tk": "tk_us"}


def rows(paths: list[str], peer: str):
    column = PEERS[peer]
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                theirs = float(r.get(column) or "nan")
                if math.isnan(theirs):
                    continue
                yield {"shape": r["shape"], "routing": r.get("routing") or "uniform", "T": int(r["T"]),
                       "floor": float(r["floor_us"]), "ours": float(r["triton_us"]), "theirs": theirs,
                       "tflops": float(r["tflops"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", help="moe_bench.py --out CSVs holding the peer's column")
    ap.add_argument("--peer", choices=sorted(PEERS), default="humming")
    ap.add_argument("--target", type=float, default=1.2, help="the ratio peer / ours asked for")
    ap.add_argument("--compute-from", type=int, default=1024, help="first T treated as bound by its math")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    table = list(rows(a.csv, a.peer))
    if not table:
        print(f"peer_ceiling: no row of {', '.join(a.csv)} holds a {PEERS[a.peer]} value.", file=sys.stderr)
        return 1
    head = ["layer", "routing", "T", "ours %copy", f"{a.peer} %copy", f"{a.peer} / ours",
            f"ceiling over {a.peer}", f">= {a.target} possible"]
    out = []
    for r in table:
        ratio = r["theirs"] / r["ours"]
        if r["T"] >= a.compute_from:
            out.append([r["shape"], r["routing"], r["T"], f"{r['tflops']:.0f} TFLOP/s", "", f"{ratio:.3f}", "", ""])
            continue
        ceiling = r["theirs"] / r["floor"]
        out.append([r["shape"], r["routing"], r["T"], f"{100 * r['floor'] / r['ours']:.1f}",
                    f"{100 * r['floor'] / r['theirs']:.1f}", f"{ratio:.3f}", f"{ceiling:.3f}",
                    "yes" if ceiling >= a.target else "no"])
    if a.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for o in out:
            print("| " + " | ".join(str(v) for v in o) + " |")
    else:
        widths = [max(len(str(v)) for v in col) for col in zip(head, *out)]
        for o in [head, *out]:
            print("  ".join(str(v).rjust(w) for v, w in zip(o, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
