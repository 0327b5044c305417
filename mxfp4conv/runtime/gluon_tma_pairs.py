"""The per-pair Gluon layer (gluon_few_tokens) in one-warp programs whose weights, e8m0 scale words and MMA B operand
arrive by TMA into a ring of shared-memory stages: the weight stream's steps in flight hold no registers, and with
one warp a program the ring needs no barrier across warps.

GEMM1: a program per (16-row slab of gate and of up, pair, K split); the last split of a slab to arrive sums the fp32
partials in split order and applies the bias and the activation (rows stored in plain order). GEMM2: a program per
(16-row slab, pair, K split); the last of a token's slab's top_k x splits programs sums their weighted partials,
pairs then splits in index order, or the caller's k-sum kernel does. The same decode and MMAs as gluon_few_tokens, so
the sums are deterministic; a pair whose expert id is negative contributes nothing.

Each ring stage holds SUB steps of 64 KB codes: the words of a slab ([slabs, K / 64, 128] int32, a box of [1, SUB KB,
128]), its scale words ([slabs, K / 64, 8]) and the step's x ([rows, K] bf16, read as ldmatrix B fragments). This
module imports Gluon's Hopper TMA; fused_moe_triton imports it only when it takes this path (gluon_tma).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from mxfp4conv.runtime.counters import zeroed_counters
from mxfp4conv.runtime.gluon_few_tokens import _FPTX, _WPTX, _barrier, _decode, _gemm1_tail, _last_arrival, _words
from mxfp4conv.runtime.triton_hopper_kernels import _gdc_launch, _gdc_wait

# the TMA load's name from triton 3.7 on / before
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

_MMA = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
MMA = gl.constexpr(_MMA)
A_OP = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=_MMA, k_width=2))
B_OP = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=_MMA, k_width=2))
ROWS = gl.constexpr(gl.SliceLayout(1, _MMA))
# a lane's words [1, b, g, t, kt] and the row group's scale word [1, b, g, t], as gluon_few_tokens' WL / SL for one warp
_SL = gl.BlockedLayout([1, 1, 1, 1], [1, 1, 8, 4], [1, 1, 1, 1], [3, 2, 1, 0])
WL = gl.constexpr(gl.BlockedLayout([1, 1, 1, 1, 4], [1, 1, 8, 4, 1], [1, 1, 1, 1, 1], [4, 3, 2, 1, 0]))
SL = gl.constexpr(_SL)
W_READ = gl.constexpr(gl.BlockedLayout([1, 1, 4], [1, 1, 32], [1, 1, 1], [2, 1, 0]))  # a stage's [1, KB, 128] words
S_READ = gl.constexpr(gl.SliceLayout(3, _SL))  # its [1, KB, 8] scale words
_NVMMA3 = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)
_NVMMA_X = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)


@gluon.jit
def _issue_weights(wdesc, sdesc, row, up_row, step, bar, wbufs, sbufs, st, STAGES: gl.constexpr,
                   GATE_UP: gl.constexpr):
    """Stage st's weight and scale-word loads of slab row (and up_row) from 64-code step `step` on."""
    _tma_load(wdesc, [row, step, 0], bar, wbufs.index(st))
    _tma_load(sdesc, [row, step, 0], bar, sbufs.index(st))
    if GATE_UP:
        _tma_load(wdesc, [up_row, step, 0], bar, wbufs.index(STAGES + st))
        _tma_load(sdesc, [up_row, step, 0], bar, sbufs.index(STAGES + st))


@gluon.jit
def _slab_step(wbufs, sbufs, i, j: gl.constexpr, KB: gl.constexpr, NB: gl.constexpr):
    """Sub-step j's words and scale words of ring buffer i (NB slabs), in the decode's layouts."""
    w = gl.convert_layout(wbufs.index(i).slice(j * KB, KB, dim=1).load(W_READ).reshape(NB, KB, 8, 4, 4), WL)
    s = gl.expand_dims(sbufs.index(i).slice(j * KB, KB, dim=1).load(S_READ), 3)
    return w, gl.broadcast(s, gl.zeros([NB, KB, 8, 4], gl.int32, layout=SL))[0]


