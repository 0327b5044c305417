"""The MMA path over the hopper_mma layouts: moe_hgemm1/2_kernel, and GEMM1 in gluon_wgmma's warpgroup MMAs where
asked.
"""

from __future__ import annotations

import os

import torch
import triton

from mxfp4conv.errors import RuntimeInputError
from mxfp4conv.kernels.triton_moe import hopper_kernels as HK
from mxfp4conv.kernels.triton_moe.config import MoEConfig
from mxfp4conv.kernels.triton_moe.gluon_load import _GLUON_BROKEN, _compiled_or_none, _gluon_module, _gluon_wgmma_module
from mxfp4conv.kernels.triton_moe.launch import _TL_DTYPES, _big_scales, _two_gemms, hopper_launch_options


def hopper_options(cfg: MoEConfig, T: int, num_pairs: int, cuda: bool) -> tuple[bool, bool, bool]:
    """(direct, fused, pdl) for this call. Automatic: all three for one token only. Measured on an
    H200 (benchmarks/results/performance-notebook.md): with the one-token tiles, T = 1 runs 1.13x (DSV3-like) and 1.23x
    (K3-like) faster than the five-launch sequence; from T = 8 on the fused k-sum costs more than
    the kernel it replaces (each program of GEMM2 counts the arrival of each of its pairs, one
    atomic round trip after another) and PDL is within noise or slower."""
    direct = cfg.direct == 1 or (cfg.direct < 0 and T == 1)
    fused = cfg.fused == 1 or (cfg.fused < 0 and direct)
    pdl = cuda and HK.HAS_GDC and (cfg.pdl == 1 or (cfg.pdl < 0 and direct))
    return direct, fused, pdl


def hopper_constants(cfg: MoEConfig, T: int, top_k: int, H: int, i_pad: int, dtype, asm: bool, fact: int, acts: dict,
                     bias13: bool, bias2: bool, rot: int = 0) -> tuple[dict, dict, tuple[bool, bool, int]]:
    """The compile-time arguments of moe_hgemm1_kernel and moe_hgemm2_kernel for one call (all but
    SPLIT and ROWS_FIRST, which follow from the grid), and (direct, fused, GEMM2 row tiles a program)."""
    direct, fused, pdl = hopper_options(cfg, T, T * top_k, asm)
    rows2 = 1 if fused else max(1, cfg.rows2)
    tail = 0 if direct or fused else cfg.tail_t
    tail2 = 0 if direct or fused or rows2 > 1 else cfg.tail_t
    common = dict(BLOCK_T=cfg.block_t, BLOCK_K=cfg.block_k, DTYPE=dtype, ASM=asm, FACT=fact, DIRECT=direct,
                  FUSED=fused, PDL=pdl, ROT=rot)
    c1 = dict(common, **acts, HAS_BIAS=bias13, BLOCK_N=cfg.block_n1, TAIL_T=tail, DUAL=cfg.dual if tail else 0,
              EVEN=H % cfg.block_k == 0 and i_pad % cfg.block_n1 == 0, ABSORB=cfg.absorb if tail else 0)
    c2 = dict(common, HAS_BIAS=bias2, BLOCK_N=cfg.block_n2, K_POW2=triton.next_power_of_2(top_k), ROW_TILES=rows2,
              TAIL_T=tail2, DUAL=cfg.dual if tail2 else 0, EVEN=i_pad % cfg.block_k == 0 and H % cfg.block_n2 == 0,
              ABSORB=cfg.absorb2 if tail2 else 0)
    return c1, c2, (direct, fused, rows2)


def wgmma1_runs(cfg, x, w13, w13_scale, i_pad, splits, direct, fused, fact, rot) -> bool:
    """Whether GEMM1 runs in gluon_wgmma.wg_gemm1: asked for (wgmma1); bf16 x on a CUDA GPU of compute capability 9.x
    (warpgroup MMAs); expert blocks of at most 64 pairs in one K split; every e8m0 scale <= 2; the xor or rot bit
    order; word-aligned weights; 128-code steps of H; x's offsets in int32; and Gluon here that has compiled."""
    return bool(cfg.wgmma1 and x.shape[1] % 128 == 0 and i_pad % 64 == 0 and x.numel() < 2 ** 31
                and x.dtype == torch.bfloat16 and x.is_cuda and torch.version.cuda is not None
                and os.environ.get("TRITON_INTERPRET") != "1" and cfg.block_t <= 64 and splits == 1 and not direct
                and not fused and fact != 2 and rot in (1, 2) and w13.data_ptr() % 16 == 0
                and w13_scale.data_ptr() % 4 == 0 and not _GLUON_BROKEN
                and torch.cuda.get_device_capability(x.device)[0] == 9 and _gluon_module() is not None)


