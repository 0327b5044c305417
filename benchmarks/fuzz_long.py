"""The long fuzzing run: every target of tests/fuzz_cases.py on many seeded inputs.

    python benchmarks/fuzz_long.py --inputs 10000 [--seconds 1500] [--out benchmarks/results/fuzz_long.md]

Inputs are split over the targets by weight (cheap parsers get more). Prints a table of
inputs, accepted, refused, crashes, hangs and silent accepts per target, and the first
failures in full. Seeds continue from where the CI suite stops, so the inputs differ.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]  # runs from a checkout, installed or not

from fuzz_cases import TARGETS, build_corpus, run_one  # noqa: E402

WEIGHTS = {"header": 30, "index": 12, "config": 20, "config_field": 12, "manifest": 12, "converted_shard": 10,
           "source_shard": 4, "resume": 3, "load_flip": 6, "cli": 12}
FIRST_SEED = 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=None, help="stop early after this long")
    ap.add_argument("--limit", type=float, default=20.0, help="seconds one input may take (a hang)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    args = ap.parse_args()

    total_w = sum(WEIGHTS.values())
    plan = {t: max(1, args.inputs * w // total_w) for t, w in WEIGHTS.items()}
    plan["header"] += args.inputs - sum(plan.values())
    counts = {t: {"inputs": 0, "ok": 0, "refused": 0, "crash": 0, "hang": 0, "silent": 0} for t in TARGETS}
    failures: list[str] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mxfp4conv-fuzz-") as tmp:
        corpus = build_corpus(Path(tmp))
        # interleave the targets so that an early stop still covers all of them
        queue = [(t, FIRST_SEED + i) for i in range(max(plan.values())) for t in TARGETS if i < plan[t]]
        for n, (target, seed) in enumerate(queue, 1):
            if args.seconds and time.monotonic() - t0 > args.seconds:
                break
            o = run_one(corpus, target, seed, args.limit)
            c = counts[target]
            c["inputs"] += 1
            c[o.kind] += 1
            if o.kind in ("crash", "hang", "silent"):
                failures.append(f"{o.kind}: {o.detail}")
                print(failures[-1], flush=True)
            if n % 500 == 0:
                print(f"... {n} inputs, {time.monotonic() - t0:.0f} s, {len(failures)} failures", flush=True)
    elapsed = time.monotonic() - t0
    rows = ["| target | inputs | accepted (checked) | refused (clear error) | crashes | hangs | silent accepts |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    tot = {k: 0 for k in ("inputs", "ok", "refused", "crash", "hang", "silent")}
    for t, c in counts.items():
        rows.append(f"| {t} | {c['inputs']} | {c['ok']} | {c['refused']} | {c['crash']} | {c['hang']} | {c['silent']} |")
        for k in tot:
            tot[k] += c[k]
    rows.append(f"| **all** | **{tot['inputs']}** | {tot['ok']} | {tot['refused']} | **{tot['crash']}** | "
                f"**{tot['hang']}** | **{tot['silent']}** |")
    table = "\n".join(rows)
    print(table)
    print(f"\n{tot['inputs']} inputs in {elapsed:.0f} s")
    for f in failures[:30]:
        print(f)
    if args.out:
        args.out.write_text(table + f"\n\n{tot['inputs']} inputs in {elapsed:.0f} s; failures:\n"
                            + ("\n".join(f"- {f}" for f in failures[:30]) or "none") + "\n")


if __name__ == "__main__":
    main()
