"""What every path does around its GEMM kernels: input checks, activation arguments, launch options, the
align into expert blocks, the activation over GEMM1's K-split partials and the deterministic sum over k.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import torch
import triton

from mxfp4conv.errors import RuntimeInputError
from mxfp4conv.format.activations import activation_params
from mxfp4conv.kernels.triton_moe import mma_kernels as K
from mxfp4conv.kernels.triton_moe.config import MoEConfig
from mxfp4conv.kernels.triton_moe.layouts import HOPPER_SETS, LAYOUT_SETS
from mxfp4conv.kernels.triton_moe.tiles import gemm_splits


_ACT_IDS = {"silu": K.ACT_SILU, "situ": K.ACT_SITU, "swigluoai": K.ACT_SWIGLUOAI}


_TL_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _activation_args(name: str, params: Mapping[str, float] | None) -> dict:
    if name not in _ACT_IDS:
        raise RuntimeInputError(
            f"The Triton MoE kernel does not support the activation {name!r}; it supports "
            f"{', '.join(sorted(_ACT_IDS))}. Use backend='torch' or a supported activation."
        )
    p = activation_params(name, params)
    args = dict(ACT=_ACT_IDS[name], HAS_LIMIT=False, HAS_LINEAR=False, p0=1.0, p1=1.0)
    if name == "situ":
        lin = p["linear_beta"]
        args.update(p0=p["beta"], p1=lin if lin is not None else 1.0, HAS_LINEAR=lin is not None and lin > 0)
    elif name == "silu":
        limit = p["swiglu_limit"]
        args.update(p1=limit if limit is not None else 1.0, HAS_LIMIT=limit is not None)
    else:
        args.update(p0=p["alpha"], p1=p["limit"])
    return args


def _check_inputs(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, layout):
    def bad(msg: str):
        raise RuntimeInputError(f"fused_moe_triton: {msg}")

    if layout not in LAYOUT_SETS:
        bad(f"layout {layout!r} is not readable by the Triton kernel (readable: {', '.join(LAYOUT_SETS)}); "
            "convert the weights to the canonical layout first (the loader does this with the layout's inverse).")
    if x.dim() != 2 or x.dtype not in _TL_DTYPES:
        bad(f"x must be a 2-D bf16/fp16/fp32 tensor [T, H_pad], got {tuple(x.shape)} {x.dtype}.")
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    if not interp and not x.is_cuda:
        bad(f"x is on {x.device}; the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1).")
    for name, t in (("w13", w13), ("w13_scale", w13_scale), ("w2", w2), ("w2_scale", w2_scale)):
        if t.dtype != torch.uint8 or t.dim() != 3:
            bad(f"{name} must be a 3-D uint8 tensor (raw MXFP4 bytes), got {tuple(t.shape)} {t.dtype}.")
        if t.device != x.device:
            bad(f"{name} is on {t.device} but x is on {x.device}.")
    T, H = x.shape
    E, two_i, hb = w13.shape
    if two_i % 2 or hb * 2 != H:
        bad(f"w13 {tuple(w13.shape)} does not match x {tuple(x.shape)}: expected [E, 2*I_pad, H_pad/2] "
            f"with H_pad = {H}.")
    i_pad = two_i // 2
    if H % 32 or i_pad % 32:
        bad(f"H_pad ({H}) and I_pad ({i_pad}) must be multiples of 32 (one e8m0 scale per 32 weights).")
    if layout in HOPPER_SETS and (H % 64 or i_pad % 64):
        bad(f"the hopper_mma layout needs H_pad ({H}) and I_pad ({i_pad}) to be multiples of 64.")
    if tuple(w13_scale.shape) != (E, two_i, H // 32):
        bad(f"w13_scale {tuple(w13_scale.shape)} must be {(E, two_i, H // 32)}.")
    if tuple(w2.shape) != (E, H, i_pad // 2):
        bad(f"w2 {tuple(w2.shape)} must be {(E, H, i_pad // 2)} for w13 {tuple(w13.shape)}.")
    if tuple(w2_scale.shape) != (E, H, i_pad // 32):
        bad(f"w2_scale {tuple(w2_scale.shape)} must be {(E, H, i_pad // 32)}.")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T or topk_ids.dtype not in (torch.int32, torch.int64):
        bad(f"topk_ids must be int32/int64 [T={T}, k], got {tuple(topk_ids.shape)} {topk_ids.dtype}.")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape) or not topk_weights.is_floating_point():
        bad(f"topk_weights must be a float tensor shaped like topk_ids {tuple(topk_ids.shape)}, "
            f"got {tuple(topk_weights.shape)} {topk_weights.dtype}.")
    for name, t, shape in (("w13_bias", w13_bias, (E, two_i)), ("w2_bias", w2_bias, (E, H))):
        if t is not None and (tuple(t.shape) != shape or not t.is_floating_point()):
            bad(f"{name} must be a float tensor {shape}, got {tuple(t.shape)} {t.dtype}.")
    return T, H, E, i_pad


def _contiguous(*tensors):
    """Each tensor contiguous (None stays None)."""
    return [t.contiguous() if t is not None else None for t in tensors]


def _big_scales(*scales: torch.Tensor) -> bool:
    """Whether any e8m0 byte exceeds 128 (a scale above 2: the one-multiply decode of the Hopper
    kernels would overflow). Remembered on the tensor with its version counter, so repeated calls
    (and CUDA graph capture after a first call) cost nothing and in-place changes are seen."""
    big = False
    for t in scales:
        memo = getattr(t, "_mxfp4conv_big_scale", None)
        if memo is None or memo[0] != t._version:
            memo = (t._version, bool(t.numel()) and int(t.view(torch.uint8).max()) > 128)
            t._mxfp4conv_big_scale = memo
        big = big or memo[1]
    return big


def _launch_options(cfg: MoEConfig, second: bool = False) -> dict:
    """Launch options of GEMM1 (or, ``second``, GEMM2: num_warps2 / maxnreg2 where set)."""
    warps = cfg.num_warps2 if second and cfg.num_warps2 else cfg.num_warps
    maxnreg = cfg.maxnreg2 if second and cfg.maxnreg2 >= 0 else cfg.maxnreg
    stages = cfg.num_stages2 if second and cfg.num_stages2 else cfg.num_stages
    launch = dict(num_warps=warps, num_stages=stages)
    if maxnreg and os.environ.get("TRITON_INTERPRET") != "1":
        launch["maxnreg"] = maxnreg
    return launch


def hopper_launch_options(cfg: MoEConfig, x_bytes: int, second: bool = False) -> dict:
    """``_launch_options`` of moe_hgemm1_kernel (or, ``second``, moe_hgemm2_kernel) for x of ``x_bytes`` an element:
    fp32 x on blocks of 128 pairs or more two stages deep, not three. Three stages of fp32 [128, block_k] tiles take
    232-280 KiB of shared memory at select_config's prefill tiles, past the 227 KiB an sm_90 program may have (Triton
    refuses the launch); two take 148-180 KiB (tests/test_hopper_shared_memory.py)."""
    launch = _launch_options(cfg, second)
    if x_bytes >= 4 and cfg.block_t >= 128:
        launch["num_stages"] = min(launch["num_stages"], 2)
    return launch


def _act_launch(part, ids, b13, inter, num_pairs, i_pad, E, splits, act, acts, has_bias):
    """Sum GEMM1's K-split partials and apply the activation; tiles of at most 4096 elements."""
    sp2 = triton.next_power_of_2(splits)
    block = min(triton.next_power_of_2(i_pad), max(128, 4096 // sp2))
    K.moe_act_kernel[(num_pairs, triton.cdiv(i_pad, block))](
        part, ids, b13, inter, num_pairs, i_pad, E, splits, b13.stride(0), inter.stride(0),
        act["p0"], act["p1"], **acts, HAS_BIAS=has_bias, BLOCK=block, S_POW2=sp2, num_warps=4,
    )


def _sum_launch(pair_out, ids, out, H, top_k, E, splits, pdl=False):
    """Deterministic sum over k (and GEMM2's K splits): one program per (token, 1024 columns),
    8 columns per thread (one 16-byte load of each k row). pdl: a programmatic dependent of the kernel
    before it (which must release it: gdc_launch_dependents)."""
    k2 = triton.next_power_of_2(top_k)
    block_h = min(triton.next_power_of_2(H), 1024)
    K.moe_sum_kernel[(out.shape[0], triton.cdiv(H, block_h))](
        pair_out, ids, out, H, top_k, E, splits, pair_out.stride(0), pair_out.stride(1), out.stride(0),
        BLOCK_H=block_h, K_POW2=k2, PDL=pdl, num_warps=max(1, min(4, block_h // 256)),
        **({"launch_pdl": True} if pdl else {}),
    )


# from this many (token, k) pairs on, the align runs over many programs (a memset and two
# launches) instead of one: the single program costs about 3.4 ns a pair on an H200 (223 us for
# 65536 pairs, 13.0 us for 3584; the many-program align 6.5 us for 4096); the layer with it,
# against one program, K3-like 2048 / 2560 / 3072 / 3584 / 4080 pairs 1.000 / 0.995 / 0.993 /
# 0.992 / 0.986 (benchmarks/results/performance-notebook.md)
ALIGN_GRID_PAIRS = 2048


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_t: int, grid: int = -1, release: bool = False):
    """(sorted_ids, block_expert, num_post_pad) for the GEMM kernels; ids < 0 are skipped.
    ``grid``: 1 many programs, 0 one program, -1 by ALIGN_GRID_PAIRS. ``release``: its last kernel lets a
    programmatic dependent launched after it start early (which must wait for it: gdc_wait)."""
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    num_pairs = ids.numel()
    max_blocks = num_pairs // block_t + min(num_experts, num_pairs) + 1
    dev = ids.device
    sorted_ids = torch.empty(max_blocks * block_t, dtype=torch.int32, device=dev)
    block_expert = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    e2 = triton.next_power_of_2(num_experts)
    if grid == 1 or (grid < 0 and num_pairs >= ALIGN_GRID_PAIRS):
        scratch = torch.zeros(2 * num_experts + 2, dtype=torch.int32, device=dev)  # counts, arrivals | cursors, end
        counts, arrive = scratch[:num_experts], scratch[num_experts:num_experts + 1]
        cursor, num_post_pad = scratch[num_experts + 1:2 * num_experts + 1], scratch[2 * num_experts + 1:]
        chunk = 1024
        fill = max_blocks * block_t
        K.moe_align_count_kernel[(triton.cdiv(max(fill, num_pairs), chunk),)](
            ids, sorted_ids, block_expert, num_post_pad, counts, cursor, arrive, num_pairs, num_experts, max_blocks,
            fill, BLOCK_T=block_t, CHUNK=chunk, E_POW2=e2, num_warps=4,
        )
        K.moe_align_scatter_kernel[(triton.cdiv(num_pairs, chunk),)](
            ids, sorted_ids, cursor, num_pairs, num_experts, CHUNK=chunk, RELEASE=release, num_warps=4)
        return sorted_ids, block_expert, num_post_pad, max_blocks
    scratch = torch.empty(2 * num_experts + 1, dtype=torch.int32, device=dev)
    num_post_pad = scratch[2 * num_experts:]
    K.moe_align_kernel[(1,)](
        ids, sorted_ids, block_expert, num_post_pad, scratch[:num_experts], scratch[num_experts:2 * num_experts],
        num_pairs, num_experts, max_blocks,
        BLOCK_T=block_t, CHUNK=1024, E_POW2=e2, RELEASE=release, num_warps=8,
    )
    return sorted_ids, block_expert, num_post_pad, max_blocks


@dataclass
class _Run:
    """Buffers and split sizes of one fused call, shared by its launches."""

    sorted_ids: torch.Tensor
    block_expert: torch.Tensor
    num_post_pad: torch.Tensor
    tw: torch.Tensor
    s1: int
    ks1: int
    s2: int
    ks2: int
    inter: torch.Tensor
    part: torch.Tensor
    b13: torch.Tensor
    b2: torch.Tensor | None = None
    pair_out: torch.Tensor | None = None
    ids: torch.Tensor | None = None  # topk_ids, contiguous
    cnt1: torch.Tensor | None = None  # arrival counters of the fused reductions (zeroed)
    cnt2: torch.Tensor | None = None
    out: torch.Tensor | None = None  # the call's result (GEMM2 writes it when fused)


def _two_gemms(x, topk_weights, topk_ids, w13_scale, w2_scale, w13_bias, w2_bias, act, cfg, out, gemm1, gemm2,
               direct=False, fused=False, rows2=1):
    """What both tensor-core paths do around their two GEMM kernels: align the pairs into expert
    blocks, size the K splits, GEMM1 (then the activation over its K-split partials), GEMM2 and
    the deterministic sum over k. ``gemm1(grid, run)`` / ``gemm2(grid, run)`` launch the kernels.
    ``direct``: one block per pair, no align (the kernels read topk_ids); ``fused``: the GEMMs do
    the activation over split-K partials and the sum over k themselves (arrival counters); ``rows2``:
    GEMM2 row tiles per program."""
    T, H = x.shape
    E, i_pad = w13_scale.shape[0], w13_scale.shape[1] // 2
    top_k = topk_ids.shape[1]
    num_pairs = T * top_k
    ids = topk_ids.contiguous()
    if direct:
        sorted_ids = block_expert = num_post_pad = ids
        max_blocks = num_pairs
    else:
        sorted_ids, block_expert, num_post_pad, max_blocks = moe_align(ids, E, cfg.block_t, cfg.align)
    n1, n2 = triton.cdiv(i_pad, cfg.block_n1), triton.cdiv(H, cfg.block_n2)
    g2 = triton.cdiv(n2, rows2)
    (s1, ks1), (s2, ks2) = gemm_splits(cfg, num_pairs, E, H, i_pad, direct, rows2)
    inter = torch.empty(num_pairs, i_pad, dtype=x.dtype, device=x.device)
    run = _Run(
        sorted_ids, block_expert, num_post_pad, topk_weights.reshape(-1).contiguous(), s1, ks1, s2, ks2, inter,
        part=torch.empty(s1, num_pairs, 2 * i_pad, dtype=torch.float32, device=x.device) if s1 > 1 else inter,
        b13=w13_bias.contiguous() if w13_bias is not None else w13_scale,  # dummy pointer when absent
        ids=ids,
    )
    if fused:
        # one memset: the output (rows of tokens with no local expert stay 0) and both counter sets
        n_out = out.numel() * out.element_size() // 4
        buf = torch.zeros(n_out + max_blocks * n1 + T * n2, dtype=torch.int32, device=x.device)
        out = buf[:n_out].view(out.dtype).view(out.shape)
        run.cnt1, run.cnt2 = buf[n_out:n_out + max_blocks * n1], buf[n_out + max_blocks * n1:]
    else:
        run.cnt1 = run.cnt2 = sorted_ids  # dummy pointers
    gemm1((max_blocks, n1, s1), run)
    acts = dict(ACT=act["ACT"], HAS_LIMIT=act["HAS_LIMIT"], HAS_LINEAR=act["HAS_LINEAR"])
    if s1 > 1 and not fused:
        _act_launch(run.part, ids, run.b13, inter, num_pairs, i_pad, E, s1, act, acts, w13_bias is not None)
    run.pair_out = torch.empty(s2, num_pairs, H, dtype=x.dtype if s2 == 1 else torch.float32, device=x.device)
    run.b2 = w2_bias.contiguous() if w2_bias is not None else w2_scale
    run.out = out
    gemm2((max_blocks, g2, s2), run)
    if not fused:
        _sum_launch(run.pair_out, ids, out, H, top_k, E, s2)
    return out
