"""A few tokens' MoE layer over hopper_mma_xor (or _rot) weights in two Gluon kernels with MMA v2 (mma.sync),
a program per (token, expert) pair: the path of fused_moe_triton for up to gluon_max_tokens bf16
tokens whose pairs number under gluon_pair_share x the experts (pairs_take) on NVIDIA GPUs
(measured on an H200 against the hopper_mma kernels and the expert blocks on the same bytes:
benchmarks/probes/gluon_moe.py, benchmarks/moe_bench.py, benchmarks/results/performance-notebook.md). An expert is
read once a pair, so this pays while tokens rarely share an expert.

Why Gluon: it states every layout, so each lane's int32 words of a 16 x 64 hopper_mma_w_xor (or _rot) block
decode (with the hopper kernels' PTX) straight into its m16n8k16 A fragment, and one token takes an
n8 MMA instead of an n16 one. Per 128-code step that is about 300 instructions at 72 registers
against the hopper kernel's 395 at 117.

GEMM1: a program per (64-row block of gate and of up, pair, K split); the last split of a tile to
arrive sums the fp32 partials in split order and applies the bias and the activation. GEMM2: a
program per (64-row block, pair, K split); the last of a token's row block's top_k x splits
programs sums their weighted partials, pairs then splits in index order, and writes its output row
(or, where the caller asks, each program only stores its partial and the k-sum kernel sums them).
GEMM1 stores its rows in fragment_order, so GEMM2 loads a lane's B operand in 16-byte words, and releases GEMM2
(a programmatic dependent) once its K loops are done: each measured faster than its alternative (rows in plain
order; GEMM2 released at GEMM1's start, or not chained) in benchmarks/results/performance-notebook.md.
Every sum is taken in a fixed order, so results are deterministic. A pair whose expert id is negative (not on
this rank) contributes nothing.

This module imports triton.experimental.gluon; fused_moe_triton imports it only when it takes this
path. Gluon kernels do not run in Triton's CPU interpreter: the CPU tests compile them for sm_90a,
benchmarks/gpu_check.py checks their results on the GPU.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from mxfp4conv.kernels.triton_moe import hopper_kernels as HK
from mxfp4conv.kernels.triton_moe.counters import zeroed_counters
from mxfp4conv.kernels.triton_moe.hopper_kernels import _arrive, _gdc_launch, _gdc_wait
from mxfp4conv.kernels.triton_moe.mma_kernels import _activate

def words32_ptx(order: str) -> str:
    """One int32 word in, its 8 codes out as 16-bit halves (R0 low, R0 high, ... R3 high): the hopper kernels'
    decode of a bit order (``hopper_kernels._decode_ptx``) with its four outputs split."""
    return ("{\n.reg .b32 a, b, c, r0, r1, r2, r3;\n" + HK._decode_ptx(order, ("r0", "r1", "r2", "r3"), "$8")
            + "mov.b32 {$0, $1}, r0;\nmov.b32 {$2, $3}, r1;\nmov.b32 {$4, $5}, r2;\nmov.b32 {$6, $7}, r3;\n}")


WORDS32_PTX = {order: words32_ptx(order) for order in ("rot", "xor")}  # hopper_mma_w_rot, hopper_mma_w_xor
# a scale word's 4 e8m0 bytes -> their factors 2**(s - 1) as 16-bit halves (exact for bytes <= 128,
# which fused_moe_triton checks before it takes this path)
FACTORS32_PTX = ("{\n.reg .b32 a, b;\nprmt.b32 a, $4, 0, 0x4140;\nprmt.b32 b, $4, 0, 0x4342;\n"
                 "mad.lo.u32 a, a, 128, 0x3F003F00;\nmad.lo.u32 b, b, 128, 0x3F003F00;\n"
                 "mov.b32 {$0, $1}, a;\nmov.b32 {$2, $3}, b;\n}")
_FPTX = gl.constexpr(FACTORS32_PTX)


def _along(layout, dim: int, rank: int):
    """The 1-D layout of dimension dim of a rank-dimensional layout (for its arange)."""
    for d in reversed(range(rank)):
        if d != dim:
            layout = gl.SliceLayout(d, layout)
    return gl.constexpr(layout)


# words [nb, b, g, t, kt]: warp = 16-row slab, lane = 4 g + t, a lane's 4 words (kt) in registers;
# scale words [nb, b, g, t]: the row group's word, the same for its 4 lanes
WL = gl.BlockedLayout([1, 1, 1, 1, 4], [1, 1, 8, 4, 1], [4, 1, 1, 1, 1], [4, 3, 2, 1, 0])
SL = gl.BlockedLayout([1, 1, 1, 1], [1, 1, 8, 4], [4, 1, 1, 1], [3, 2, 1, 0])
W0, W1, W2, W3, W4 = (_along(WL, d, 5) for d in range(5))
S0, S1, S2, S3 = (_along(SL, d, 4) for d in range(4))
_MMA = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
MMA = gl.constexpr(_MMA)
A_OP = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=_MMA, k_width=2))
B_OP = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=_MMA, k_width=2))
ROWS = gl.constexpr(gl.SliceLayout(1, _MMA))  # a tile's 64 rows, column 0 of the MMA layout
# the name of the CTA barrier from triton 3.7 on / before
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _offsets(K, NB: gl.constexpr, KB: gl.constexpr):
    """Word offsets of a lane's weight words [NB, KB, 8, 4, 4] and scale words [NB, KB, 8, 4] in a
    [16 NB, K] slab group (hopper_mma_w_xor or _rot / hopper_mma_s read as int32)."""
    w_off = (gl.arange(0, NB, layout=W0)[:, None, None, None, None] * (2 * K)
             + gl.arange(0, KB, layout=W1)[None, :, None, None, None] * 128
             + gl.arange(0, 8, layout=W2)[None, None, :, None, None] * 16
             + gl.arange(0, 4, layout=W3)[None, None, None, :, None] * 4
             + gl.arange(0, 4, layout=W4)[None, None, None, None, :])
    s_off = (gl.arange(0, NB, layout=S0)[:, None, None, None] * (K // 8)
             + gl.arange(0, KB, layout=S1)[None, :, None, None] * 8
             + gl.arange(0, 8, layout=S2)[None, None, :, None]
             + gl.arange(0, 4, layout=S3)[None, None, None, :] * 0)
    return w_off, s_off


@gluon.jit
def _decode(w, s, NB: gl.constexpr, KB: gl.constexpr, WPTX: gl.constexpr, FPTX: gl.constexpr):
    """A lane's words w and scale words s of a [16 NB, 64 KB] tile -> the dequantised tile (bf16). WPTX: the decode
    of the words' bit order, WORDS32_PTX[order]; the kernels take it from their caller, with no default order."""
    gl.static_assert(WPTX is not None, "WPTX (the words' decode, WORDS32_PTX[order]) not given")
    o = gl.inline_asm_elementwise(asm=WPTX, constraints="=h,=h,=h,=h,=h,=h,=h,=h,r", args=[w],
                                  dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
    a = gl.join(gl.join(o[0], o[2]), gl.join(o[1], o[3])).reshape(NB, KB, 8, 4, 4, 4)
    b = gl.join(gl.join(o[4], o[6]), gl.join(o[5], o[7])).reshape(NB, KB, 8, 4, 4, 4)
    v = gl.join(a, b).reshape(NB, KB, 8, 4, 2, 2, 2, 2, 2)  # nb b g t (j kt) (c kk) h
    f4 = gl.inline_asm_elementwise(asm=FPTX, constraints="=h,=h,=h,=h,r", args=[s], dtype=(gl.bfloat16,) * 4,
                                   is_pure=True, pack=1)
    f = gl.join(gl.join(f4[0], f4[2]), gl.join(f4[1], f4[3])).permute(0, 1, 2, 3, 5, 4)  # nb b g t j h
    v = v * gl.convert_layout(f.reshape(NB, KB, 8, 4, 2, 1, 1, 1, 2), v.type.layout)
    return v.reshape(NB, KB, 8, 4, 4, 2, 2, 2).permute(0, 7, 2, 1, 4, 5, 3, 6).reshape(NB * 16, KB * 64)


@gluon.jit
def _x_operand_ptrs(x_ptr, KB: gl.constexpr):
    """Pointers of one K step's [64 KB, 8] MMA B operand at x_ptr: x's slice broadcast over the 8
    columns (the one token of a pair)."""
    xk = gl.arange(0, 64 * KB, layout=gl.SliceLayout(1, B_OP))
    xn = gl.arange(0, 8, layout=gl.SliceLayout(0, B_OP))
    return x_ptr + xk[:, None] + xn[None, :] * 0


@gluon.jit
def fragment_order(k, KB: gl.constexpr):
    """Where code k of a row of GEMM2's B operand is stored (rows written by GEMM1 for GEMM2 in steps of 64 KB
    codes): within each step, lane t's fragment of every m16n8k16 MMA of the step side by side (the k of its
    chunk c, half h, pair element i at 16 KB t + 4 c + 2 h + i), so that a lane loads its step in 16-byte words."""
    q = k & (64 * KB - 1)  # (k >= 0; shifts and masks, not the signed // and %)
    return k - q + ((q >> 1) & 3) * (16 * KB) + ((q >> 4) << 2) + (((q >> 3) & 1) << 1) + (q & 1)


@gluon.jit
def _fragment_ptrs(row_ptrs, KB: gl.constexpr):
    """[N, 4, 16 KB] pointers of one step's B operand stored in fragment_order: column n's row at
    row_ptrs[n] ([N], _frag_cols), lane 4 (n % 8) + t's 16 KB codes contiguous."""
    t = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, _frag_layout(KB))))
    r = gl.arange(0, 16 * KB, layout=gl.SliceLayout(0, gl.SliceLayout(1, _frag_layout(KB))))
    return row_ptrs[:, None, None] + t[None, :, None] * (16 * KB) + r[None, None, :]


