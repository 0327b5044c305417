"""Triton GEMMs of the fused MoE over the ``hopper_mma_w`` / ``hopper_mma_s`` layouts.

Same swap-AB shape of work as ``moe_gemm1_kernel`` / ``moe_gemm2_kernel`` (weight rows on the
MMA M dimension, the pairs of one expert block on N), but each program loads its weights as
[BLOCK_N/16, BLOCK_K/64, 512] bytes: one 16-byte vector per lane per 16 x 64 block, which is
that lane's MMA operand fragment (see ``mxfp4conv.shuffle.hopper``). The decode is four
mask/shift groups per 32-bit word straight into bf16 pairs, one multiply by the e8m0 factor,
and register-only reshapes into the [BLOCK_N, BLOCK_K] operand: Triton 3.6 compiles the chain
without a shared-memory layout conversion (checked on its sm_90 output: no convert_layout is
left in the loop apart from the per-16-K operand slices, which are identities).

Two options cut the small launches around the GEMMs (decode batches):
- DIRECT: block m is the single pair m (expert ``topk_ids[m]``), no align kernel; used for one
  token, whose top-k experts are distinct, so no expert is read twice.
- FUSED: the reductions run in the GEMMs' tails instead of in separate kernels. Every program
  stores its partial tile, then counts its arrival on a per-tile counter (zeroed by the caller);
  the program that arrives last sums all partials in a fixed order (split 0, 1, ...; k slot 0,
  1, ...), so the result does not depend on which program that is. GEMM1 with split-K: the last
  split of a (block, row tile) sums the fp32 partials and applies the activation. GEMM2: the last
  of the k x splits programs that touch a (token, row tile) sums that token's rows and writes the
  output row (the ``moe_sum_kernel`` work).
"""

from __future__ import annotations

import triton
import triton.language as tl

from mxfp4conv.kernels.triton_moe.mma_kernels import (HAS_GDC, _gdc_launch, _gdc_wait, block_pairs,  # noqa: F401
                                                      gemm1_finish, gemm2_finish)


def _decode_ptx(order: str, out: tuple[str, str, str, str], w: str) -> str:
    """PTX of the integer decode of the word in register w into the bf16 pairs R0..R3 (registers
    out; scratch a, b, c) for a ``hopper_np.ORDERS`` bit order: "plain" (``BITS``) in 11 instructions, "rot"
    (``BITS_ROT``) in 9, "xor" (``hopper_mma_w_xor``) in 8 (ptxas merges R3's xor and mask into one LOP3). In
    BITS_ROT, R1's rotation by 4 and R3's by 6 wrap no bit their masks keep, so they are plain shifts, which ptxas
    issues as IMAD.SHL on the FMA pipe instead of SHF on the integer pipe the masks and other rotations use (the same
    instruction count; on an H200 DSV3-like T = 1 / 8 1.059 / 1.027 and K3-like T = 8 1.054 faster,
    benchmarks/results/performance-notebook.md)."""
    r0, r1, r2, r3 = out
    if order == "nodecode":  # a timing probe (PROBE_IDS): four distinct pairs in three instructions, wrong values
        lines = [f"mov.b32 {r0}, {w}", f"not.b32 {r1}, {w}", f"xor.b32 {r2}, {w}, 0x55555555",
                 f"xor.b32 {r3}, {w}, 0x33333333"]
    elif order == "xor":  # R1 a shift, R2 a rotation, each then masked; R3 = ((w << 2) ^ (w >> 6)) & M, computed as
        # ((w ^ (w >> 8)) & (M >> 2)) << 2 (the same bits: M holds none below bit 2), which keeps one scratch register
        # live, not two
        lines = [f"and.b32 {r0}, {w}, 0x81C081C0", f"shl.b32 a, {w}, 6", f"and.b32 {r1}, a, 0x81C081C0",
                 f"shf.l.wrap.b32 a, {w}, {w}, 12", f"and.b32 {r2}, a, 0x81C081C0", f"shr.b32 a, {w}, 8",
                 f"xor.b32 a, a, {w}", "and.b32 a, a, 0x20702070", f"shl.b32 {r3}, a, 2"]
    elif order == "rot":  # R1 / R2 by one rotation and the R0 mask, R3 from two rotations
        lines = [f"and.b32 {r0}, {w}, 0x81C081C0", f"shl.b32 a, {w}, 4", f"and.b32 {r1}, a, 0x81C081C0",
                 f"shf.l.wrap.b32 a, {w}, {w}, 10", f"and.b32 {r2}, a, 0x81C081C0", f"shl.b32 a, {w}, 6",
                 f"shf.l.wrap.b32 b, {w}, {w}, 14", "and.b32 a, a, 0x00400040", "and.b32 b, b, 0x81808180",
                 f"or.b32 {r3}, a, b"]
    else:
        lines = [f"and.b32 {r0}, {w}, 0x81C081C0", f"shl.b32 a, {w}, 3", f"and.b32 {r1}, a, 0x81C081C0",
                 f"shl.b32 a, {w}, 6", f"and.b32 {r2}, a, 0x81C081C0", f"shr.b32 a, {w}, 4", "and.b32 a, a, 0x00C000C0",
                 f"shr.b32 b, {w}, 5", "and.b32 b, b, 0x01000100", f"shl.b32 c, {w}, 1", "and.b32 c, c, 0x80008000",
                 "or.b32 a, a, b", f"or.b32 {r3}, a, c"]
    return "".join(f"{line};\n" for line in lines)


ORDER_IDS = {"plain": 0, "rot": 1, "xor": 2}  # the kernels' ROT constexpr for each bit order
# ROT values no layout maps to: timing probes for benchmarks/probes/decode_probe.py, whose outputs are wrong. 3: a word's
# four bf16 pairs in three logic instructions in place of the decode's 8, the e8m0 factors applied as usual; 4: in
# one, each word xor-ed with its lane's scale word (so every scale byte is still loaded), no factors
PROBE_IDS = {"nodecode": 3, "noscale": 4}
_WORDS_PTX = tl.constexpr("{\n.reg .b32 a, b, c;\n" + _decode_ptx("plain", ("$0", "$1", "$2", "$3"), "$4") + "}")
_WORDS_ROT_PTX = tl.constexpr("{\n.reg .b32 a, b, c;\n" + _decode_ptx("rot", ("$0", "$1", "$2", "$3"), "$4") + "}")
_WORDS_XOR_PTX = tl.constexpr("{\n.reg .b32 a, b, c;\n" + _decode_ptx("xor", ("$0", "$1", "$2", "$3"), "$4") + "}")
_PROBE3_PTX = tl.constexpr("{\n" + _decode_ptx("nodecode", ("$0", "$1", "$2", "$3"), "$4") + "}")
_PROBE4_PTX = tl.constexpr("{\nxor.b32 $0, $4, $5;\nmov.b32 $1, $4;\nmov.b32 $2, $5;\nmov.b32 $3, $0;\n}")


