"""Where ``convert`` spends its time: one in-process convert under cProfile.

The worker pool is replaced by a serial one that runs every task on the calling thread, so
the profile sees reading, transforming, checksumming and writing together (cProfile follows
one thread). Generates a Kimi-K3-format checkpoint once (``--src``, reused when present),
drops or evicts its page cache, converts it into ``--out`` and prints the functions with the
most total and own time.

    python benchmarks/profile_convert.py --src /tmp/p-src --out /tmp/p-out --arch sm90 --tp 1
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from convert_bench import drop_caches, generate  # noqa: E402


class SerialPool:
    """``OrderedPool`` with the jobs run inline, in order."""

    def __init__(self, workers: int, depth: int | None = None, name: str = ""):
        pass

    def map(self, fn, jobs):
        for job in jobs:
            yield job, fn(job)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arch", default="gfx950")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)

    if not args.src.exists():
        generate(args.src, args.size_gb, 2048, 2048, args.experts, 4.0)
    t0 = time.perf_counter()
    from mxfp4conv.convert import run
    from mxfp4conv.oracle import Target
    imports = time.perf_counter() - t0

    run.OrderedPool = SerialPool
    shutil.rmtree(args.out, ignore_errors=True)
    drop_caches(args.src)
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    run.convert(str(args.src), str(args.out), Target(arch=args.arch, tp=args.tp), progress="none", workers=1)
    prof.disable()
    wall = time.perf_counter() - t
    shutil.rmtree(args.out, ignore_errors=True)
    print(f"{args.arch} tp {args.tp}: imports {imports:.2f} s, convert {wall:.2f} s (serial, profiled)")
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(args.top)
    st.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
