"""GEMM1 of the MoE layer over hopper_mma_xor (or _rot) weights on expert blocks, in Gluon with warpgroup MMAs
(wgmma): a program per (64 rows of gate and of up, pair block), the block's pairs the N columns. Each lane's weight
and scale words come with the block's x tile through a ring of shared-memory stages by cp.async, and the lane that
copied them decodes them into its A fragments (gluon_few_tokens' decode); the wgmmas read x from the ring. A fifth
fewer instructions a 128-code step than moe_hgemm1_kernel and bit-equal outputs. A block may run as two tiles on the
same decoded weights (DUAL), the second down to 8 pairs wide, which the hopper_mma kernels' tl.dot cannot take.
fused_moe_triton runs it where MoEConfig.wgmma1 asks (select_config: 32-pair blocks, and DSV3-like 64-pair ones with
32 + 8 tiles; benchmarks/results/performance-notebook.md, "GEMM1 of 32-pair blocks in gluon_wgmma" and "32 + 8 tiles
in gluon_wgmma").
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from mxfp4conv.kernels.triton_moe.gluon_few_tokens import _FPTX, _barrier, _decode, _offsets
from mxfp4conv.kernels.triton_moe.mma_kernels import _activate

# cp.async of a tile into shared memory: async_load from triton 3.9 on, async_copy_global_to_shared before
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@gluon.constexpr_function
def acc_layout(BT):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])


@gluon.constexpr_function
def a_layout(BT):
    return gl.DotOperandLayout(operand_index=0, parent=acc_layout(BT), k_width=2)


@gluon.constexpr_function
def x_shared_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, transposed=True)


@gluon.constexpr_function
def x_copy_layout(KB):
    """[64 KB, BT] x tile, codes contiguous: a lane copies 8 codes (16 bytes) of one column."""
    along = min(8 * KB, 32)
    return gl.BlockedLayout([8, 1], [along, 32 // along], [1, 4], [0, 1])


@gluon.constexpr_function
def words_ring_layout():
    """A ring stage of a lane's weight words ([NB, KB, 8, 4, 4], _offsets), read back by the lane that copied them."""
    return gl.SwizzledSharedLayout(1, 1, 1, [4, 3, 2, 1, 0])


@gluon.constexpr_function
def scales_ring_layout():
    """A ring stage of a lane's scale words ([NB, KB, 8, 4])."""
    return gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0])


@gluon.jit
def _expert(bexp_ptr, npp_ptr, BT: gl.constexpr):
    """Expert of pair block program_id(1); -1 past num_post_pad (and for a block on no local expert)."""
    m = gl.program_id(1)
    return gl.load(bexp_ptr + m, mask=m * BT < gl.load(npp_ptr), other=-1).to(gl.int64)


@gluon.jit
def _pairs_in(sorted_ptr, num_pairs, BT: gl.constexpr):
    """Number of pairs in pair block program_id(1) (they fill its first slots)."""
    slots = sorted_ptr + gl.program_id(1) * BT + gl.arange(0, BT, layout=gl.BlockedLayout([1], [32], [4], [0]))
    return gl.sum((gl.load(slots) < num_pairs).to(gl.int32), axis=0)