@gluon.jit
def _ring_k_loop(wdesc, sdesc, xdesc, row, up_row, xrow, s0, ITERS, KB: gl.constexpr, SUB: gl.constexpr,
                 STAGES: gl.constexpr, GATE_UP: gl.constexpr, WAIT: gl.constexpr, NB: gl.constexpr):
    """acc (and with GATE_UP the up rows' acc) [16 NB, 8] of the NB slabs from `row` (and `up_row`) times x's row xrow over ITERS
    stages of SUB steps of 64 KB codes from 64-code step s0 (ITERS >= STAGES). WAIT: x is the output of the kernel
    this one depends on programmatically; the first stages' weights are asked for before it is waited for."""
    SPAN: gl.constexpr = SUB * KB
    NG: gl.constexpr = 2 if GATE_UP else 1
    wbufs = gl.allocate_shared_memory(gl.int32, [STAGES * NG, NB, SPAN, 128], wdesc.layout)
    sbufs = gl.allocate_shared_memory(gl.int32, [STAGES * NG, NB, SPAN, 8], sdesc.layout)
    xbufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, 1, 64 * SPAN], xdesc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    nbytes: gl.constexpr = NG * NB * SPAN * (128 + 8) * 4 + SPAN * 128
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.expect(bars.index(i), nbytes)
        _issue_weights(wdesc, sdesc, row, up_row, s0 + i * SPAN, bars.index(i), wbufs, sbufs, i, STAGES, GATE_UP)
    if WAIT:
        _gdc_wait()
    for i in gl.static_range(STAGES):
        _tma_load(xdesc, [xrow, (s0 + i * SPAN) * 64], bars.index(i), xbufs.index(i))
    acc_g = gl.zeros([16 * NB, 8], gl.float32, layout=MMA)
    acc_u = gl.zeros([16 * NB, 8], gl.float32, layout=MMA)
    xz = gl.zeros([64 * KB, 8], gl.bfloat16, layout=B_OP)
    for it in range(ITERS):
        st = it % STAGES
        mbarrier.wait(bars.index(st), (it // STAGES) & 1)
        for j in gl.static_range(SUB):
            xv = xbufs.index(st).reshape([64 * SPAN]).slice(j * 64 * KB, 64 * KB).load(gl.SliceLayout(1, B_OP))
            x = gl.broadcast(gl.expand_dims(xv, 1), xz)[0]
            wg, sg = _slab_step(wbufs, sbufs, st, j, KB, NB)
            acc_g = mma_v2(gl.convert_layout(_decode(wg, sg, NB, KB, _WPTX, _FPTX), A_OP), x, acc_g)
            if GATE_UP:
                wu, su = _slab_step(wbufs, sbufs, STAGES + st, j, KB, NB)
                acc_u = mma_v2(gl.convert_layout(_decode(wu, su, NB, KB, _WPTX, _FPTX), A_OP), x, acc_u)
        _barrier()  # the warp's lanes have read the stage before it is refilled
        nxt = it + STAGES
        if nxt < ITERS:
            step = s0 + nxt * SPAN
            mbarrier.expect(bars.index(st), nbytes)
            _issue_weights(wdesc, sdesc, row, up_row, step, bars.index(st), wbufs, sbufs, st, STAGES, GATE_UP)
            _tma_load(xdesc, [xrow, step * 64], bars.index(st), xbufs.index(st))
    return acc_g, acc_u


@gluon.jit
def _column0(acc):
    """Column 0 of a [rows, 8] accumulator (every column holds the same token's sums)."""
    on = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))
    return gl.sum(gl.where(on[None, :] == 0, acc, 0.0), axis=1)


