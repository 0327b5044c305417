"""What checking expert bytes against the manifest's crc32 costs at load.

    python benchmarks/load_checksum_bench.py [--gb 3] [--repeat 3]

Writes a converted checkpoint (identity layout, one rank) whose rank holds about ``--gb`` GB of
expert bytes, then times ``load_moe_layers`` with and without the check (page cache warm:
one unmeasured load first, then the two modes alternately). Also times crc32 alone over the
same bytes. Prints one line per mode and the cost.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]  # runs from a checkout, installed or not

import torch  # noqa: E402

from runtime_fixtures import manifest_for, write_converted  # noqa: E402


def build(root: Path, gb: float) -> int:
    E, H, I = 32, 2048, 2048
    per_layer = E * (2 * I * H // 2 + 2 * I * H // 32 + H * I // 2 + H * I // 32)
    layers = max(1, round(gb * 1e9 / per_layer))
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for li in range(layers):
        p = f"model.layers.{li}.mlp.experts.rank0."
        tensors[p + "w13_weight"] = torch.randint(0, 256, (E, 2 * I, H // 2), generator=g, dtype=torch.uint8)
        tensors[p + "w13_weight_scale"] = torch.randint(118, 127, (E, 2 * I, H // 32), generator=g, dtype=torch.uint8)
        tensors[p + "w2_weight"] = torch.randint(0, 256, (E, H, I // 2), generator=g, dtype=torch.uint8)
        tensors[p + "w2_weight_scale"] = torch.randint(118, 127, (E, H, I // 32), generator=g, dtype=torch.uint8)
    m = manifest_for(hidden=H, hidden_padded=H, intermediate=I, i_rank=I, i_rank_padded=I, num_experts=E,
                     top_k=2, layers=[f"model.layers.{li}.mlp" for li in range(layers)])
    write_converted(root, m, tensors, shards=max(1, layers // 4))
    return layers * per_layer


def timed_load(root: Path, check: bool, copy: bool = False) -> float:
    """``copy``: also copy every loaded byte once (what moving the experts to a device does at
    least; on the CPU the loaded tensors map the shards, and bytes are read when first used)."""
    from mxfp4conv.runtime import load_moe_layers

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layers = load_moe_layers(root, rank=0, backend="torch", check_checksums=check)
    if copy:
        for ex in layers.values():
            for kind in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"):
                getattr(ex, kind).clone()
    dt = time.perf_counter() - t0
    del layers
    return dt


def crc_only(root: Path) -> float:
    from safetensors import safe_open

    from mxfp4conv.convert.crc import crc32

    tensors = []
    for shard in sorted(root.glob("model-*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            tensors += [f.get_tensor(n) for n in f.keys()]
    t0 = time.perf_counter()
    for t in tensors:
        crc32(t.reshape(-1).numpy())
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mxfp4conv-crc-bench-") as tmp:
        root = Path(tmp) / "ckpt"
        nbytes = build(root, args.gb)
        timed_load(root, True)  # page cache warm
        modes = [(False, False), (True, False), (False, True), (True, True)]
        times = {m: [] for m in modes}
        for _ in range(args.repeat):
            for m in modes:
                times[m].append(timed_load(root, *m))
        crc_s = min(crc_only(root) for _ in range(args.repeat))
    off, on = min(times[(False, False)]), min(times[(True, False)])
    off_c, on_c = min(times[(False, True)]), min(times[(True, True)])
    print(f"expert bytes of the rank: {nbytes / 1e9:.2f} GB, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"load_moe_layers without the check: {off:.2f} s ({nbytes / off / 1e9:.2f} GB/s), best of {args.repeat}")
    print(f"load_moe_layers with the check:    {on:.2f} s ({nbytes / on / 1e9:.2f} GB/s), best of {args.repeat}")
    print(f"crc32 alone (zlib-ng): {crc_s:.2f} s ({nbytes / crc_s / 1e9:.2f} GB/s)")
    print(f"cost of the check: {on - off:+.2f} s")
    print(f"load + one copy of every byte, without the check: {off_c:.2f} s; with: {on_c:.2f} s "
          f"({100 * (on_c - off_c) / off_c:+.0f}%)")


if __name__ == "__main__":
    main()
