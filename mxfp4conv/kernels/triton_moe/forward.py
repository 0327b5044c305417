"""``fused_moe_triton``: the entry point. It picks the path (the Gluon kernels, the hopper_mma kernels, the
decode path without tensor cores or the identity-layout MMA kernels) and runs the identity-layout ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton

from mxfp4conv.errors import RuntimeInputError
from mxfp4conv.kernels.triton_moe import gemv_kernels as GK
from mxfp4conv.kernels.triton_moe import hopper_kernels as HK
from mxfp4conv.kernels.triton_moe import mma_kernels as K
from mxfp4conv.kernels.triton_moe.config import MoEConfig
from mxfp4conv.kernels.triton_moe.gluon_choice import (device_sms, gluon_plan, gluon_rows2, grouped_plan, loop_tuning,
                                                     sum2_by_kernel)
from mxfp4conv.kernels.triton_moe.gluon_forward import _gluon_forward, _gluon_grouped_forward
from mxfp4conv.kernels.triton_moe.hopper_forward import _hopper_forward
from mxfp4conv.kernels.triton_moe.launch import (_TL_DTYPES, _act_launch, _activation_args, _check_inputs,
                                                 _launch_options, _sum_launch, _two_gemms, moe_align)
from mxfp4conv.kernels.triton_moe.layouts import HOPPER_ORDERS, HOPPER_SETS
from mxfp4conv.kernels.triton_moe.tiles import _gemv_block_k, _gemv_block_t, _splits, select_config, uses_gemv


def fused_moe_triton(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, *, activation,
                     activation_params, w13_bias=None, w2_bias=None, layout="identity",
                     config: MoEConfig | None = None) -> torch.Tensor:
    """sum_k topk_weights[:, k] * expert_k(x) with MXFP4 weights stored in ``layout``.

    x [T, H_pad] bf16/fp16/fp32 (zero-padded); w13 uint8 [E, 2*I_pad, H_pad/2] rows
    [gate | up]; w13_scale [E, 2*I_pad, H_pad/32]; w2 [E, H_pad, I_pad/2]; w2_scale
    [E, H_pad, I_pad/32]; topk_ids [T, k] local expert ids, -1 = not on this rank.
    ``layout``: "identity" (those canonical bytes), "hopper_mma_xor" (weights in hopper_mma_w_xor, an
    8-instruction decode, scales in hopper_mma_s, same shapes; H_pad and I_pad multiples of 64: what convert
    writes), "hopper_mma_rot" (weights in hopper_mma_w_rot, a 9-instruction decode) or "hopper_mma" (weights in
    hopper_mma_w): the same words in other bit orders, read so that checkpoints earlier releases converted still run.
    Returns [T, H_pad] in x's dtype.
    """
    T, H, E, i_pad = _check_inputs(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids,
                                   w13_bias, w2_bias, layout)
    act = _activation_args(activation, activation_params)
    num_pairs = T * topk_ids.shape[1]
    out = torch.empty_like(x)
    if num_pairs == 0:
        return out.zero_()
    cfg = config or select_config(num_pairs, E, H, i_pad, layout)
    call = _Call(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, act, cfg, out, layout)
    for _, plan_of, run in HOPPER_PATHS if layout in HOPPER_SETS else IDENTITY_PATHS:
        plan = plan_of(call)
        if plan is not None and (done := run(call, plan)) is not None:
            return done
    raise AssertionError("the last path of each table takes every call")  # pragma: no cover


@dataclass(frozen=True)
class _Call:
    """One call's operands, activation arguments, configuration and output, as the paths take them."""

    x: torch.Tensor
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    w13_bias: torch.Tensor | None
    w2_bias: torch.Tensor | None
    act: dict
    cfg: MoEConfig
    out: torch.Tensor
    layout: str

    @property
    def tensors(self) -> tuple:
        return (self.x, self.w13, self.w13_scale, self.w2, self.w2_scale, self.topk_weights, self.topk_ids,
                self.w13_bias, self.w2_bias)

    @property
    def weights(self) -> tuple:
        return self.w13, self.w13_scale, self.w2, self.w2_scale


def _pairs_run(c: _Call, plan):
    H, i_pad, num_pairs = c.x.shape[1], c.w13.shape[1] // 2, c.topk_ids.numel()
    cfg, order = c.cfg, HOPPER_ORDERS[c.layout]
    rows2 = gluon_rows2(cfg, H, i_pad, plan[1])
    return _gluon_forward(*c.tensors, c.act, c.out, plan, cfg.gluon == 1, sum2_by_kernel(cfg, i_pad, plan), rows2,
                          loop_tuning(cfg, False, plan[0], rows2, i_pad // 64 * num_pairs * plan[2],
                                      device_sms(c.x.device), order),
                          cfg.gluon_counters == 1, order=order)


def _grouped_run(c: _Call, plan):
    return _gluon_grouped_forward(*c.tensors, c.act, c.out, c.cfg, plan, HOPPER_ORDERS[c.layout])


