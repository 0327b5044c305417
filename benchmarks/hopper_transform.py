"""The hopper_mma transforms on one core: the numpy path against the compiled one (when built),
for the three weight bit orders (hopper_mma_w_xor, hopper_mma_w_rot and hopper_mma_w).

Same process, same input, interleaved rounds; GB/s of input a second, median (and best) of the
runs in each round. The output buffers are new arrays every call, as in ``weight_forward``.

    python benchmarks/hopper_transform.py --shape 6 4096 1024 --rounds 3 --runs 9
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mxfp4conv.shuffle import hopper_native, hopper_np  # noqa: E402


def rate(f, x, runs: int) -> tuple[float, float]:
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        f(x)
        ts.append(time.perf_counter() - t)
    return x.nbytes / np.median(ts) / 1e9, x.nbytes / min(ts) / 1e9


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=int, nargs=3, default=[6, 4096, 1024], metavar=("E", "N", "KB"),
                    help="weight bytes [E, N, K/2]; the scales are [E, N, K/32]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args(argv)
    e, n, kb = args.shape
    rng = np.random.default_rng(0)
    w = rng.integers(0, 256, (e, n, kb), dtype=np.uint8)
    s = rng.integers(0, 256, (e, n, kb // 16), dtype=np.uint8)
    paths = []
    for tag, order in (("xor", "xor"), ("rot", "rot"), ("w", "plain")):
        paths.append((f"{tag} numpy", lambda x, order=order: hopper_np.weight_forward(x, order), w))
        if hopper_native.enabled():
            assert np.array_equal(hopper_native.weight_forward(w, order), hopper_np.weight_forward(w, order))
            paths.append((f"{tag} native", lambda x, order=order: hopper_native.weight_forward(x, order), w))
    if not hopper_native.enabled():
        print("the compiled transform is not built or is switched off: numpy only")
    paths.append(("scales numpy", hopper_np.scale_forward, s))
    print(f"weights {w.nbytes / 2**20:.0f} MiB {tuple(w.shape)}, scales {s.nbytes / 2**20:.1f} MiB {tuple(s.shape)}")
    for r in range(args.rounds):
        print(f"round {r + 1}: " + "; ".join(f"{name} {med:.2f} GB/s (best {best:.2f})"
                                           for name, f, x in paths for med, best in [rate(f, x, args.runs)]))


if __name__ == "__main__":
    main()
