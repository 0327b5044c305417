"""Triton kernels of the fused MXFP4 MoE (W4A16): align, GEMM1 + activation, GEMM2, top-k sum.

Both GEMMs are "swap-AB": the weight tile is the left MMA operand (output features on the MMA
M dimension) and the tokens of one expert block are the N dimension, so decode batches of one
to a few tokens per expert still feed full MMA tiles from the weights. Weights stay MXFP4 in
memory; each K step loads packed bytes and e8m0 scales and decodes them in registers.

fp4 decode: the 3 magnitude bits of an e2m1 code placed at bits 9..11 of an fp16 give
``2**(e-15) * (1 + m/2)`` (or the subnormal ``m * 2**-15`` when e == 0), i.e. the e2m1 value
times ``2**-14`` in every case; the sign bit goes to bit 15. The ``2**14`` is folded into the
e8m0 scale, so one multiply per weight finishes the decode (MODE 0). MODE 1 reads int32 words
and decodes two codes per integer operation straight into bf16 bits (``_dequant_words``).
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # programmatic dependent launch (griddepcontrol, sm_90); absent from older Triton builds
    from triton.language.extra.cuda import gdc_launch_dependents as _gdc_launch, gdc_wait as _gdc_wait
    HAS_GDC = True
except ImportError:  # pragma: no cover - depends on the Triton build
    HAS_GDC = False

    @triton.jit
    def _gdc_wait():
        pass

    @triton.jit
    def _gdc_launch():
        pass

ACT_SILU = 0
ACT_SITU = 1
ACT_SWIGLUOAI = 2


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _tanh(x):
    # exp overflow to inf gives exactly +-1 at the tails
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _activate(g, u, p0, p1, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_LINEAR: tl.constexpr):
    if ACT == 1:  # situ: p0 = beta, p1 = linear_beta
        h = p0 * _tanh(g / p0) * _sigmoid(g)
        if HAS_LINEAR:
            u = p1 * _tanh(u / p1)
        h = h * u
    elif ACT == 2:  # swigluoai: p0 = alpha, p1 = limit
        g = tl.minimum(g, p1)
        u = tl.minimum(tl.maximum(u, -p1), p1)
        h = (u + 1.0) * g * _sigmoid(p0 * g)
    else:  # silu, p1 = swiglu_limit when HAS_LIMIT
        if HAS_LIMIT:
            g = tl.minimum(g, p1)
            u = tl.minimum(tl.maximum(u, -p1), p1)
        h = g * _sigmoid(g) * u
    return h


@triton.jit
def _dequant(w_u8, s_u8, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr):
    """[BLOCK_N, BLOCK_K//2] packed e2m1 + [BLOCK_N, BLOCK_K//32] e8m0 -> [BLOCK_N, BLOCK_K] DTYPE."""
    w = w_u8.to(tl.int16)
    lo = ((w & 0x7) << 9) | ((w & 0x8) << 12)
    hi = ((w & 0x70) << 5) | ((w & 0x80) << 8)
    v = tl.join(lo, hi).reshape(BLOCK_N, BLOCK_K // 32, 32)
    v = v.to(tl.float16, bitcast=True).to(tl.float32)
    s = s_u8.to(tl.int32)
    scale = (s << 23).to(tl.float32, bitcast=True) * 16384.0
    scale = tl.where(s == 255, float("nan"), scale)
    v = v * scale[:, :, None]
    return v.reshape(BLOCK_N, BLOCK_K).to(DTYPE)


@triton.jit
def _bf16_pair(wq, SHIFT: tl.constexpr):
    t = wq >> SHIFT
    r = ((t & 0x00070007) << 6) | ((t & 0x00080008) << 12)
    return tl.join(r.to(tl.int16), (r >> 16).to(tl.int16))


@triton.jit
def _dequant_words(wq, s_u8, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr):
    """[BLOCK_N, BLOCK_K//8] int32 words (8 codes each) + e8m0 -> [BLOCK_N, BLOCK_K] DTYPE.

    Works on two codes per 32-bit operation: for nibble i of a word, the mask 0x00070007
    picks codes i and i+4 into the two 16-bit halves, and ``<< 6`` / ``<< 12`` place the
    magnitude and sign bits so each half is the bf16 ``e2m1 * 2**-126`` (a subnormal for
    the codes 0.5 and 0). Multiplying by ``2**(s-1)`` (bf16 bits ``(s + 126) << 7``) applies
    the bias and the e8m0 scale at once; that factor overflows for s > 128, where a tile
    takes two multiplies instead.
    """
    v = tl.join(tl.join(_bf16_pair(wq, 0), _bf16_pair(wq, 8)), tl.join(_bf16_pair(wq, 4), _bf16_pair(wq, 12)))
    v = v.reshape(BLOCK_N, BLOCK_K // 32, 32).to(tl.bfloat16, bitcast=True)
    s = s_u8.to(tl.int16)
    if tl.max(tl.max(s_u8, 1), 0) > 128:
        sb = tl.where(s == 255, 0x7FC0, tl.where(s == 0, 0x0040, s << 7)).to(tl.int16)  # 2**(s-127)
        v = (v * 8.507059e37) * sb.to(tl.bfloat16, bitcast=True)[:, :, None]
    else:
        sb = ((s + 126) << 7).to(tl.int16)  # 2**(s-1)
        v = v * sb.to(tl.bfloat16, bitcast=True)[:, :, None]
    return v.reshape(BLOCK_N, BLOCK_K).to(DTYPE)


@triton.jit
def _mx_dot(w, s, xt, acc, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr,
            MODE: tl.constexpr):
    """acc + dequant(w, s) @ xt; MODE 0: byte decode, 1: word decode."""
    if MODE == 1:
        return tl.dot(_dequant_words(w, s, BLOCK_N, BLOCK_K, DTYPE), xt, acc)
    else:
        return tl.dot(_dequant(w, s, BLOCK_N, BLOCK_K, DTYPE), xt, acc)


@triton.jit
def block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_T: tl.constexpr):
    """The (token, k) pairs of expert block pid_m (padding slots hold num_pairs) and their mask."""
    pair = tl.load(sorted_ids_ptr + pid_m * BLOCK_T + tl.arange(0, BLOCK_T))
    return pair, pair < num_pairs


@triton.jit
def gemm1_finish(acc_g, acc_u, pair, tmask, e, offs_n, nmask, b_ptr, out_ptr, part_ptr, num_pairs, I_pad,
                 stride_be, stride_ot, p0, p1, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr,
                 HAS_LINEAR: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr):
    """GEMM1 epilogue of a [BLOCK_N, BLOCK_T] tile: with SPLIT the fp32 gate/up partials of this K
    split (part[split, pair, :]), else bias, activation and the intermediate row of each pair."""
    if SPLIT:
        p_ptrs = part_ptr + (tl.program_id(2) * num_pairs + pair[None, :].to(tl.int64)) * (2 * I_pad) + offs_n[:, None]
        pmask = tmask[None, :] & nmask[:, None]
        tl.store(p_ptrs, acc_g, mask=pmask)
        tl.store(p_ptrs + I_pad, acc_u, mask=pmask)
    else:
        if HAS_BIAS:
            acc_g += tl.load(b_ptr + e * stride_be + offs_n, mask=nmask, other=0.0).to(tl.float32)[:, None]
            acc_u += tl.load(b_ptr + e * stride_be + I_pad + offs_n, mask=nmask, other=0.0).to(tl.float32)[:, None]
        h = _activate(acc_g, acc_u, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR)
        out_ptrs = out_ptr + pair[None, :].to(tl.int64) * stride_ot + offs_n[:, None]
        tl.store(out_ptrs, h.to(out_ptr.dtype.element_ty), mask=tmask[None, :] & nmask[:, None])


@triton.jit
def gemm2_finish(acc, pair, tmask, e, offs_n, nmask, b_ptr, tw_ptr, out_ptr, stride_be, stride_ot, stride_os,
                 HAS_BIAS: tl.constexpr):
    """GEMM2 epilogue: bias (split 0 only), the pair's top-k weight, row pair_out[split, pair]."""
    if HAS_BIAS:
        if tl.program_id(2) == 0:
            acc += tl.load(b_ptr + e * stride_be + offs_n, mask=nmask, other=0.0).to(tl.float32)[:, None]
    acc = acc * tl.load(tw_ptr + pair, mask=tmask, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + tl.program_id(2) * stride_os + pair[None, :].to(tl.int64) * stride_ot + offs_n[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=tmask[None, :] & nmask[:, None])


@triton.jit
def moe_align_kernel(
    topk_ids_ptr, sorted_ids_ptr, block_expert_ptr, num_post_pad_ptr, counts_ptr, cursor_ptr,
    num_pairs, num_experts, max_blocks,
    BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, E_POW2: tl.constexpr, RELEASE: tl.constexpr = False,
):
    """One program: sort (token, k) pairs by expert into blocks of BLOCK_T, padding each expert.
    RELEASE: the kernel after it (a programmatic dependent) may launch from its start.

    sorted_ids[i] = pair index (t * top_k + j) or num_pairs for padding; block_expert[b] =
    expert of block b or -1 past the end; num_post_pad = used length. The order of pairs inside
    one expert's blocks depends on atomics, but each pair's result does not depend on its slot.
    """
    if RELEASE:
        _gdc_launch()
    offs_e = tl.arange(0, E_POW2)
    emask = offs_e < num_experts
    tl.store(counts_ptr + offs_e, tl.zeros([E_POW2], tl.int32), mask=emask)
    tl.debug_barrier()
    for c in range(0, num_pairs, CHUNK):
        offs = c + tl.arange(0, CHUNK)
        ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=-1).to(tl.int32)
        ok = (ids >= 0) & (ids < num_experts)
        tl.atomic_add(counts_ptr + ids, tl.full([CHUNK], 1, tl.int32), mask=ok, sem="relaxed")
    tl.debug_barrier()
    counts = tl.load(counts_ptr + offs_e, mask=emask, other=0, volatile=True)
    nblk = (counts + BLOCK_T - 1) // BLOCK_T
    blk_end = tl.cumsum(nblk, axis=0)
    blk_start = blk_end - nblk
    total_blocks = tl.sum(nblk, axis=0)
    tl.store(num_post_pad_ptr, total_blocks * BLOCK_T)
    tl.store(cursor_ptr + offs_e, blk_start * BLOCK_T, mask=emask)
    for b in range(0, max_blocks, CHUNK):
        offs = b + tl.arange(0, CHUNK)
        tl.store(block_expert_ptr + offs, tl.full([CHUNK], -1, tl.int32), mask=offs < max_blocks)
    for b in range(0, total_blocks * BLOCK_T, CHUNK):
        offs = b + tl.arange(0, CHUNK)
        tl.store(sorted_ids_ptr + offs, tl.full([CHUNK], 0, tl.int32) + num_pairs,
                 mask=offs < total_blocks * BLOCK_T)
    tl.debug_barrier()
    # block -> expert: every expert writes its own block range (at most max nblk iterations)
    max_nblk = tl.max(nblk, axis=0)
    for j in range(0, max_nblk):
        tl.store(block_expert_ptr + blk_start + j, offs_e, mask=emask & (j < nblk))
    for c in range(0, num_pairs, CHUNK):
        offs = c + tl.arange(0, CHUNK)
        ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=-1).to(tl.int32)
        ok = (ids >= 0) & (ids < num_experts)
        slot = tl.atomic_add(cursor_ptr + ids, tl.full([CHUNK], 1, tl.int32), mask=ok, sem="relaxed")
        tl.store(sorted_ids_ptr + slot, offs, mask=ok)


@triton.jit
def moe_gemm1_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, part_ptr,
    sorted_ids_ptr, block_expert_ptr, num_post_pad_ptr,
    num_pairs, top_k, K, I_pad, K_SPLIT,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_ot,
    p0, p1,
    ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_LINEAR: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr,
    MODE: tl.constexpr, SPLIT: tl.constexpr,
):
    """inter[pair, j] = act(gate_j . x, up_j . x) for rows j and I_pad + j of w13.

    With SPLIT, program_id(2) covers K range [pid * K_SPLIT, (pid + 1) * K_SPLIT) and writes
    fp32 gate/up partial sums to part[pid, pair, :] instead; moe_act_kernel finishes them.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_T >= tl.load(num_post_pad_ptr):
        return
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if e < 0:
        return
    pair, tmask = block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_T)
    tok = (pair // top_k).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < I_pad
    PACK: tl.constexpr = 8 if MODE == 1 else 2  # codes per element of w (int32 words or bytes)
    offs_kb = tl.arange(0, BLOCK_K // PACK)
    offs_ks = tl.arange(0, BLOCK_K // 32)
    offs_k = tl.arange(0, BLOCK_K)
    wg_ptr = w_ptr + e * stride_we + offs_n[:, None].to(tl.int64) * stride_wn + offs_kb[None, :]
    wu_ptr = wg_ptr + I_pad * stride_wn
    sg_ptr = s_ptr + e * stride_se + offs_n[:, None].to(tl.int64) * stride_sn + offs_ks[None, :]
    su_ptr = sg_ptr + I_pad * stride_sn
    xt_ptr = x_ptr + tok[None, :] * stride_xt + offs_k[:, None]
    acc_g = tl.zeros([BLOCK_N, BLOCK_T], tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_T], tl.float32)
    k_lo = tl.program_id(2) * K_SPLIT
    wg_ptr += k_lo // PACK
    wu_ptr += k_lo // PACK
    sg_ptr += k_lo // 32
    su_ptr += k_lo // 32
    xt_ptr += k_lo
    for k0 in range(k_lo, tl.minimum(K, k_lo + K_SPLIT), BLOCK_K):
        kbm = nmask[:, None] & (offs_kb[None, :] < (K - k0) // PACK)
        ksm = nmask[:, None] & (offs_ks[None, :] < (K - k0) // 32)
        wg = tl.load(wg_ptr, mask=kbm, other=0)
        wu = tl.load(wu_ptr, mask=kbm, other=0)
        sg = tl.load(sg_ptr, mask=ksm, other=127)
        su = tl.load(su_ptr, mask=ksm, other=127)
        xt = tl.load(xt_ptr, mask=tmask[None, :] & (offs_k[:, None] < K - k0), other=0.0).to(DTYPE)
        acc_g = _mx_dot(wg, sg, xt, acc_g, BLOCK_N, BLOCK_K, DTYPE, MODE)
        acc_u = _mx_dot(wu, su, xt, acc_u, BLOCK_N, BLOCK_K, DTYPE, MODE)
        wg_ptr += BLOCK_K // PACK
        wu_ptr += BLOCK_K // PACK
        sg_ptr += BLOCK_K // 32
        su_ptr += BLOCK_K // 32
        xt_ptr += BLOCK_K
    gemm1_finish(acc_g, acc_u, pair, tmask, e, offs_n, nmask, b_ptr, out_ptr, part_ptr, num_pairs, I_pad,
                 stride_be, stride_ot, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, SPLIT)


@triton.jit
def moe_gemm2_kernel(
    a_ptr, w_ptr, s_ptr, b_ptr, tw_ptr, out_ptr,
    sorted_ids_ptr, block_expert_ptr, num_post_pad_ptr,
    num_pairs, K, N, K_SPLIT,
    stride_at, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_ot, stride_os,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr,
    MODE: tl.constexpr,
):
    """pair_out[split, pair, n] = w_pair * (w2[e, n, split's K range] . inter[pair] (+ b2[e, n] in split 0))."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_T >= tl.load(num_post_pad_ptr):
        return
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if e < 0:
        return
    pair, tmask = block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_T)
    pair64 = pair.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    PACK: tl.constexpr = 8 if MODE == 1 else 2
    offs_kb = tl.arange(0, BLOCK_K // PACK)
    offs_ks = tl.arange(0, BLOCK_K // 32)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + e * stride_we + offs_n[:, None].to(tl.int64) * stride_wn + offs_kb[None, :]
    s_ptrs = s_ptr + e * stride_se + offs_n[:, None].to(tl.int64) * stride_sn + offs_ks[None, :]
    at_ptrs = a_ptr + pair64[None, :] * stride_at + offs_k[:, None]
    acc = tl.zeros([BLOCK_N, BLOCK_T], tl.float32)
    k_lo = tl.program_id(2) * K_SPLIT
    w_ptrs += k_lo // PACK
    s_ptrs += k_lo // 32
    at_ptrs += k_lo
    for k0 in range(k_lo, tl.minimum(K, k_lo + K_SPLIT), BLOCK_K):
        w = tl.load(w_ptrs, mask=nmask[:, None] & (offs_kb[None, :] < (K - k0) // PACK), other=0)
        s = tl.load(s_ptrs, mask=nmask[:, None] & (offs_ks[None, :] < (K - k0) // 32), other=127)
        at = tl.load(at_ptrs, mask=tmask[None, :] & (offs_k[:, None] < K - k0), other=0.0).to(DTYPE)
        acc = _mx_dot(w, s, at, acc, BLOCK_N, BLOCK_K, DTYPE, MODE)
        w_ptrs += BLOCK_K // PACK
        s_ptrs += BLOCK_K // 32
        at_ptrs += BLOCK_K
    gemm2_finish(acc, pair, tmask, e, offs_n, nmask, b_ptr, tw_ptr, out_ptr, stride_be, stride_ot, stride_os, HAS_BIAS)


@triton.jit
def moe_act_kernel(
    part_ptr, ids_ptr, b_ptr, out_ptr, num_pairs, I_pad, num_experts, splits, stride_be, stride_ot,
    p0, p1,
    ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_LINEAR: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr, S_POW2: tl.constexpr,
):
    """inter[pair] = act(sum over splits of the GEMM1 partials (+ bias)); pairs of skipped ids are left alone.
    All splits are loaded as one [S_POW2, BLOCK] tile (independent loads) and reduced in a fixed order."""
    pair = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    offs_s = tl.arange(0, S_POW2)
    eid = tl.load(ids_ptr + pair + tl.zeros([BLOCK], tl.int32)).to(tl.int64)
    m = (offs < I_pad) & (eid >= 0) & (eid < num_experts)
    rows = part_ptr + (offs_s[:, None].to(tl.int64) * num_pairs + pair) * (2 * I_pad) + offs[None, :]
    m2 = (offs_s[:, None] < splits) & m[None, :]
    g = tl.sum(tl.load(rows, mask=m2, other=0.0), axis=0)
    u = tl.sum(tl.load(rows + I_pad, mask=m2, other=0.0), axis=0)
    if HAS_BIAS:
        g += tl.load(b_ptr + eid * stride_be + offs, mask=m, other=0.0).to(tl.float32)
        u += tl.load(b_ptr + eid * stride_be + I_pad + offs, mask=m, other=0.0).to(tl.float32)
    h = _activate(g, u, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR)
    tl.store(out_ptr + pair * stride_ot + offs, h.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def moe_align_count_kernel(
    topk_ids_ptr, sorted_ids_ptr, block_expert_ptr, num_post_pad_ptr, counts_ptr, cursor_ptr, arrive_ptr,
    num_pairs, num_experts, max_blocks, fill_len,
    BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, E_POW2: tl.constexpr,
):
    """``moe_align_kernel`` over many programs, first half (counts and arrival counter zeroed by
    the caller): each program counts its CHUNK of pairs per expert and fills its share of
    sorted_ids (padding) and block_expert (-1); the last program to arrive turns the counts into
    block starts (cursor = first slot of each expert) and writes block_expert, num_post_pad.
    ``moe_align_scatter_kernel`` then places the pairs."""
    pid = tl.program_id(0)
    offs = pid * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=-1).to(tl.int32)
    ok = (ids >= 0) & (ids < num_experts)
    tl.atomic_add(counts_ptr + ids, tl.full([CHUNK], 1, tl.int32), mask=ok, sem="relaxed")
    tl.store(sorted_ids_ptr + offs, tl.full([CHUNK], 0, tl.int32) + num_pairs, mask=offs < fill_len)
    tl.store(block_expert_ptr + offs, tl.full([CHUNK], -1, tl.int32), mask=offs < max_blocks)
    tl.debug_barrier()
    old = tl.atomic_add(arrive_ptr, 1, sem="acq_rel", scope="gpu")
    if old == tl.num_programs(0) - 1:
        tl.debug_barrier()
        offs_e = tl.arange(0, E_POW2)
        emask = offs_e < num_experts
        counts = tl.load(counts_ptr + offs_e, mask=emask, other=0, volatile=True)
        nblk = (counts + BLOCK_T - 1) // BLOCK_T
        blk_end = tl.cumsum(nblk, axis=0)
        blk_start = blk_end - nblk
        tl.store(num_post_pad_ptr, tl.sum(nblk, axis=0) * BLOCK_T)
        tl.store(cursor_ptr + offs_e, blk_start * BLOCK_T, mask=emask)
        for j in range(0, tl.max(nblk, axis=0)):
            tl.store(block_expert_ptr + blk_start + j, offs_e, mask=emask & (j < nblk))


@triton.jit
def moe_align_scatter_kernel(topk_ids_ptr, sorted_ids_ptr, cursor_ptr, num_pairs, num_experts, CHUNK: tl.constexpr,
                             RELEASE: tl.constexpr = False):
    """Second half of the many-program align: each pair takes the next slot of its expert. RELEASE: as
    moe_align_kernel's."""
    if RELEASE:
        _gdc_launch()
    offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=-1).to(tl.int32)
    ok = (ids >= 0) & (ids < num_experts)
    slot = tl.atomic_add(cursor_ptr + ids, tl.full([CHUNK], 1, tl.int32), mask=ok, sem="relaxed")
    tl.store(sorted_ids_ptr + slot, offs, mask=ok)


@triton.jit
def moe_sum_kernel(
    pair_ptr, ids_ptr, out_ptr, N, top_k, num_experts, splits, stride_ps, stride_pt, stride_ot,
    BLOCK_H: tl.constexpr, K_POW2: tl.constexpr, PDL: tl.constexpr = False,
):
    """out[t] = sum over splits and k of pair_out[split, t * top_k + k], skipping ids outside
    [0, E) (never written). Each thread keeps its own columns of the row in registers: the k rows
    are K_POW2 independent row loads (unrolled, all in flight before the adds) summed in k order,
    with no reduction across threads; deterministic. PDL: launched as a programmatic dependent of the
    kernel that writes pair_out, waited for before anything is read."""
    if PDL:
        _gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = offs < N
    acc = tl.zeros([BLOCK_H], tl.float32)
    for sp in range(0, splits):
        for j in tl.static_range(K_POW2):
            inside = tl.full([], j, tl.int32) < top_k
            e = tl.load(ids_ptr + t * top_k + j, mask=inside, other=-1)
            ok = (inside & (e >= 0) & (e < num_experts)).to(tl.int32)
            m = hmask & ((tl.zeros([BLOCK_H], tl.int32) + ok) > 0)
            v = tl.load(pair_ptr + sp * stride_ps + (t * top_k + j) * stride_pt + offs, mask=m, other=0.0)
            acc += v.to(tl.float32)
    tl.store(out_ptr + t * stride_ot + offs, acc.to(out_ptr.dtype.element_ty), mask=hmask)