@gluon.constexpr_function
def _frag_layout(KB):
    """[column g, lane t, its 16 KB codes]: lane 4 g + t holds them in registers; the 4 warps see the same."""
    return gl.BlockedLayout([1, 1, 16 * KB], [8, 4, 1], [1, 1, 4], [2, 1, 0])


@gluon.constexpr_function
def _frag_cols(KB):
    return gl.SliceLayout(1, gl.SliceLayout(2, _frag_layout(KB)))


@gluon.jit
def _x_load(ptrs, mask, MASKED: gl.constexpr):
    """ptrs' values (MASKED: where mask holds, 0 elsewhere)."""
    if MASKED:
        return gl.load(ptrs, mask=mask, other=0.0)
    return gl.load(ptrs)


@gluon.jit
def _fragments(ptrs, KB: gl.constexpr):
    """One step's [64 KB, N] B operand (B_OP) from _fragment_ptrs' [N, 4, 16 KB] pointers."""
    v = gl.load(ptrs)
    N: gl.constexpr = ptrs.shape[0]
    return gl.convert_layout(v.reshape(N, 4, 4 * KB, 2, 2).permute(2, 3, 1, 4, 0).reshape(64 * KB, N), B_OP)


@gluon.constexpr_function
def shared_x_layout(KB):
    """[64 KB, N] B operand (K contiguous) loaded once by the CTA: a lane's 4 KB codes of one column in one load,
    the 4 warps a quarter of the codes each."""
    return gl.BlockedLayout([4 * KB, 1], [4, 8], [4, 1], [0, 1])


