"""Correctness of the Triton fused MXFP4 MoE on a CUDA GPU, on real layer shapes.

Each case draws fresh random MXFP4 bytes (scales chosen so GEMM outputs are O(1..10), which
exercises the activations' clamps and saturation), runs ``fused_moe_triton`` twice with the
allocator's free memory poisoned with NaN first (so an unwritten element shows up as NaN),
checks the two runs are bitwise equal, and compares with a float64 computation from the
raw bytes (codec dequantiser, activation formulas written out here). Prints a table; exits 1
on any failure.

Every case runs the configuration the dispatcher picks (the decode path without tensor cores
when experts see few pairs, else the MMA path) and the other path forced, with and without a
forced K split; the label names the path each run took.

    python benchmarks/gpu_check.py [--out DIR] [--layout identity|hopper_mma_rot|hopper_mma_xor|hopper_mma|both]
        (a hopper layout runs its variants and the default in the other bit orders; both: identity and
        hopper_mma_xor, what convert writes; --quick, which once skipped two MMA modes since removed, is accepted
        and changes nothing)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time

import torch

from mxfp4conv.codec import dequantize_mxfp4

from mxfp4conv.kernels.triton_moe import (HOPPER_ORDERS, HOPPER_SETS, LAYOUT_SETS, fused_moe_triton, select_config,
                                          uses_gemv)
from mxfp4conv.kernels.triton_moe.gluon_choice import (device_sms, gluon_plan, gluon_rows2, gluon_tiles, grouped_masks,
                                                       grouped_plan, grouped_programs1, grouped_takes, grouped_tiles,
                                                       loop_tuning, pairs_take, sum2_by_kernel)
from mxfp4conv.kernels.triton_moe.hopper_forward import hopper_options
from mxfp4conv.kernels.triton_moe.launch import ALIGN_GRID_PAIRS
from mxfp4conv.shuffle import get_layout


def act64(name, params, g, u):
    if name == "situ":
        beta, lin = params.get("beta", 1.0), params.get("linear_beta")
        gate = beta * torch.tanh(g / beta) * torch.sigmoid(g)
        return gate * (lin * torch.tanh(u / lin) if lin is not None and lin > 0 else u)
    if name == "silu":
        lim = params.get("swiglu_limit")
        if lim is not None:
            g, u = g.clamp(max=lim), u.clamp(-lim, lim)
        return g * torch.sigmoid(g) * u
    alpha, lim = params.get("alpha", 1.702), params.get("limit", 7.0)
    g, u = g.clamp(max=lim), u.clamp(-lim, lim)
    return (u + 1) * g * torch.sigmoid(alpha * g)


def reference(x, w13, s13, w2, s2, tw, ids, act, params, b13=None, b2=None):
    """float64, expert by expert, on the device."""
    T, H = x.shape
    i_pad = w13.shape[1] // 2
    out = torch.zeros(T, H, dtype=torch.float64, device=x.device)
    xd = x.double()
    for e in torch.unique(ids[ids >= 0]).tolist():
        t_idx, j_idx = torch.nonzero(ids == e, as_tuple=True)
        W13 = dequantize_mxfp4(w13[e], s13[e]).double()
        h = xd[t_idx] @ W13.T
        if b13 is not None:
            h += b13[e].double()
        a = act64(act, params, h[:, :i_pad], h[:, i_pad:])
        y = a @ dequantize_mxfp4(w2[e], s2[e]).double().T
        if b2 is not None:
            y += b2[e].double()
        out.index_add_(0, t_idx, y * tw[t_idx, j_idx].double()[:, None])
    return out


def scale_code(fan_in: int, target_rms: float) -> int:
    # random e2m1 codes have rms ~2.9; pick the e8m0 exponent giving outputs of about target_rms
    return round(127 + math.log2(target_rms / (math.sqrt(fan_in) * 2.9)))


def make_case(T, H, I, E, k, *, bias, routing, seed, dev):
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(T, H, generator=g, device=dev)
    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), generator=g, device=dev, dtype=torch.uint8)
    c1 = scale_code(H, 4.0)
    s13 = torch.randint(c1 - 1, c1 + 2, (E, 2 * I, H // 32), generator=g, device=dev, dtype=torch.uint8)
    w2 = torch.randint(0, 256, (E, H, I // 2), generator=g, device=dev, dtype=torch.uint8)
    c2 = scale_code(I, 1.0 / 4.0)
    s2 = torch.randint(c2 - 1, c2 + 2, (E, H, I // 32), generator=g, device=dev, dtype=torch.uint8)
    ids = torch.rand(T, E, generator=g, device=dev).topk(k, dim=1).indices
    if routing == "ragged":
        # expert 0 gets every token (many), expert 1 exactly one, the last expert none, some slots skipped
        ids = torch.where(ids == 0, E - 2, ids)
        ids = torch.where(ids == 1, E - 3, ids)
        ids = torch.where(ids == E - 1, E - 4, ids)
        ids[:, 0] = 0
        if k > 1:
            ids[0, 1] = 1
            ids[1:, 1] = torch.where(ids[1:, 1] == 1, 2, ids[1:, 1])
            ids[T // 2:, -1] = -1
        ids[-1] = -1  # a token routed to no local expert
    elif routing == "edge":  # the last expert (the end of every weight tensor) and a slot on no local expert
        ids = torch.where(ids == E - 1, ids[:, :1], ids)  # E - 1 swapped into slot 0: the ids stay distinct
        ids[:, 0] = E - 1
        ids[:, -1] = -1
    tw = torch.rand(T, k, generator=g, device=dev)
    b13 = torch.randn(E, 2 * I, generator=g, device=dev) if bias else None
    b2 = torch.randn(E, H, generator=g, device=dev) * 0.1 if bias else None
    return x, w13, s13, w2, s2, tw, ids.to(torch.int32), b13, b2


CASES = [
    # name, T, H, I, E, k, activation, params, bias, dtype, routing
    ("dsv3 T1 silu", 1, 7168, 2048, 256, 8, "silu", {}, False, torch.bfloat16, "uniform"),
    ("dsv3 T64 silu+limit ragged", 64, 7168, 2048, 256, 8, "silu", {"swiglu_limit": 10.0}, False, torch.bfloat16, "ragged"),
    ("k3 T1 situ", 1, 3584, 384, 896, 16, "situ", {"beta": 4.0, "linear_beta": 25.0}, False, torch.bfloat16, "uniform"),
    ("k3 T8 situ", 8, 3584, 384, 896, 16, "situ", {"beta": 4.0, "linear_beta": 25.0}, False, torch.bfloat16, "uniform"),
    ("dsv3 T64 situ", 64, 7168, 2048, 256, 8, "situ", {"beta": 4.0, "linear_beta": 25.0}, False, torch.bfloat16, "uniform"),
    ("k3 T37 situ ragged", 37, 3584, 384, 896, 16, "situ", {"beta": 4.0, "linear_beta": 25.0}, False, torch.bfloat16, "ragged"),
    ("k3 T4096 situ", 4096, 3584, 384, 896, 16, "situ", {"beta": 4.0, "linear_beta": 25.0}, False, torch.bfloat16, "uniform"),
    ("dsv3 T4096 silu", 4096, 7168, 2048, 64, 8, "silu", {}, False, torch.bfloat16, "uniform"),
    ("oss H2880 swigluoai bias fp16 ragged", 19, 2880, 2880, 32, 4, "swigluoai", {"alpha": 1.702, "limit": 7.0}, True, torch.float16, "ragged"),
    ("odd tiles situ-nolin fp16", 23, 1056, 96, 8, 3, "situ", {"beta": 4.0}, False, torch.float16, "ragged"),
    ("odd tiles silu fp32", 9, 1056, 160, 8, 2, "silu", {}, False, torch.float32, "ragged"),
    ("64-tiles situ ragged", 29, 1088, 192, 8, 3, "situ", {"beta": 4.0, "linear_beta": 25.0}, False, torch.bfloat16, "ragged"),
    ("64-tiles silu fp32", 9, 1088, 192, 8, 2, "silu", {}, False, torch.float32, "ragged"),
    # one token at the tensors' end and with a slot on no local expert (the one-token Gluon kernels'
    # edges), every activation, biases; 1088 = 17 x 64 and 192 = 3 x 64: no K split, 64-code steps
    ("dsv3 T1 swigluoai bias edge", 1, 7168, 2048, 256, 8, "swigluoai", {"alpha": 1.702, "limit": 7.0}, True, torch.bfloat16, "edge"),
    ("k3 T1 situ edge", 1, 3584, 384, 896, 16, "situ", {"beta": 4.0, "linear_beta": 25.0}, False, torch.bfloat16, "edge"),
    ("64-tiles T1 silu+limit bias edge", 1, 1088, 192, 8, 3, "silu", {"swiglu_limit": 10.0}, True, torch.bfloat16, "edge"),
    ("dsv3 T4 swigluoai bias edge", 4, 7168, 2048, 256, 8, "swigluoai", {"alpha": 1.702, "limit": 7.0}, True, torch.bfloat16, "edge"),
    # a few tokens whose pairs share enough experts for the expert blocks (pairs_take), biases
    ("dsv3 T8 swigluoai bias", 8, 7168, 2048, 256, 8, "swigluoai", {"alpha": 1.702, "limit": 7.0}, True, torch.bfloat16, "uniform"),
    # prefill past 96 pairs an expert: experts' last small blocks in the programs before them (absorb), biases
    ("dsv3 T4096 swigluoai bias", 4096, 7168, 2048, 256, 8, "swigluoai", {"alpha": 1.702, "limit": 7.0}, True, torch.bfloat16, "uniform"),
    # per pair with the GEMM1 grid fitted to a wave: unsplit (K3-like T = 5), over single steps (T = 9)
    ("k3 T5 situ", 5, 3584, 384, 896, 16, "situ", {"beta": 4.0, "linear_beta": 25.0}, False, torch.bfloat16, "uniform"),
    ("k3 T9 silu+limit bias ragged", 9, 3584, 384, 896, 16, "silu", {"swiglu_limit": 10.0}, True, torch.bfloat16, "ragged"),
    # per pair past 9 tokens, GEMM1 unsplit in 64-code steps: one wave of 8 programs an SM (K3-like T = 10 and 11)
    ("k3 T10 swigluoai bias ragged", 10, 3584, 384, 896, 16, "swigluoai", {"alpha": 1.702, "limit": 7.0}, True, torch.bfloat16, "ragged"),
    ("k3 T11 situ", 11, 3584, 384, 896, 16, "situ", {"beta": 4.0, "linear_beta": 25.0}, False, torch.bfloat16, "uniform"),
    # expert blocks after the many-program align (from 2048 pairs)
    ("k3 T160 silu bias ragged", 160, 3584, 384, 896, 16, "silu", {}, True, torch.bfloat16, "ragged"),
    # expert blocks whose GEMM1 runs over pairs of steps (its expected grid in two waves of 4 programs an SM)
    ("k3 T12 silu", 12, 3584, 384, 896, 16, "silu", {}, False, torch.bfloat16, "uniform"),
    # the middle's expert blocks: 64-pair blocks in 32-pair tiles or whole (DSV3-like), 32-pair ones in 16 or whole
    # (K3-like), biases, slots on no local expert
    ("dsv3 T1024 silu+limit bias ragged", 1024, 7168, 2048, 256, 8, "silu", {"swiglu_limit": 10.0}, True, torch.bfloat16, "ragged"),
    ("k3 T1024 situ ragged", 1024, 3584, 384, 896, 16, "situ", {"beta": 4.0, "linear_beta": 25.0}, False, torch.bfloat16, "ragged"),
    # DSV3-like 32-pair blocks, whose GEMM1 runs in gluon_wgmma by default (the words through its cp.async ring)
    ("dsv3 T640 swigluoai bias ragged", 640, 7168, 2048, 256, 8, "swigluoai", {"alpha": 1.702, "limit": 7.0}, True, torch.bfloat16, "ragged"),
    # DSV3-like 128-pair blocks in 64-pair tiles, 64 + 32 or whole (and 64 + 16 with dual 2)
    ("dsv3 T2048 silu bias ragged", 2048, 7168, 2048, 256, 8, "silu", {}, True, torch.bfloat16, "ragged"),
    ("k3 T4096 silu ragged", 4096, 3584, 384, 896, 16, "silu", {}, False, torch.bfloat16, "ragged"),
    # fp32 x on 128-pair blocks (64 pairs an expert: 64 + 16 tails; 128: an expert's last 32 pairs in its block
    # before), two stages deep: three would need more shared memory than an sm_90 program may have
    ("64-tiles prefill silu fp32 ragged", 256, 1088, 192, 8, 2, "silu", {}, False, torch.float32, "ragged"),
    ("64-tiles prefill situ fp32", 512, 1088, 192, 8, 2, "situ", {"beta": 4.0, "linear_beta": 25.0}, False, torch.float32, "uniform"),
]


def poison_free_memory(dev):
    free, _ = torch.cuda.mem_get_info(dev)
    n = min(int(free * 0.5), 8 << 30) // 4
    torch.empty(n, dtype=torch.float32, device=dev).fill_(float("nan"))
    torch.cuda.synchronize(dev)


def variants_for(T, H, I, k, E, dtype):
    default = select_config(T * k, E, H, I)
    gemv = uses_gemv(default, T * k, E)
    mma = dataclasses.replace(default, gemv_max_pairs=0)
    forced = dataclasses.replace(default, gemv_max_pairs=1e9, gemv_block_t=4 if T * k > E else 0)
    out = [("default", default)]
    if dtype != torch.float32:  # the MMA decode modes
        out += [(f"mode{m}", dataclasses.replace(mma, mode=m)) for m in (0, 1) if gemv or m != default.mode]
    elif gemv:
        out.append(("mma", mma))
    if not gemv and T <= 64:
        out.append(("gemv", forced))
    if T <= 64:  # K split forced on (GEMM1 partials + activation kernel, GEMM2 partials), both paths
        out.append(("split", dataclasses.replace(default, split_k1=3, split_k2=2)))
        other = mma if gemv else forced
        out.append(("split", dataclasses.replace(other, split_k1=3, split_k2=2)))
    return out


def hopper_variants(T, H, I, k, E):
    """The default, a forced K split, the v9 launch sequence (align, separate activation and k-sum
    kernels), one block per pair with more than one token, the fused reductions forced on where
    the default leaves them off, GEMM2 row tiles in one flat loop where it does not use them, row
    tiles first in both grids (where not fused), the small and the two-tile paths of partly filled
    blocks switched the other way, the decode's e8m0 factors computed the other way, and the align
    the default does not take."""
    default = select_config(T * k, E, H, I, "hopper_mma_rot")
    out = [("default", default), ("split", dataclasses.replace(default, split_k1=3, split_k2=2)),
           ("v9", dataclasses.replace(default, fused=0, direct=0, pdl=0))]
    if 1 < T <= 64:
        out.append(("split", dataclasses.replace(default, direct=1, split_k1=3, split_k2=2)))
    if not hopper_options(default, T, T * k, True)[1]:
        out.append(("fused", dataclasses.replace(default, fused=1)))
    if default.rows2 == 1:  # GEMM2's flat loop over several row tiles
        out.append(("rows3", dataclasses.replace(default, rows2=3, fused=0)))
    if T * k / min(E, T * k) > 16:
        out.append(("bt16", dataclasses.replace(default, block_t=16, block_n2=128, tail_t=0)))
    if not hopper_options(default, T, T * k, True)[1]:  # row tiles first in both grids, GEMM2 two stages deep
        out.append(("rowsfirst", dataclasses.replace(default, rows_first1=1, rows_first2=1, num_stages2=2)))
    if not hopper_options(default, T, T * k, True)[1]:  # partly filled blocks in small tiles, or not (the other
        # choice from the default's; 32-pair blocks at least, so that there is a smaller tile)
        bt = max(32, default.block_t)
        out.append(("tail", dataclasses.replace(default, block_t=bt, tail_t=0 if default.tail_t else bt // 2, dual=0,
                                                rows2=1)))
        def halves(least, dual):  # blocks of at least `least` pairs in half-block tails; blocks made larger than the
            # default's drop its register cap, as select_config's do (a 96-register cap on 128-pair blocks with
            # fp32 x is past what ptxas can allocate)
            bt = max(least, default.block_t)
            cap = dict(maxnreg=0, maxnreg2=-1) if bt > default.block_t else {}
            return dataclasses.replace(default, block_t=bt, tail_t=bt // 2, dual=dual, rows2=1, **cap)

        # and the two-tile blocks switched the other way (on: 64-pair blocks at least)
        on = not (default.dual and default.tail_t >= 32)
        out.append(("dual", halves(64, 1) if on else dataclasses.replace(default, dual=0)))
        # and two-tile blocks in quarter steps of tail_t (dual 2, 128-pair blocks at least: a [rows, tail_t / 4]
        # second tile too), or without them where the default has them
        out.append(("dual2", dataclasses.replace(default, dual=1) if default.dual == 2 else halves(128, 2)))
    if not hopper_options(default, T, T * k, True)[1] and default.tail_t >= 16:  # an expert's last small block in
        # the program of its block before (absorb), switched the other way
        on = int(not (default.absorb or default.absorb2)) * 16
        out.append(("absorb", dataclasses.replace(default, absorb=on, absorb2=on)))
    # the e8m0 factors of the decode computed the other way (two to a word or one at a time)
    out.append(("factors", dataclasses.replace(default, factor_pairs=1 - default.factor_pairs)))
    # GEMM1 in gluon_wgmma's kernel where the default runs moe_hgemm1_kernel, and the other way (where it runs:
    # expert blocks of up to 64 pairs, bf16 x)
    out.append(("wgmma1", dataclasses.replace(default, wgmma1=0 if default.wgmma1 else 1)))
    if default.tail_t >= 16 and default.block_t <= 64:  # its two tiles a block (wgmma_dual: 8-pair second tiles where
        # tail_t is 32) switched the other way from the default's
        on = 2 if default.tail_t >= 32 else 1
        out.append(("wgdual", dataclasses.replace(default, wgmma1=1, wgmma_dual=0 if default.wgmma_dual else on)))
    if T > 1:  # the other align (many programs below ALIGN_GRID_PAIRS, one program from it)
        out.append(("align", dataclasses.replace(default, align=int(T * k < ALIGN_GRID_PAIRS))))
    if pairs_take(default, T, T * k, E):  # the Gluon kernels take these tokens where they can: the variants above on
        # the hopper_mma kernels, and the Gluon ones' other K steps and splits
        out = out[:1] + [(n, dataclasses.replace(c, gluon=0)) for n, c in out[1:]]
        out.append(("gluonk", dataclasses.replace(default, gluon=1, gluon_k1=128, gluon_k2=64, gluon_split1=2,
                                                gluon_split2=2)))
        out.append(("split", dataclasses.replace(default, gluon=1, gluon_split1=16, gluon_split2=4)))
        # GEMM2's sum over k the other way from the default's (in its last programs, or in the k-sum kernel after
        # it), and in the k-sum kernel after GEMM2's K splits
        by_kernel = sum2_by_kernel(default, I, gluon_tiles(default, H, I, T * k, T, device_sms(torch.device("cuda"))))
        out.append(("sum2", dataclasses.replace(default, gluon=1, gluon_sum2=int(by_kernel))))
        out.append(("sum2", dataclasses.replace(default, gluon=1, gluon_sum2=0, gluon_split2=2)))
        # GEMM2 in programs of the other row count (64 or 128), with the sum in GEMM2 and in the k-sum kernel
        rows2 = 64 if gluon_rows2(default, H, I, gluon_tiles(default, H, I, T * k, T)[1]) > 64 else 128
        out.append(("rows2", dataclasses.replace(default, gluon=1, gluon_rows2=rows2, gluon_sum2=1)))
        out.append(("rows2", dataclasses.replace(default, gluon=1, gluon_rows2=rows2, gluon_sum2=0)))
        # the K loops the other way (over pairs of steps, or single ones), uncapped
        out.append(("unroll", dataclasses.replace(default, gluon=1, **_other_loops(default, False, H, I, E, T * k, T))))
    else:  # the Gluon kernels on expert blocks: where the default takes them, the variants above on the hopper_mma
        # kernels; and the expert blocks forced on (as they come where the default does not take them), in 64-code
        # steps, and with 4 K splits of GEMM1
        if grouped_takes(default, T, T * k, E):
            out = out[:1] + [(n, dataclasses.replace(c, gluon_grouped=0)) for n, c in out[1:]]
        else:
            out.append(("grouped", dataclasses.replace(default, gluon=1, gluon_grouped=1)))
        out.append(("grouped", dataclasses.replace(default, gluon=1, gluon_grouped=1, gluon_k1=64, gluon_k2=64)))
        out.append(("grouped", dataclasses.replace(default, gluon=1, gluon_grouped=1, gluon_split1=4)))
        # GEMM2 over one 64-row block a program, and over seven (64-code steps)
        out.append(("grouped", dataclasses.replace(default, gluon=1, gluon_grouped=1, gluon_blocks2=1)))
        out.append(("grouped", dataclasses.replace(default, gluon=1, gluon_grouped=1, gluon_k2=64, gluon_blocks2=7)))
        # GEMM1's x operand masked where the default leaves it unmasked, or unmasked where it masks it
        out.append(("grouped", dataclasses.replace(default, gluon=1, gluon_grouped=1,
                                                   gluon_xmask=1 - grouped_masks(default, I))))
        # GEMM2 over one row block a program of the other row count (64 or 128)
        out.append(("grouped", dataclasses.replace(default, gluon=1, gluon_grouped=1, gluon_blocks2=1,
                                                   gluon_rows2=64 if gluon_rows2(default, H, I, 128 if I % 128 == 0
                                                                                 else 64) > 64 else 128)))
        out.append(("grouped", dataclasses.replace(default, gluon=1, gluon_grouped=1, gluon_blocks2=4, gluon_rows2=64)))
        # and both K loops the other way (GEMM2 over one row block a program, where the loop choice applies), uncapped
        out.append(("grouped", dataclasses.replace(default, gluon=1, gluon_grouped=1, gluon_blocks2=1,
                                                   **_other_loops(default, True, H, I, E, T * k, T))))
        if T <= 16:  # and the per-pair ones on more tokens than they take by default
            out.append(("gluon", dataclasses.replace(default, gluon=1, gluon_max_tokens=16, gluon_pair_share=1e9)))
    return out


def _other_loops(cfg, grouped, H, I, E, pairs, T):
    """Config overrides running both Gluon GEMMs' K loops the other way from cfg's choice on this GPU, without register
    caps."""
    sms = device_sms(torch.device("cuda"))
    k1, _, s1, _ = gluon_tiles(cfg, H, I, pairs, T, sms)
    k1 = 128 if grouped and H % 128 == 0 else k1
    if grouped:
        programs1 = grouped_programs1(T, pairs // T, E, I, grouped_tiles(cfg, H, I, pairs, E)[2])
    else:
        programs1 = I // 64 * pairs * s1
    rows2 = gluon_rows2(cfg, H, I, 128 if I % 128 == 0 else 64)
    u1, u2 = loop_tuning(cfg, grouped, k1, rows2, programs1, sms)["unroll"]
    return dict(gluon_unroll1=3 - u1, gluon_unroll2=3 - u2, gluon_maxnreg1=0, gluon_maxnreg2=0)


def _loops(cfg, grouped, k1, rows2, programs1=0, sms=0, order="rot"):
    """The Gluon K loops' label: u<GEMM1>/<GEMM2> (1 single steps, 2 pairs), and their register caps (the per-pair
    GEMM1's for programs1 programs on sms SMs)."""
    t = loop_tuning(cfg, grouped, k1, rows2, programs1, sms, order)
    caps = "/".join(str(m) for m in t["maxnreg"])
    return f" u{t['unroll'][0]}/{t['unroll'][1]}{'' if caps == '0/0' else ' cap' + caps}"


