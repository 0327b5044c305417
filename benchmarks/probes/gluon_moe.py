"""The few-token MoE layer of fused_moe_triton over hopper_mma_rot: the Gluon MMA v2 kernels
(mxfp4conv/kernels/triton_moe/gluon_few_tokens.py, taken automatically at up to 8 bf16 tokens on Hopper; here
at every --tokens count) against the hopper_mma kernels (config gluon=0) on the same bytes and
routing.

Checked first: both outputs against a float64 computation from the bytes (silu, situ, and
swigluoai with biases), and that each is deterministic. Then per kernel (torch profiler, L2
flushed before each call, no PDL) over K steps and splits of each GEMM, the other GEMM held at
the default; then the default, the fastest of the sweep without PDL and with it (GEMM2 a
programmatic dependent of GEMM1, as fused_moe_triton runs it), each timed by CUDA-graph replay, each
call routing the tokens to other experts (so L2 holds no weights), interleaved round by round with
the hopper_mma kernels; ratio = median gluon / hopper_mma.

    python benchmarks/probes/gluon_moe.py [--shapes dsv3,k3] [--tokens 1,2,4,8] [--rounds 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(_HERE, ".."), os.path.join(_HERE, "..", "..")]  # the probes, the tools, the repository

import torch  # noqa: E402

from benchmarks.probes.gluon_t1_bench import start_log, write_log  # noqa: E402
from benchmarks.probes.kernel_split import split as kernel_times  # noqa: E402
from benchmarks.moe_bench import SHAPES, graph_time_us, make_weights  # noqa: E402
from mxfp4conv.codec import dequantize_mxfp4  # noqa: E402
from mxfp4conv.runtime.activations import resolve_activation  # noqa: E402
from mxfp4conv.kernels.triton_moe import LAYOUT_SETS, fused_moe_triton, select_config  # noqa: E402
from mxfp4conv.kernels.triton_moe import hopper_kernels as HK  # noqa: E402
from mxfp4conv.kernels.triton_moe.gluon_choice import gluon_plan  # noqa: E402
from mxfp4conv.shuffle import get_layout  # noqa: E402


def reference(x, w13, s13, w2, s2, ids, tw, activation="silu", params=None, b13=None, b2=None):
    """float64 MoE of x [T, H] from the bytes (touched experts only), the intermediate rounded to
    bf16 as the kernels store it."""
    act = resolve_activation(activation, params)
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for t in range(x.shape[0]):
        xd = x[t].double()
        for j, e in enumerate(ids[t].tolist()):
            gu = dequantize_mxfp4(w13[e], s13[e]).double() @ xd + (b13[e].double() if b13 is not None else 0)
            g, u = gu.chunk(2)
            y = dequantize_mxfp4(w2[e], s2[e]).double() @ act(g, u).bfloat16().double()
            out[t] += tw[t, j].double() * (y + (b2[e].double() if b2 is not None else 0))
    return out


@contextlib.contextmanager
def pdl(on: bool):
    """The Gluon kernels launched as programmatic dependents (where Triton has it) or not, as this Triton without it."""
    has = HK.HAS_GDC
    HK.HAS_GDC = has and on
    try:
        yield
    finally:
        HK.HAS_GDC = has


# activations checked besides silu (each with biases once): K3's situ, gpt-oss's swigluoai
CHECKS = (("silu", {}, False), ("situ", {"beta": 4.0, "linear_beta": 25.0}, False),
          ("swigluoai", {"alpha": 1.702, "limit": 7.0}, True))


def bench(name, T, rounds, log):
    H, I, E, k = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(11)
    w13, s13, w2, s2 = make_weights(H, I, E, gen)
    Wl, Sl = (get_layout(n) for n in LAYOUT_SETS["hopper_mma_rot"])
    w = (Wl.forward(w13), Sl.forward(s13), Wl.forward(w2), Sl.forward(s2))
    calls = 8  # the tokens routed to other experts in each call of a replay
    routes = []
    for _ in range(calls):
        ids = torch.rand(T, E, device="cuda", generator=gen).topk(k, dim=1).indices.to(torch.int32)
        tw = torch.rand(T, k, device="cuda", generator=gen)
        routes.append((ids, tw / tw.sum(1, keepdim=True)))
    xs = [torch.randn(T, H, device="cuda", generator=gen).bfloat16() for _ in range(calls)]
    # the Gluon kernels taken at T tokens (past their default limit too, to see where it should lie)
    default = dataclasses.replace(select_config(T * k, E, H, I, "hopper_mma_rot"), gluon_max_tokens=max(T, 8),
                                  gluon_pair_share=1e9)
    hopper = dataclasses.replace(default, gluon=0)
    moe = lambda cfg, c=0, act="silu", params=None, b13=None, b2=None: fused_moe_triton(  # noqa: E731
        xs[c], *w, routes[c][1], routes[c][0], activation=act, activation_params=params or {}, w13_bias=b13,
        w2_bias=b2, layout="hopper_mma_rot", config=cfg)
    rel = lambda a, b: float((a.double().reshape(-1) - b.reshape(-1)).norm() / b.norm())  # noqa: E731
    biases = (torch.randn(E, 2 * I, device="cuda", generator=gen), torch.randn(E, H, device="cuda", generator=gen))
    log(f"{name} T={T}, default plan (k1, k2, splits1, splits2) {gluon_plan(default, xs[0], w, k, 'hopper_mma_rot')}")
    for act, params, bias in CHECKS:
        b13, b2 = biases if bias else (None, None)
        ref = reference(xs[0], w13, s13, w2, s2, *routes[0], act, params, b13, b2)
        g = [moe(dataclasses.replace(default, gluon=1), 0, act, params, b13, b2) for _ in range(2)]
        h = moe(hopper, 0, act, params, b13, b2)
        log(f"  {act}{' with biases' if bias else ''}: rel err gluon {rel(g[0], ref):.2e} (deterministic "
            f"{bool(torch.equal(g[0], g[1]))}), hopper_mma {rel(h, ref):.2e}, between them {rel(g[0], h.double()):.2e}")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def per_kernel(cfg, chained=False):
        with pdl(chained):
            return dict(kernel_times(lambda: moe(cfg), 20, flush=flush))

    log("  hopper_mma kernels (us, L2 flushed, mean of 20): "
        + ", ".join(f"{n[:24]} {t:.1f}" for n, t in per_kernel(hopper, True).items()))
    sweep = []
    for gemm, knob_k, knob_s, steps, splits in (("few_gemm1", "gluon_k1", "gluon_split1", (64, 128), (1, 2, 4, 7, 8, 14, 16)),
                                                 ("few_gemm2", "gluon_k2", "gluon_split2", (64, 128), (1, 2, 4))):
        for kk in steps:
            for sp in splits:
                cfg = dataclasses.replace(default, gluon=1, **{knob_k: kk, knob_s: sp})
                plan = gluon_plan(cfg, xs[0], w, k, "hopper_mma_rot")
                if plan[0 if gemm == "few_gemm1" else 1] != kk or plan[2 if gemm == "few_gemm1" else 3] != sp:
                    continue  # lowered to another configuration
                t = per_kernel(cfg)
                sweep.append((gemm, kk, sp, t.get(gemm, float("nan")), cfg))
                log(f"  {gemm} {kk} codes a step, {sp} splits: {t.get(gemm, float('nan')):.1f} us")
    best = {g: min((r for r in sweep if r[0] == g), key=lambda r: r[3]) for g in ("few_gemm1", "few_gemm2")}
    fastest = dataclasses.replace(default, gluon=1, gluon_k1=best["few_gemm1"][1],
                                  gluon_split1=best["few_gemm1"][2], gluon_k2=best["few_gemm2"][1],
                                  gluon_split2=best["few_gemm2"][2])
    rows = []
    for label, cfg, chained in (("default", dataclasses.replace(default, gluon=1), True),
                                ("fastest of sweep, no PDL", fastest, False),
                                ("its GEMM2 PDL after GEMM1's loop", fastest, True)):
        plan = gluon_plan(cfg, xs[0], w, k, "hopper_mma_rot")
        if chained and cfg is fastest:  # the same sums in the same order: bit-equal outputs
            with pdl(False):
                unchained = moe(cfg)
            label += f" (bit-equal without: {bool(torch.equal(moe(cfg), unchained))})"
        tg, th = [], []
        for _ in range(rounds):
            with pdl(chained):
                tg.append(graph_time_us([lambda c=c: moe(cfg, c) for c in range(calls)]))
            th.append(graph_time_us([lambda c=c: moe(hopper, c) for c in range(calls)]))
        ratio = statistics.median(a / b for a, b in zip(tg, th))
        rows.append((name, T, label, plan, statistics.median(tg), statistics.median(th), ratio))
        log(f"  {label} {plan}: {statistics.median(tg):.1f} us, hopper_mma {statistics.median(th):.1f} us, "
            f"gluon / hopper_mma {ratio:.3f} (rounds {' '.join(f'{t:.1f}' for t in tg)}; "
            f"{' '.join(f'{t:.1f}' for t in th)})")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="dsv3,k3")
    ap.add_argument("--tokens", default="1", help="comma-separated token counts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    log, lines, _ = start_log()
    table = []
    for name in args.shapes.split(","):
        for T in (int(t) for t in args.tokens.split(",")):
            table += bench(name, T, args.rounds, log)
    log(f"{'shape':6s} {'T':>3s} {'configuration':44s} {'k1, k2, s1, s2':16s} {'gluon us':>9s} {'hopper us':>10s} "
        f"{'ratio':>6s}")
    for r in table:
        log(f"{r[0]:6s} {r[1]:3d} {r[2]:44s} {str(r[3]):16s} {r[4]:9.1f} {r[5]:10.1f} {r[6]:6.3f}")
    write_log(lines, args.out, "gluon_moe.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