@gluon.jit
def _k_loop(w_ptr, s_ptr, x_ptr, x_mask, K, k_lo, K_SPLIT, up_w, up_s, KB: gl.constexpr, GATE_UP: gl.constexpr,
            WAIT: gl.constexpr, MASKED: gl.constexpr, FRAG: gl.constexpr = False, SHARED: gl.constexpr = False,
            NB: gl.constexpr = 4, UNROLL: gl.constexpr = 1, WPTX: gl.constexpr = None):
    """acc (and with GATE_UP the up rows' acc) [16 NB, N] of 16 NB rows (NB slabs from w_ptr / s_ptr, a warp's
    NB / 4 of them slabs w, w + 4, ...) times x over codes [k_lo, k_lo + K_SPLIT): x_ptr the [64 KB, N] B operand's
    pointers at code 0, the next step's words loaded before this step's decode (the last step loads its own again:
    nothing past the split is read; UNROLL 2: in a loop over pairs of steps, _k_loop_pairs). WAIT: x is the output
    of the kernel this one depends on programmatically; it is waited for after the first step's weight loads are
    issued. FRAG: x is stored in fragment_order and x_ptr holds its _fragment_ptrs. SHARED: x_ptr in
    shared_x_layout, each warp loading a quarter of the step's B operand (the next step's before this step's
    decode), which the four warps then read through shared memory (convert_layout), not each from L1 / L2; with
    MASKED, its columns x_mask, the others read as 0. WPTX: the words' decode (WORDS32_PTX)."""
    w_off, s_off = _offsets(K, NB, KB)
    N: gl.constexpr = x_ptr.shape[0] if FRAG else x_ptr.shape[1]
    acc_g = gl.zeros([16 * NB, N], gl.float32, layout=MMA)
    acc_u = gl.zeros([16 * NB, N], gl.float32, layout=MMA)
    if UNROLL == 2:
        acc_g, acc_u = _k_loop_pairs(w_ptr, s_ptr, x_ptr, x_mask, w_off, s_off, acc_g, acc_u, k_lo, K_SPLIT, up_w,
                                     up_s, KB, GATE_UP, WAIT, MASKED, FRAG, SHARED, NB, WPTX)
    else:
        wg, sg, wu, su = _w_loads(w_ptr, s_ptr, w_off, s_off, up_w, up_s, k_lo, GATE_UP)
        if WAIT:
            _gdc_wait()
        last = k_lo + K_SPLIT - 64 * KB
        xs = _x_load(x_ptr + k_lo, x_mask, MASKED) if SHARED else x_mask  # (x_mask: unused without SHARED)
        for k0 in range(k_lo, k_lo + K_SPLIT, 64 * KB):
            k1 = gl.minimum(k0 + 64 * KB, last)
            wg_n = gl.load(w_ptr + w_off + k1 * 2)
            sg_n = gl.load(s_ptr + s_off + k1 // 8)
            x, xs = _x_operand(x_ptr, x_mask, xs, k0, k1, KB, MASKED, FRAG, SHARED)
            acc_g = mma_v2(gl.convert_layout(_decode(wg, sg, NB, KB, WPTX, _FPTX), A_OP), x, acc_g)
            if GATE_UP:
                wu_n = gl.load(w_ptr + up_w + w_off + k1 * 2)
                su_n = gl.load(s_ptr + up_s + s_off + k1 // 8)
                acc_u = mma_v2(gl.convert_layout(_decode(wu, su, NB, KB, WPTX, _FPTX), A_OP), x, acc_u)
                wu = wu_n
                su = su_n
            wg = wg_n
            sg = sg_n
    return acc_g, acc_u


@gluon.jit
def _x_operand(x_ptr, x_mask, xs, k, k_next, KB: gl.constexpr, MASKED: gl.constexpr, FRAG: gl.constexpr,
               SHARED: gl.constexpr):
    """(the B operand of the step at code k, xs after it): with SHARED, xs holds that step's tile (loaded a step
    before) and the step at k_next's is loaded in its place; without, the operand is loaded now and xs passes on."""
    if SHARED:
        xs_next = _x_load(x_ptr + k_next, x_mask, MASKED)
        x = gl.convert_layout(xs, B_OP)
    else:
        x = _x_step(x_ptr, k, KB, FRAG)
        xs_next = xs
    return x, xs_next


@gluon.jit
def _x_step(x_ptr, k, KB: gl.constexpr, FRAG: gl.constexpr):
    """The B operand of the step at code k (from fragment_order rows with FRAG)."""
    if FRAG:
        x = _fragments(x_ptr + k, KB)
    else:
        x = gl.load(x_ptr + k)
    return x


@gluon.jit
def _w_loads(w_ptr, s_ptr, w_off, s_off, up_w, up_s, k, GATE_UP: gl.constexpr):
    """A lane's weight and scale words of the step at code k (and the up rows' with GATE_UP, else the same again)."""
    wg = gl.load(w_ptr + w_off + k * 2)
    sg = gl.load(s_ptr + s_off + k // 8)
    wu = wg
    su = sg
    if GATE_UP:
        wu = gl.load(w_ptr + up_w + w_off + k * 2)
        su = gl.load(s_ptr + up_s + s_off + k // 8)
    return wg, sg, wu, su


@gluon.jit
def _mmas(acc_g, acc_u, wg, sg, wu, su, x, NB: gl.constexpr, KB: gl.constexpr, GATE_UP: gl.constexpr,
          WPTX: gl.constexpr):
    """acc_g (and acc_u with GATE_UP) plus the decoded words times the step's B operand x."""
    acc_g = mma_v2(gl.convert_layout(_decode(wg, sg, NB, KB, WPTX, _FPTX), A_OP), x, acc_g)
    if GATE_UP:
        acc_u = mma_v2(gl.convert_layout(_decode(wu, su, NB, KB, WPTX, _FPTX), A_OP), x, acc_u)
    return acc_g, acc_u


@gluon.jit
def _k_loop_pairs(w_ptr, s_ptr, x_ptr, x_mask, w_off, s_off, acc_g, acc_u, k_lo, K_SPLIT, up_w, up_s, KB: gl.constexpr,
                  GATE_UP: gl.constexpr, WAIT: gl.constexpr, MASKED: gl.constexpr, FRAG: gl.constexpr,
                  SHARED: gl.constexpr, NB: gl.constexpr, WPTX: gl.constexpr):
    """_k_loop over pairs of steps, a and b: b's words loaded before a's decode, the next a's before b's, so that
    neither register set is copied into the other between steps; an odd split's last b is not run."""
    S: gl.constexpr = 64 * KB
    end = k_lo + K_SPLIT
    last = end - S
    ga, sa, ua, va = _w_loads(w_ptr, s_ptr, w_off, s_off, up_w, up_s, k_lo, GATE_UP)
    if WAIT:
        _gdc_wait()
    xs = _x_load(x_ptr + k_lo, x_mask, MASKED) if SHARED else x_mask  # (x_mask: unused without SHARED)
    for k0 in range(k_lo, end, 2 * S):
        kb = gl.minimum(k0 + S, last)
        gb, sb, ub, vb = _w_loads(w_ptr, s_ptr, w_off, s_off, up_w, up_s, kb, GATE_UP)
        x, xs_b = _x_operand(x_ptr, x_mask, xs, k0, kb, KB, MASKED, FRAG, SHARED)
        acc_g, acc_u = _mmas(acc_g, acc_u, ga, sa, ua, va, x, NB, KB, GATE_UP, WPTX)
        if k0 + S < end:
            ka = gl.minimum(k0 + 2 * S, last)
            ga, sa, ua, va = _w_loads(w_ptr, s_ptr, w_off, s_off, up_w, up_s, ka, GATE_UP)
            x, xs = _x_operand(x_ptr, x_mask, xs_b, kb, ka, KB, MASKED, FRAG, SHARED)
            acc_g, acc_u = _mmas(acc_g, acc_u, gb, sb, ub, vb, x, NB, KB, GATE_UP, WPTX)
    return acc_g, acc_u


@gluon.jit
def _program(w_ptr, s_ptr, ids_ptr, NROWS, K, NB: gl.constexpr = 4):
    """(row block, pair, split) of this program, pair j's expert and the word / scale-word pointers
    of the program's NB slabs in it (NROWS rows a matrix of K codes)."""
    rb = gl.program_id(0)
    j = gl.program_id(1)
    e = gl.load(ids_ptr + j).to(gl.int64)
    w_ptr += e * (NROWS * (K // 8)) + rb * NB * (2 * K)
    s_ptr += e * (NROWS * K // 128) + rb * NB * (K // 8)  # (NROWS K / 32 bytes: K need not divide by 128)
    return rb, j, gl.program_id(2), e, w_ptr, s_ptr


@gluon.jit
def _last_arrival(cnt_ptr, expected):
    """_arrive; the last of the expected arrivals also sets the counter back to zero for the next call (counters.py)."""
    last = _arrive(cnt_ptr, expected)
    if last:
        gl.store(cnt_ptr, 0)
    return last


@gluon.jit
def _column0(acc):
    """Column 0 of a [rows, 8] MMA accumulator (every column holds the same token's sums)."""
    on = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))
    return gl.sum(gl.where(on[None, :] == 0, acc, 0.0), axis=1)


@gluon.jit
def _gemm1_tail(g, u, e, j, rows, b_ptr, inter_ptr, I, p0, p1, ACT: gl.constexpr, HAS_LIMIT: gl.constexpr,
                HAS_LINEAR: gl.constexpr, HAS_BIAS: gl.constexpr, FRAG_KB: gl.constexpr):
    """Bias, activation and the bf16 intermediate row of a tile's complete gate / up sums, in fragment_order for
    GEMM2 steps of 64 FRAG_KB codes."""
    if HAS_BIAS:
        g += gl.load(b_ptr + e * (2 * I) + rows).to(gl.float32)
        u += gl.load(b_ptr + e * (2 * I) + I + rows).to(gl.float32)
    rows = fragment_order(rows, FRAG_KB)
    gl.store(inter_ptr + j * I + rows, _activate(g, u, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR).to(gl.bfloat16))


@gluon.jit
def few_gemm1(w_ptr, s_ptr, x_ptr, ids_ptr, b_ptr, inter_ptr, part_ptr, cnt_ptr, K, I, K_SPLIT, TOP_K, p0, p1,
              KB: gl.constexpr, ACT: gl.constexpr, HAS_LIMIT: gl.constexpr, HAS_LINEAR: gl.constexpr,
              HAS_BIAS: gl.constexpr, SPLITS: gl.constexpr, PDL: gl.constexpr, FRAG_KB: gl.constexpr,
              UNROLL: gl.constexpr = 1, WPTX: gl.constexpr = None):
    """inter[j, rows] = act(gate . x + b, up . x + b) for pair j (token j // TOP_K) and its expert,
    rows [64 rb, 64 rb + 64) (b13 [E, 2 I] with HAS_BIAS), stored in fragment_order for GEMM2 steps of 64 FRAG_KB
    codes. PDL: GEMM2's programs may launch once this program's K loop is done. UNROLL: the K loop over single steps
    (1) or pairs (2). WPTX: the words' decode (WORDS32_PTX)."""
    rb, j, sp, e, w_ptr, s_ptr = _program(w_ptr, s_ptr, ids_ptr, 2 * I, K)
    if e >= 0:
        acc_g, acc_u = _k_loop(w_ptr, s_ptr, _x_operand_ptrs(x_ptr + (j // TOP_K) * K, KB), 0, K, sp * K_SPLIT,
                               K_SPLIT, (I // 16) * (2 * K), (I // 16) * (K // 8), KB, True, False, False,
                               UNROLL=UNROLL, WPTX=WPTX)
        if PDL:
            _gdc_launch()
        g = _column0(acc_g)
        u = _column0(acc_u)
        rows = rb * 64 + gl.arange(0, 64, layout=ROWS)
        if SPLITS > 1:
            npair = gl.num_programs(1)
            gl.store(part_ptr + ((sp * npair + j) * 2) * I + rows, g)
            gl.store(part_ptr + ((sp * npair + j) * 2 + 1) * I + rows, u)
            _barrier()
            if _last_arrival(cnt_ptr + j * gl.num_programs(0) + rb, SPLITS):
                _barrier()
                g = gl.zeros([64], gl.float32, layout=ROWS)
                u = gl.zeros([64], gl.float32, layout=ROWS)
                for s in range(SPLITS):
                    g += gl.load(part_ptr + ((s * npair + j) * 2) * I + rows)
                    u += gl.load(part_ptr + ((s * npair + j) * 2 + 1) * I + rows)
                _gemm1_tail(g, u, e, j, rows, b_ptr, inter_ptr, I, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS,
                            FRAG_KB)
        else:
            _gemm1_tail(g, u, e, j, rows, b_ptr, inter_ptr, I, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, FRAG_KB)


@gluon.jit
def few_gemm2(w_ptr, s_ptr, inter_ptr, ids_ptr, b_ptr, tw_ptr, part_ptr, cnt_ptr, out_ptr, K, N, K_SPLIT, TOP_K,
              KB: gl.constexpr, HAS_BIAS: gl.constexpr, SPLITS: gl.constexpr, PDL: gl.constexpr,
              SUM: gl.constexpr, NB: gl.constexpr = 4, UNROLL: gl.constexpr = 1, RELEASE: gl.constexpr = False,
              WPTX: gl.constexpr = None):
    """out[t, rows] = sum over token t's pairs j of tw[j] * (w2[e_j] rows . inter[j] + b2[e_j] rows),
    rows [16 NB rb, 16 NB rb + 16 NB) (NB 4, 8 or 16 slabs a program; inter's rows in fragment_order): with SUM the
    last of the TOP_K x SPLITS programs of a token's row block sums their partials, pairs then splits in index order
    (the bias in split 0's); without, each program only stores its partial (the caller sums them). PDL: launched as a
    programmatic dependent of GEMM1, whose output is waited for after the first weight loads. UNROLL: the K loop over
    single steps (1) or pairs (2). RELEASE: the kernel after it (a programmatic dependent) may launch from its start.
    WPTX: the words' decode (WORDS32_PTX)."""
    if RELEASE:
        _gdc_launch()
    rb, j, sp, e, w_ptr, s_ptr = _program(w_ptr, s_ptr, ids_ptr, N, K, NB)
    npair = gl.num_programs(1)
    rows = rb * (16 * NB) + gl.arange(0, 16 * NB, layout=ROWS)
    v = gl.zeros([16 * NB], gl.float32, layout=ROWS)
    if e >= 0:
        x_ptrs = _fragment_ptrs(inter_ptr + j * K + gl.zeros([8], gl.int32, layout=_frag_cols(KB)), KB)  # 8 x row j
        acc, _ = _k_loop(w_ptr, s_ptr, x_ptrs, 0, K, sp * K_SPLIT, K_SPLIT, 0, 0, KB, False, PDL, False, True,
                         NB=NB, UNROLL=UNROLL, WPTX=WPTX)
        v = _column0(acc)
        if HAS_BIAS:
            if sp == 0:
                v += gl.load(b_ptr + e * N + rows).to(gl.float32)
        v = v * gl.load(tw_ptr + j).to(gl.float32)
    gl.store(part_ptr + (sp * npair + j) * N + rows, v)
    if SUM:
        _k_sum(part_ptr, cnt_ptr, out_ptr, j, rb, rows, npair, N, TOP_K, SPLITS)


@gluon.jit
def _k_sum(part_ptr, cnt_ptr, out_ptr, j, rb, rows, npair, N, TOP_K, SPLITS: gl.constexpr):
    """The arrival of pair j's partial of row block rb; the last of its token's TOP_K x SPLITS sums
    them, pairs then splits in index order, into out."""
    _barrier()
    t = j // TOP_K
    if _last_arrival(cnt_ptr + t * gl.num_programs(0) + rb, TOP_K * SPLITS):
        _barrier()
        total = gl.zeros(rows.shape, gl.float32, layout=ROWS)
        for p in range(t * TOP_K, t * TOP_K + TOP_K):
            for s in range(SPLITS):
                total += gl.load(part_ptr + (s * npair + p) * N + rows)
        gl.store(out_ptr + t * N + rows, total.to(gl.bfloat16))


def _cap(maxnreg: int) -> dict:
    """A launch's register cap option (none for 0)."""
    return {"maxnreg": maxnreg} if maxnreg else {}


def _words(t: torch.Tensor) -> torch.Tensor:
    """A contiguous uint8 tensor as flat int32 words (RuntimeError where its storage is not 4-byte aligned)."""
    return t.reshape(-1).view(torch.int32)


def forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, act, out, *,
            k1: int, k2: int, splits1: int, splits2: int, pdl: bool = False, k_sum=None, rows2: int = 64,
            unroll: tuple[int, int] = (1, 1), maxnreg: tuple[int, int] = (0, 0),
            reuse_counters: bool = True, release2: bool = False, order: str) -> torch.Tensor:
    """out [T, H] bf16 = the layer for a few tokens x [T, H] bf16, programs per (token, expert) pair (contiguous tensors
    of the hopper_mma layout whose words are in ``order``, "xor" or "rot" (WORDS32_PTX), scales <= 2; k1 / k2 codes a
    K step of GEMM1 / GEMM2, 64 or 128, splits dividing H / I into whole steps; the caller checks these; the
    intermediate rows in fragment_order, GEMM2's B operand loaded in 16-byte words; pdl: GEMM2 launched as a
    programmatic dependent of GEMM1, released once GEMM1's K loops are done (where Triton has it); k_sum: None,
    GEMM2's last program of a token's row block sums it, or a callable that sums GEMM2's fp32 partials
    [splits2, pairs, H] into out; rows2: GEMM2's rows a program, 64, 128 or 256 dividing H; unroll: GEMM1's / GEMM2's K
    loop over single steps (1) or pairs (2); maxnreg: their register caps, 0 none; reuse_counters: the arrival
    counters from counters.zeroed_counters' buffer for the device, which the kernels leave zero, else zeroed for this
    call; release2: k_sum's kernel launched as a programmatic dependent of GEMM2, which releases it from its start)."""
    E, two_i, _ = w13.shape
    H, I = x.shape[1], two_i // 2
    T, k = topk_ids.shape
    pairs = T * k
    dev = x.device
    inter = torch.empty(pairs, I, dtype=torch.bfloat16, device=dev)
    part1 = torch.empty(splits1, pairs, 2, I, dtype=torch.float32, device=dev)
    part2 = torch.empty(splits2, pairs, H, dtype=torch.float32, device=dev)
    counters = pairs * (I // 64) * (splits1 > 1) + T * (H // rows2) * (k_sum is None)  # arrivals to count
    cnt = zeroed_counters(dev, counters, reuse_counters) if counters else inter  # (unread without counters)
    ids = topk_ids.reshape(-1)
    tw = topk_weights.reshape(-1)
    few_gemm1[(I // 64, pairs, splits1)](
        _words(w13), _words(w13_scale), x, ids, w13_bias if w13_bias is not None else part1, inter, part1, cnt,
        H, I, H // splits1, k, act["p0"], act["p1"], KB=k1 // 64, ACT=act["ACT"], HAS_LIMIT=act["HAS_LIMIT"],
        HAS_LINEAR=act["HAS_LINEAR"], HAS_BIAS=w13_bias is not None, SPLITS=splits1, PDL=pdl,
        FRAG_KB=k2 // 64, UNROLL=unroll[0], WPTX=WORDS32_PTX[order], num_warps=4, **_cap(maxnreg[0]))
    few_gemm2[(H // rows2, pairs, splits2)](
        _words(w2), _words(w2_scale), inter, ids, w2_bias if w2_bias is not None else part2, tw, part2,
        cnt[pairs * (I // 64) * (splits1 > 1):], out, I, H, I // splits2, k, KB=k2 // 64,
        HAS_BIAS=w2_bias is not None, SPLITS=splits2, PDL=pdl, SUM=k_sum is None, NB=rows2 // 16,
        UNROLL=unroll[1], RELEASE=release2 and k_sum is not None, WPTX=WORDS32_PTX[order], num_warps=4,
        **_cap(maxnreg[1]),
        **({"launch_pdl": True} if pdl else {}))
    return out if k_sum is None else k_sum(part2)