def path_name(cfg, T, k, E, dtype, layout="identity"):
    if layout != "identity":
        direct, fused, pdl = hopper_options(cfg, T, T * k, True)
        flags = "".join(f" {n}" for n, on in (("direct", direct), ("fused", fused), ("pdl", pdl)) if on)
        order = " rowsfirst" if (cfg.rows_first1 or cfg.rows_first2) and not fused else ""
        order += f" absorb{cfg.absorb}/{cfg.absorb2}" if (cfg.absorb or cfg.absorb2) and cfg.tail_t and not fused else ""
        order += f" tail{cfg.tail_t}{' dual' if cfg.dual == 1 else ' dual2' if cfg.dual == 2 else ''}" if (
            cfg.tail_t and not fused) else ""
        if cfg.wgmma1 and cfg.block_t <= 64 and not fused and dtype == torch.bfloat16:
            order += f" wgmma1 ring{cfg.wgmma1_stages}"
        if cfg.wgmma_dual and cfg.tail_t and cfg.wgmma1 and not fused and dtype == torch.bfloat16:
            order += f" wgdual{cfg.wgmma_dual}"
        return f"{layout} bt{cfg.block_t}{flags}{f' rows{cfg.rows2}' if cfg.rows2 > 1 and not fused else ''}{order}"
    if uses_gemv(cfg, T * k, E):
        return "gemv"
    return "words" if dtype == torch.bfloat16 and cfg.mode == 1 else "bytes"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="no effect (kept for the commands of earlier runs)")
    ap.add_argument("--layout", default="identity", help="identity, hopper_mma_rot, hopper_mma_xor, hopper_mma or both")
    ap.add_argument("--cases", default=None, help="comma-separated case indices (default: all)")
    args = ap.parse_args()
    layouts = ("identity", "hopper_mma_xor") if args.layout == "both" else (args.layout,)
    dev = torch.device("cuda")
    rows, ok_all = [], True
    only = None if args.cases is None else {int(c) for c in args.cases.split(",")}
    for i, (name, T, H, I, E, k, act, params, bias, dtype, routing) in enumerate(CASES):
        if only is not None and i not in only:
            continue
        x, w13, s13, w2, s2, tw, ids, b13, b2 = make_case(T, H, I, E, k, bias=bias, routing=routing, seed=100 + i, dev=dev)
        xin = x.to(dtype)
        ref = reference(xin.float(), w13, s13, w2, s2, tw, ids, act, params, b13, b2)
        runs = []
        for layout in layouts:
            if layout == "identity":
                runs += [(layout, v, c, (w13, s13, w2, s2)) for v, c in variants_for(T, H, I, k, E, dtype)]
            elif H % 64 == 0 and I % 64 == 0:
                def stored(lay):
                    Wl, Sl = (get_layout(n) for n in LAYOUT_SETS[lay])
                    return Wl.forward(w13), Sl.forward(s13), Wl.forward(w2), Sl.forward(s2)

                mine = stored(layout)
                runs += [(layout, v, c, mine) for v, c in hopper_variants(T, H, I, k, E)]
                # the same weights in the other bit orders of the weight words
                runs += [(other, other, select_config(T * k, E, H, I, other), stored(other))
                         for other in HOPPER_SETS if other != layout]
        for layout, vname, cfg, weights in runs:
            t0 = time.time()
            plan = gluon_plan(cfg, xin, weights, k, layout) if layout in HOPPER_SETS else None
            blocks = grouped_plan(cfg, xin, weights, k, layout, E) if layout in HOPPER_SETS else None
            if blocks:
                r2 = gluon_rows2(cfg, H, I, blocks[1]) if blocks[3] == 1 else 64
                loops = _loops(cfg, True, blocks[0], r2, grouped_programs1(T, k, E, I, blocks[2]), device_sms(dev),
                               HOPPER_ORDERS[layout])
                path = (f"gluon grouped k{blocks[0]}/{blocks[1]} s{blocks[2]} b{blocks[3]} xmask{grouped_masks(cfg, I)}"
                        f" r{r2}{loops}")
            elif plan:
                r2 = gluon_rows2(cfg, H, I, plan[1])
                loops = _loops(cfg, False, plan[0], r2, I // 64 * T * k * plan[2], device_sms(dev), HOPPER_ORDERS[layout])
                path = (f"gluon k{plan[0]}/{plan[1]} s{plan[2]}/{plan[3]}"
                        f"{' ksum' if sum2_by_kernel(cfg, I, plan) else ''} r{r2}{loops}")
            else:
                path = path_name(cfg, T, k, E, dtype, layout)
            label = f"{name} [{path}{' splitK' if vname == 'split' else ''}]"
            outs = []
            try:
                for _ in range(2):
                    poison_free_memory(dev)
                    outs.append(fused_moe_triton(xin, *weights, tw, ids, activation=act, activation_params=params,
                                                 w13_bias=b13, w2_bias=b2, config=cfg, layout=layout))
                torch.cuda.synchronize()
            except Exception as exc:  # a kernel that fails to compile or launch is a failed case, not a crash
                print(f"{label}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                rows.append((label, str(dtype).split(".")[-1], T, 0, float("nan"), float("nan"), False, False, False,
                             time.time() - t0))
                ok_all = False
                continue
            out = outs[0]
            finite = bool(torch.isfinite(out).all())
            det = bool(torch.equal(outs[0], outs[1]))
            err = float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))
            maxerr = float(((out.double() - ref).abs() / ref.abs().max()).max())
            tol = 1e-2 if dtype != torch.float32 else 2e-3
            skipped_zero = bool(torch.all(out[-1] == 0)) if routing == "ragged" else True
            ok = finite and det and err < tol and skipped_zero and out.dtype == dtype and out.shape == x.shape
            ok_all &= ok
            ntouch = int(torch.unique(ids[ids >= 0]).numel())
            rows.append((label, str(dtype).split(".")[-1], T, ntouch, err, maxerr, finite, det, ok, time.time() - t0))
            print(f"{label}: err {err:.2e} {'PASS' if ok else 'FAIL'}", flush=True)
            del outs, out
        del x, w13, s13, w2, s2, ref, runs
        torch.cuda.empty_cache()
    hdr = f"{'case':52s} {'dtype':8s} {'T':>5s} {'experts':>7s} {'relL2':>9s} {'max/ref':>9s} {'finite':>6s} {'determ':>6s} {'ok':>4s} {'s':>5s}"
    lines = [hdr] + [f"{r[0]:52s} {r[1]:8s} {r[2]:5d} {r[3]:7d} {r[4]:9.2e} {r[5]:9.2e} {str(r[6]):>6s} {str(r[7]):>6s} {('PASS' if r[8] else 'FAIL'):>4s} {r[9]:5.1f}" for r in rows]
    print("\n".join(lines))
    if args.out:
        with open(f"{args.out}/gpu_check.txt", "w") as f:
            f.write(torch.cuda.get_device_name() + "\n" + "\n".join(lines) + "\n")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
