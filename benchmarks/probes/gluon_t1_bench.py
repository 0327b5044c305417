"""One token's two weight streams as Gluon MMA v2 (mma.sync) kernels, timed on the GPU beside the
production kernels of the same layer: does the instruction cut of gluon_v2_probe.py (a quarter of
GEMM1's K step, a third of GEMM2's) turn into time at T = 1, where both GEMMs are issue-bound?

Each stream kernel is a program per (64-row block, pair, K split), reading hopper_mma_w_rot /
hopper_mma_s as int32 words and writing fp32 partial sums; GEMM1 runs gate and up together. No
activation, no routing and no sums over splits or pairs: what is timed is the weight stream with
its decode and MMAs, which is where the production kernels spend their time. Checked against a
float64 product of the dequantised weights first. Beside them, three floors of the same reads:
the stream's loads alone (folded by xor, no decode, no MMA: rows gemmN/ro), the same with each
step's tile one contiguous run (/c, a step-major order no layout has, timed for its read rate),
and the words as TMA bulk copies into shared memory, 2-8 stages deep (/tma; there the "depth"
column is the stage count). The stream's work itself also runs with its words, scale words and x
coming by TMA (/tmas: one-warp programs, a ring of STAGES stages of SUB steps in shared memory; the
"KB" column is 10 KB + SUB, "depth" the stages). Production kernels are timed per kernel from a
profile of the whole MoE on the same bytes, L2 flushed before each call; the streams by CUDA-graph
replay over enough copies of the weights to defeat L2.

    python benchmarks/probes/gluon_t1_bench.py [--points dsv3:1,k3:1,k3:8] [--kinds stream,tma_stream] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(_HERE, ".."), os.path.join(_HERE, "..", "..")]  # the probes, the tools, the repository

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from mxfp4conv.kernels.triton_moe.gluon_few_tokens import (FACTORS32_PTX, WORDS32_PTX, _barrier, _decode, _offsets)  # noqa: E402
from benchmarks.probes.kernel_split import split as kernel_times  # noqa: E402
from benchmarks.moe_bench import SHAPES, copy_bandwidth, graph_time_us, make_weights, routing  # noqa: E402
from mxfp4conv.codec import dequantize_mxfp4  # noqa: E402
from mxfp4conv.kernels.triton_moe import LAYOUT_SETS, fused_moe_triton, select_config  # noqa: E402
from mxfp4conv.shuffle import get_layout  # noqa: E402


# the TMA load's name from triton 3.7 on / before
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# tma_stream's rings: (KB, SUB, STAGES); KB x SUB is 4, so that a stage's 32-byte scale words a step fill a
# 128-byte line (TMA writes shared memory at 128-byte aligned addresses)
TMA_STREAM_RINGS = ((1, 4, 2), (1, 4, 3), (2, 2, 2), (2, 2, 3))
KINDS = ("stream", "ro", "contig", "tma", "tma_stream")


@gluon.jit
def stream(w_ptr, s_ptr, x_ptr, out_ptr, K, ROWS, K_SPLIT, X_STRIDE, NB: gl.constexpr, KB: gl.constexpr,
           WPTX: gl.constexpr, FPTX: gl.constexpr, GATE_UP: gl.constexpr, DEPTH: gl.constexpr,
           READ_ONLY: gl.constexpr, CONTIG: gl.constexpr):
    """Program (row block, pair, split): rows [64 rb, 64 rb + 64) of pair e's matrix (ROWS rows; with
    GATE_UP the same rows of its up half too) over codes [K_SPLIT sp, K_SPLIT (sp + 1)).
    out [splits, pairs, ROWS] fp32. READ_ONLY: the same loads, folded by xor and stored to out as
    words (no decode, no MMA): what this access pattern reads at. CONTIG: each step's tile read as one
    contiguous run (a row block's words stored step-major, not slab-major: a layout that does not
    exist, timed for its read rate; the values are then wrong)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    rb = gl.program_id(0)
    e = gl.program_id(1)
    sp = gl.program_id(2)
    w_off, s_off = _offsets(64 * KB if CONTIG else K, NB, KB)
    WK: gl.constexpr = 2 * NB if CONTIG else 2  # words a code further along K
    SK: gl.constexpr = NB if CONTIG else 1  # scale words per 8 codes
    half = ROWS // 2 if GATE_UP else ROWS
    w_ptr += e * (ROWS * (K // 8)) + rb * NB * (2 * K)
    s_ptr += e * (ROWS * (K // 128)) + rb * NB * (K // 8)
    up_w = (half // 16) * (2 * K)
    up_s = (half // 16) * (K // 8)
    xk = gl.arange(0, 64 * KB, layout=gl.SliceLayout(1, b_op))
    xn = gl.arange(0, 8, layout=gl.SliceLayout(0, b_op))
    x_ptr += e * X_STRIDE + xk[:, None] + xn[None, :] * 0
    acc_g = gl.zeros([16 * NB, 8], gl.float32, layout=mma)
    acc_u = gl.zeros([16 * NB, 8], gl.float32, layout=mma)
    k_lo = sp * K_SPLIT
    step: gl.constexpr = 64 * KB
    # the words of the next DEPTH steps are in flight while a step decodes (DEPTH 1 or 2); the last
    # steps' prefetches read up to DEPTH steps on: the weights carry that much padding
    wg = gl.load(w_ptr + w_off + k_lo * WK)
    sg = gl.load(s_ptr + s_off + (k_lo // 8) * SK)
    wu = wg
    su = sg
    if GATE_UP:
        wu = gl.load(w_ptr + up_w + w_off + k_lo * WK)
        su = gl.load(s_ptr + up_s + s_off + (k_lo // 8) * SK)
    wg1 = wg
    sg1 = sg
    wu1 = wu
    su1 = su
    if DEPTH == 2:
        wg1 = gl.load(w_ptr + w_off + (k_lo + step) * WK)
        sg1 = gl.load(s_ptr + s_off + ((k_lo + step) // 8) * SK)
        if GATE_UP:
            wu1 = gl.load(w_ptr + up_w + w_off + (k_lo + step) * WK)
            su1 = gl.load(s_ptr + up_s + s_off + ((k_lo + step) // 8) * SK)
    fold_w = wg ^ wg
    fold_s = sg ^ sg
    for k0 in range(k_lo, k_lo + K_SPLIT, step):
        k1 = k0 + DEPTH * step
        wg_n = gl.load(w_ptr + w_off + k1 * WK)
        sg_n = gl.load(s_ptr + s_off + (k1 // 8) * SK)
        if READ_ONLY:
            fold_w = fold_w ^ wg
            fold_s = fold_s ^ sg
        else:
            x = gl.load(x_ptr + k0)
            acc_g = mma_v2(gl.convert_layout(_decode(wg, sg, NB, KB, WPTX, FPTX), a_op), x, acc_g)
        if GATE_UP:
            wu_n = gl.load(w_ptr + up_w + w_off + k1 * WK)
            su_n = gl.load(s_ptr + up_s + s_off + (k1 // 8) * SK)
            if READ_ONLY:
                fold_w = fold_w ^ wu
                fold_s = fold_s ^ su
            else:
                acc_u = mma_v2(gl.convert_layout(_decode(wu, su, NB, KB, WPTX, FPTX), a_op), x, acc_u)
            if DEPTH == 2:
                wu = wu1
                su = su1
                wu1 = wu_n
                su1 = su_n
            else:
                wu = wu_n
                su = su_n
        if DEPTH == 2:
            wg = wg1
            sg = sg1
            wg1 = wg_n
            sg1 = sg_n
        else:
            wg = wg_n
            sg = sg_n
    if READ_ONLY:  # one step's words and scale words a program, packed
        pid = (sp * gl.num_programs(1) + e) * gl.num_programs(0) + rb
        c_w, c_s = _offsets(64 * KB, NB, KB)
        gl.store(out_ptr.to(gl.pointer_type(gl.int32)) + pid * (160 * NB * KB) + c_w, fold_w)
        gl.store(out_ptr.to(gl.pointer_type(gl.int32)) + pid * (160 * NB * KB) + 128 * NB * KB + c_s, fold_s)
        return
    _store_column0(out_ptr + (sp * gl.num_programs(1) + e) * ROWS + rb * 16 * NB, acc_g, acc_u, half, GATE_UP)


@gluon.jit
def _store_column0(o_ptr, acc_g, acc_u, half, GATE_UP: gl.constexpr):
    """Column 0 of the [rows, 8] MMA accumulator acc_g (every column holds the same token's sums) at o_ptr, and with
    GATE_UP acc_u's half rows further on."""
    layout: gl.constexpr = acc_g.type.layout
    om = gl.arange(0, acc_g.shape[0], layout=gl.SliceLayout(1, layout))
    on = gl.arange(0, 8, layout=gl.SliceLayout(0, layout))
    o = o_ptr + om[:, None] + on[None, :] * 0
    gl.store(o, acc_g, mask=on[None, :] == 0)
    if GATE_UP:
        gl.store(o + half, acc_u, mask=on[None, :] == 0)


@gluon.jit
def tma_read(desc, out_ptr, SLABS, STEPS, HALF_SLABS, STAGES: gl.constexpr, GATE_UP: gl.constexpr):
    """The stream's loads as TMA bulk copies, STAGES deep, folded by xor: program (row block, pair,
    split) reads STEPS boxes of [4 slabs, one step's words] (with GATE_UP the up rows' too), the
    words [slabs, 2 K] of each expert one after the other."""
    BL: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
    box: gl.constexpr = desc.block_type.shape[1]
    row = gl.program_id(1) * SLABS + gl.program_id(0) * 4
    col0 = gl.program_id(2) * STEPS * box
    bufs = gl.allocate_shared_memory(gl.int32, [STAGES * (2 if GATE_UP else 1), 4, box], desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    nbytes: gl.constexpr = 4 * box * 4 * (2 if GATE_UP else 1)
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.expect(bars.index(i), nbytes)
        _tma_load(desc, [row, col0 + i * box], bars.index(i), bufs.index(i))
        if GATE_UP:
            _tma_load(desc, [row + HALF_SLABS, col0 + i * box], bars.index(i), bufs.index(STAGES + i))
    fold = gl.zeros([4, box], gl.int32, layout=BL)
    for it in range(STEPS):
        st = it % STAGES
        mbarrier.wait(bars.index(st), (it // STAGES) & 1)
        fold = fold ^ bufs.index(st).load(BL)
        if GATE_UP:
            fold = fold ^ bufs.index(STAGES + st).load(BL)
        gl.thread_barrier()  # every warp has read the stage before it is refilled
        nxt = it + STAGES
        if nxt < STEPS:
            mbarrier.expect(bars.index(st), nbytes)
            _tma_load(desc, [row, col0 + nxt * box], bars.index(st), bufs.index(st))
            if GATE_UP:
                _tma_load(desc, [row + HALF_SLABS, col0 + nxt * box], bars.index(st), bufs.index(STAGES + st))
    pid = (gl.program_id(2) * gl.num_programs(1) + gl.program_id(1)) * gl.num_programs(0) + gl.program_id(0)
    r = gl.arange(0, 4, layout=gl.SliceLayout(1, BL))
    c = gl.arange(0, box, layout=gl.SliceLayout(0, BL))
    gl.store(out_ptr + pid * (4 * box) + r[:, None] * box + c[None, :], fold)


@gluon.jit
def _tma_stage(wdesc, sdesc, xdesc, row, xrow, st, step, HALF_SLABS, wbufs, sbufs, xbufs, bars, STAGES: gl.constexpr,
               GATE_UP: gl.constexpr, SPAN: gl.constexpr):
    """Ring stage st's TMA loads: SPAN 64-code steps from step `step` of slab row `row` (and of the up half's) and of
    x's row xrow, all on the stage's barrier."""
    NG: gl.constexpr = 2 if GATE_UP else 1
    nbytes: gl.constexpr = NG * SPAN * (128 + 8) * 4 + SPAN * 128
    mbarrier.expect(bars.index(st), nbytes)
    _tma_load(wdesc, [row, step, 0], bars.index(st), wbufs.index(st))
    _tma_load(sdesc, [row, step, 0], bars.index(st), sbufs.index(st))
    _tma_load(xdesc, [xrow, step * 64], bars.index(st), xbufs.index(st))
    if GATE_UP:
        _tma_load(wdesc, [row + HALF_SLABS, step, 0], bars.index(st), wbufs.index(STAGES + st))
        _tma_load(sdesc, [row + HALF_SLABS, step, 0], bars.index(st), sbufs.index(STAGES + st))


@gluon.jit
def tma_stream(wdesc, sdesc, xdesc, out_ptr, SLABS, STAGE_ITERS, HALF_SLABS, X_ROWS, ROWS, KB: gl.constexpr,
               SUB: gl.constexpr, STAGES: gl.constexpr, GATE_UP: gl.constexpr, WPTX: gl.constexpr,
               FPTX: gl.constexpr):
    """stream's work (DEPTH aside) in one-warp programs whose words, scale words and x come by TMA into a ring of
    STAGES stages of SUB steps of 64 KB codes in shared memory: program (16-row slab, pair, split), the slab's rows
    (with GATE_UP the same rows of the up half too) over STAGE_ITERS stages. wdesc: the words as [slabs, K / 64, 128]
    int32, box [1, SUB KB, 128]; sdesc: the scale words as [slabs, K / 64, 8], box [1, SUB KB, 8]; xdesc: x as
    [X_ROWS, K] bf16 (pair e reads row e where X_ROWS > 1, else row 0), box [1, 64 SUB KB]. With one warp a program
    the ring needs no barrier across warps, and the steps in flight hold no registers."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    wl: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, 4], [1, 1, 8, 4, 1], [1, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    sl: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1], [1, 1, 8, 4], [1, 1, 1, 1], [3, 2, 1, 0])
    wread: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 1, 32], [1, 1, 1], [2, 1, 0])
    sread: gl.constexpr = gl.SliceLayout(3, sl)
    rb = gl.program_id(0)
    e = gl.program_id(1)
    sp = gl.program_id(2)
    row = e * SLABS + rb
    xrow = e if X_ROWS > 1 else 0
    SPAN: gl.constexpr = SUB * KB
    s0 = sp * STAGE_ITERS * SPAN
    NG: gl.constexpr = 2 if GATE_UP else 1
    wbufs = gl.allocate_shared_memory(gl.int32, [STAGES * NG, 1, SPAN, 128], wdesc.layout)
    sbufs = gl.allocate_shared_memory(gl.int32, [STAGES * NG, 1, SPAN, 8], sdesc.layout)
    xbufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, 1, 64 * SPAN], xdesc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        _tma_stage(wdesc, sdesc, xdesc, row, xrow, i, s0 + i * SPAN, HALF_SLABS, wbufs, sbufs, xbufs, bars, STAGES,
                   GATE_UP, SPAN)
    acc_g = gl.zeros([16, 8], gl.float32, layout=mma)
    acc_u = gl.zeros([16, 8], gl.float32, layout=mma)
    zs = gl.zeros([1, KB, 8, 4], gl.int32, layout=sl)
    zx = gl.zeros([64 * KB, 8], gl.bfloat16, layout=b_op)
    for it in range(STAGE_ITERS):
        st = it % STAGES
        mbarrier.wait(bars.index(st), (it // STAGES) & 1)
        for j in gl.static_range(SUB):
            wg = gl.convert_layout(wbufs.index(st).slice(j * KB, KB, dim=1).load(wread).reshape(1, KB, 8, 4, 4), wl)
            sg = gl.broadcast(gl.expand_dims(sbufs.index(st).slice(j * KB, KB, dim=1).load(sread), 3), zs)[0]
            xv = xbufs.index(st).reshape([64 * SPAN]).slice(j * 64 * KB, 64 * KB).load(gl.SliceLayout(1, b_op))
            x = gl.broadcast(gl.expand_dims(xv, 1), zx)[0]
            acc_g = mma_v2(gl.convert_layout(_decode(wg, sg, 1, KB, WPTX, FPTX), a_op), x, acc_g)
            if GATE_UP:
                wu = gl.convert_layout(wbufs.index(STAGES + st).slice(j * KB, KB, dim=1).load(wread)
                                       .reshape(1, KB, 8, 4, 4), wl)
                su = gl.broadcast(gl.expand_dims(sbufs.index(STAGES + st).slice(j * KB, KB, dim=1).load(sread), 3),
                                  zs)[0]
                acc_u = mma_v2(gl.convert_layout(_decode(wu, su, 1, KB, WPTX, FPTX), a_op), x, acc_u)
        _barrier()  # the warp's lanes have read the stage before it is refilled
        nxt = it + STAGES
        if nxt < STAGE_ITERS:
            _tma_stage(wdesc, sdesc, xdesc, row, xrow, st, s0 + nxt * SPAN, HALF_SLABS, wbufs, sbufs, xbufs, bars,
                       STAGES, GATE_UP, SPAN)
    _store_column0(out_ptr + (sp * gl.num_programs(1) + e) * ROWS + rb * 16, acc_g, acc_u,
                   ROWS // 2 if GATE_UP else ROWS, GATE_UP)


def tma_descs(w, s, x, K, span):
    """TMA descriptors of hopper_mma_rot int32 words w and scale words s (matrices of K codes, 16-row slabs,
    padding after them) and of x ([K] or [rows, K] bf16) for tma_stream's stages of span 64-code steps."""
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)
    steps = K // 64
    wd = TensorDescriptor(w, [w.numel() // (2 * K), steps, 128], [2 * K, 128, 1], [1, span, 128], layout)
    sd = TensorDescriptor(s, [s.numel() // (K // 8), steps, 8], [K // 8, 8, 1], [1, span, 8], layout)
    x2 = x.reshape(-1, K)
    xd = TensorDescriptor(x2, list(x2.shape), [K, 1], [1, 64 * span],
                          gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2))
    return wd, sd, xd


def run_tma_stream(descs, x_rows, out, K, rows, split, gate_up, kb, sub, stages, pairs):
    """tma_stream over pairs matrices of rows rows and K codes; out [split, pairs, rows] fp32."""
    grid = ((rows // 2 if gate_up else rows) // 16, pairs, split)
    tma_stream[grid](*descs, out, rows // 16, K // (64 * kb * sub) // split, rows // 32, x_rows, rows,
                     KB=kb, SUB=sub, STAGES=stages, GATE_UP=gate_up, WPTX=WORDS32_PTX["rot"], FPTX=FACTORS32_PTX,
                     num_warps=1)


def run_tma(desc, out, rows, split, gate_up, kb, stages, pairs, K):
    """tma_read over pairs matrices of rows rows and K codes (desc: their words as [slabs, 2 K])."""
    grid = ((rows // 2 if gate_up else rows) // 64, pairs, split)
    tma_read[grid](desc, out, rows // 16, K // (64 * kb) // split, rows // 32, STAGES=stages, GATE_UP=gate_up,
                   num_warps=4)


def run_stream(w, s, x, out, K, rows, split, gate_up, kb, depth, read_only, pairs, contig=False, wptx=None):
    """w, s: int32 words of pairs matrices (plus padding); x [K] or [pairs, K] bf16; out [split,
    pairs, rows] fp32 (read_only: 160 * 4 * kb int32 words a program); wptx: the words' decode
    (None: hopper_mma_w_rot's)."""
    grid = ((rows // 2 if gate_up else rows) // 64, pairs, split)
    stream[grid](w, s, x, out, K, rows, K // split, K if x.dim() == 2 else 0, NB=4, KB=kb,
                 WPTX=wptx or WORDS32_PTX["rot"], FPTX=FACTORS32_PTX, GATE_UP=gate_up, DEPTH=depth, READ_ONLY=read_only,
                 CONTIG=contig, num_warps=4)


def stored(w, s, pad_words):
    """Canonical bytes -> hopper_mma_rot int32 words, with a step of padding after the last expert."""
    Wl, Sl = (get_layout(n) for n in LAYOUT_SETS["hopper_mma_rot"])
    ws = Wl.forward(w).contiguous().view(torch.int32).reshape(-1)
    ss = Sl.forward(s).contiguous().view(torch.int32).reshape(-1)
    pad = torch.zeros(pad_words, dtype=torch.int32, device=w.device)
    return torch.cat([ws, pad]), torch.cat([ss, pad])


def layer_point(name, T):
    """A layer of shape name at T tokens as moe_bench draws it (seed 7): (H, I, E, top_k), the generator after
    the draw, canonical (w13, s13, w2, s2), routing (ids, tw), x [T, H] bf16 and the touched experts."""
    H, I, E, k = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(7)
    weights = make_weights(H, I, E, gen)
    ids, tw = routing(T, E, k, gen)
    x = torch.randn(T, H, device="cuda", generator=gen).bfloat16()
    return (H, I, E, k), gen, weights, (ids, tw), x, torch.unique(ids)


def bench(name, T, copy_bw, log, kinds=KINDS, quick=False):
    """Production per kernel at T tokens (real routing over all experts), then the streams over the
    touched experts' matrices, one token each (at T = 1 exactly the production work; past it the
    same bytes, with the few experts that get two pairs counted once)."""
    (H, I, E, k), gen, (w13, s13, w2, s2), (ids, tw), x, touched = layer_point(name, T)
    pairs = int(touched.numel())
    Wl, Sl = (get_layout(n) for n in LAYOUT_SETS["hopper_mma_rot"])
    bytes1 = pairs * (2 * I) * (H // 2 + H // 32)
    bytes2 = pairs * H * (I // 2 + I // 32)
    ncopy = max(1, -(-200_000_000 // (bytes1 + bytes2)))
    prods = [(Wl.forward(w13), Sl.forward(s13), Wl.forward(w2), Sl.forward(s2))]
    prods += [tuple(t.clone() for t in prods[0]) for _ in range(ncopy - 1)]
    cfg = select_config(T * k, E, H, I, "hopper_mma_rot")
    moes = [lambda p=p: fused_moe_triton(x, *p, tw, ids, activation="silu", activation_params={},
                                         layout="hopper_mma_rot") for p in prods]
    ktimes = kernel_times(moes[0], 20, flush=torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    t_moe = graph_time_us(moes)
    log(f"{name} T={T} production (hopper_mma_rot, {pairs} experts touched, block_t {cfg.block_t}, split_k1 "
        f"{cfg.split_k1}, split_k2 {cfg.split_k2}): {t_moe:.1f} us graph-replayed over {len(moes)} copies; "
        "kernels (us, L2 flushed, mean of 20): " + ", ".join(f"{n[:40]} {t:.1f}" for n, t in ktimes))
    del prods, moes

    k = pairs  # the streams: one matrix pair a touched expert, one token each
    w13, s13, w2, s2 = (t[touched] for t in (w13, s13, w2, s2))
    x = x[0]
    x2 = torch.randn(k, I, device="cuda", generator=gen).bfloat16()
    ref1 = torch.einsum("erk,k->er", dequantize_mxfp4(w13, s13).double(), x.double())
    ref2 = torch.einsum("erk,ek->er", dequantize_mxfp4(w2, s2).double(), x2.double())
    copies1 = max(2, -(-400_000_000 // bytes1))
    copies2 = max(2, -(-400_000_000 // bytes2))
    st1 = [stored(w13, s13, 8192) for _ in range(copies1)]
    st2 = [stored(w2, s2, 8192) for _ in range(copies2)]

    rows = []
    for gemm, (st, K, nrows, gate_up, xin, ref, nbytes) in (
            ("gemm1", (st1, H, 2 * I, True, x, ref1, bytes1)),
            ("gemm2", (st2, I, H, False, x2, ref2, bytes2))):
        splits = (1, 2, 4, 8)
        grid = [(ro, False, kb, d, sp) for ro in (False, True) for kb in (1, 2, 4) for d in (1, 2) for sp in splits
                if not quick or (kb < 4 and d == 1)]
        grid += [(ro, True, kb, 1, sp) for ro in (False, True) for kb in (1, 2, 4) for sp in splits]
        for ro, contig, kb, depth, split in grid:
            if K % (split * 64 * kb) or (K // split) // (64 * kb) < 2:
                continue
            if ("contig" if contig else "ro" if ro else "stream") not in kinds:
                continue
            programs = (nrows // 2 if gate_up else nrows) // 64 * k * split
            label = (f"{name} {gemm}{' read-only' if ro else ''}{' contiguous' if contig else ''} KB={kb} "
                     f"depth={depth} split={split}")
            shape = (programs * 160 * 4 * kb,) if ro else (split, k, nrows)
            outs = [torch.empty(shape, device="cuda", dtype=torch.int32 if ro else torch.float32) for _ in st]
            try:
                run_stream(*st[0], xin, outs[0], K, nrows, split, gate_up, kb, depth, ro, k, contig)
                torch.cuda.synchronize()
            except Exception as exc:  # a configuration that does not compile is a row, not a crash
                log(f"  {label}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            err = float("nan") if ro or contig else float((outs[0].double().sum(0) - ref).norm() / ref.norm())
            t = graph_time_us([lambda c=c: run_stream(*st[c], xin, outs[c], K, nrows, split, gate_up, kb, depth, ro, k,
                                                          contig)
                               for c in range(len(st))])
            rows.append((name, gemm + ("/ro" if ro else "") + ("/c" if contig else ""), kb, depth, split, programs, t,
                         nbytes / (t * 1e-6) / copy_bw, err, T))
            log(f"  {label}: {programs} programs, {t:.1f} us, {100 * rows[-1][7]:.1f}% copy, rel err {err:.1e}")
        descs_by_span = {}
        for kb, sub, stages, split in ((kb, sub, n, sp) for kb, sub, n in TMA_STREAM_RINGS for sp in splits):
            span = kb * sub
            if "tma_stream" not in kinds or K % (split * 64 * span) or K // (split * 64 * span) < stages:
                continue
            if span not in descs_by_span:
                descs_by_span[span] = [tma_descs(w, s, xin, K, span) for w, s in st]
            descs = descs_by_span[span]
            x_rows = xin.reshape(-1, K).shape[0]
            programs = (nrows // 2 if gate_up else nrows) // 16 * k * split
            outs = [torch.empty(split, k, nrows, device="cuda", dtype=torch.float32) for _ in st]
            label = f"{name} {gemm} TMA stream KB={kb} sub={sub} stages={stages} split={split}"
            try:
                run_tma_stream(descs[0], x_rows, outs[0], K, nrows, split, gate_up, kb, sub, stages, k)
                torch.cuda.synchronize()
            except Exception as exc:  # a configuration that does not compile is a row, not a crash
                log(f"  {label}: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            err = float((outs[0].double().sum(0) - ref).norm() / ref.norm())
            t = graph_time_us([lambda c=c: run_tma_stream(descs[c], x_rows, outs[c], K, nrows, split, gate_up, kb, sub,
                                                          stages, k) for c in range(len(st))])
            rows.append((name, gemm + "/tmas", kb * 10 + sub, stages, split, programs, t,
                         nbytes / (t * 1e-6) / copy_bw, err, T))
            log(f"  {label}: {programs} programs, {t:.1f} us, {100 * rows[-1][7]:.1f}% copy, rel err {err:.1e}")
        for kb, stages, split in ((kb, n, sp) for kb in (1, 2) for n in (2, 4, 8) for sp in splits):
            steps = K // (64 * kb) // split
            if "tma" not in kinds or K % (split * 64 * kb) or steps < stages:
                continue
            box = 128 * kb
            layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
            descs = [TensorDescriptor(w, [w.numel() // (2 * K), 2 * K], [2 * K, 1], [4, box], layout)
                     for w, _ in st]
            programs = (nrows // 2 if gate_up else nrows) // 64 * k * split
            outs = [torch.empty(programs * 4 * box, device="cuda", dtype=torch.int32) for _ in st]
            label = f"{name} {gemm} TMA read-only KB={kb} stages={stages} split={split}"
            try:
                run_tma(descs[0], outs[0], nrows, split, gate_up, kb, stages, k, K)
                torch.cuda.synchronize()
            except Exception as exc:  # a configuration that does not compile is a row, not a crash
                log(f"  {label}: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            t = graph_time_us([lambda c=c: run_tma(descs[c], outs[c], nrows, split, gate_up, kb, stages, k, K)
                               for c in range(len(st))])
            wbytes = k * nrows * K // 2  # the words only: the scales are not read here
            rows.append((name, gemm + "/tma", kb, stages, split, programs, t, wbytes / (t * 1e-6) / copy_bw,
                         float("nan"), T))
            log(f"  {label}: {programs} programs, {t:.1f} us, {100 * rows[-1][7]:.1f}% copy (weights only)")
    return rows


def start_log():
    """(log, its lines, the copy bandwidth in B/s): log prints a line and keeps it; the first names
    the GPU, the copy bandwidth measured now and the torch and triton versions."""
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    copy_bw = copy_bandwidth()
    log(f"{torch.cuda.get_device_name()} copy bandwidth {copy_bw / 1e12:.2f} TB/s; torch {torch.__version__}, "
        f"triton {triton.__version__}")
    return log, lines, copy_bw


def write_log(lines, out_dir, name):
    """The logged lines to out_dir/name (nothing without out_dir)."""
    if out_dir:
        with open(os.path.join(out_dir, name), "w") as f:
            f.write("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", default="dsv3:1,k3:1", help="shape:T, comma-separated")
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true",
                    help="the stream rows in 64- and 128-code steps one step ahead only")
    ap.add_argument("--kinds", default=",".join(KINDS), help="which rows, comma-separated, of " + ", ".join(KINDS))
    args = ap.parse_args()
    log, lines, copy_bw = start_log()
    table = []
    for point in args.points.split(","):
        name, T = point.split(":")
        table += bench(name, int(T), copy_bw, log, args.kinds.split(","), args.quick)
    hdr = (f"{'shape':6s} {'T':>4s} {'gemm':11s} {'KB':>3s} {'depth':>5s} {'split':>5s} {'progs':>6s} {'us':>8s} "
           f"{'%copy':>6s} {'relerr':>8s}")
    log(hdr)
    for r in table:
        log(f"{r[0]:6s} {r[9]:4d} {r[1]:11s} {r[2]:3d} {r[3]:5d} {r[4]:5d} {r[5]:6d} {r[6]:8.1f} {100 * r[7]:5.1f}% "
            f"{r[8]:8.1e}")
    write_log(lines, args.out, "gluon_t1_bench.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