@gluon.jit
def wg_gemm1(w_ptr, s_ptr, x_ptr, sorted_ptr, bexp_ptr, npp_ptr, b_ptr, inter_ptr, num_pairs, TOP_K, K, I, p0, p1,
             KB: gl.constexpr, BT: gl.constexpr, TAIL: gl.constexpr, STAGES: gl.constexpr, ACT: gl.constexpr,
             HAS_LIMIT: gl.constexpr, HAS_LINEAR: gl.constexpr, HAS_BIAS: gl.constexpr, WPTX: gl.constexpr = None,
             DUAL: gl.constexpr = 0):
    """inter[pair, rows] = act(gate . x[pair // TOP_K] + b, up . x + b) for pair block program_id(1) (BT slots) and
    rows [64 rb, 64 rb + 64), rb = program_id(0): in a [64, TAIL] tile where the block holds at most TAIL pairs
    (TAIL 0: never), else a [64, BT] one. DUAL: up to 1.5 TAIL pairs in a [64, TAIL] and a [64, TAIL / 2] tile on
    the same decoded weights; DUAL 2 also up to 1.25 TAIL in [64, TAIL] and [64, TAIL / 4] (8 pairs wide where TAIL
    is 32: warpgroup MMAs take 8-wide tiles). STAGES: the ring's depth."""
    m = gl.program_id(1)
    e = _expert(bexp_ptr, npp_ptr, BT)
    if e >= 0:
        rb = gl.program_id(0)
        w_ptr += e * (2 * I * (K // 8)) + rb * 4 * (2 * K)
        s_ptr += e * (2 * I * K // 128) + rb * 4 * (K // 8)
        slots = sorted_ptr + m * BT
        if TAIL > 0:
            n = _pairs_in(sorted_ptr, num_pairs, BT)
            if n <= TAIL:
                _wg_tile(w_ptr, s_ptr, x_ptr, slots, b_ptr, inter_ptr, e, rb, num_pairs, TOP_K, K, I, p0, p1, KB,
                         TAIL, STAGES, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, WPTX)
            elif DUAL == 2 and n <= TAIL + TAIL // 4:
                _wg_tile(w_ptr, s_ptr, x_ptr, slots, b_ptr, inter_ptr, e, rb, num_pairs, TOP_K, K, I, p0, p1, KB,
                         TAIL, STAGES, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, WPTX, TAIL // 4)
            elif DUAL > 0 and n <= TAIL + TAIL // 2:
                _wg_tile(w_ptr, s_ptr, x_ptr, slots, b_ptr, inter_ptr, e, rb, num_pairs, TOP_K, K, I, p0, p1, KB,
                         TAIL, STAGES, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, WPTX, TAIL // 2)
            else:
                _wg_tile(w_ptr, s_ptr, x_ptr, slots, b_ptr, inter_ptr, e, rb, num_pairs, TOP_K, K, I, p0, p1, KB,
                         BT, STAGES, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, WPTX)
        else:
            _wg_tile(w_ptr, s_ptr, x_ptr, slots, b_ptr, inter_ptr, e, rb, num_pairs, TOP_K, K, I, p0, p1, KB, BT,
                     STAGES, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, WPTX)


@gluon.jit
def _x_tile(x_ptr, slots_ptr, num_pairs, TOP_K, K, KB: gl.constexpr, BT: gl.constexpr):
    """The pairs in slots slots_ptr[0:BT] (the copy layout), the pointers [64 KB, BT] at code 0 of their rows of x
    (row pair // TOP_K) and their mask."""
    XL: gl.constexpr = x_copy_layout(KB)
    pair_x = gl.load(slots_ptr + gl.arange(0, BT, layout=gl.SliceLayout(0, XL)))
    ok_x = pair_x < num_pairs
    tok = gl.where(ok_x, pair_x // TOP_K, 0)
    xk = gl.arange(0, 64 * KB, layout=gl.SliceLayout(1, XL))
    x_ptrs = x_ptr + (tok[None, :] * K + xk[:, None])  # (int32 offsets: the callers check rows K < 2**31)
    return pair_x, x_ptrs, ok_x[None, :] & (xk[:, None] >= 0)


@gluon.jit
def _wg_tile(w_ptr, s_ptr, x_ptr, slots_ptr, b_ptr, inter_ptr, e, rb, num_pairs, TOP_K, K, I, p0, p1,
             KB: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr, ACT: gl.constexpr, HAS_LIMIT: gl.constexpr,
             HAS_LINEAR: gl.constexpr, HAS_BIAS: gl.constexpr, WPTX: gl.constexpr, BT2: gl.constexpr = 0):
    """GEMM1's K loop and epilogue for the [64, BT] tile of the pairs in slots slots_ptr[0:BT]; BT2 > 0: also a
    [64, BT2] tile of the pairs in the next BT2 slots, on the same decoded weights."""
    S: gl.constexpr = 64 * KB
    pair_x, x_ptrs, x_mask = _x_tile(x_ptr, slots_ptr, num_pairs, TOP_K, K, KB, BT)
    up_w = (I // 16) * (2 * K)
    up_s = (I // 16) * (K // 8)
    w_off, s_off = _offsets(K, 4, KB)
    xs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, S, BT], x_shared_layout())
    steps = K // S
    if BT2 > 0:
        pair_x2, x_ptrs2, x_mask2 = _x_tile(x_ptr, slots_ptr + BT, num_pairs, TOP_K, K, KB, BT2)
        xs2 = gl.allocate_shared_memory(gl.bfloat16, [STAGES, S, BT2], x_shared_layout())
        acc_g, acc_u, acc_g2, acc_u2 = _ring_k_loop(w_ptr, s_ptr, x_ptrs, x_mask, xs, w_off, s_off, up_w, up_s, steps,
                                                    KB, BT, STAGES, WPTX, x_ptrs2, x_mask2, xs2, BT2)
    else:
        acc_g, acc_u, _, _ = _ring_k_loop(w_ptr, s_ptr, x_ptrs, x_mask, xs, w_off, s_off, up_w, up_s, steps, KB, BT,
                                          STAGES, WPTX, x_ptrs, x_mask, xs, 0)
    async_copy.wait_group(0)
    _wg_store(acc_g, acc_u, pair_x, b_ptr, inter_ptr, e, rb, num_pairs, I, p0, p1, BT, ACT, HAS_LIMIT, HAS_LINEAR,
              HAS_BIAS)
    if BT2 > 0:
        _wg_store(acc_g2, acc_u2, pair_x2, b_ptr, inter_ptr, e, rb, num_pairs, I, p0, p1, BT2, ACT, HAS_LIMIT,
                  HAS_LINEAR, HAS_BIAS)


@gluon.jit
def _wg_store(acc_g, acc_u, pair_x, b_ptr, inter_ptr, e, rb, num_pairs, I, p0, p1, BT: gl.constexpr,
              ACT: gl.constexpr, HAS_LIMIT: gl.constexpr, HAS_LINEAR: gl.constexpr, HAS_BIAS: gl.constexpr):
    """GEMM1's epilogue for a [64, BT] tile: bias, activation, the bf16 rows of its pairs into inter."""
    ACC: gl.constexpr = acc_layout(BT)
    rows = rb * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, ACC))
    if HAS_BIAS:
        acc_g += gl.load(b_ptr + e * (2 * I) + rows).to(gl.float32)[:, None]
        acc_u += gl.load(b_ptr + e * (2 * I) + I + rows).to(gl.float32)[:, None]
    h = _activate(acc_g, acc_u, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR).to(gl.bfloat16)
    pair = gl.convert_layout(pair_x, gl.SliceLayout(0, ACC))
    ok = pair < num_pairs
    gl.store(inter_ptr + pair[None, :].to(gl.int64) * I + rows[:, None], h, mask=ok[None, :] & (rows[:, None] >= 0))


@gluon.jit
def _ring_k_loop(w_ptr, s_ptr, x_ptrs, x_mask, xs, w_off, s_off, up_w, up_s, steps, KB: gl.constexpr,
                 BT: gl.constexpr, STAGES: gl.constexpr, WPTX: gl.constexpr, x_ptrs2, x_mask2, xs2, BT2: gl.constexpr):
    """GEMM1's K loop with each lane's words brought by cp.async into a ring of shared-memory stages beside the x
    tile's (a stage's words read back by the lane that copied them), each matrix's MMAs waited for at once: (gate,
    up) sums [64, BT], and with BT2 > 0 those of the second tile [64, BT2] (x_ptrs2, xs2; else the first's again)."""
    ACC: gl.constexpr = acc_layout(BT)
    A_OP: gl.constexpr = a_layout(BT)
    S: gl.constexpr = 64 * KB
    wgs = gl.allocate_shared_memory(gl.int32, [STAGES] + list(w_off.shape), words_ring_layout())
    wus = gl.allocate_shared_memory(gl.int32, [STAGES] + list(w_off.shape), words_ring_layout())
    sgs = gl.allocate_shared_memory(gl.int32, [STAGES] + list(s_off.shape), scales_ring_layout())
    sus = gl.allocate_shared_memory(gl.int32, [STAGES] + list(s_off.shape), scales_ring_layout())
    for i in gl.static_range(STAGES - 1):
        _ring_issue(w_ptr, s_ptr, x_ptrs, x_mask, xs, wgs, sgs, wus, sus, w_off, s_off, up_w, up_s, i, i, S, x_ptrs2,
                    x_mask2, xs2, BT2)
    acc_g = gl.zeros([64, BT], gl.float32, layout=ACC)
    acc_u = gl.zeros([64, BT], gl.float32, layout=ACC)
    if BT2 > 0:
        acc_g2 = gl.zeros([64, BT2], gl.float32, layout=acc_layout(BT2))
        acc_u2 = gl.zeros([64, BT2], gl.float32, layout=acc_layout(BT2))
    else:
        acc_g2 = acc_g
        acc_u2 = acc_u
    for i in range(steps):
        async_copy.wait_group(STAGES - 2)  # step i's tiles are in
        _barrier()  # and every warp is past step i - 1, whose stage the next copies take
        j = i + STAGES - 1
        _ring_issue(w_ptr, s_ptr, x_ptrs, x_mask, xs, wgs, sgs, wus, sus, w_off, s_off, up_w, up_s,
                    gl.minimum(j, steps - 1), j % STAGES, S, x_ptrs2, x_mask2, xs2, BT2)
        hopper.fence_async_shared()
        st = i % STAGES
        x = xs.index(st)
        acc_g, acc_g2 = _matrix_mmas(wgs.index(st), sgs.index(st), w_off, s_off, x, xs2, st, acc_g, acc_g2, KB, A_OP,
                                     WPTX, BT2)
        acc_u, acc_u2 = _matrix_mmas(wus.index(st), sus.index(st), w_off, s_off, x, xs2, st, acc_u, acc_u2, KB, A_OP,
                                     WPTX, BT2)
    return acc_g, acc_u, acc_g2, acc_u2


@gluon.jit
def _matrix_mmas(ws, ss, w_off, s_off, x, xs2, st, acc, acc2, KB: gl.constexpr, A_OP: gl.constexpr,
                 WPTX: gl.constexpr, BT2: gl.constexpr):
    """One matrix's (gate or up) step: its words and scales of ring stage st decoded into A fragments, their MMAs on
    the x tile and, with BT2 > 0, on the second tile's (xs2's stage st), waited for at once."""
    a = gl.convert_layout(_decode(ws.load(w_off.type.layout), ss.load(s_off.type.layout), 4, KB, WPTX, _FPTX), A_OP)
    acc = hopper.warpgroup_mma(a, x, acc, is_async=True)
    if BT2 > 0:
        acc2 = hopper.warpgroup_mma(gl.convert_layout(a, a_layout(BT2)), xs2.index(st), acc2, is_async=True)
        acc, acc2 = hopper.warpgroup_mma_wait(0, deps=[acc, acc2])
    else:
        acc = hopper.warpgroup_mma_wait(0, deps=[acc])
    return acc, acc2


@gluon.jit
def _ring_issue(w_ptr, s_ptr, x_ptrs, x_mask, xs, wgs, sgs, wus, sus, w_off, s_off, up_w, up_s, step, st, S, x_ptrs2,
                x_mask2, xs2, BT2: gl.constexpr):
    """One commit group of cp.async: step's x tile (and the second tile's with BT2 > 0) and gate / up words and scale
    words into ring stage st."""
    k = step * S
    _async_load(xs.index(st), x_ptrs + k, mask=x_mask)
    if BT2 > 0:
        _async_load(xs2.index(st), x_ptrs2 + k, mask=x_mask2)
    _words_issue(w_ptr, s_ptr, wgs, sgs, w_off, s_off, k, st)
    _words_issue(w_ptr + up_w, s_ptr + up_s, wus, sus, w_off, s_off, k, st)
    async_copy.commit_group()


@gluon.jit
def _words_issue(w_ptr, s_ptr, ws, ss, w_off, s_off, k, st):
    """cp.async of a lane's words and scale words at code k into ring stage st (no commit)."""
    _async_load(ws.index(st), w_ptr + w_off + k * 2)
    _async_load(ss.index(st), s_ptr + s_off + k // 8)
