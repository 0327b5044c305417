"""Triton kernels of the decode path without tensor cores (``moe_gemv1_kernel`` / ``moe_gemv2_kernel``): taken
where each touched expert sees about one pair, on the identity layout.
"""

from __future__ import annotations

import triton
import triton.language as tl

from mxfp4conv.kernels.triton_moe.mma_kernels import _activate


# ---------------------------------------------------------------------------------------------
# Decode path without tensor cores (few pairs per expert block).
#
# A program owns BLOCK_N weight rows of one expert and streams K as int32 words (8 codes each,
# 16-byte vectors per thread), so the tile stays in the plain blocked layout of its load: every
# operation below is elementwise on that layout (no MMA operand layout, no shared-memory
# shuffle). Two codes per 32-bit operation: the codes at nibble i and i + 4 of each word land in
# the two halves as fp16 bits ``e2m1 * 2**-14`` (exact for the subnormal codes too). Each code
# multiplies the activation at its own K index (8q + i for word q: x is read in that order, so
# the natural K order is never rebuilt), the eight products of a word are summed, and the
# word's sum is scaled by its e8m0 block factor; the ``2**14`` is restored once at the end and
# the K axis reduced once.
# ---------------------------------------------------------------------------------------------


@triton.jit
def _rows(v, KT: tl.constexpr):
    """A per-row vector as a column of the word tile ([BLOCK_N, BLOCK_KW], or [BLOCK_KW, BLOCK_N] with KT)."""
    if KT:
        return v[None, :]
    else:
        return v[:, None]


@triton.jit
def _cols(v, KT: tl.constexpr):
    """A per-word-column vector broadcast along the rows of the word tile."""
    if KT:
        return v[:, None]
    else:
        return v[None, :]


@triton.jit
def _fp16_pair(w, I: tl.constexpr):
    """fp16 bits of the codes at nibble I (low half) and I + 4 (high half) of each word."""
    if 4 * I <= 9:
        mag = (w << (9 - 4 * I)) & 0x0E000E00
    else:
        mag = (w >> (4 * I - 9)) & 0x0E000E00  # arithmetic shift: the smeared sign bits are masked off
    return mag | ((w << (12 - 4 * I)) & -0x7FFF8000)  # -0x7FFF8000 == 0x80008000 as int32


