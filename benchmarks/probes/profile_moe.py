"""One fused MoE call per kernel mode, for a profiler (ncu) to attach to.

    ncu --clock-control none -k regex:moe_gemm -c 4 python benchmarks/probes/profile_moe.py --shape dsv3 --tokens 64
    ncu --clock-control none -k regex:moe_ python benchmarks/probes/profile_moe.py --layout hopper_mma_xor --shape k3 --tokens 8
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from mxfp4conv.kernels.triton_moe import LAYOUT_SETS, fused_moe_triton, select_config
from mxfp4conv.shuffle import get_layout

SHAPES = {"dsv3": (7168, 2048, 256, 8), "k3": (3584, 384, 896, 16)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="dsv3")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--modes", default="0,1")
    ap.add_argument("--layout", default="identity",
                    help="identity, hopper_mma_xor (what convert writes for sm90), hopper_mma_rot or hopper_mma (then "
                         "--modes is ignored)")
    args = ap.parse_args()
    H, I, E, k = SHAPES[args.shape]
    T = args.tokens
    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), device="cuda", dtype=torch.uint8)
    s13 = torch.randint(118, 122, (E, 2 * I, H // 32), device="cuda", dtype=torch.uint8)
    w2 = torch.randint(0, 256, (E, H, I // 2), device="cuda", dtype=torch.uint8)
    s2 = torch.randint(118, 122, (E, H, I // 32), device="cuda", dtype=torch.uint8)
    ids = torch.rand(T, E, device="cuda").topk(k, dim=1).indices.to(torch.int32)
    tw = torch.rand(T, k, device="cuda")
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    if args.layout in LAYOUT_SETS and args.layout != "identity":
        W, S = (get_layout(n) for n in LAYOUT_SETS[args.layout])
        weights = (W.forward(w13), S.forward(s13), W.forward(w2), S.forward(s2))
        for _ in range(2):  # the second call is the one to read (no compilation in it)
            fused_moe_triton(x, *weights, tw, ids, activation="silu", activation_params={}, layout=args.layout)
        torch.cuda.synchronize()
        return
    for m in (int(v) for v in args.modes.split(",")):
        cfg = dataclasses.replace(select_config(T * k, E, H, I), mode=m)
        fused_moe_triton(x, w13, s13, w2, s2, tw, ids, activation="silu", activation_params={}, config=cfg)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