def _wgmma_gemm1(x, w13, w13_scale, w13_bias, act, cfg, r, num_pairs, top_k, i_pad, max_blocks, rot):
    """GEMM1 of the hopper_mma path in gluon_wgmma.wg_gemm1: r.inter = act(gate . x, up . x) per pair; True once
    launched."""
    few = _gluon_module()
    # 64-pair blocks under a 168-register cap (two programs an SM; uncapped, the first form took 1.070 against 1.031 of
    # moe_hgemm1_kernel's time, DSV3-like T = 1024 on an H100: benchmarks/results/performance-notebook.md)
    cap = 168 if cfg.block_t > 32 else 0
    _gluon_wgmma_module().wg_gemm1[(i_pad // 64, max_blocks)](
        few._words(w13), few._words(w13_scale), x, r.sorted_ids, r.block_expert, r.num_post_pad,
        r.b13 if w13_bias is not None else r.inter, r.inter, num_pairs, top_k, x.shape[1], i_pad, act["p0"], act["p1"],
        KB=2, BT=cfg.block_t, TAIL=cfg.tail_t, STAGES=cfg.wgmma1_stages, ACT=act["ACT"], HAS_LIMIT=act["HAS_LIMIT"],
        HAS_LINEAR=act["HAS_LINEAR"], HAS_BIAS=w13_bias is not None, WPTX=few.WORDS32_PTX["xor" if rot == 2 else "rot"],
        DUAL=cfg.wgmma_dual if cfg.tail_t else 0, num_warps=4,
        **({"maxnreg": cap} if cap else {}))
    return True


def _hopper_forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, act, cfg, out,
                    rot=0):
    """The MMA path over the hopper_mma layouts (moe_hgemm1/2_kernel); rot: the weight words' bit order
    (hopper_kernels.ORDER_IDS)."""
    T, H = x.shape
    E, two_i, _ = w13.shape
    i_pad = two_i // 2
    top_k = topk_ids.shape[1]
    num_pairs = T * top_k
    dtype = getattr(triton.language, _TL_DTYPES[x.dtype])
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    asm = x.is_cuda and torch.version.cuda is not None and not interp
    fact = 2 if _big_scales(w13_scale, w2_scale) else cfg.factor_pairs
    if cfg.block_k % 64 or cfg.block_n1 % 16 or cfg.block_n2 % 16:
        raise RuntimeInputError(
            f"fused_moe_triton: the hopper_mma kernels need block_k a multiple of 64 and block_n1/block_n2 "
            f"multiples of 16, got {cfg.block_k}, {cfg.block_n1}, {cfg.block_n2}.")
    t = cfg.tail_t
    if t and (t < 16 or t & (t - 1) or t >= cfg.block_t):
        raise RuntimeInputError(
            f"fused_moe_triton: tail_t must be 0 or a power of two from 16 to below block_t ({cfg.block_t}), got {t}.")
    # two-tile blocks' second tiles (tail_t / 4 with 2, else tail_t / 2): tl.dot's at least 16 pairs wide, the
    # warpgroup MMAs' 8 (gluon_wgmma's GEMM1, where asked for)
    for option, dual, least in (("dual", cfg.dual, 16), ("wgmma_dual", cfg.wgmma_dual if cfg.wgmma1 else 0, 8)):
        need = least * (4 if dual == 2 else 2)
        if dual and t and t < need:
            raise RuntimeInputError(f"fused_moe_triton: {option}{' 2' if dual == 2 else ''} needs tail_t of "
                                    f"{need} or more (second tiles of at least {least} pairs), got {t}.")
    for name, a in (("absorb", cfg.absorb), ("absorb2", cfg.absorb2)):
        if a and t and (a < 16 or a & (a - 1) or a > t):
            raise RuntimeInputError(
                f"fused_moe_triton: {name} must be 0 or a power of two from 16 up to tail_t ({t}), got {a}.")
    x = x.contiguous()
    w13, w13_scale, w2, w2_scale = (t.contiguous() for t in (w13, w13_scale, w2, w2_scale))
    acts = dict(ACT=act["ACT"], HAS_LIMIT=act["HAS_LIMIT"], HAS_LINEAR=act["HAS_LINEAR"])
    launch, launch2 = (hopper_launch_options(cfg, x.element_size(), second) for second in (False, True))
    c1, c2, (direct, fused, rows2) = hopper_constants(cfg, T, top_k, H, i_pad, dtype, asm, fact, acts,
                                                      w13_bias is not None, w2_bias is not None, rot)

    def order(grid, on):  # (grid, rows first): row tiles on grid axis 0 where asked and possible
        if on and not fused and grid[0] < 65536:
            return (grid[1], grid[0], grid[2]), True
        return grid, False

    def gemm1(grid, r):
        if wgmma1_runs(cfg, x, w13, w13_scale, i_pad, r.s1, direct, fused, fact, rot) and _compiled_or_none(
                lambda: _wgmma_gemm1(x, w13, w13_scale, w13_bias, act, cfg, r, num_pairs, top_k, i_pad, grid[0], rot),
                required=False):
            return
        grid, rf = order(grid, cfg.rows_first1)
        HK.moe_hgemm1_kernel[grid](
            x, w13, w13_scale, r.b13, r.inter, r.part, r.sorted_ids, r.block_expert, r.num_post_pad,
            r.cnt1, num_pairs, E, top_k, H, i_pad, r.ks1,
            x.stride(0), w13.stride(0), w13_scale.stride(0), r.b13.stride(0), r.inter.stride(0),
            act["p0"], act["p1"], **c1, SPLIT=r.s1 > 1, ROWS_FIRST=rf, **launch,
        )

    def gemm2(grid, r):
        grid, rf = order(grid, cfg.rows_first2)
        HK.moe_hgemm2_kernel[grid](
            r.inter, w2, w2_scale, r.b2, r.tw, r.pair_out, r.sorted_ids, r.block_expert, r.num_post_pad,
            r.ids, r.out, r.cnt2, num_pairs, E, top_k, i_pad, H, r.ks2,
            r.inter.stride(0), w2.stride(0), w2_scale.stride(0), r.b2.stride(0), r.pair_out.stride(1),
            r.pair_out.stride(0), r.out.stride(0),
            **c2, ROWS_FIRST=rf, **launch2,
            **({"launch_pdl": True} if c2["PDL"] else {}),
        )

    return _two_gemms(x, topk_weights, topk_ids, w13_scale, w2_scale, w13_bias, w2_bias, act, cfg, out, gemm1, gemm2,
                      direct=direct, fused=fused, rows2=rows2)
