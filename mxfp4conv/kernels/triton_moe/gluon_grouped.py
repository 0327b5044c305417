"""The MoE layer over hopper_mma_xor (or _rot) weights in two Gluon MMA v2 kernels on expert blocks: the
(token, expert) pairs sorted by expert into blocks of BT (moe_align), a program per (64-row block,
pair block), each block's tokens the N columns of its m16n8k16 MMAs; the pairs' outputs summed over
k by the Triton k-sum kernel. The decode and K loop are gluon_few_tokens'; this covers the batches
past its limit where an expert still sees few pairs (fused_moe_triton takes it where grouped_takes
says: measured on an H200 in benchmarks/results/performance-notebook.md). As measured fastest there: GEMM1's x
tile loaded once a program and read by its warps through shared memory, the intermediate rows in
gluon_few_tokens.fragment_order, GEMM2's B operand unmasked, and the chain align -> GEMM1 -> GEMM2 -> k-sum by
programmatic dependent launch where Triton has it. benchmarks/gpu_check.py checks its results
on a
GPU, benchmarks/moe_bench.py --variants times it.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from mxfp4conv.kernels.triton_moe.gluon_few_tokens import (_FPTX, A_OP, B_OP, MMA, ROWS, WORDS32_PTX, _barrier, _cap,
                                                         _decode, _frag_cols, _fragment_ptrs, _fragments, _k_loop,
                                                         _offsets, _words, fragment_order, shared_x_layout)
from mxfp4conv.kernels.triton_moe.hopper_kernels import _arrive, _gdc_launch, _gdc_wait
from mxfp4conv.kernels.triton_moe.mma_kernels import _activate

COLS = gl.constexpr(gl.SliceLayout(0, MMA))  # a tile's pair columns


@gluon.jit
def _block(sorted_ptr, bexp_ptr, npp_ptr, num_pairs, BT: gl.constexpr, LAYOUT: gl.constexpr):
    """(live, expert, pairs, pair mask) of pair block program_id(1) (padding slots hold num_pairs;
    blocks past num_post_pad are not live)."""
    m = gl.program_id(1)
    live = m * BT < gl.load(npp_ptr)
    e = gl.load(bexp_ptr + m).to(gl.int64)
    pair = gl.load(sorted_ptr + m * BT + gl.arange(0, BT, layout=LAYOUT))
    return live, e, pair, pair < num_pairs


@gluon.jit
def grp_gemm1(w_ptr, s_ptr, x_ptr, sorted_ptr, bexp_ptr, npp_ptr, b_ptr, inter_ptr, part_ptr, cnt_ptr, num_pairs,
              TOP_K, K, I, K_SPLIT, p0, p1, KB: gl.constexpr, BT: gl.constexpr, ACT: gl.constexpr,
              HAS_LIMIT: gl.constexpr, HAS_LINEAR: gl.constexpr, HAS_BIAS: gl.constexpr, SPLITS: gl.constexpr,
              FRAG_KB: gl.constexpr, MASKED: gl.constexpr = True, UNROLL: gl.constexpr = 1, PDL: gl.constexpr = False,
              WPTX: gl.constexpr = None):
    """inter[pair, rows] = act(gate . x[pair // TOP_K] + b, up . x + b) for the block's pairs and its
    expert, rows [64 rb, 64 rb + 64), stored in fragment_order for GEMM2 steps of 64 FRAG_KB codes. SPLITS > 1: a
    program per K split (program_id(2)) stores its fp32 partials at part[split, pair, gate / up]; the last of a
    tile's splits to arrive sums them in split order and finishes the tile. Each warp loads a quarter of a step's x
    tile, which the four read through shared memory. MASKED: the padding slots' x read as 0 (else token 0's; their
    columns are not stored). UNROLL: the K loop over single steps (1) or pairs (2). PDL: launched as a programmatic
    dependent of the align, waited for before its blocks are read, and GEMM2 (its dependent) may launch once the K
    loop is done. WPTX: the words' decode (gluon_few_tokens.WORDS32_PTX)."""
    if PDL:
        _gdc_wait()
    XL: gl.constexpr = shared_x_layout(KB)
    live, e, pair_x, ok_x = _block(sorted_ptr, bexp_ptr, npp_ptr, num_pairs, BT, gl.SliceLayout(0, XL))
    if live:
        rb = gl.program_id(0)
        xk = gl.arange(0, 64 * KB, layout=gl.SliceLayout(1, XL))
        tok = gl.where(ok_x, pair_x // TOP_K, 0).to(gl.int64)
        x_ptrs = x_ptr + tok[None, :] * K + xk[:, None]
        x_mask = ok_x[None, :] & (xk[:, None] >= 0)
        w_ptr += e * (2 * I * (K // 8)) + rb * 4 * (2 * K)
        s_ptr += e * (2 * I * K // 128) + rb * 4 * (K // 8)
        g, u = _k_loop(w_ptr, s_ptr, x_ptrs, x_mask, K, gl.program_id(2) * K_SPLIT, K_SPLIT, (I // 16) * (2 * K),
                       (I // 16) * (K // 8), KB, True, False, MASKED, False, True, UNROLL=UNROLL, WPTX=WPTX)
        if PDL:
            _gdc_launch()
        rows = rb * 64 + gl.arange(0, 64, layout=ROWS)
        pair = gl.convert_layout(pair_x, COLS)
        ok = pair < num_pairs
        tile_mask = ok[None, :] & (rows[:, None] >= 0)
        if SPLITS > 1:
            part = part_ptr + pair[None, :].to(gl.int64) * (2 * I) + rows[:, None]
            split_stride = num_pairs.to(gl.int64) * (2 * I)
            gl.store(part + gl.program_id(2) * split_stride, g, mask=tile_mask)
            gl.store(part + gl.program_id(2) * split_stride + I, u, mask=tile_mask)
            _barrier()
            if _arrive(cnt_ptr + gl.program_id(1) * gl.num_programs(0) + rb, SPLITS):
                _barrier()
                g = gl.zeros(g.shape, gl.float32, layout=MMA)
                u = gl.zeros(u.shape, gl.float32, layout=MMA)
                for sp in range(SPLITS):
                    g += gl.load(part + sp * split_stride, mask=tile_mask, other=0.0)
                    u += gl.load(part + sp * split_stride + I, mask=tile_mask, other=0.0)
                _gemm1_tile_tail(g, u, e, rows, pair, tile_mask, b_ptr, inter_ptr, I, p0, p1, ACT, HAS_LIMIT,
                                 HAS_LINEAR, HAS_BIAS, FRAG_KB)
        else:
            _gemm1_tile_tail(g, u, e, rows, pair, tile_mask, b_ptr, inter_ptr, I, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR,
                             HAS_BIAS, FRAG_KB)


@gluon.jit
def _gemm1_tile_tail(g, u, e, rows, pair, tile_mask, b_ptr, inter_ptr, I, p0, p1, ACT: gl.constexpr,
                     HAS_LIMIT: gl.constexpr, HAS_LINEAR: gl.constexpr, HAS_BIAS: gl.constexpr,
                     FRAG_KB: gl.constexpr):
    """Bias, activation and the bf16 intermediate rows of a tile's complete gate / up sums, in fragment_order for
    GEMM2 steps of 64 FRAG_KB codes."""
    if HAS_BIAS:
        g += gl.load(b_ptr + e * (2 * I) + rows).to(gl.float32)[:, None]
        u += gl.load(b_ptr + e * (2 * I) + I + rows).to(gl.float32)[:, None]
    h = _activate(g, u, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR).to(gl.bfloat16)
    rows = fragment_order(rows, FRAG_KB)
    gl.store(inter_ptr + pair[None, :].to(gl.int64) * I + rows[:, None], h, mask=tile_mask)


@gluon.jit
def _block_loads(w_ptr, s_ptr, w_off, s_off, r, k, K):
    """A lane's weight and scale words at code k of 64-row block r past w_ptr / s_ptr."""
    return gl.load(w_ptr + w_off + r * (8 * K) + k * 2), gl.load(s_ptr + s_off + r * (K // 2) + k // 8)


@gluon.jit
def _next_step(r, kk, steps, BLOCKS: gl.constexpr, KB: gl.constexpr):
    """(block, code) of the step after step kk of block r in a loop over BLOCKS blocks of steps K
    steps; the last step's is the last block's first (loaded again, nothing past the loop is read)."""
    wrap = (kk + 1) // steps
    return gl.minimum(r + wrap, BLOCKS - 1), (kk + 1 - wrap * steps) * (64 * KB)


@gluon.jit
def grp_gemm2(w_ptr, s_ptr, inter_ptr, sorted_ptr, bexp_ptr, npp_ptr, b_ptr, tw_ptr, pair_out_ptr, num_pairs, K, N,
              KB: gl.constexpr, BT: gl.constexpr, HAS_BIAS: gl.constexpr, BLOCKS: gl.constexpr,
              NB: gl.constexpr = 4, UNROLL: gl.constexpr = 1, PDL: gl.constexpr = False,
              RELEASE: gl.constexpr = False, WPTX: gl.constexpr = None):
    """pair_out[pair, rows] = tw[pair] * (w2[e] rows . inter[pair] + b2[e] rows) for the block's pairs,
    BLOCKS 64-row blocks a program (more than one: in one loop, the next block's first words loaded during the last
    step of this one; one: a block of 16 NB rows), in pair_out's dtype; inter's rows in fragment_order, a padding
    slot's B operand read from pair 0's row (its column is never stored). UNROLL (one block a program): the K loop
    over single steps (1) or pairs (2). PDL: launched as a programmatic dependent of GEMM1, whose output is waited
    for after the first weight loads. RELEASE: the kernel after it (a programmatic dependent) may launch from its
    start. WPTX: the words' decode."""
    if RELEASE:
        _gdc_launch()
    live, e, pair_x, _ok = _block(sorted_ptr, bexp_ptr, npp_ptr, num_pairs, BT, gl.SliceLayout(0, B_OP))
    if live:
        rb = gl.program_id(0) * BLOCKS  # (in blocks of 16 NB rows)
        pf = gl.convert_layout(pair_x, _frag_cols(KB))
        x_ptrs = _fragment_ptrs(inter_ptr + gl.where(pf < num_pairs, pf, 0).to(gl.int64) * K, KB)
        w_ptr += e * (N * (K // 8)) + rb * NB * (2 * K)
        s_ptr += e * (N * K // 128) + rb * NB * (K // 8)
        if BLOCKS == 1:
            y, _ = _k_loop(w_ptr, s_ptr, x_ptrs, 0, K, 0, K, 0, 0, KB, False, PDL, False, True, False, NB, UNROLL,
                           WPTX)
            _gemm2_tile_tail(y, e, rb, pair_x, num_pairs, b_ptr, tw_ptr, pair_out_ptr, N, HAS_BIAS)
        else:
            steps = K // (64 * KB)
            w_off, s_off = _offsets(K, 4, KB)
            w, s = _block_loads(w_ptr, s_ptr, w_off, s_off, 0, 0, K)
            if PDL:
                _gdc_wait()
            for r in range(BLOCKS):
                acc = gl.zeros([64, BT], gl.float32, layout=MMA)
                for kk in range(steps):
                    r_n, k_n = _next_step(r, kk, steps, BLOCKS, KB)
                    w_n, s_n = _block_loads(w_ptr, s_ptr, w_off, s_off, r_n, k_n, K)
                    x = _fragments(x_ptrs + kk * (64 * KB), KB)
                    acc = mma_v2(gl.convert_layout(_decode(w, s, 4, KB, WPTX, _FPTX), A_OP), x, acc)
                    w = w_n
                    s = s_n
                _gemm2_tile_tail(acc, e, rb + r, pair_x, num_pairs, b_ptr, tw_ptr, pair_out_ptr, N, HAS_BIAS)


@gluon.jit
def _gemm2_tile_tail(y, e, rb, pair_x, num_pairs, b_ptr, tw_ptr, pair_out_ptr, N, HAS_BIAS: gl.constexpr):
    """Bias and routing weight of row block rb's complete sums (y [R, pairs]: rows [R rb, R rb + R)), stored at the
    block's pairs' rows."""
    R: gl.constexpr = y.shape[0]
    rows = rb * R + gl.arange(0, R, layout=ROWS)
    if HAS_BIAS:
        y += gl.load(b_ptr + e * N + rows).to(gl.float32)[:, None]
    pair = gl.convert_layout(pair_x, COLS)
    ok = pair < num_pairs
    y = y * gl.load(tw_ptr + pair, mask=ok, other=0.0).to(gl.float32)[None, :]
    gl.store(pair_out_ptr + pair[None, :].to(gl.int64) * N + rows[:, None],
             y.to(pair_out_ptr.dtype.element_ty), mask=ok[None, :] & (rows[:, None] >= 0))


def forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, act, align, k_sum, *,
            k1: int, k2: int, block_t: int, splits1: int = 1, blocks2: int = 1, masked: bool = True,
            rows2: int = 64, unroll: tuple[int, int] = (1, 1), maxnreg: tuple[int, int] = (0, 0), pdl: bool = False,
            release2: bool = False, order: str) -> torch.Tensor:
    """The layer for x [T, H] bf16 (contiguous tensors of the hopper_mma layout whose words are in ``order``, "xor" or
    "rot" (WORDS32_PTX), scales <= 2): align the pairs with align(block_t) -> (sorted_ids, block_expert,
    num_post_pad, max_blocks), run both GEMMs (GEMM1 in splits1 K splits, dividing H into whole steps of k1; GEMM2 in
    programs of blocks2 64-row blocks, dividing H / 64), and return k_sum(pair_out [1, T k, H]), the caller's sum
    over k. masked: GEMM1's x operand masked at the padding slots (unmasked, a padding slot reads row 0 into a
    column that is never stored). rows2: with one block a program, GEMM2's rows a program (64, 128 or 256 dividing
    H). unroll: GEMM1's / GEMM2's (one block a program) K loop over single steps (1) or pairs (2); maxnreg: their
    register caps, 0 none. pdl: GEMM1 a programmatic dependent of the align (align releases it) and GEMM2 one of
    GEMM1; release2: k_sum's kernel one of GEMM2 (GEMM2 releases it from its start)."""
    E, two_i, _ = w13.shape
    T, H = x.shape
    I = two_i // 2
    k = topk_ids.shape[1]
    pairs = T * k
    sorted_ids, block_expert, num_post_pad, max_blocks = align(block_t)
    inter = torch.empty(pairs, I, dtype=torch.bfloat16, device=x.device)
    pair_out = torch.empty(1, pairs, H, dtype=x.dtype, device=x.device)
    tw = topk_weights.reshape(-1)
    part, cnt = inter, sorted_ids  # (unread without splits)
    if splits1 > 1:
        part = torch.empty(splits1, pairs, 2, I, dtype=torch.float32, device=x.device)
        cnt = torch.zeros(max_blocks * (I // 64), dtype=torch.int32, device=x.device)
    grp_gemm1[(I // 64, max_blocks, splits1)](
        _words(w13), _words(w13_scale), x, sorted_ids, block_expert, num_post_pad,
        w13_bias if w13_bias is not None else inter, inter, part, cnt, pairs, k, H, I, H // splits1, act["p0"],
        act["p1"], KB=k1 // 64, BT=block_t, ACT=act["ACT"], HAS_LIMIT=act["HAS_LIMIT"], HAS_LINEAR=act["HAS_LINEAR"],
        HAS_BIAS=w13_bias is not None, SPLITS=splits1, FRAG_KB=k2 // 64, MASKED=masked, UNROLL=unroll[0], PDL=pdl,
        WPTX=WORDS32_PTX[order], num_warps=4, **_cap(maxnreg[0]),
        **({"launch_pdl": True} if pdl else {}))
    rows2 = rows2 if blocks2 == 1 else 64
    grp_gemm2[(H // rows2 // blocks2, max_blocks)](
        _words(w2), _words(w2_scale), inter, sorted_ids, block_expert, num_post_pad,
        w2_bias if w2_bias is not None else pair_out, tw, pair_out, pairs, I, H, KB=k2 // 64, BT=block_t,
        HAS_BIAS=w2_bias is not None, BLOCKS=blocks2, NB=rows2 // 16, UNROLL=unroll[1], PDL=pdl, RELEASE=release2,
        WPTX=WORDS32_PTX[order], num_warps=4,
        **_cap(maxnreg[1]),
        **({"launch_pdl": True} if pdl else {}))
    return k_sum(pair_out)
