"""Per-kernel device time of one MoE layer call, ours and (with --triton-kernels DIR) OpenAI's
triton_kernels on the same bytes and routing, from torch.profiler (CUDA activity; mean over
--iters calls after a warm-up; weights > L2 from T ~ 256 on, so the GEMMs read DRAM).

    python benchmarks/probes/kernel_split.py --shapes k3,dsv3 --tokens 2048,4096 [--triton-kernels DIR]
        [--variants '[{"gluon_split1": 2}]']

--variants: MoEConfig overrides of the default config, each split beside it.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(_HERE, ".."), os.path.join(_HERE, "..", "..")]  # the probes, the tools, the repository
from moe_bench import SHAPES, SITU, make_weights, routing  # noqa: E402

from mxfp4conv.kernels.triton_moe import fused_moe_triton, select_config  # noqa: E402
from mxfp4conv.shuffle import get_layout  # noqa: E402


def split(fn, iters, flush=None):
    """(kernel name, mean device time in us) of fn's kernels, longest first; with flush (a tensor
    larger than L2) it is rewritten before each call, so that every call reads from DRAM."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            if flush is not None:
                flush.bitwise_not_()
            fn()
        torch.cuda.synchronize()
    tot = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and "bitwise_not" not in ev.name:
            tot[ev.name[:110]] += ev.device_time / iters
    return sorted(tot.items(), key=lambda kv: -kv[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="k3")
    ap.add_argument("--tokens", default="4096")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--triton-kernels", default=None, metavar="DIR")
    ap.add_argument("--variants", default="[]", help="JSON list of MoEConfig overrides, each split beside the default")
    args = ap.parse_args()
    variants = json.loads(args.variants)
    tk = None
    if args.triton_kernels:
        import tk_moe
        tk = tk_moe.TritonKernels(args.triton_kernels)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name in args.shapes.split(","):
        H, I, E, k = SHAPES[name]
        canon = make_weights(H, I, E, gen)
        tkm = None
        if tk is not None:
            import tk_moe
            tkm = tk_moe.TkMoE(tk, *canon)
        Wl, Sl = get_layout("hopper_mma_w_xor"), get_layout("hopper_mma_s")
        w = (Wl.forward(canon[0]), Sl.forward(canon[1]), Wl.forward(canon[2]), Sl.forward(canon[3]))
        del canon
        for T in (int(t) for t in args.tokens.split(",")):
            ids, tw = routing(T, E, k, gen)
            x = torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16)
            base = select_config(T * k, E, H, I, "hopper_mma_xor")

            def ours(cfg):
                return fused_moe_triton(x, *w, tw, ids, activation="situ", activation_params=SITU,
                                        layout="hopper_mma_xor", config=cfg)

            runs = {" ".join(["ours"] + [f"{key}={val}" for key, val in v.items()]):
                    functools.partial(ours, dataclasses.replace(base, **v)) for v in [{}] + variants}
            if tkm is not None:
                runs["triton_kernels"] = lambda: tkm(x, ids, tw)
            for label, fn in runs.items():
                rows = split(fn, args.iters)
                print(f"{name} T={T} {label}: total {sum(t for _, t in rows):.1f} us")
                for kname, t in rows:
                    print(f"    {t:9.1f} us  {kname}")
        del w, tkm
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
