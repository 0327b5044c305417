"""The MoE layer's GEMMs over hopper_mma_xor (or _rot) weights on expert blocks, in Gluon with warpgroup MMAs
(wgmma). GEMM1: a program per (64 rows of gate and of up, pair block), the block's pairs the N columns. Each lane
loads its weight words straight into registers a step ahead (or through the x tile's ring) and decodes them into its
A fragments (gluon_few_tokens' decode); the block's x tile comes into a ring of shared-memory stages by cp.async,
from which the wgmmas read it. GEMM2 the same way over 64 or 128 rows of w2. A fifth fewer instructions a 128-code
step than the hopper_mma kernels and bit-equal outputs. A block may run as two tiles on the same decoded weights
(DUAL), the second down to 8 pairs wide, which the hopper_mma kernels' tl.dot cannot take. fused_moe_triton runs them
where MoEConfig.wgmma1 / wgmma2 ask: select_config asks for GEMM1 with the words through the ring on 32-pair blocks,
where it is faster on an H200 and an H100, and with 32 + 8 tiles on DSV3-like 64-pair ones, faster on an H100
(benchmarks/results/performance-notebook.md, sections "32 + 8 tiles in gluon_wgmma", "GEMM1 of 32-pair blocks in
gluon_wgmma" and "GEMM1
and GEMM2 in Gluon with warpgroup MMAs").
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
             HAS_LIMIT: gl.constexpr, HAS_LINEAR: gl.constexpr, HAS_BIAS: gl.constexpr, OVERLAP: gl.constexpr = 3,
             EARLY: gl.constexpr = False, RING: gl.constexpr = False, WPTX: gl.constexpr = None,
             DUAL: gl.constexpr = 0):
    """inter[pair, rows] = act(gate . x[pair // TOP_K] + b, up . x + b) for pair block program_id(1) (BT slots) and
    rows [64 rb, 64 rb + 64), rb = program_id(0): in a [64, TAIL] tile where the block holds at most TAIL pairs
    (TAIL 0: never), else a [64, BT] one. DUAL (the ring form only): up to 1.5 TAIL pairs in a [64, TAIL] and a
    [64, TAIL / 2] tile on the same decoded weights; DUAL 2 also up to 1.25 TAIL in [64, TAIL] and [64, TAIL / 4]
    (8 pairs wide where TAIL is 32: warpgroup MMAs take 8-wide tiles). OVERLAP (bit 0: the BT tile, bit 1: the TAIL
    tile): each warpgroup MMA runs while the next matrix's rows decode (else it is waited for at once). EARLY: a
    step's next words are loaded at its start (else each matrix's once its words are decoded, into their registers).
    RING: the words come through the x tile's ring of shared-memory stages by cp.async instead (each MMA waited for at
    once)."""
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
                         TAIL, STAGES, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, (OVERLAP >> 1) & 1, EARLY, RING, WPTX)
            elif DUAL == 2 and n <= TAIL + TAIL // 4:
                _wg_tile(w_ptr, s_ptr, x_ptr, slots, b_ptr, inter_ptr, e, rb, num_pairs, TOP_K, K, I, p0, p1, KB,
                         TAIL, STAGES, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, 0, EARLY, RING, WPTX, TAIL // 4)
            elif DUAL > 0 and n <= TAIL + TAIL // 2:
                _wg_tile(w_ptr, s_ptr, x_ptr, slots, b_ptr, inter_ptr, e, rb, num_pairs, TOP_K, K, I, p0, p1, KB,
                         TAIL, STAGES, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, 0, EARLY, RING, WPTX, TAIL // 2)
            else:
                _wg_tile(w_ptr, s_ptr, x_ptr, slots, b_ptr, inter_ptr, e, rb, num_pairs, TOP_K, K, I, p0, p1, KB,
                         BT, STAGES, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, OVERLAP & 1, EARLY, RING, WPTX)
        else:
            _wg_tile(w_ptr, s_ptr, x_ptr, slots, b_ptr, inter_ptr, e, rb, num_pairs, TOP_K, K, I, p0, p1, KB, BT,
                     STAGES, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS, OVERLAP & 1, EARLY, RING, WPTX)


@gluon.jit
def _x_tile(x_ptr, slots_ptr, num_pairs, TOP_K, K, KB: gl.constexpr, BT: gl.constexpr):
    """The pairs in slots slots_ptr[0:BT] (the copy layout), the pointers [64 KB, BT] at code 0 of their rows of x
    (row pair // TOP_K: GEMM1's x, TOP_K 1: GEMM2's intermediate) and their mask."""
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
             HAS_LINEAR: gl.constexpr, HAS_BIAS: gl.constexpr, OVERLAP: gl.constexpr, EARLY: gl.constexpr,
             RING: gl.constexpr, WPTX: gl.constexpr, BT2: gl.constexpr = 0):
    """GEMM1's K loop and epilogue for the [64, BT] tile of the pairs in slots slots_ptr[0:BT]; BT2 > 0 (the ring
    form): also a [64, BT2] tile of the pairs in the next BT2 slots, on the same decoded weights."""
    S: gl.constexpr = 64 * KB
    pair_x, x_ptrs, x_mask = _x_tile(x_ptr, slots_ptr, num_pairs, TOP_K, K, KB, BT)
    up_w = (I // 16) * (2 * K)
    up_s = (I // 16) * (K // 8)
    w_off, s_off = _offsets(K, 4, KB)
    xs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, S, BT], x_shared_layout())
    steps = K // S
    if BT2 > 0:
        gl.static_assert(RING, "two tiles a block in the ring form only")
        pair_x2, x_ptrs2, x_mask2 = _x_tile(x_ptr, slots_ptr + BT, num_pairs, TOP_K, K, KB, BT2)
        xs2 = gl.allocate_shared_memory(gl.bfloat16, [STAGES, S, BT2], x_shared_layout())
        acc_g, acc_u, acc_g2, acc_u2 = _ring_k_loop(w_ptr, s_ptr, x_ptrs, x_mask, xs, w_off, s_off, up_w, up_s, steps,
                                                    KB, BT, STAGES, WPTX, x_ptrs2, x_mask2, xs2, BT2)
    elif RING:
        acc_g, acc_u, _, _ = _ring_k_loop(w_ptr, s_ptr, x_ptrs, x_mask, xs, w_off, s_off, up_w, up_s, steps, KB, BT,
                                          STAGES, WPTX, x_ptrs, x_mask, xs, 0)
    else:
        acc_g, acc_u = _reg_k_loop(w_ptr, s_ptr, x_ptrs, x_mask, xs, w_off, s_off, up_w, up_s, steps, KB, BT, STAGES,
                                   OVERLAP, EARLY, WPTX)
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
def _reg_k_loop(w_ptr, s_ptr, x_ptrs, x_mask, xs, w_off, s_off, up_w, up_s, steps, KB: gl.constexpr, BT: gl.constexpr,
                STAGES: gl.constexpr, OVERLAP: gl.constexpr, EARLY: gl.constexpr, WPTX: gl.constexpr):
    """GEMM1's K loop with each lane's words loaded into registers a step ahead: (gate, up) sums [64, BT]."""
    ACC: gl.constexpr = acc_layout(BT)
    A_OP: gl.constexpr = a_layout(BT)
    S: gl.constexpr = 64 * KB
    for i in gl.static_range(STAGES - 1):
        _x_issue(xs, x_ptrs, x_mask, i, i, S)
    wg = gl.load(w_ptr + w_off)
    sg = gl.load(s_ptr + s_off)
    wu = gl.load(w_ptr + up_w + w_off)
    su = gl.load(s_ptr + up_s + s_off)
    acc_g = gl.zeros([64, BT], gl.float32, layout=ACC)
    acc_u = gl.zeros([64, BT], gl.float32, layout=ACC)
    a_u = gl.zeros([64, S], gl.bfloat16, layout=A_OP)  # (the up MMA before the first step's: none)
    if OVERLAP:  # carried through the loop in flight
        acc_u = hopper.warpgroup_mma_init(acc_u)
    for i in range(steps):
        kn = gl.minimum(i + 1, steps - 1) * S
        j = i + STAGES - 1
        if not OVERLAP:
            _x_issue(xs, x_ptrs, x_mask, gl.minimum(j, steps - 1), j % STAGES, S)
        if EARLY:  # the step's next words in registers of their own, loaded before this step's decode
            wg_n = gl.load(w_ptr + w_off + kn * 2)
            sg_n = gl.load(s_ptr + s_off + kn // 8)
            wu_n = gl.load(w_ptr + up_w + w_off + kn * 2)
            su_n = gl.load(s_ptr + up_s + s_off + kn // 8)
            a_g = gl.convert_layout(_decode(wg, sg, 4, KB, WPTX, _FPTX), A_OP)
            wg = wg_n
            sg = sg_n
        else:  # each matrix's next words loaded once its words are decoded, into their registers
            a_g = gl.convert_layout(_decode(wg, sg, 4, KB, WPTX, _FPTX), A_OP)
            wg = gl.load(w_ptr + w_off + kn * 2)
            sg = gl.load(s_ptr + s_off + kn // 8)
        async_copy.wait_group(STAGES - 2 if OVERLAP else STAGES - 1)
        _barrier()
        hopper.fence_async_shared()
        x = xs.index(i % STAGES)
        acc_g = hopper.warpgroup_mma(a_g, x, acc_g, is_async=True)
        if OVERLAP:  # the up MMA of the step before is done (its operands free): its x stage takes step j's tile
            acc_u, a_u = hopper.warpgroup_mma_wait(1, deps=[acc_u, a_u])
            _x_issue(xs, x_ptrs, x_mask, gl.minimum(j, steps - 1), j % STAGES, S)
        else:
            acc_g = hopper.warpgroup_mma_wait(0, deps=[acc_g])
        a_u = gl.convert_layout(_decode(wu, su, 4, KB, WPTX, _FPTX), A_OP)
        if EARLY:
            wu = wu_n
            su = su_n
        else:
            wu = gl.load(w_ptr + up_w + w_off + kn * 2)
            su = gl.load(s_ptr + up_s + s_off + kn // 8)
        acc_u = hopper.warpgroup_mma(a_u, x, acc_u, is_async=True)
        if OVERLAP:  # the gate MMA is done: the next step's gate rows may decode while the up MMA runs
            acc_g, a_g = hopper.warpgroup_mma_wait(1, deps=[acc_g, a_g])
        else:
            acc_u = hopper.warpgroup_mma_wait(0, deps=[acc_u])
    acc_u, a_u = hopper.warpgroup_mma_wait(0, deps=[acc_u, a_u])
    return acc_g, acc_u


@gluon.jit
def _x_issue(xs, x_ptrs, x_mask, step, st, S):
    """One commit group of cp.async: step's x tile (or intermediate tile) into ring stage st."""
    _async_load(xs.index(st), x_ptrs + step * S, mask=x_mask)
    async_copy.commit_group()


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
        a_g = gl.convert_layout(_decode(wgs.index(st).load(w_off.type.layout), sgs.index(st).load(s_off.type.layout),
                                        4, KB, WPTX, _FPTX), A_OP)
        acc_g = hopper.warpgroup_mma(a_g, x, acc_g, is_async=True)
        if BT2 > 0:
            acc_g2 = hopper.warpgroup_mma(gl.convert_layout(a_g, a_layout(BT2)), xs2.index(st), acc_g2, is_async=True)
            acc_g, acc_g2 = hopper.warpgroup_mma_wait(0, deps=[acc_g, acc_g2])
        else:
            acc_g = hopper.warpgroup_mma_wait(0, deps=[acc_g])
        a_u = gl.convert_layout(_decode(wus.index(st).load(w_off.type.layout), sus.index(st).load(s_off.type.layout),
                                        4, KB, WPTX, _FPTX), A_OP)
        acc_u = hopper.warpgroup_mma(a_u, x, acc_u, is_async=True)
        if BT2 > 0:
            acc_u2 = hopper.warpgroup_mma(gl.convert_layout(a_u, a_layout(BT2)), xs2.index(st), acc_u2, is_async=True)
            acc_u, acc_u2 = hopper.warpgroup_mma_wait(0, deps=[acc_u, acc_u2])
        else:
            acc_u = hopper.warpgroup_mma_wait(0, deps=[acc_u])
    return acc_g, acc_u, acc_g2, acc_u2


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


@gluon.jit
def wg_gemm2(w_ptr, s_ptr, a_ptr, sorted_ptr, bexp_ptr, npp_ptr, b_ptr, tw_ptr, out_ptr, num_pairs, K, N,
             KB: gl.constexpr, BT: gl.constexpr, TAIL: gl.constexpr, ROWS: gl.constexpr, STAGES: gl.constexpr,
             HAS_BIAS: gl.constexpr, RING: gl.constexpr = False, WPTX: gl.constexpr = None, DUAL: gl.constexpr = 0):
    """out[pair, rows] = tw[pair] * (w2[e] rows . a[pair] + b2[e] rows) for pair block program_id(1) (BT slots) and
    rows [ROWS rb, ROWS rb + ROWS), rb = program_id(0), in out's dtype: in a [ROWS, TAIL] tile where the block holds
    at most TAIL pairs (TAIL 0: never), else a [ROWS, BT] one; DUAL as in wg_gemm1 (the ring form only). Each step's
    MMAs are waited for at once. RING: the words come through the intermediate tile's ring of shared-memory stages by
    cp.async (else into registers a step ahead)."""
    m = gl.program_id(1)
    e = _expert(bexp_ptr, npp_ptr, BT)
    if e >= 0:
        rb = gl.program_id(0)
        NB: gl.constexpr = ROWS // 16
        w_ptr += e * (N * (K // 8)) + rb * NB * (2 * K)
        s_ptr += e * (N * K // 128) + rb * NB * (K // 8)
        slots = sorted_ptr + m * BT
        if TAIL > 0:
            n = _pairs_in(sorted_ptr, num_pairs, BT)
            if n <= TAIL:
                _wg_tile2(w_ptr, s_ptr, a_ptr, slots, b_ptr, tw_ptr, out_ptr, e, rb, num_pairs, K, N, KB, TAIL, ROWS,
                          STAGES, HAS_BIAS, RING, WPTX)
            elif DUAL == 2 and n <= TAIL + TAIL // 4:
                _wg_tile2(w_ptr, s_ptr, a_ptr, slots, b_ptr, tw_ptr, out_ptr, e, rb, num_pairs, K, N, KB, TAIL, ROWS,
                          STAGES, HAS_BIAS, RING, WPTX, TAIL // 4)
            elif DUAL > 0 and n <= TAIL + TAIL // 2:
                _wg_tile2(w_ptr, s_ptr, a_ptr, slots, b_ptr, tw_ptr, out_ptr, e, rb, num_pairs, K, N, KB, TAIL, ROWS,
                          STAGES, HAS_BIAS, RING, WPTX, TAIL // 2)
            else:
                _wg_tile2(w_ptr, s_ptr, a_ptr, slots, b_ptr, tw_ptr, out_ptr, e, rb, num_pairs, K, N, KB, BT, ROWS,
                          STAGES, HAS_BIAS, RING, WPTX)
        else:
            _wg_tile2(w_ptr, s_ptr, a_ptr, slots, b_ptr, tw_ptr, out_ptr, e, rb, num_pairs, K, N, KB, BT, ROWS, STAGES,
                      HAS_BIAS, RING, WPTX)


@gluon.jit
def _wg_tile2(w_ptr, s_ptr, a_ptr, slots_ptr, b_ptr, tw_ptr, out_ptr, e, rb, num_pairs, K, N, KB: gl.constexpr,
              BT: gl.constexpr, ROWS: gl.constexpr, STAGES: gl.constexpr, HAS_BIAS: gl.constexpr, RING: gl.constexpr,
              WPTX: gl.constexpr, BT2: gl.constexpr = 0):
    """GEMM2's K loop and epilogue for the [ROWS, BT] tile of the pairs in slots slots_ptr[0:BT]; BT2 > 0 (the ring
    form): also a [ROWS, BT2] tile of the pairs in the next BT2 slots, on the same decoded weights."""
    S: gl.constexpr = 64 * KB
    NB: gl.constexpr = ROWS // 16
    pair_x, x_ptrs, x_mask = _x_tile(a_ptr, slots_ptr, num_pairs, 1, K, KB, BT)
    w_off, s_off = _offsets(K, NB, KB)
    xs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, S, BT], x_shared_layout())
    steps = K // S
    if BT2 > 0:
        gl.static_assert(RING, "two tiles a block in the ring form only")
        pair_x2, x_ptrs2, x_mask2 = _x_tile(a_ptr, slots_ptr + BT, num_pairs, 1, K, KB, BT2)
        xs2 = gl.allocate_shared_memory(gl.bfloat16, [STAGES, S, BT2], x_shared_layout())
        acc, acc2 = _ring_k_loop2(w_ptr, s_ptr, x_ptrs, x_mask, xs, w_off, s_off, steps, KB, BT, ROWS, STAGES, WPTX,
                                  x_ptrs2, x_mask2, xs2, BT2)
    elif RING:
        acc, _ = _ring_k_loop2(w_ptr, s_ptr, x_ptrs, x_mask, xs, w_off, s_off, steps, KB, BT, ROWS, STAGES, WPTX,
                               x_ptrs, x_mask, xs, 0)
    else:
        acc = _reg_k_loop2(w_ptr, s_ptr, x_ptrs, x_mask, xs, w_off, s_off, steps, KB, BT, ROWS, STAGES, WPTX)
    async_copy.wait_group(0)
    _wg_store2(acc, pair_x, b_ptr, tw_ptr, out_ptr, e, rb, num_pairs, N, BT, ROWS, HAS_BIAS)
    if BT2 > 0:
        _wg_store2(acc2, pair_x2, b_ptr, tw_ptr, out_ptr, e, rb, num_pairs, N, BT2, ROWS, HAS_BIAS)


@gluon.jit
def _wg_store2(acc, pair_x, b_ptr, tw_ptr, out_ptr, e, rb, num_pairs, N, BT: gl.constexpr, ROWS: gl.constexpr,
               HAS_BIAS: gl.constexpr):
    """GEMM2's epilogue for a [ROWS, BT] tile: bias, routing weight, its pairs' rows into out."""
    ACC: gl.constexpr = acc_layout(BT)
    rows = rb * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, ACC))
    if HAS_BIAS:
        acc += gl.load(b_ptr + e * N + rows).to(gl.float32)[:, None]
    pair = gl.convert_layout(pair_x, gl.SliceLayout(0, ACC))
    ok = pair < num_pairs
    acc = acc * gl.load(tw_ptr + pair, mask=ok, other=0.0).to(gl.float32)[None, :]
    gl.store(out_ptr + pair[None, :].to(gl.int64) * N + rows[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=ok[None, :] & (rows[:, None] >= 0))


@gluon.jit
def _reg_k_loop2(w_ptr, s_ptr, x_ptrs, x_mask, xs, w_off, s_off, steps, KB: gl.constexpr, BT: gl.constexpr,
                 ROWS: gl.constexpr, STAGES: gl.constexpr, WPTX: gl.constexpr):
    """GEMM2's K loop with each lane's words loaded into registers a step ahead, each MMA waited for at once: the
    [ROWS, BT] sums."""
    ACC: gl.constexpr = acc_layout(BT)
    A_OP: gl.constexpr = a_layout(BT)
    S: gl.constexpr = 64 * KB
    for i in gl.static_range(STAGES - 1):
        _x_issue(xs, x_ptrs, x_mask, i, i, S)
    w = gl.load(w_ptr + w_off)
    sc = gl.load(s_ptr + s_off)
    acc = gl.zeros([ROWS, BT], gl.float32, layout=ACC)
    for i in range(steps):
        kn = gl.minimum(i + 1, steps - 1) * S
        j = i + STAGES - 1
        _x_issue(xs, x_ptrs, x_mask, gl.minimum(j, steps - 1), j % STAGES, S)
        a = gl.convert_layout(_decode(w, sc, ROWS // 16, KB, WPTX, _FPTX), A_OP)
        w = gl.load(w_ptr + w_off + kn * 2)  # the next step's words, once these are decoded, into their registers
        sc = gl.load(s_ptr + s_off + kn // 8)
        async_copy.wait_group(STAGES - 1)
        _barrier()
        hopper.fence_async_shared()
        acc = hopper.warpgroup_mma(a, xs.index(i % STAGES), acc, is_async=True)
        acc = hopper.warpgroup_mma_wait(0, deps=[acc])
    return acc


@gluon.jit
def _ring_k_loop2(w_ptr, s_ptr, x_ptrs, x_mask, xs, w_off, s_off, steps, KB: gl.constexpr, BT: gl.constexpr,
                  ROWS: gl.constexpr, STAGES: gl.constexpr, WPTX: gl.constexpr, x_ptrs2, x_mask2, xs2,
                  BT2: gl.constexpr):
    """GEMM2's K loop with each lane's words brought by cp.async into a ring of shared-memory stages beside the
    intermediate tile's, each step's MMAs waited for at once: the [ROWS, BT] sums, and with BT2 > 0 those of the
    second tile [ROWS, BT2] (x_ptrs2, xs2; else the first's again)."""
    ACC: gl.constexpr = acc_layout(BT)
    A_OP: gl.constexpr = a_layout(BT)
    S: gl.constexpr = 64 * KB
    ws = gl.allocate_shared_memory(gl.int32, [STAGES] + list(w_off.shape), words_ring_layout())
    ss = gl.allocate_shared_memory(gl.int32, [STAGES] + list(s_off.shape), scales_ring_layout())
    for i in gl.static_range(STAGES - 1):
        _ring_issue2(w_ptr, s_ptr, x_ptrs, x_mask, xs, ws, ss, w_off, s_off, i, i, S, x_ptrs2, x_mask2, xs2, BT2)
    acc = gl.zeros([ROWS, BT], gl.float32, layout=ACC)
    if BT2 > 0:
        acc2 = gl.zeros([ROWS, BT2], gl.float32, layout=acc_layout(BT2))
    else:
        acc2 = acc
    for i in range(steps):
        async_copy.wait_group(STAGES - 2)  # step i's tiles are in
        _barrier()  # and every warp is past step i - 1, whose stage the next copies take
        j = i + STAGES - 1
        _ring_issue2(w_ptr, s_ptr, x_ptrs, x_mask, xs, ws, ss, w_off, s_off, gl.minimum(j, steps - 1), j % STAGES, S,
                     x_ptrs2, x_mask2, xs2, BT2)
        hopper.fence_async_shared()
        st = i % STAGES
        a = gl.convert_layout(_decode(ws.index(st).load(w_off.type.layout), ss.index(st).load(s_off.type.layout),
                                      ROWS // 16, KB, WPTX, _FPTX), A_OP)
        acc = hopper.warpgroup_mma(a, xs.index(st), acc, is_async=True)
        if BT2 > 0:
            acc2 = hopper.warpgroup_mma(gl.convert_layout(a, a_layout(BT2)), xs2.index(st), acc2, is_async=True)
            acc, acc2 = hopper.warpgroup_mma_wait(0, deps=[acc, acc2])
        else:
            acc = hopper.warpgroup_mma_wait(0, deps=[acc])
    return acc, acc2


@gluon.jit
def _ring_issue2(w_ptr, s_ptr, x_ptrs, x_mask, xs, ws, ss, w_off, s_off, step, st, S, x_ptrs2, x_mask2, xs2,
                 BT2: gl.constexpr):
    """One commit group of cp.async: step's intermediate tile (and the second tile's with BT2 > 0), words and scale
    words into ring stage st."""
    k = step * S
    _async_load(xs.index(st), x_ptrs + k, mask=x_mask)
    if BT2 > 0:
        _async_load(xs2.index(st), x_ptrs2 + k, mask=x_mask2)
    _words_issue(w_ptr, s_ptr, ws, ss, w_off, s_off, k, st)
    async_copy.commit_group()