def _hopper_run(c: _Call, _plan):
    return _hopper_forward(*c.tensors, c.act, c.cfg, c.out, rot=HK.ORDER_IDS[HOPPER_ORDERS[c.layout]])


def _gemv_plan(c: _Call):
    """The weights as int32 words where the decode path without tensor cores takes the call (uses_gemv), else None
    (also where their storage is not 4-byte aligned: the MMA path's byte decode reads it as is)."""
    if not uses_gemv(c.cfg, c.topk_ids.numel(), c.w13.shape[0]):
        return None
    try:
        return c.w13.view(torch.int32), c.w2.view(torch.int32)
    except RuntimeError:
        return None


def _gemv_run(c: _Call, words):
    return _gemv_forward(c.x, words[0], c.w13_scale, words[1], c.w2_scale, c.topk_weights, c.topk_ids, c.w13_bias,
                         c.w2_bias, c.act, c.cfg, c.out)


def _mma_run(c: _Call, _plan):
    return _mma_forward(*c.tensors, c.act, c.cfg, c.out)


# The paths a call may take, asked in order: the first whose plan takes the call runs it. A Gluon path whose kernels
# fail to compile here gives None, and the next path runs the call; the last of each table takes every call. Which
# calls each path takes (and why) is in gluon_choice (pairs_take, grouped_takes), tiles (uses_gemv) and
# docs/performance.md ("What runs").
HOPPER_PATHS = (  # the hopper_mma layouts
    ("gluon per pair", lambda c: gluon_plan(c.cfg, c.x, c.weights, c.topk_ids.shape[1], c.layout), _pairs_run),
    ("gluon expert blocks",
     lambda c: grouped_plan(c.cfg, c.x, c.weights, c.topk_ids.shape[1], c.layout, c.w13.shape[0]), _grouped_run),
    ("hopper_mma", lambda c: True, _hopper_run),
)
IDENTITY_PATHS = (  # the canonical bytes
    ("decode without tensor cores", _gemv_plan, _gemv_run),
    ("mma", lambda c: True, _mma_run),
)


def _mma_forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, act, cfg, out):
    """The tensor-core path over the identity layout (moe_gemm1/2_kernel)."""
    T, H = x.shape
    i_pad = w13.shape[1] // 2
    top_k = topk_ids.shape[1]
    num_pairs = T * top_k
    dtype = getattr(triton.language, _TL_DTYPES[x.dtype])
    if cfg.mode not in (0, 1):
        raise RuntimeInputError(f"fused_moe_triton: mode must be 0 (byte decode) or 1 (word decode), got {cfg.mode}.")
    # the word decode builds bf16 bits: fp16 and fp32 x take the byte decode
    mma = dict(MODE=cfg.mode if x.dtype == torch.bfloat16 else 0)
    if mma["MODE"] == 1:  # the kernels read the packed codes as int32 words (8 codes each)
        try:
            w13, w2 = w13.view(torch.int32), w2.view(torch.int32)
        except RuntimeError:  # storage not 4-byte aligned: the byte decode reads it as is
            mma["MODE"] = 0
    x = x.contiguous()
    w13, w13_scale, w2, w2_scale = (t if t.stride(-1) == 1 else t.contiguous() for t in (w13, w13_scale, w2, w2_scale))
    acts = dict(ACT=act["ACT"], HAS_LIMIT=act["HAS_LIMIT"], HAS_LINEAR=act["HAS_LINEAR"])
    launch = _launch_options(cfg)

    def gemm1(grid, r):
        K.moe_gemm1_kernel[grid](
            x, w13, w13_scale, r.b13, r.inter, r.part, r.sorted_ids, r.block_expert, r.num_post_pad,
            num_pairs, top_k, H, i_pad, r.ks1,
            x.stride(0), w13.stride(0), w13.stride(1), w13_scale.stride(0), w13_scale.stride(1),
            r.b13.stride(0), r.inter.stride(0),
            act["p0"], act["p1"], **acts, HAS_BIAS=w13_bias is not None,
            BLOCK_N=cfg.block_n1, BLOCK_T=cfg.block_t, BLOCK_K=cfg.block_k, DTYPE=dtype, **mma, SPLIT=r.s1 > 1,
            **launch,
        )

    def gemm2(grid, r):
        K.moe_gemm2_kernel[grid](
            r.inter, w2, w2_scale, r.b2, r.tw, r.pair_out, r.sorted_ids, r.block_expert, r.num_post_pad,
            num_pairs, i_pad, H, r.ks2,
            r.inter.stride(0), w2.stride(0), w2.stride(1), w2_scale.stride(0), w2_scale.stride(1),
            r.b2.stride(0), r.pair_out.stride(1), r.pair_out.stride(0),
            HAS_BIAS=w2_bias is not None,
            BLOCK_N=cfg.block_n2, BLOCK_T=cfg.block_t, BLOCK_K=cfg.block_k, DTYPE=dtype, **mma,
            **launch,
        )

    return _two_gemms(x, topk_weights, topk_ids, w13_scale, w2_scale, w13_bias, w2_bias, act, cfg, out, gemm1, gemm2)