@triton.jit
def _probe4_tile(w, s, NB: tl.constexpr, KB: tl.constexpr):
    """Timing probe 4's (PROBE_IDS) operand tile from the words w [NB, KB, 8, 4, 4, 4] and the lanes' scale words
    s [NB, KB, 128]: each word xor-ed with its lane's scale word, no factors (wrong values)."""
    sw = tl.broadcast_to(s.reshape(NB, KB, 8, 4, 1, 4), (NB, KB, 8, 4, 4, 4))
    a, b = tl.inline_asm_elementwise(asm=_PROBE4_PTX, constraints="=r,=r,=r,=r,r,r", args=[w, sw],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    return tl.join(a, b).reshape(NB, KB, 8, 4, 4, 2, 2, 2).permute(0, 7, 2, 1, 4, 5, 3, 6).reshape(NB * 16, KB * 64)


@triton.jit
def _words_asm(w, PTX: tl.constexpr):
    """[..., 4] bytes (one encoded word) -> the 8 codes as two bf16 [..., 4] (``e2m1 * 2**-126``):
    output A holds registers R0, R1, output B holds R2, R3 (see ``mxfp4conv.shuffle.hopper``); PTX: the
    decode of the words' bit order (_WORDS_PTX, _WORDS_ROT_PTX or _WORDS_XOR_PTX: 11, 9 or 8 integer
    instructions a word)."""
    return tl.inline_asm_elementwise(asm=PTX, constraints="=r,=r,=r,=r,r", args=[w],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def _factors_asm(s):
    """e8m0 bytes -> the bf16 factors ``2**(s - 1)`` (bits ``(s + 126) << 7``, s <= 128), two at a time:
    one byte permute spreads two bytes into the halves of a word, one multiply-add shifts both."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 a, b;
        prmt.b32 a, $2, 0, 0x4140;
        prmt.b32 b, $2, 0, 0x4342;
        mad.lo.u32 $0, a, 128, 0x3F003F00;
        mad.lo.u32 $1, b, 128, 0x3F003F00;
        }""",
        constraints="=r,=r,r", args=[s], dtype=tl.bfloat16, is_pure=True, pack=4)


@triton.jit
def _halves_f32(r):
    """The two bf16 halves of each int32 as fp32 (their bits moved up: exact, subnormals too)."""
    return (r << 16).to(tl.float32, bitcast=True), (r & -0x10000).to(tl.float32, bitcast=True)


@triton.jit
def _rotl(x, k: tl.constexpr):
    return (x << k) | ((x >> (32 - k)) & ((1 << k) - 1))  # int32: mask off the arithmetic shift's sign copies


@triton.jit
def _words_generic(w, ROT: tl.constexpr):
    """``_words_asm`` (with ROT 0, 1 or 2: the plain, rot or xor order's decode) in plain Triton integer operations,
    as fp32 ``e2m1 * 2**-126`` (the interpreter's bf16 arithmetic and conversions flush those subnormals; fp32 keeps
    them)."""
    b02, b13 = tl.split(w.to(tl.int32).reshape(w.shape[0], w.shape[1], 8, 4, 4, 2, 2))
    b0, b2 = tl.split(b02)
    b1, b3 = tl.split(b13)
    word = b0 | (b1 << 8) | (b2 << 16) | (b3 << 24)
    r0 = word & -0x7E3F7E40  # 0x81C081C0 as int32
    if ROT == 2:
        r1 = (word << 6) & -0x7E3F7E40
        r2 = _rotl(word, 12) & -0x7E3F7E40
        r3 = ((word << 2) ^ ((word >> 6) & 0x03FFFFFF)) & -0x7E3F7E40  # (a logical shift)
    elif ROT:
        r1 = _rotl(word, 4) & -0x7E3F7E40
        r2 = _rotl(word, 10) & -0x7E3F7E40
        r3 = (_rotl(word, 6) & 0x00400040) | (_rotl(word, 14) & -0x7E7F7E80)  # 0x81808180
    else:
        r1 = (word << 3) & -0x7E3F7E40
        r2 = (word << 6) & -0x7E3F7E40
        r3 = ((word >> 4) & 0x00C000C0) | ((word >> 5) & 0x01000100) | ((word << 1) & -0x7FFF8000)
    r0l, r0h = _halves_f32(r0)
    r1l, r1h = _halves_f32(r1)
    r2l, r2h = _halves_f32(r2)
    r3l, r3h = _halves_f32(r3)
    a = tl.join(tl.join(r0l, r1l), tl.join(r0h, r1h)).reshape(w.shape)  # element 2 * reg + half
    b = tl.join(tl.join(r2l, r3l), tl.join(r2h, r3h)).reshape(w.shape)
    return a, b


@triton.jit
def _hopper_tile(w, s, NB: tl.constexpr, KB: tl.constexpr, FACT: tl.constexpr, ASM: tl.constexpr,
                 DTYPE: tl.constexpr, ROT: tl.constexpr = False):
    """w [NB, KB, 512] and s [NB, KB, 128] (each lane's 4 scale bytes, repeated for the 4 lanes of
    a row group) -> the dequantised [16 NB, 64 KB] operand tile: bf16 with ASM (exact: every MXFP4
    value is a bf16), else DTYPE. FACT (with ASM): the e8m0 factors one at a time (0) or two to a
    word (1), both for scales <= 2; 2: some scale is larger (two multiplies). ROT: the words' bit
    order, ``ORDER_IDS`` (0 ``hopper_np.BITS``, 1 ``BITS_ROT``, 2 xor), or a timing probe's (``PROBE_IDS``)."""
    w = w.reshape(NB, KB, 8, 4, 4, 4)  # nb b g t kt byte
    if ROT == 4:
        return _probe4_tile(w, s, NB, KB)
    if ROT == 3:  # timing probe (PROBE_IDS): four distinct pairs from the word in three instructions
        a, b = _words_asm(w, _PROBE3_PTX)
        f = _factors_asm(s)
    elif ASM:
        if ROT == 2:
            a, b = _words_asm(w, _WORDS_XOR_PTX)
        elif ROT:
            a, b = _words_asm(w, _WORDS_ROT_PTX)
        else:
            a, b = _words_asm(w, _WORDS_PTX)
        if FACT == 2:  # some scale > 2 (2**(s-1) would overflow bf16): restore 2**126 first, then 2**(s-127)
            s16 = s.to(tl.int16)
            bits = tl.where(s16 == 255, 0x7FC0, tl.where(s16 == 0, 0x0040, s16 << 7))
            f = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
        elif FACT == 1:
            f = _factors_asm(s)
        else:
            f = ((s.to(tl.int16) + 126) << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        a, b = _words_generic(w, ROT)
        s32 = s.to(tl.int32)
        f = tl.where(s32 == 255, float("nan"), tl.where(s32 == 0, 5.877471754111438e-39, (s32 << 23).to(tl.float32, bitcast=True)))
    v = tl.join(a, b)  # nb b g t kt (c kk) h
    if FACT == 2 or not ASM:
        v = v * 8.507059e37  # 2**126
    f = f.reshape(NB, KB, 8, 4, 2, 2).permute(0, 1, 2, 3, 5, 4)  # nb b g t j h
    v = v.reshape(NB, KB, 8, 4, 2, 2, 2, 2, 2) * f.reshape(NB, KB, 8, 4, 2, 1, 1, 1, 2)  # j: the 32-group
    v = v.reshape(NB, KB, 8, 4, 4, 2, 2, 2).permute(0, 7, 2, 1, 4, 5, 3, 6)  # nb h g b kt c t kk
    v = v.reshape(NB * 16, KB * 64)
    if not ASM and v.dtype != DTYPE:
        v = v.to(DTYPE)
    return v


@triton.jit
def _mma(a, x, acc, ASM: tl.constexpr):
    """acc + a @ x. With ASM the weights are bf16; fp16 / fp32 activations then go in as two bf16
    parts (x = hi + lo, exact for fp16, 16 significant bits for fp32) so the tile keeps the
    register-operand path (an fp32 / tf32 operand would not)."""
    if ASM and x.dtype != tl.bfloat16:
        xf = x.to(tl.float32)
        hi = xf.to(tl.bfloat16)
        acc = tl.dot(a, hi, acc)
        return tl.dot(a, (xf - hi.to(tl.float32)).to(tl.bfloat16), acc)
    return tl.dot(a, x.to(a.dtype), acc)


@triton.jit
def _hopper_ptrs(w_ptr, s_ptr, e, stride_we, stride_se, nb0, K, k0, NB: tl.constexpr, KB: tl.constexpr):
    """Pointers of the [NB, KB, 512] weight and [NB, KB, 128] scale tiles of row slabs nb0.. at
    code k0 (a multiple of 64: a slab stores K in 64-code blocks of 512 weight and 32 scale bytes)."""
    o_nb = nb0 + tl.arange(0, NB)
    o_b = tl.arange(0, KB)
    o_l = tl.arange(0, 512)
    o_s = tl.arange(0, 128)
    o_s = tl.max_contiguous(tl.multiple_of((o_s // 16) * 4 + o_s % 4, 4), 4)  # lane 4g + t -> bytes 4g..
    wp = (w_ptr + e * stride_we + o_nb[:, None, None].to(tl.int64) * (8 * K) + k0 * 8 + o_b[None, :, None] * 512
          + o_l[None, None, :])
    sp = (s_ptr + e * stride_se + o_nb[:, None, None].to(tl.int64) * (K // 2) + k0 // 2 + o_b[None, :, None] * 32
          + o_s[None, None, :])
    return wp, sp, o_nb, o_b


@triton.jit
def _block_and_tile(ROWS_FIRST: tl.constexpr):
    """(pair block, row tile) of this program: grid axis 0 is the pair block, or the row tile
    with ROWS_FIRST (one block's row tiles then run side by side)."""
    if ROWS_FIRST:
        pid_m = tl.program_id(1)
        pid_n = tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
    return pid_m, pid_n


@triton.jit
def _direct_block(block_expert_ptr, pid_m, num_pairs, num_experts, BLOCK_T: tl.constexpr):
    """DIRECT: block_expert_ptr is topk_ids itself and block pid_m holds pair pid_m alone; (expert
    or -1 for a skipped slot, the block's pairs, their mask)."""
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    e = tl.where((e >= 0) & (e < num_experts), e, -1)
    pair = tl.where(tl.arange(0, BLOCK_T) == 0, pid_m, num_pairs)
    return e, pair, pair < num_pairs


@triton.jit
def _arrive(cnt_ptr, expected):
    """Count this program's arrival; True for the last of ``expected`` (its partial stores, made
    before the barrier by all threads, are released with the count; the reader acquires them)."""
    old = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
    return old == expected - 1


@triton.jit
def _gemm1_reduce(part_ptr, pair, tmask, offs_n, nmask, num_pairs, I_pad, splits,
                  BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
    """Sum of the fp32 gate / up partials of every K split, in split order."""
    p = part_ptr + pair[None, :].to(tl.int64) * (2 * I_pad) + offs_n[:, None]
    pm = tmask[None, :] & nmask[:, None]
    g = tl.zeros([BLOCK_N, BLOCK_T], tl.float32)
    u = tl.zeros([BLOCK_N, BLOCK_T], tl.float32)
    for sp in range(0, splits):
        g += tl.load(p, mask=pm, other=0.0, cache_modifier=".cg")
        u += tl.load(p + I_pad, mask=pm, other=0.0, cache_modifier=".cg")
        p += num_pairs * (2 * I_pad)
    return g, u


@triton.jit
def _gemm2_token_sum(pair_ptr, ids_ptr, y_ptr, cnt_ptr, t, offs_n, nmask, top_k, num_experts, splits,
                     stride_ot, stride_os, stride_yt, BLOCK_N: tl.constexpr, K_POW2: tl.constexpr):
    """Arrival of one (token t, row tile) contribution; the last of them writes y[t, tile] = sum
    over splits and valid k slots of pair_out (the moe_sum_kernel order: split, then k)."""
    offs_k = tl.arange(0, K_POW2)
    eid = tl.load(ids_ptr + t * top_k + offs_k, mask=offs_k < top_k, other=-1)
    km = (offs_k < top_k) & (eid >= 0) & (eid < num_experts)
    if _arrive(cnt_ptr, tl.sum(km.to(tl.int32), axis=0) * splits):
        tl.debug_barrier()
        rows = pair_ptr + (t * top_k + offs_k[:, None]) * stride_ot + offs_n[None, :]
        acc = tl.zeros([BLOCK_N], tl.float32)
        for sp in range(0, splits):
            v = tl.load(rows + sp * stride_os, mask=km[:, None] & nmask[None, :], other=0.0, cache_modifier=".cg")
            acc += tl.sum(v.to(tl.float32), axis=0)
        tl.store(y_ptr + t * stride_yt + offs_n, acc.to(y_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _load_step(p, nbm, o_b, K, k0, EVEN: tl.constexpr):
    """A step's weight or scale tile at code k0, masked to the real rows (nbm) and 64-code blocks;
    EVEN (every step full, every row real): unmasked."""
    if EVEN:
        v = tl.load(p)
    else:
        v = tl.load(p, mask=nbm & (o_b < (K - k0) // 64)[None, :, None], other=0)
    return v


@triton.jit
def _load_x(p, tmask, offs_k, K, k0, EVEN: tl.constexpr):
    """A step's [BLOCK_K, pairs] operand tile at code k0, masked to the block's pairs (and, unless
    EVEN, to K)."""
    if EVEN:
        v = tl.load(p, mask=tmask[None, :], other=0.0)
    else:
        v = tl.load(p, mask=tmask[None, :] & (offs_k[:, None] < K - k0), other=0.0)
    return v


@triton.jit
def _decode_mma(w, s, nbm, o_b, K, k0, x, x2, acc, acc2, NB: tl.constexpr, KB: tl.constexpr, FACT: tl.constexpr,
                ASM: tl.constexpr, DTYPE: tl.constexpr, ROT: tl.constexpr, EVEN: tl.constexpr, BT2: tl.constexpr):
    """One K step of one weight matrix: its tile at code k0 decoded once, then acc + tile @ x and,
    with BT2 > 0, acc2 + tile @ x2 (acc2 passes through otherwise)."""
    a = _hopper_tile(_load_step(w, nbm, o_b, K, k0, EVEN), _load_step(s, nbm, o_b, K, k0, EVEN), NB, KB, FACT, ASM,
                     DTYPE, ROT)
    acc = _mma(a, x, acc, ASM)
    if BT2 > 0:
        acc2 = _mma(a, x2, acc2, ASM)
    return acc, acc2


@triton.jit
def _hgemm1_tile(xt, xt2, wg, sg, wu, su, o_nb, o_b, pair, tmask, pair2, tmask2, e, offs_n, nmask, b_ptr, out_ptr,
                 part_ptr, num_pairs, K, I_pad, K_SPLIT, k_lo, stride_be, stride_ot, p0, p1,
                 ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_LINEAR: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr,
                 SPLIT: tl.constexpr, ASM: tl.constexpr, FACT: tl.constexpr, BT2: tl.constexpr = 0,
                 EVEN: tl.constexpr = False, ROT: tl.constexpr = False):
    """GEMM1's K loop and epilogue for one [BLOCK_N, BLOCK_T] tile of gate and up rows (xt: the
    pairs' x pointers at code k_lo); BT2 > 0: also a [BLOCK_N, BT2] tile of the pairs pair2 (x
    pointers xt2), on the same decoded weights."""
    NB: tl.constexpr = BLOCK_N // 16
    KB: tl.constexpr = BLOCK_K // 64
    offs_k = tl.arange(0, BLOCK_K)
    acc_g = tl.zeros([BLOCK_N, BLOCK_T], tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_T], tl.float32)
    acc_g2 = tl.zeros([BLOCK_N, BT2 if BT2 > 0 else 16], tl.float32)  # (unused without BT2)
    acc_u2 = acc_g2
    nbm = (o_nb < I_pad // 16)[:, None, None]
    for k0 in range(k_lo, tl.minimum(K, k_lo + K_SPLIT), BLOCK_K):
        x = _load_x(xt, tmask, offs_k, K, k0, EVEN)
        x2 = _load_x(xt2, tmask2, offs_k, K, k0, EVEN) if BT2 > 0 else x
        acc_g, acc_g2 = _decode_mma(wg, sg, nbm, o_b, K, k0, x, x2, acc_g, acc_g2, NB, KB, FACT, ASM, DTYPE, ROT, EVEN,
                                    BT2)
        acc_u, acc_u2 = _decode_mma(wu, su, nbm, o_b, K, k0, x, x2, acc_u, acc_u2, NB, KB, FACT, ASM, DTYPE, ROT, EVEN,
                                    BT2)
        if BT2 > 0:
            xt2 += BLOCK_K
        wg += BLOCK_K * 8
        wu += BLOCK_K * 8
        sg += BLOCK_K // 2
        su += BLOCK_K // 2
        xt += BLOCK_K
    gemm1_finish(acc_g, acc_u, pair, tmask, e, offs_n, nmask, b_ptr, out_ptr, part_ptr, num_pairs, I_pad,
                 stride_be, stride_ot, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, SPLIT)
    if BT2 > 0:
        gemm1_finish(acc_g2, acc_u2, pair2, tmask2, e, offs_n, nmask, b_ptr, out_ptr, part_ptr, num_pairs, I_pad,
                     stride_be, stride_ot, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, SPLIT)


@triton.jit
def _hgemm2_tile(at, at2, wp, sp, o_nb, o_b, pair, tmask, pair2, tmask2, e, offs_n, nmask, b_ptr, tw_ptr, out_ptr,
                 K, N, K_SPLIT, k_lo, stride_be, stride_ot, stride_os, HAS_BIAS: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr,
                 ASM: tl.constexpr, FACT: tl.constexpr, BT2: tl.constexpr = 0, EVEN: tl.constexpr = False,
                 ROT: tl.constexpr = False):
    """GEMM2's K loop and epilogue for one [BLOCK_N, BLOCK_T] tile, one row tile a program (at: the
    pairs' intermediate pointers at code k_lo); BT2 > 0: also a [BLOCK_N, BT2] tile of pair2."""
    NB: tl.constexpr = BLOCK_N // 16
    KB: tl.constexpr = BLOCK_K // 64
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_T], tl.float32)
    acc2 = tl.zeros([BLOCK_N, BT2 if BT2 > 0 else 16], tl.float32)  # (unused without BT2)
    nbm = (o_nb < N // 16)[:, None, None]
    for k0 in range(k_lo, tl.minimum(K, k_lo + K_SPLIT), BLOCK_K):
        x = _load_x(at, tmask, offs_k, K, k0, EVEN)
        x2 = _load_x(at2, tmask2, offs_k, K, k0, EVEN) if BT2 > 0 else x
        acc, acc2 = _decode_mma(wp, sp, nbm, o_b, K, k0, x, x2, acc, acc2, NB, KB, FACT, ASM, DTYPE, ROT, EVEN, BT2)
        if BT2 > 0:
            at2 += BLOCK_K
        wp += BLOCK_K * 8
        sp += BLOCK_K // 2
        at += BLOCK_K
    gemm2_finish(acc, pair, tmask, e, offs_n, nmask, b_ptr, tw_ptr, out_ptr, stride_be, stride_ot, stride_os,
                 HAS_BIAS)
    if BT2 > 0:
        gemm2_finish(acc2, pair2, tmask2, e, offs_n, nmask, b_ptr, tw_ptr, out_ptr, stride_be, stride_ot, stride_os,
                     HAS_BIAS)


@triton.jit
def _slot_pairs(sorted_ids_ptr, rows_ptr, slot0, num_pairs, per_row, stride_row, offs_k, k_lo, BT: tl.constexpr):
    """The pairs in BT block slots from slot0, their mask and their operand pointers at code k_lo
    (row pair // per_row of rows_ptr: x for GEMM1, the intermediate for GEMM2)."""
    pair = tl.load(sorted_ids_ptr + slot0 + tl.arange(0, BT))
    rows = rows_ptr + (pair // per_row).to(tl.int64)[None, :] * stride_row + offs_k[:, None] + k_lo
    return pair, pair < num_pairs, rows


@triton.jit
def _hgemm1_two(sorted_ids_ptr, x_ptr, slot0, wg, sg, wu, su, o_nb, o_b, e, offs_n, nmask, offs_k, b_ptr, out_ptr,
                part_ptr, num_pairs, top_k, K, I_pad, K_SPLIT, k_lo, stride_xt, stride_be, stride_ot, p0, p1,
                ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_LINEAR: tl.constexpr, HAS_BIAS: tl.constexpr,
                BLOCK_N: tl.constexpr, BT1: tl.constexpr, BT2: tl.constexpr, BLOCK_K: tl.constexpr,
                DTYPE: tl.constexpr, SPLIT: tl.constexpr, ASM: tl.constexpr, FACT: tl.constexpr, EVEN: tl.constexpr,
                ROT: tl.constexpr):
    """GEMM1 of a block's first BT1 + BT2 slots from slot0 as a [rows, BT1] and a [rows, BT2] tile."""
    pa, ma, ra = _slot_pairs(sorted_ids_ptr, x_ptr, slot0, num_pairs, top_k, stride_xt, offs_k, k_lo, BT1)
    pb, mb, rb = _slot_pairs(sorted_ids_ptr, x_ptr, slot0 + BT1, num_pairs, top_k, stride_xt, offs_k, k_lo, BT2)
    _hgemm1_tile(ra, rb, wg, sg, wu, su, o_nb, o_b, pa, ma, pb, mb, e, offs_n, nmask, b_ptr, out_ptr, part_ptr,
                 num_pairs, K, I_pad, K_SPLIT, k_lo, stride_be, stride_ot, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS,
                 BLOCK_N, BT1, BLOCK_K, DTYPE, SPLIT, ASM, FACT, BT2, EVEN=EVEN, ROT=ROT)


@triton.jit
def _hgemm1_block(sorted_ids_ptr, x_ptr, pid_m, n, xt, wg, sg, wu, su, o_nb, o_b, pair, tmask, e, offs_n, nmask, offs_k,
                  b_ptr, out_ptr, part_ptr, num_pairs, top_k, K, I_pad, K_SPLIT, k_lo, stride_xt, stride_be, stride_ot,
                  p0, p1, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_LINEAR: tl.constexpr,
                  HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
                  DTYPE: tl.constexpr, SPLIT: tl.constexpr, ASM: tl.constexpr, FACT: tl.constexpr,
                  TAIL_T: tl.constexpr, DUAL: tl.constexpr, EVEN: tl.constexpr, ROT: tl.constexpr):
    """GEMM1 of a sorted block of n pairs with TAIL_T: [rows, TAIL_T] tiles up to TAIL_T pairs, with DUAL
    [rows, TAIL_T] and [rows, TAIL_T / 2] ones up to 1.5 TAIL_T, else the [rows, BLOCK_T] tile. DUAL 2 also:
    [rows, TAIL_T] and [rows, TAIL_T / 4] ones up to 1.25 TAIL_T."""
    if n <= TAIL_T:
        pa, ma, ra = _slot_pairs(sorted_ids_ptr, x_ptr, pid_m * BLOCK_T, num_pairs, top_k, stride_xt, offs_k, k_lo,
                                 TAIL_T)
        _hgemm1_tile(ra, ra, wg, sg, wu, su, o_nb, o_b, pa, ma, pa, ma, e, offs_n, nmask, b_ptr, out_ptr, part_ptr,
                     num_pairs, K, I_pad, K_SPLIT, k_lo, stride_be, stride_ot, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR,
                     HAS_BIAS, BLOCK_N, TAIL_T, BLOCK_K, DTYPE, SPLIT, ASM, FACT, EVEN=EVEN, ROT=ROT)
    elif DUAL == 2 and n <= TAIL_T + TAIL_T // 4:  # (the second tile's width is a constexpr: one call a width)
        _hgemm1_two(sorted_ids_ptr, x_ptr, pid_m * BLOCK_T, wg, sg, wu, su, o_nb, o_b, e, offs_n, nmask, offs_k, b_ptr,
                    out_ptr, part_ptr, num_pairs, top_k, K, I_pad, K_SPLIT, k_lo, stride_xt, stride_be, stride_ot, p0,
                    p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, BLOCK_N, TAIL_T, TAIL_T // 4, BLOCK_K, DTYPE, SPLIT, ASM,
                    FACT, EVEN, ROT)
    elif DUAL > 0 and n <= TAIL_T + TAIL_T // 2:
        _hgemm1_two(sorted_ids_ptr, x_ptr, pid_m * BLOCK_T, wg, sg, wu, su, o_nb, o_b, e, offs_n, nmask, offs_k, b_ptr,
                    out_ptr, part_ptr, num_pairs, top_k, K, I_pad, K_SPLIT, k_lo, stride_xt, stride_be, stride_ot, p0,
                    p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, BLOCK_N, TAIL_T, TAIL_T // 2, BLOCK_K, DTYPE, SPLIT, ASM,
                    FACT, EVEN, ROT)
    else:
        _hgemm1_tile(xt, xt, wg, sg, wu, su, o_nb, o_b, pair, tmask, pair, tmask, e, offs_n, nmask, b_ptr, out_ptr,
                     part_ptr, num_pairs, K, I_pad, K_SPLIT, k_lo, stride_be, stride_ot, p0, p1, ACT, HAS_LIMIT,
                     HAS_LINEAR, HAS_BIAS, BLOCK_N, BLOCK_T, BLOCK_K, DTYPE, SPLIT, ASM, FACT, EVEN=EVEN, ROT=ROT)


@triton.jit
def _hgemm2_two(sorted_ids_ptr, a_ptr, slot0, wp, sp, o_nb, o_b, e, offs_n, nmask, offs_k, b_ptr, tw_ptr, out_ptr,
                num_pairs, K, N, K_SPLIT, k_lo, stride_at, stride_be, stride_ot, stride_os, HAS_BIAS: tl.constexpr,
                BLOCK_N: tl.constexpr, BT1: tl.constexpr, BT2: tl.constexpr, BLOCK_K: tl.constexpr,
                DTYPE: tl.constexpr, ASM: tl.constexpr, FACT: tl.constexpr, EVEN: tl.constexpr, ROT: tl.constexpr):
    """GEMM2 of a block's first BT1 + BT2 slots from slot0 as a [rows, BT1] and a [rows, BT2] tile."""
    pa, ma, ra = _slot_pairs(sorted_ids_ptr, a_ptr, slot0, num_pairs, 1, stride_at, offs_k, k_lo, BT1)
    pb, mb, rb = _slot_pairs(sorted_ids_ptr, a_ptr, slot0 + BT1, num_pairs, 1, stride_at, offs_k, k_lo, BT2)
    _hgemm2_tile(ra, rb, wp, sp, o_nb, o_b, pa, ma, pb, mb, e, offs_n, nmask, b_ptr, tw_ptr, out_ptr, K, N, K_SPLIT,
                 k_lo, stride_be, stride_ot, stride_os, HAS_BIAS, BLOCK_N, BT1, BLOCK_K, DTYPE, ASM, FACT, BT2,
                 EVEN=EVEN, ROT=ROT)


@triton.jit
def _hgemm2_block(sorted_ids_ptr, a_ptr, pid_m, n, at, wp, sp, o_nb, o_b, pair, tmask, e, offs_n, nmask, offs_k, b_ptr,
                  tw_ptr, out_ptr, num_pairs, K, N, K_SPLIT, k_lo, stride_at, stride_be, stride_ot, stride_os,
                  HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
                  DTYPE: tl.constexpr, ASM: tl.constexpr, FACT: tl.constexpr, TAIL_T: tl.constexpr,
                  DUAL: tl.constexpr, EVEN: tl.constexpr, ROT: tl.constexpr):
    """GEMM2 of a sorted block of n pairs with TAIL_T, one row tile: the tiles of ``_hgemm1_block``."""
    if n <= TAIL_T:
        pa, ma, ra = _slot_pairs(sorted_ids_ptr, a_ptr, pid_m * BLOCK_T, num_pairs, 1, stride_at, offs_k, k_lo,
                                 TAIL_T)
        _hgemm2_tile(ra, ra, wp, sp, o_nb, o_b, pa, ma, pa, ma, e, offs_n, nmask, b_ptr, tw_ptr, out_ptr, K, N,
                     K_SPLIT, k_lo, stride_be, stride_ot, stride_os, HAS_BIAS, BLOCK_N, TAIL_T, BLOCK_K, DTYPE,
                     ASM, FACT, EVEN=EVEN, ROT=ROT)
    elif DUAL == 2 and n <= TAIL_T + TAIL_T // 4:
        _hgemm2_two(sorted_ids_ptr, a_ptr, pid_m * BLOCK_T, wp, sp, o_nb, o_b, e, offs_n, nmask, offs_k, b_ptr, tw_ptr,
                    out_ptr, num_pairs, K, N, K_SPLIT, k_lo, stride_at, stride_be, stride_ot, stride_os, HAS_BIAS,
                    BLOCK_N, TAIL_T, TAIL_T // 4, BLOCK_K, DTYPE, ASM, FACT, EVEN, ROT)
    elif DUAL > 0 and n <= TAIL_T + TAIL_T // 2:
        _hgemm2_two(sorted_ids_ptr, a_ptr, pid_m * BLOCK_T, wp, sp, o_nb, o_b, e, offs_n, nmask, offs_k, b_ptr, tw_ptr,
                    out_ptr, num_pairs, K, N, K_SPLIT, k_lo, stride_at, stride_be, stride_ot, stride_os, HAS_BIAS,
                    BLOCK_N, TAIL_T, TAIL_T // 2, BLOCK_K, DTYPE, ASM, FACT, EVEN, ROT)
    else:
        _hgemm2_tile(at, at, wp, sp, o_nb, o_b, pair, tmask, pair, tmask, e, offs_n, nmask, b_ptr, tw_ptr, out_ptr, K,
                     N, K_SPLIT, k_lo, stride_be, stride_ot, stride_os, HAS_BIAS, BLOCK_N, BLOCK_T, BLOCK_K, DTYPE,
                     ASM, FACT, EVEN=EVEN, ROT=ROT)


@triton.jit
def _absorbs(block_expert_ptr, sorted_ids_ptr, num_post_pad_ptr, pid_m, e, n, num_pairs, BLOCK_T: tl.constexpr,
             ABSORB: tl.constexpr):
    """(this block is its expert's last and holds at most ABSORB pairs, so the program of the block
    before it runs it; the next block is such a block of the same expert, so this program runs it
    too, on the weights it decodes anyway). Pairs fill a block's first slots and an expert's blocks
    are consecutive (moe_align), so at most the next block's first ABSORB slots hold pairs."""
    prev = tl.load(block_expert_ptr + tl.maximum(pid_m - 1, 0))
    absorbed = (pid_m > 0) & (prev == e) & (n <= ABSORB)
    nxt = pid_m + 1
    live = nxt * BLOCK_T < tl.load(num_post_pad_ptr)
    e_next = tl.load(block_expert_ptr + nxt, mask=live, other=-1)
    past = tl.load(sorted_ids_ptr + nxt * BLOCK_T + ABSORB, mask=live, other=0)
    takes = live & (e_next == e) & (past >= num_pairs)
    return absorbed, takes


@triton.jit
def moe_hgemm1_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, part_ptr,
    sorted_ids_ptr, block_expert_ptr, num_post_pad_ptr,
    cnt_ptr, num_pairs, num_experts, top_k, K, I_pad, K_SPLIT,
    stride_xt, stride_we, stride_se, stride_be, stride_ot,
    p0, p1,
    ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_LINEAR: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr,
    SPLIT: tl.constexpr, ASM: tl.constexpr, FACT: tl.constexpr,
    DIRECT: tl.constexpr = False, FUSED: tl.constexpr = False, PDL: tl.constexpr = False,
    ROWS_FIRST: tl.constexpr = False, TAIL_T: tl.constexpr = 0, DUAL: tl.constexpr = False,
    EVEN: tl.constexpr = False, ROT: tl.constexpr = False, ABSORB: tl.constexpr = 0,
):
    """``moe_gemm1_kernel`` over the Hopper layouts: inter[pair, j] = act(gate_j . x, up_j . x).
    With SPLIT and FUSED, the last K split of each tile finishes it (module docstring).
    ROWS_FIRST (not with FUSED): grid axis 0 is the row tile, axis 1 the pair block.
    EVEN (the caller checks it): every K step is full and every row tile real, so the loads carry
    only the pairs' mask (both GEMMs). ROT: the weight words' bit order (``ORDER_IDS``).
    ABSORB (with TAIL_T, not FUSED; a power of two up to TAIL_T, 0 off): an expert's last block of at
    most ABSORB pairs runs as a second [BLOCK_N, ABSORB] tile in the program of the expert's block
    before it (``_absorbs``; both GEMMs)."""
    if PDL:
        _gdc_launch()  # let GEMM2's programs launch while the last of these run
    pid_m, pid_n = _block_and_tile(ROWS_FIRST)
    if DIRECT:
        e, pair, tmask = _direct_block(block_expert_ptr, pid_m, num_pairs, num_experts, BLOCK_T)
    else:
        if pid_m * BLOCK_T >= tl.load(num_post_pad_ptr):
            return
        e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        pair, tmask = block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_T)
    if e < 0:
        return
    NB: tl.constexpr = BLOCK_N // 16
    KB: tl.constexpr = BLOCK_K // 64
    tok = (pair // top_k).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < I_pad
    k_lo = tl.program_id(2) * (K_SPLIT // BLOCK_K) * BLOCK_K  # keeps k_lo's known divisibility: 16-byte loads
    wg, sg, o_nb, o_b = _hopper_ptrs(w_ptr, s_ptr, e, stride_we, stride_se, pid_n * NB, K, k_lo, NB, KB)
    wu = wg + (I_pad // 16) * (8 * K)
    su = sg + (I_pad // 16) * (K // 2)
    offs_k = tl.arange(0, BLOCK_K)
    xt = x_ptr + tok[None, :] * stride_xt + offs_k[:, None] + k_lo
    if TAIL_T > 0 and not DIRECT:
        # a block's pairs fill its first slots (moe_align): with n of them, the first n tile columns
        n = tl.sum(tmask.to(tl.int32), axis=0)
        # _hgemm1_block is called in both branches: flags defaulted to False outside `if ABSORB` become runtime
        # values, and the merged path would then be compiled into every kernel (more shared memory, other SASS)
        if ABSORB > 0:
            absorbed, takes = _absorbs(block_expert_ptr, sorted_ids_ptr, num_post_pad_ptr, pid_m, e, n, num_pairs,
                                       BLOCK_T, ABSORB)
            if takes:
                pb, mb, rb = _slot_pairs(sorted_ids_ptr, x_ptr, (pid_m + 1) * BLOCK_T, num_pairs, top_k, stride_xt,
                                         offs_k, k_lo, ABSORB)
                _hgemm1_tile(xt, rb, wg, sg, wu, su, o_nb, o_b, pair, tmask, pb, mb, e, offs_n, nmask, b_ptr, out_ptr,
                             part_ptr, num_pairs, K, I_pad, K_SPLIT, k_lo, stride_be, stride_ot, p0, p1, ACT,
                             HAS_LIMIT, HAS_LINEAR, HAS_BIAS, BLOCK_N, BLOCK_T, BLOCK_K, DTYPE, SPLIT, ASM, FACT,
                             ABSORB, EVEN=EVEN, ROT=ROT)
            elif not absorbed:
                _hgemm1_block(sorted_ids_ptr, x_ptr, pid_m, n, xt, wg, sg, wu, su, o_nb, o_b, pair, tmask, e, offs_n,
                              nmask, offs_k, b_ptr, out_ptr, part_ptr, num_pairs, top_k, K, I_pad, K_SPLIT, k_lo,
                              stride_xt, stride_be, stride_ot, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, BLOCK_N,
                              BLOCK_T, BLOCK_K, DTYPE, SPLIT, ASM, FACT, TAIL_T, DUAL, EVEN, ROT)
        else:
            _hgemm1_block(sorted_ids_ptr, x_ptr, pid_m, n, xt, wg, sg, wu, su, o_nb, o_b, pair, tmask, e, offs_n,
                          nmask, offs_k, b_ptr, out_ptr, part_ptr, num_pairs, top_k, K, I_pad, K_SPLIT, k_lo,
                          stride_xt, stride_be, stride_ot, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, BLOCK_N,
                          BLOCK_T, BLOCK_K, DTYPE, SPLIT, ASM, FACT, TAIL_T, DUAL, EVEN, ROT)
    else:
        _hgemm1_tile(xt, xt, wg, sg, wu, su, o_nb, o_b, pair, tmask, pair, tmask, e, offs_n, nmask, b_ptr, out_ptr,
                     part_ptr, num_pairs, K, I_pad, K_SPLIT, k_lo, stride_be, stride_ot, p0, p1, ACT, HAS_LIMIT,
                     HAS_LINEAR, HAS_BIAS, BLOCK_N, BLOCK_T, BLOCK_K, DTYPE, SPLIT, ASM, FACT, EVEN=EVEN, ROT=ROT)
    if SPLIT and FUSED:
        tl.debug_barrier()
        splits = tl.num_programs(2)
        if _arrive(cnt_ptr + pid_m * tl.num_programs(1) + pid_n, splits):
            tl.debug_barrier()
            g, u = _gemm1_reduce(part_ptr, pair, tmask, offs_n, nmask, num_pairs, I_pad, splits, BLOCK_N, BLOCK_T)
            gemm1_finish(g, u, pair, tmask, e, offs_n, nmask, b_ptr, out_ptr, part_ptr, num_pairs, I_pad,
                         stride_be, stride_ot, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, False)


@triton.jit
def moe_hgemm2_kernel(
    a_ptr, w_ptr, s_ptr, b_ptr, tw_ptr, out_ptr,
    sorted_ids_ptr, block_expert_ptr, num_post_pad_ptr,
    ids_ptr, y_ptr, cnt_ptr, num_pairs, num_experts, top_k, K, N, K_SPLIT,
    stride_at, stride_we, stride_se, stride_be, stride_ot, stride_os, stride_yt,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr,
    ASM: tl.constexpr, FACT: tl.constexpr,
    DIRECT: tl.constexpr = False, FUSED: tl.constexpr = False, PDL: tl.constexpr = False,
    K_POW2: tl.constexpr = 1, ROW_TILES: tl.constexpr = 1, ROWS_FIRST: tl.constexpr = False,
    TAIL_T: tl.constexpr = 0, DUAL: tl.constexpr = False, EVEN: tl.constexpr = False, ROT: tl.constexpr = False,
    ABSORB: tl.constexpr = 0,
):
    """``moe_gemm2_kernel`` over the Hopper layouts:
    pair_out[split, pair, n] = w_pair * (w2[e, n, split's K range] . inter[pair] (+ b2[e, n] in split 0)).
    With FUSED, the last program touching a (token, row tile) also writes y[token, tile] = the sum
    over k and splits (module docstring). ROW_TILES > 1 (not with FUSED): a program does that many
    consecutive row tiles in one flat loop over (tile, K step), so the loads of the next tile are in
    flight while this one finishes, and the block's prologue is paid once (short K: few steps a tile).
    ROWS_FIRST (not with FUSED): grid axis 0 is the row-tile group, axis 1 the pair block."""
    pid_m, pid_n = _block_and_tile(ROWS_FIRST)
    if DIRECT:
        e, pair, tmask = _direct_block(block_expert_ptr, pid_m, num_pairs, num_experts, BLOCK_T)
    else:
        if pid_m * BLOCK_T >= tl.load(num_post_pad_ptr):
            return
        e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        pair, tmask = block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_T)
    if e < 0:
        return
    NB: tl.constexpr = BLOCK_N // 16
    KB: tl.constexpr = BLOCK_K // 64
    pair64 = pair.to(tl.int64)
    tile0 = pid_n * ROW_TILES  # first row tile of this program
    offs_n = tile0 * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    k_lo = tl.program_id(2) * (K_SPLIT // BLOCK_K) * BLOCK_K  # keeps k_lo's known divisibility: 16-byte loads
    wp, sp, o_nb, o_b = _hopper_ptrs(w_ptr, s_ptr, e, stride_we, stride_se, tile0 * NB, K, k_lo, NB, KB)
    offs_k = tl.arange(0, BLOCK_K)
    at = a_ptr + pair64[None, :] * stride_at + offs_k[:, None] + k_lo
    acc = tl.zeros([BLOCK_N, BLOCK_T], tl.float32)
    if PDL:
        _gdc_wait()  # GEMM1's intermediate is complete and visible from here on
    if ROW_TILES == 1:
        if TAIL_T > 0 and not DIRECT:
            # a block's pairs fill its first slots (moe_align): with n of them, the first n tile columns
            n = tl.sum(tmask.to(tl.int32), axis=0)
            if ABSORB > 0:
                absorbed, takes = _absorbs(block_expert_ptr, sorted_ids_ptr, num_post_pad_ptr, pid_m, e, n, num_pairs,
                                           BLOCK_T, ABSORB)
                if takes:
                    pb, mb, rb = _slot_pairs(sorted_ids_ptr, a_ptr, (pid_m + 1) * BLOCK_T, num_pairs, 1, stride_at,
                                             offs_k, k_lo, ABSORB)
                    _hgemm2_tile(at, rb, wp, sp, o_nb, o_b, pair, tmask, pb, mb, e, offs_n, nmask, b_ptr, tw_ptr,
                                 out_ptr, K, N, K_SPLIT, k_lo, stride_be, stride_ot, stride_os, HAS_BIAS, BLOCK_N,
                                 BLOCK_T, BLOCK_K, DTYPE, ASM, FACT, ABSORB, EVEN=EVEN, ROT=ROT)
                elif not absorbed:
                    _hgemm2_block(sorted_ids_ptr, a_ptr, pid_m, n, at, wp, sp, o_nb, o_b, pair, tmask, e, offs_n, nmask,
                                  offs_k, b_ptr, tw_ptr, out_ptr, num_pairs, K, N, K_SPLIT, k_lo, stride_at, stride_be,
                                  stride_ot, stride_os, HAS_BIAS, BLOCK_N, BLOCK_T, BLOCK_K, DTYPE, ASM, FACT, TAIL_T,
                                  DUAL, EVEN, ROT)
            else:
                _hgemm2_block(sorted_ids_ptr, a_ptr, pid_m, n, at, wp, sp, o_nb, o_b, pair, tmask, e, offs_n, nmask,
                              offs_k, b_ptr, tw_ptr, out_ptr, num_pairs, K, N, K_SPLIT, k_lo, stride_at, stride_be,
                              stride_ot, stride_os, HAS_BIAS, BLOCK_N, BLOCK_T, BLOCK_K, DTYPE, ASM, FACT, TAIL_T, DUAL,
                              EVEN, ROT)
        else:
            _hgemm2_tile(at, at, wp, sp, o_nb, o_b, pair, tmask, pair, tmask, e, offs_n, nmask, b_ptr, tw_ptr, out_ptr,
                         K, N, K_SPLIT, k_lo, stride_be, stride_ot, stride_os, HAS_BIAS, BLOCK_N, BLOCK_T, BLOCK_K,
                         DTYPE, ASM, FACT, EVEN=EVEN, ROT=ROT)
    else:
        # row tiles tile0, tile0 + 1, ...; _hopper_ptrs above placed wp / sp at the first
        steps = tl.cdiv(tl.minimum(K, k_lo + K_SPLIT) - k_lo, BLOCK_K)
        tiles = tl.minimum(ROW_TILES, tl.cdiv(N, BLOCK_N) - tile0)
        ks = 0
        nt = 0
        for _ in range(0, tiles * steps):
            k0 = k_lo + ks * BLOCK_K
            slab = nt * NB  # 16-row slabs past the first tile's
            nbm = ((o_nb + slab) < N // 16)[:, None, None]
            x = _load_x(at + ks * BLOCK_K, tmask, offs_k, K, k0, EVEN)
            w = _load_step(wp + slab.to(tl.int64) * (8 * K) + ks * (BLOCK_K * 8), nbm, o_b, K, k0, EVEN)
            sc = _load_step(sp + slab.to(tl.int64) * (K // 2) + ks * (BLOCK_K // 2), nbm, o_b, K, k0, EVEN)
            acc = _mma(_hopper_tile(w, sc, NB, KB, FACT, ASM, DTYPE, ROT), x, acc, ASM)
            if ks == steps - 1:
                offs_t = offs_n + nt * BLOCK_N
                gemm2_finish(acc, pair, tmask, e, offs_t, offs_t < N, b_ptr, tw_ptr, out_ptr, stride_be, stride_ot,
                             stride_os, HAS_BIAS)
                acc = tl.zeros([BLOCK_N, BLOCK_T], tl.float32)
            nt = tl.where(ks == steps - 1, nt + 1, nt)
            ks = tl.where(ks == steps - 1, 0, ks + 1)
    if FUSED:
        tl.debug_barrier()
        splits = tl.num_programs(2)
        cnt = cnt_ptr + pid_n
        if DIRECT:
            t = pid_m // top_k
            _gemm2_token_sum(out_ptr, ids_ptr, y_ptr, cnt + t * tl.num_programs(1), t, offs_n, nmask, top_k,
                             num_experts, splits, stride_ot, stride_os, stride_yt, BLOCK_N, K_POW2)
        else:
            for j in range(0, BLOCK_T):
                pj = tl.load(sorted_ids_ptr + pid_m * BLOCK_T + j)
                if pj < num_pairs:
                    t = pj // top_k
                    _gemm2_token_sum(out_ptr, ids_ptr, y_ptr, cnt + t * tl.num_programs(1), t, offs_n, nmask, top_k,
                                     num_experts, splits, stride_ot, stride_os, stride_yt, BLOCK_N, K_POW2)