@triton.jit
def _halves_f32(r, ASM: tl.constexpr):
    """The two fp16 halves of each int32 as fp32. ASM: one cvt per half straight from the
    register halves (the generic int16 truncation costs extra byte permutes on the GPU; the
    interpreter has no inline assembly)."""
    if ASM:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
            "=r,=r,r", [r], dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        lo = r.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (r >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _load_x8(x_ptrs, xmask):
    """The activations at K indices 8q + i, i = 0..7, for the word columns q, as fp32."""
    x0 = tl.load(x_ptrs + 0, mask=xmask, other=0.0).to(tl.float32)
    x1 = tl.load(x_ptrs + 1, mask=xmask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptrs + 2, mask=xmask, other=0.0).to(tl.float32)
    x3 = tl.load(x_ptrs + 3, mask=xmask, other=0.0).to(tl.float32)
    x4 = tl.load(x_ptrs + 4, mask=xmask, other=0.0).to(tl.float32)
    x5 = tl.load(x_ptrs + 5, mask=xmask, other=0.0).to(tl.float32)
    x6 = tl.load(x_ptrs + 6, mask=xmask, other=0.0).to(tl.float32)
    x7 = tl.load(x_ptrs + 7, mask=xmask, other=0.0).to(tl.float32)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _word_dot(w, x0, x1, x2, x3, x4, x5, x6, x7, ASM: tl.constexpr, KT: tl.constexpr):
    """sum over the 8 codes of each word of decode(code) * x[8q + nibble], fp32, times 2**-14."""
    lo, hi = _halves_f32(_fp16_pair(w, 0), ASM)
    p = lo * _cols(x0, KT) + hi * _cols(x4, KT)
    lo, hi = _halves_f32(_fp16_pair(w, 1), ASM)
    p += lo * _cols(x1, KT)
    p += hi * _cols(x5, KT)
    lo, hi = _halves_f32(_fp16_pair(w, 2), ASM)
    p += lo * _cols(x2, KT)
    p += hi * _cols(x6, KT)
    lo, hi = _halves_f32(_fp16_pair(w, 3), ASM)
    p += lo * _cols(x3, KT)
    p += hi * _cols(x7, KT)
    return p


@triton.jit
def _word_scale(s_u8):
    """e8m0 byte -> 2**(s-127) (0 for s == 0, NaN for 0xFF)."""
    s = s_u8.to(tl.int32)
    return tl.where(s == 255, float("nan"), (s << 23).to(tl.float32, bitcast=True))


@triton.jit
def _slot(sorted_ids_ptr, base, J: tl.constexpr, num_pairs, top_k):
    pair = tl.load(sorted_ids_ptr + base + J)
    tok = tl.where(pair < num_pairs, pair // top_k, 0).to(tl.int64)
    return pair.to(tl.int64), tok


@triton.jit
def _step_mask(offs_q, nmask, kw, kw_hi, KW, EVEN_K: tl.constexpr, KT: tl.constexpr):
    """Load mask of the word tile at word offset kw: rows in range, kw inside this split (the
    prefetch past the last step loads nothing) and, without EVEN_K, words inside K."""
    q = tl.zeros_like(offs_q) + kw < kw_hi
    if not EVEN_K:
        q = q & (offs_q < KW - kw)
    return _rows(nmask, KT) & _cols(q, KT)


@triton.jit
def _valid(pair, offs, num_pairs):
    # a vector mask (the interpreter rejects a scalar comparison broadcast into a load mask)
    return (tl.zeros_like(offs) + pair) < num_pairs


@triton.jit(do_not_specialize=["one"])
def moe_gemv1_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, part_ptr,
    sorted_ids_ptr, block_expert_ptr, num_post_pad_ptr,
    num_pairs, top_k, KW, I_pad, KW_SPLIT,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_ot, one,
    p0, p1,
    ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_LINEAR: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_KW: tl.constexpr, EVEN_K: tl.constexpr,
    SPLIT: tl.constexpr, ASM: tl.constexpr, KT: tl.constexpr,
):
    """GEMM1 of the decode path: inter[pair, j] = act(gate_j . x, up_j . x) for the (at most 4)
    pairs of one expert block; w is int32 words [E, 2*I_pad, KW]. SPLIT as in moe_gemm1_kernel."""
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_T >= tl.load(num_post_pad_ptr):
        return
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if e < 0:
        return
    base = pid_m * BLOCK_T
    offs_q = tl.arange(0, BLOCK_KW)
    pair0, tok0 = _slot(sorted_ids_ptr, base, 0, num_pairs, top_k)
    v0 = _valid(pair0, offs_q, num_pairs)
    if BLOCK_T > 1:
        pair1, tok1 = _slot(sorted_ids_ptr, base, 1, num_pairs, top_k)
        v1 = _valid(pair1, offs_q, num_pairs)
    if BLOCK_T > 2:
        pair2, tok2 = _slot(sorted_ids_ptr, base, 2, num_pairs, top_k)
        v2 = _valid(pair2, offs_q, num_pairs)
        pair3, tok3 = _slot(sorted_ids_ptr, base, 3, num_pairs, top_k)
        v3 = _valid(pair3, offs_q, num_pairs)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < I_pad
    kw_lo = tl.program_id(2) * KW_SPLIT
    # scalar base pointers that advance along K, int32 offsets inside one expert's matrix
    rows = _rows(offs_n, KT)
    w_off = rows * stride_wn + _cols(offs_q * one, KT)
    s_off = rows * stride_sn + _cols(offs_q // 4, KT)
    wg_base = w_ptr + e * stride_we + kw_lo
    wu_base = wg_base + I_pad * stride_wn
    sg_base = s_ptr + e * stride_se + kw_lo // 4
    su_base = sg_base + I_pad * stride_sn
    xq = offs_q * 8
    ag0 = tl.zeros([BLOCK_KW, BLOCK_N] if KT else [BLOCK_N, BLOCK_KW], tl.float32)
    au0 = tl.zeros([BLOCK_KW, BLOCK_N] if KT else [BLOCK_N, BLOCK_KW], tl.float32)
    if BLOCK_T > 1:
        ag1 = tl.zeros([BLOCK_KW, BLOCK_N] if KT else [BLOCK_N, BLOCK_KW], tl.float32)
        au1 = tl.zeros([BLOCK_KW, BLOCK_N] if KT else [BLOCK_N, BLOCK_KW], tl.float32)
    if BLOCK_T > 2:
        ag2 = tl.zeros([BLOCK_KW, BLOCK_N] if KT else [BLOCK_N, BLOCK_KW], tl.float32)
        au2 = tl.zeros([BLOCK_KW, BLOCK_N] if KT else [BLOCK_N, BLOCK_KW], tl.float32)
        ag3 = tl.zeros([BLOCK_KW, BLOCK_N] if KT else [BLOCK_N, BLOCK_KW], tl.float32)
        au3 = tl.zeros([BLOCK_KW, BLOCK_N] if KT else [BLOCK_N, BLOCK_KW], tl.float32)
    kw_hi = tl.minimum(KW, kw_lo + KW_SPLIT)
    # software prefetch: the next step's words and scales are in flight while this step computes
    wm = _step_mask(offs_q, nmask, kw_lo, kw_hi, KW, EVEN_K, KT)
    wg_n = tl.load(wg_base + w_off, mask=wm, other=0)
    wu_n = tl.load(wu_base + w_off, mask=wm, other=0)
    sg_n = tl.load(sg_base + s_off, mask=wm, other=0)
    su_n = tl.load(su_base + s_off, mask=wm, other=0)
    for kw0 in range(kw_lo, kw_hi, BLOCK_KW):
        wg, wu, sg, su = wg_n, wu_n, sg_n, su_n
        wg_base += BLOCK_KW
        wu_base += BLOCK_KW
        sg_base += BLOCK_KW // 4
        su_base += BLOCK_KW // 4
        wm = _step_mask(offs_q, nmask, kw0 + BLOCK_KW, kw_hi, KW, EVEN_K, KT)
        wg_n = tl.load(wg_base + w_off, mask=wm, other=0)
        wu_n = tl.load(wu_base + w_off, mask=wm, other=0)
        sg_n = tl.load(sg_base + s_off, mask=wm, other=0)
        su_n = tl.load(su_base + s_off, mask=wm, other=0)
        qm = offs_q < KW - kw0
        scg = _word_scale(sg)
        scu = _word_scale(su)
        xs = _load_x8(x_ptr + tok0 * stride_xt + kw0 * 8 + xq, qm & v0)
        ag0 += _word_dot(wg, *xs, ASM, KT) * scg
        au0 += _word_dot(wu, *xs, ASM, KT) * scu
        if BLOCK_T > 1:
            xs = _load_x8(x_ptr + tok1 * stride_xt + kw0 * 8 + xq, qm & v1)
            ag1 += _word_dot(wg, *xs, ASM, KT) * scg
            au1 += _word_dot(wu, *xs, ASM, KT) * scu
        if BLOCK_T > 2:
            xs = _load_x8(x_ptr + tok2 * stride_xt + kw0 * 8 + xq, qm & v2)
            ag2 += _word_dot(wg, *xs, ASM, KT) * scg
            au2 += _word_dot(wu, *xs, ASM, KT) * scu
            xs = _load_x8(x_ptr + tok3 * stride_xt + kw0 * 8 + xq, qm & v3)
            ag3 += _word_dot(wg, *xs, ASM, KT) * scg
            au3 += _word_dot(wu, *xs, ASM, KT) * scu
    _gemv1_out(ag0, au0, pair0, v0, e, offs_n, nmask, b_ptr, out_ptr, part_ptr, num_pairs, I_pad, stride_be,
               stride_ot, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, SPLIT, KT)
    if BLOCK_T > 1:
        _gemv1_out(ag1, au1, pair1, v1, e, offs_n, nmask, b_ptr, out_ptr, part_ptr, num_pairs, I_pad, stride_be,
                   stride_ot, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, SPLIT, KT)
    if BLOCK_T > 2:
        _gemv1_out(ag2, au2, pair2, v2, e, offs_n, nmask, b_ptr, out_ptr, part_ptr, num_pairs, I_pad, stride_be,
                   stride_ot, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, SPLIT, KT)
        _gemv1_out(ag3, au3, pair3, v3, e, offs_n, nmask, b_ptr, out_ptr, part_ptr, num_pairs, I_pad, stride_be,
                   stride_ot, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, SPLIT, KT)


@triton.jit
def _gemv1_out(ag, au, pair, valid, e, offs_n, nmask, b_ptr, out_ptr, part_ptr, num_pairs, I_pad, stride_be,
               stride_ot, p0, p1, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_LINEAR: tl.constexpr,
               HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, KT: tl.constexpr):
    g = tl.sum(ag, axis=0 if KT else 1) * 16384.0
    u = tl.sum(au, axis=0 if KT else 1) * 16384.0
    m = nmask & _valid(pair, offs_n, num_pairs)
    if SPLIT:
        row = part_ptr + (tl.program_id(2) * num_pairs + pair) * (2 * I_pad) + offs_n
        tl.store(row, g, mask=m)
        tl.store(row + I_pad, u, mask=m)
    else:
        if HAS_BIAS:
            g += tl.load(b_ptr + e * stride_be + offs_n, mask=nmask, other=0.0).to(tl.float32)
            u += tl.load(b_ptr + e * stride_be + I_pad + offs_n, mask=nmask, other=0.0).to(tl.float32)
        h = _activate(g, u, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR)
        tl.store(out_ptr + pair * stride_ot + offs_n, h.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _gemv2_out(acc, pair, valid, e, offs_n, nmask, b_ptr, tw_ptr, out_ptr, stride_be, stride_ot, stride_os,
               num_pairs, HAS_BIAS: tl.constexpr, KT: tl.constexpr):
    y = tl.sum(acc, axis=0 if KT else 1) * 16384.0
    if HAS_BIAS:
        if tl.program_id(2) == 0:
            y += tl.load(b_ptr + e * stride_be + offs_n, mask=nmask, other=0.0).to(tl.float32)
    valid = _valid(pair, offs_n, num_pairs)
    y = y * tl.load(tw_ptr + pair + tl.zeros_like(offs_n), mask=valid, other=0.0).to(tl.float32)
    out = out_ptr + tl.program_id(2) * stride_os + pair * stride_ot + offs_n
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=nmask & valid)


@triton.jit(do_not_specialize=["one"])
def moe_gemv2_kernel(
    a_ptr, w_ptr, s_ptr, b_ptr, tw_ptr, out_ptr,
    sorted_ids_ptr, block_expert_ptr, num_post_pad_ptr,
    num_pairs, KW, N, KW_SPLIT,
    stride_at, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_ot, stride_os, one,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_KW: tl.constexpr, EVEN_K: tl.constexpr,
    ASM: tl.constexpr, KT: tl.constexpr,
):
    """GEMM2 of the decode path: pair_out[split, pair, n] = w_pair * (w2[e, n] . inter[pair] (+ b2))."""
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_T >= tl.load(num_post_pad_ptr):
        return
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if e < 0:
        return
    base = pid_m * BLOCK_T
    offs_q = tl.arange(0, BLOCK_KW)
    pair0, _t0 = _slot(sorted_ids_ptr, base, 0, num_pairs, 1)
    v0 = _valid(pair0, offs_q, num_pairs)
    if BLOCK_T > 1:
        pair1, _t1 = _slot(sorted_ids_ptr, base, 1, num_pairs, 1)
        v1 = _valid(pair1, offs_q, num_pairs)
    if BLOCK_T > 2:
        pair2, _t2 = _slot(sorted_ids_ptr, base, 2, num_pairs, 1)
        v2 = _valid(pair2, offs_q, num_pairs)
        pair3, _t3 = _slot(sorted_ids_ptr, base, 3, num_pairs, 1)
        v3 = _valid(pair3, offs_q, num_pairs)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    kw_lo = tl.program_id(2) * KW_SPLIT
    rows = _rows(offs_n, KT)
    w_off = rows * stride_wn + _cols(offs_q * one, KT)
    s_off = rows * stride_sn + _cols(offs_q // 4, KT)
    w_base = w_ptr + e * stride_we + kw_lo
    s_base = s_ptr + e * stride_se + kw_lo // 4
    aq = offs_q * 8
    acc0 = tl.zeros([BLOCK_KW, BLOCK_N] if KT else [BLOCK_N, BLOCK_KW], tl.float32)
    if BLOCK_T > 1:
        acc1 = tl.zeros([BLOCK_KW, BLOCK_N] if KT else [BLOCK_N, BLOCK_KW], tl.float32)
    if BLOCK_T > 2:
        acc2 = tl.zeros([BLOCK_KW, BLOCK_N] if KT else [BLOCK_N, BLOCK_KW], tl.float32)
        acc3 = tl.zeros([BLOCK_KW, BLOCK_N] if KT else [BLOCK_N, BLOCK_KW], tl.float32)
    kw_hi = tl.minimum(KW, kw_lo + KW_SPLIT)
    wm = _step_mask(offs_q, nmask, kw_lo, kw_hi, KW, EVEN_K, KT)
    w_n = tl.load(w_base + w_off, mask=wm, other=0)
    s_n = tl.load(s_base + s_off, mask=wm, other=0)
    for kw0 in range(kw_lo, kw_hi, BLOCK_KW):
        w, s8 = w_n, s_n
        w_base += BLOCK_KW
        s_base += BLOCK_KW // 4
        wm = _step_mask(offs_q, nmask, kw0 + BLOCK_KW, kw_hi, KW, EVEN_K, KT)
        w_n = tl.load(w_base + w_off, mask=wm, other=0)
        s_n = tl.load(s_base + s_off, mask=wm, other=0)
        qm = offs_q < KW - kw0
        sc = _word_scale(s8)
        acc0 += _word_dot(w, *_load_x8(a_ptr + pair0 * stride_at + kw0 * 8 + aq, qm & v0), ASM, KT) * sc
        if BLOCK_T > 1:
            acc1 += _word_dot(w, *_load_x8(a_ptr + pair1 * stride_at + kw0 * 8 + aq, qm & v1), ASM, KT) * sc
        if BLOCK_T > 2:
            acc2 += _word_dot(w, *_load_x8(a_ptr + pair2 * stride_at + kw0 * 8 + aq, qm & v2), ASM, KT) * sc
            acc3 += _word_dot(w, *_load_x8(a_ptr + pair3 * stride_at + kw0 * 8 + aq, qm & v3), ASM, KT) * sc
    _gemv2_out(acc0, pair0, v0, e, offs_n, nmask, b_ptr, tw_ptr, out_ptr, stride_be, stride_ot, stride_os, num_pairs, HAS_BIAS, KT)
    if BLOCK_T > 1:
        _gemv2_out(acc1, pair1, v1, e, offs_n, nmask, b_ptr, tw_ptr, out_ptr, stride_be, stride_ot, stride_os, num_pairs, HAS_BIAS, KT)
    if BLOCK_T > 2:
        _gemv2_out(acc2, pair2, v2, e, offs_n, nmask, b_ptr, tw_ptr, out_ptr, stride_be, stride_ot, stride_os, num_pairs, HAS_BIAS, KT)
        _gemv2_out(acc3, pair3, v3, e, offs_n, nmask, b_ptr, tw_ptr, out_ptr, stride_be, stride_ot, stride_os, num_pairs, HAS_BIAS, KT)