# The word tile's loads carry no contiguity information (see mma_kernels), and Triton's
# layout choice for such a tile differs by version: 3.6 puts a warp's threads along the tile's
# first axis, 3.9 along its last (read from the compiled layouts). Threads must run along K
# (one 128-byte row segment per warp), so the tile puts K first on older versions.
_KMAJOR_AUTO = tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 9)


def _gemv_forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, act, cfg, out):
    """The decode path without tensor cores (moe_gemv1/2_kernel); w13 / w2 as int32 words."""
    T, H = x.shape
    E, two_i, _ = w13.shape
    i_pad = two_i // 2
    top_k = topk_ids.shape[1]
    num_pairs = T * top_k
    bt = _gemv_block_t(cfg, num_pairs / max(1, min(E, num_pairs)))
    x = x.contiguous()
    w13, w13_scale, w2, w2_scale = (t if t.stride(-1) == 1 else t.contiguous() for t in (w13, w13_scale, w2, w2_scale))
    ids = topk_ids.contiguous()
    tw = topk_weights.reshape(-1).contiguous()
    sorted_ids, block_expert, num_post_pad, max_blocks = moe_align(ids, E, bt, cfg.align)
    blocks_est = min(num_pairs, num_pairs // bt + min(E, num_pairs))
    bk1 = _gemv_block_k(cfg.gemv_block_k, H)
    bk2 = _gemv_block_k(cfg.gemv_block_k, i_pad)
    s1, ks1 = _splits(cfg.split_k1, blocks_est * triton.cdiv(i_pad, cfg.gemv_block_n1), H, bk1)
    s2, ks2 = _splits(cfg.split_k2, blocks_est * triton.cdiv(H, cfg.gemv_block_n2), i_pad, bk2)
    acts = dict(ACT=act["ACT"], HAS_LIMIT=act["HAS_LIMIT"], HAS_LINEAR=act["HAS_LINEAR"])
    launch = dict(num_warps=cfg.gemv_num_warps, num_stages=cfg.num_stages)
    kt = _KMAJOR_AUTO if cfg.gemv_kmajor < 0 else bool(cfg.gemv_kmajor)
    asm = cfg.gemv_asm and x.is_cuda and torch.version.cuda is not None and os.environ.get("TRITON_INTERPRET") != "1"

    inter = torch.empty(num_pairs, i_pad, dtype=x.dtype, device=x.device)
    part = torch.empty(s1, num_pairs, 2 * i_pad, dtype=torch.float32, device=x.device) if s1 > 1 else inter
    b13 = w13_bias.contiguous() if w13_bias is not None else w13_scale  # dummy pointer when absent
    GK.moe_gemv1_kernel[(max_blocks, triton.cdiv(i_pad, cfg.gemv_block_n1), s1)](
        x, w13, w13_scale, b13, inter, part, sorted_ids, block_expert, num_post_pad,
        num_pairs, top_k, H // 8, i_pad, ks1 // 8,
        x.stride(0), w13.stride(0), w13.stride(1), w13_scale.stride(0), w13_scale.stride(1),
        b13.stride(0), inter.stride(0), 1,
        act["p0"], act["p1"], **acts, HAS_BIAS=w13_bias is not None,
        BLOCK_N=cfg.gemv_block_n1, BLOCK_T=bt, BLOCK_KW=bk1 // 8, EVEN_K=H % bk1 == 0, SPLIT=s1 > 1, ASM=asm, KT=kt,
        **launch,
    )
    if s1 > 1:
        _act_launch(part, ids, b13, inter, num_pairs, i_pad, E, s1, act, acts, w13_bias is not None)
    pair_out = torch.empty(s2, num_pairs, H, dtype=x.dtype if s2 == 1 else torch.float32, device=x.device)
    b2 = w2_bias.contiguous() if w2_bias is not None else w2_scale
    GK.moe_gemv2_kernel[(max_blocks, triton.cdiv(H, cfg.gemv_block_n2), s2)](
        inter, w2, w2_scale, b2, tw, pair_out, sorted_ids, block_expert, num_post_pad,
        num_pairs, i_pad // 8, H, ks2 // 8,
        inter.stride(0), w2.stride(0), w2.stride(1), w2_scale.stride(0), w2_scale.stride(1),
        b2.stride(0), pair_out.stride(1), pair_out.stride(0), 1,
        HAS_BIAS=w2_bias is not None,
        BLOCK_N=cfg.gemv_block_n2, BLOCK_T=bt, BLOCK_KW=bk2 // 8, EVEN_K=i_pad % bk2 == 0, ASM=asm, KT=kt,
        **launch,
    )
    _sum_launch(pair_out, ids, out, H, top_k, E, s2)
    return out