@gluon.jit
def tma_gemm1(wdesc, sdesc, xdesc, ids_ptr, b_ptr, inter_ptr, part_ptr, cnt_ptr, I, ITERS, TOP_K, p0, p1,
              KB: gl.constexpr, SUB: gl.constexpr, STAGES: gl.constexpr, ACT: gl.constexpr,
              HAS_LIMIT: gl.constexpr, HAS_LINEAR: gl.constexpr, HAS_BIAS: gl.constexpr, SPLITS: gl.constexpr,
              PDL: gl.constexpr, NB: gl.constexpr = 1):
    """inter[j, rows] = act(gate . x + b, up . x + b) for pair j (token j // TOP_K) and its expert, rows [16 NB rb,
    16 NB rb + 16 NB) (b13 [E, 2 I] with HAS_BIAS). PDL 1 / 2: GEMM2's programs may launch from this program's start /
    once its K loop is done."""
    if PDL == 1:
        _gdc_launch()
    rb = gl.program_id(0)
    j = gl.program_id(1)
    sp = gl.program_id(2)
    e = gl.load(ids_ptr + j).to(gl.int32)  # (TMA coordinates are 32-bit)
    if e >= 0:
        row = e * (I // 8) + rb * NB
        acc_g, acc_u = _ring_k_loop(wdesc, sdesc, xdesc, row, row + I // 16, j // TOP_K, sp * ITERS * SUB * KB,
                                    ITERS, KB, SUB, STAGES, True, False, NB)
        if PDL == 2:
            _gdc_launch()
        g = _column0(acc_g)
        u = _column0(acc_u)
        rows = rb * (16 * NB) + gl.arange(0, 16 * NB, layout=ROWS)
        if SPLITS > 1:
            npair = gl.num_programs(1)
            gl.store(part_ptr + ((sp * npair + j) * 2) * I + rows, g)
            gl.store(part_ptr + ((sp * npair + j) * 2 + 1) * I + rows, u)
            _barrier()
            if _last_arrival(cnt_ptr + j * gl.num_programs(0) + rb, SPLITS):
                _barrier()
                g = gl.zeros([16 * NB], gl.float32, layout=ROWS)
                u = gl.zeros([16 * NB], gl.float32, layout=ROWS)
                for s in range(SPLITS):
                    g += gl.load(part_ptr + ((s * npair + j) * 2) * I + rows)
                    u += gl.load(part_ptr + ((s * npair + j) * 2 + 1) * I + rows)
                _gemm1_tail(g, u, e.to(gl.int64), j, rows, b_ptr, inter_ptr, I, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR,
                            HAS_BIAS, 0)
        else:
            _gemm1_tail(g, u, e.to(gl.int64), j, rows, b_ptr, inter_ptr, I, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR,
                        HAS_BIAS, 0)


@gluon.jit
def tma_gemm2(wdesc, sdesc, xdesc, ids_ptr, b_ptr, tw_ptr, part_ptr, cnt_ptr, out_ptr, N, ITERS, TOP_K,
              KB: gl.constexpr, SUB: gl.constexpr, STAGES: gl.constexpr, HAS_BIAS: gl.constexpr,
              SPLITS: gl.constexpr, PDL: gl.constexpr, SUM: gl.constexpr, RELEASE: gl.constexpr, NB: gl.constexpr = 1):
    """out[t, rows] = sum over token t's pairs j of tw[j] * (w2[e_j] rows . inter[j] + b2[e_j] rows), rows [16 NB rb,
    16 NB rb + 16 NB): with SUM the last of the TOP_K x SPLITS programs of a token's slab sums their partials, pairs then
    splits in index order (the bias in split 0's); without, each program only stores its partial. PDL: launched as a
    programmatic dependent of GEMM1, whose output is waited for after the first stages' weights are asked for.
    RELEASE: the kernel after it (a programmatic dependent) may launch from its start."""
    if RELEASE:
        _gdc_launch()
    rb = gl.program_id(0)
    j = gl.program_id(1)
    sp = gl.program_id(2)
    npair = gl.num_programs(1)
    e = gl.load(ids_ptr + j).to(gl.int32)
    rows = rb * (16 * NB) + gl.arange(0, 16 * NB, layout=ROWS)
    v = gl.zeros([16 * NB], gl.float32, layout=ROWS)
    if e >= 0:
        acc, _ = _ring_k_loop(wdesc, sdesc, xdesc, e * (N // 16) + rb * NB, 0, j, sp * ITERS * SUB * KB, ITERS, KB,
                              SUB, STAGES, False, PDL, NB)
        v = _column0(acc)
        if HAS_BIAS:
            if sp == 0:
                v += gl.load(b_ptr + e.to(gl.int64) * N + rows).to(gl.float32)
        v = v * gl.load(tw_ptr + j).to(gl.float32)
    gl.store(part_ptr + (sp * npair + j) * N + rows, v)
    if SUM:
        _barrier()
        t = j // TOP_K
        if _last_arrival(cnt_ptr + t * gl.num_programs(0) + rb, TOP_K * SPLITS):
            _barrier()
            total = gl.zeros([16 * NB], gl.float32, layout=ROWS)
            for p in range(t * TOP_K, t * TOP_K + TOP_K):
                for s in range(SPLITS):
                    total += gl.load(part_ptr + (s * npair + p) * N + rows)
            gl.store(out_ptr + t * N + rows, total.to(gl.bfloat16))


def _descs(w: torch.Tensor, s: torch.Tensor, rows: int, K: int, nb: int, span: int):
    """TMA descriptors of a hopper_mma_rot weight tensor's words and scale words (rows rows of K codes, all experts)
    for stages of nb slabs and span 64-code steps."""
    slabs = rows // 16
    wd = TensorDescriptor(_words(w), [slabs, K // 64, 128], [2 * K, 128, 1], [nb, span, 128], _NVMMA3)
    sd = TensorDescriptor(_words(s), [slabs, K // 64, 8], [K // 8, 8, 1], [nb, span, 8], _NVMMA3)
    return wd, sd


def _x_desc(x: torch.Tensor, span: int):
    return TensorDescriptor(x, list(x.shape), [x.stride(0), 1], [1, 64 * span], _NVMMA_X)


def forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, act, out, *,
            rings: tuple[tuple[int, int, int, int], tuple[int, int, int, int]], splits1: int, splits2: int,
            pdl: int = 0, k_sum=None, reuse_counters: bool = True, release2: bool = False, gemm1=None) -> torch.Tensor:
    """out [T, H] bf16 = the layer for a few tokens x [T, H] bf16, a program per (NB 16-row slabs, pair, K split):
    contiguous hopper_mma_rot tensors, scales <= 2, x and the weights 16-byte aligned (TMA sources); rings: (NB, KB,
    SUB, STAGES) of GEMM1 and of GEMM2, programs of NB slabs (of gate and of up in GEMM1), stages of SUB steps of 64
    KB codes, STAGES of them, each K split a whole number (at least STAGES) of stages; pdl, k_sum, reuse_counters and
    release2 as gluon_few_tokens.forward; gemm1: None, or a callable (inter, part1, counters) that launches another
    GEMM1 writing inter in plain order (with NB 4: its counters a 64-row block)."""
    E, two_i, _ = w13.shape
    H, I = x.shape[1], two_i // 2
    T, k = topk_ids.shape
    pairs = T * k
    dev = x.device
    (nb1, kb1, sub1, st1), (nb2, kb2, sub2, st2) = rings
    inter = torch.empty(pairs, I, dtype=torch.bfloat16, device=dev)
    part1 = torch.empty(splits1, pairs, 2, I, dtype=torch.float32, device=dev)
    part2 = torch.empty(splits2, pairs, H, dtype=torch.float32, device=dev)
    counters = pairs * (I // (16 * nb1)) * (splits1 > 1) + T * (H // (16 * nb2)) * (k_sum is None)
    cnt = zeroed_counters(dev, counters, reuse_counters) if counters else inter  # (unread without counters)
    ids = topk_ids.reshape(-1)
    tw = topk_weights.reshape(-1)
    if gemm1 is not None:
        gemm1(inter, part1, cnt)
    else:
        wd1, sd1 = _descs(w13, w13_scale, E * two_i, H, nb1, kb1 * sub1)
        tma_gemm1[(I // (16 * nb1), pairs, splits1)](
            wd1, sd1, _x_desc(x, kb1 * sub1), ids, w13_bias if w13_bias is not None else part1, inter, part1, cnt,
            I, H // (64 * kb1 * sub1) // splits1, k, act["p0"], act["p1"], KB=kb1, SUB=sub1, STAGES=st1,
            ACT=act["ACT"], HAS_LIMIT=act["HAS_LIMIT"], HAS_LINEAR=act["HAS_LINEAR"], HAS_BIAS=w13_bias is not None,
            SPLITS=splits1, PDL=pdl, NB=nb1, num_warps=1)
    wd2, sd2 = _descs(w2, w2_scale, E * H, I, nb2, kb2 * sub2)
    tma_gemm2[(H // (16 * nb2), pairs, splits2)](
        wd2, sd2, _x_desc(inter, kb2 * sub2), ids, w2_bias if w2_bias is not None else part2, tw, part2,
        cnt[pairs * (I // (16 * nb1)) * (splits1 > 1):], out, H, I // (64 * kb2 * sub2) // splits2, k, KB=kb2,
        SUB=sub2, STAGES=st2, HAS_BIAS=w2_bias is not None, SPLITS=splits2, PDL=bool(pdl), SUM=k_sum is None,
        RELEASE=release2 and k_sum is not None, NB=nb2, num_warps=1, **({"launch_pdl": True} if pdl else {}))
    return out if k_sum is None else k_sum(part2)
