"""One token's whole MoE layer in Gluon MMA v2 (mma.sync) kernels, against the production
one-token path (fused_moe_triton, hopper_mma_rot) on the same bytes and routing: does the stream
gain of gluon_t1_bench.py survive its epilogues?

Two launches and a memset, as production at T = 1: GEMM1 (a program per 64-row block of gate and
up, pair and K split; the last split of a tile to arrive sums the fp32 partials in split order,
applies the production activation and writes the pair's intermediate row) and GEMM2 (a program per
64-row block, pair and K split; the last of the top_k x splits programs of a row block to arrive
sums their weighted partials in a fixed order and writes the output row), GEMM2 launched
programmatically dependent on GEMM1 (its programs start while GEMM1's last run). Weights are
hopper_mma_w_rot / hopper_mma_s read as int32 words (with a step of padding after the last
expert, which the prefetch of the last step reads); x in bf16; the production activations and
optional biases.

Checked first: both outputs against a float64 computation from the bytes, and against each other
(silu, and for each configuration also situ and swigluoai with biases); silu is timed.
Then timed by CUDA-graph replay, each call routing the token to other experts (so L2 holds no
weights), interleaved round by round with production; ratio = median gluon / production.

    python benchmarks/gluon_t1_moe.py [--shapes dsv3,k3] [--rounds 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: E402

from benchmarks.gluon_t1_bench import start_log, stored, write_log  # noqa: E402
from benchmarks.gluon_v2_probe import FACTORS32_PTX, WORDS32_ROT_PTX, _decode, _offsets  # noqa: E402
from benchmarks.moe_bench import SHAPES, graph_time_us, make_weights  # noqa: E402
from mxfp4conv.codec import dequantize_mxfp4  # noqa: E402
from mxfp4conv.runtime.triton_hopper_kernels import _arrive  # noqa: E402
from mxfp4conv.runtime.activations import resolve_activation  # noqa: E402
from mxfp4conv.runtime.triton_moe import LAYOUT_SETS, _activation_args, fused_moe_triton  # noqa: E402
from mxfp4conv.runtime.triton_moe_kernels import _activate  # noqa: E402
from mxfp4conv.shuffle import get_layout  # noqa: E402

_MMA = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
MMA = gl.constexpr(_MMA)
A_OP = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=_MMA, k_width=2))
B_OP = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=_MMA, k_width=2))
ROWS = gl.constexpr(gl.SliceLayout(1, _MMA))  # a tile's 64 rows, column 0 of the MMA layout


@gluon.jit
def _k_loop(w_ptr, s_ptr, x_ptr, K, k_lo, K_SPLIT, up_w, up_s, KB: gl.constexpr, WPTX: gl.constexpr,
            FPTX: gl.constexpr, GATE_UP: gl.constexpr):
    """acc (and with GATE_UP the up rows' acc) [64, 8] of 64 rows (4 slabs from w_ptr / s_ptr) times
    x over codes [k_lo, k_lo + K_SPLIT): x's slice broadcast over the 8 columns, the next step's
    words loaded before this step's decode."""
    w_off, s_off = _offsets(K, 4, KB)
    xk = gl.arange(0, 64 * KB, layout=gl.SliceLayout(1, B_OP))
    xn = gl.arange(0, 8, layout=gl.SliceLayout(0, B_OP))
    x_ptr += xk[:, None] + xn[None, :] * 0
    acc_g = gl.zeros([64, 8], gl.float32, layout=MMA)
    acc_u = gl.zeros([64, 8], gl.float32, layout=MMA)
    wg = gl.load(w_ptr + w_off + k_lo * 2)
    sg = gl.load(s_ptr + s_off + k_lo // 8)
    wu = wg
    su = sg
    if GATE_UP:
        wu = gl.load(w_ptr + up_w + w_off + k_lo * 2)
        su = gl.load(s_ptr + up_s + s_off + k_lo // 8)
    for k0 in range(k_lo, k_lo + K_SPLIT, 64 * KB):
        k1 = k0 + 64 * KB
        wg_n = gl.load(w_ptr + w_off + k1 * 2)
        sg_n = gl.load(s_ptr + s_off + k1 // 8)
        x = gl.load(x_ptr + k0)
        acc_g = mma_v2(gl.convert_layout(_decode(wg, sg, 4, KB, WPTX, FPTX), A_OP), x, acc_g)
        if GATE_UP:
            wu_n = gl.load(w_ptr + up_w + w_off + k1 * 2)
            su_n = gl.load(s_ptr + up_s + s_off + k1 // 8)
            acc_u = mma_v2(gl.convert_layout(_decode(wu, su, 4, KB, WPTX, FPTX), A_OP), x, acc_u)
            wu = wu_n
            su = su_n
        wg = wg_n
        sg = sg_n
    return acc_g, acc_u


@gluon.jit
def _program(w_ptr, s_ptr, ids_ptr, ROWS, K):
    """(row block, pair, split) of this program, pair j's expert and the word / scale-word pointers
    of the program's 4 slabs in it (ROWS rows a matrix of K codes)."""
    rb = gl.program_id(0)
    j = gl.program_id(1)
    e = gl.load(ids_ptr + j).to(gl.int64)
    w_ptr += e * (ROWS * (K // 8)) + rb * 4 * (2 * K)
    s_ptr += e * (ROWS * (K // 128)) + rb * 4 * (K // 8)
    return rb, j, gl.program_id(2), e, w_ptr, s_ptr


@gluon.jit
def _column0(acc):
    """Column 0 of a [64, 8] MMA accumulator (every column holds the same token's sums)."""
    on = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))
    return gl.sum(gl.where(on[None, :] == 0, acc, 0.0), axis=1)


@gluon.jit
def t1_gemm1(w_ptr, s_ptr, x_ptr, ids_ptr, b_ptr, inter_ptr, part_ptr, cnt_ptr, K, I, K_SPLIT, p0, p1,
             KB: gl.constexpr, WPTX: gl.constexpr, FPTX: gl.constexpr, ACT: gl.constexpr,
             HAS_LIMIT: gl.constexpr, HAS_LINEAR: gl.constexpr, HAS_BIAS: gl.constexpr, SPLITS: gl.constexpr):
    """inter[j, rows] = act(gate . x + b, up . x + b) for pair j's expert, rows [64 rb, 64 rb + 64)
    (the production activations, b13 [E, 2 I] with HAS_BIAS)."""
    gdc_launch_dependents()  # GEMM2's programs may launch now
    rb, j, sp, e, w_ptr, s_ptr = _program(w_ptr, s_ptr, ids_ptr, 2 * I, K)
    acc_g, acc_u = _k_loop(w_ptr, s_ptr, x_ptr, K, sp * K_SPLIT, K_SPLIT, (I // 16) * (2 * K), (I // 16) * (K // 8),
                           KB, WPTX, FPTX, True)
    g = _column0(acc_g)
    u = _column0(acc_u)
    rows = rb * 64 + gl.arange(0, 64, layout=ROWS)
    if SPLITS > 1:
        npair = gl.num_programs(1)
        gl.store(part_ptr + ((sp * npair + j) * 2) * I + rows, g)
        gl.store(part_ptr + ((sp * npair + j) * 2 + 1) * I + rows, u)
        gl.thread_barrier()
        if _arrive(cnt_ptr + j * gl.num_programs(0) + rb, SPLITS):
            gl.thread_barrier()
            g = gl.zeros([64], gl.float32, layout=ROWS)
            u = gl.zeros([64], gl.float32, layout=ROWS)
            for s in range(SPLITS):
                g += gl.load(part_ptr + ((s * npair + j) * 2) * I + rows)
                u += gl.load(part_ptr + ((s * npair + j) * 2 + 1) * I + rows)
            _gemm1_tail(g, u, e, j, rows, b_ptr, inter_ptr, I, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS)
    else:
        _gemm1_tail(g, u, e, j, rows, b_ptr, inter_ptr, I, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR, HAS_BIAS)


@gluon.jit
def _gemm1_tail(g, u, e, j, rows, b_ptr, inter_ptr, I, p0, p1, ACT: gl.constexpr, HAS_LIMIT: gl.constexpr,
                HAS_LINEAR: gl.constexpr, HAS_BIAS: gl.constexpr):
    """Bias, activation and the bf16 intermediate row of a tile's complete gate / up sums."""
    if HAS_BIAS:
        g += gl.load(b_ptr + e * (2 * I) + rows)
        u += gl.load(b_ptr + e * (2 * I) + I + rows)
    gl.store(inter_ptr + j * I + rows, _activate(g, u, p0, p1, ACT, HAS_LIMIT, HAS_LINEAR).to(gl.bfloat16))


@gluon.jit
def t1_gemm2(w_ptr, s_ptr, inter_ptr, ids_ptr, b_ptr, tw_ptr, part_ptr, cnt_ptr, out_ptr, K, N, K_SPLIT,
             KB: gl.constexpr, WPTX: gl.constexpr, FPTX: gl.constexpr, HAS_BIAS: gl.constexpr,
             SPLITS: gl.constexpr):
    """out[rows] = sum over pairs j of tw[j] * (w2[e_j] rows . inter[j] + b2[e_j] rows), rows
    [64 rb, 64 rb + 64): the last of the top_k x SPLITS programs of a row block sums their partials,
    pairs then splits in index order (the bias in split 0's)."""
    rb, j, sp, e, w_ptr, s_ptr = _program(w_ptr, s_ptr, ids_ptr, N, K)
    npair = gl.num_programs(1)
    gdc_wait()  # GEMM1's intermediate rows are complete from here on
    acc, _ = _k_loop(w_ptr, s_ptr, inter_ptr + j * K, K, sp * K_SPLIT, K_SPLIT, 0, 0, KB, WPTX, FPTX, False)
    v = _column0(acc)
    rows = rb * 64 + gl.arange(0, 64, layout=ROWS)
    if HAS_BIAS:
        if sp == 0:
            v += gl.load(b_ptr + e * N + rows)
    v = v * gl.load(tw_ptr + j)
    gl.store(part_ptr + (sp * npair + j) * N + rows, v)
    gl.thread_barrier()
    if _arrive(cnt_ptr + rb, npair * SPLITS):
        gl.thread_barrier()
        total = gl.zeros([64], gl.float32, layout=ROWS)
        for p in range(npair):
            for s in range(SPLITS):
                total += gl.load(part_ptr + (s * npair + p) * N + rows)
        gl.store(out_ptr + rows, total.to(gl.bfloat16))


class GluonT1:
    """The two launches over words = (w13, s13, w2, s2) as padded int32 words (all experts, from
    gluon_t1_bench.stored), with the buffers of one call; __call__(x [1, H] bf16, ids [1, k] int32,
    tw [1, k] fp32, activation, its params, b13 [E, 2 I] / b2 [E, H] fp32 or None) -> out [1, H] bf16."""

    def __init__(self, words, H, I, k, splits1, splits2, kb1=2, kb2=1, pdl=True):
        self.w13, self.s13, self.w2, self.s2 = words
        self.pdl = pdl
        dev = self.w13.device
        self.H, self.I, self.k, self.splits1, self.splits2, self.kb1, self.kb2 = H, I, k, splits1, splits2, kb1, kb2
        self.inter = torch.empty(k, I, dtype=torch.bfloat16, device=dev)
        self.part1 = torch.empty(splits1, k, 2, I, dtype=torch.float32, device=dev)
        self.part2 = torch.empty(splits2, k, H, dtype=torch.float32, device=dev)
        self.cnt = torch.zeros(k * (I // 64) + H // 64, dtype=torch.int32, device=dev)

    def __call__(self, x, ids, tw, activation="silu", params=None, b13=None, b2=None):
        H, I, k = self.H, self.I, self.k
        act = _activation_args(activation, params)
        out = torch.empty(1, H, dtype=torch.bfloat16, device=x.device)
        self.cnt.zero_()
        ptx = dict(WPTX=WORDS32_ROT_PTX, FPTX=FACTORS32_PTX)
        t1_gemm1[(I // 64, k, self.splits1)](
            self.w13, self.s13, x, ids, b13 if b13 is not None else self.part1, self.inter, self.part1, self.cnt,
            H, I, H // self.splits1, act["p0"], act["p1"], KB=self.kb1, ACT=act["ACT"], HAS_LIMIT=act["HAS_LIMIT"],
            HAS_LINEAR=act["HAS_LINEAR"], HAS_BIAS=b13 is not None, SPLITS=self.splits1, num_warps=4, **ptx)
        t1_gemm2[(H // 64, k, self.splits2)](
            self.w2, self.s2, self.inter, ids, b2 if b2 is not None else self.part2, tw, self.part2,
            self.cnt[k * (I // 64):], out, I, H, I // self.splits2, KB=self.kb2, HAS_BIAS=b2 is not None,
            SPLITS=self.splits2, num_warps=4, launch_pdl=self.pdl, **ptx)
        return out


def reference(x, w13, s13, w2, s2, ids, tw, activation="silu", params=None, b13=None, b2=None):
    """float64 MoE of one token from the bytes (touched experts only), the intermediate rounded to
    bf16 as the kernels store it."""
    act = resolve_activation(activation, params)
    out = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
    xd = x[0].double()
    for j, e in enumerate(ids[0].tolist()):
        gu = dequantize_mxfp4(w13[e], s13[e]).double() @ xd + (b13[e].double() if b13 is not None else 0)
        g, u = gu.chunk(2)
        y = dequantize_mxfp4(w2[e], s2[e]).double() @ act(g, u).bfloat16().double()
        out += tw[0, j].double() * (y + (b2[e].double() if b2 is not None else 0))
    return out


# activations checked besides silu (each with biases once): K3's situ, gpt-oss's swigluoai
CHECKS = (("silu", {}, False), ("situ", {"beta": 4.0, "linear_beta": 25.0}, False),
          ("swigluoai", {"alpha": 1.702, "limit": 7.0}, True))


def bench(name, rounds, log):
    H, I, E, k = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(11)
    w13, s13, w2, s2 = make_weights(H, I, E, gen)
    Wl, Sl = (get_layout(n) for n in LAYOUT_SETS["hopper_mma_rot"])
    prod_w = (Wl.forward(w13), Sl.forward(s13), Wl.forward(w2), Sl.forward(s2))
    calls = 8  # a token routed to other experts in each call of a replay
    routes = []
    for _ in range(calls):
        ids = torch.rand(1, E, device="cuda", generator=gen).topk(k, dim=1).indices.to(torch.int32)
        tw = torch.rand(1, k, device="cuda", generator=gen)
        routes.append((ids, tw / tw.sum(1, keepdim=True)))
    xs = [torch.randn(1, H, device="cuda", generator=gen).bfloat16() for _ in range(calls)]
    prod = [lambda c=c: fused_moe_triton(xs[c], *prod_w, routes[c][1], routes[c][0], activation="silu",
                                         activation_params={}, layout="hopper_mma_rot") for c in range(calls)]
    ref = reference(xs[0], w13, s13, w2, s2, *routes[0])
    rel = lambda a, b: float((a.double().reshape(-1) - b.reshape(-1)).norm() / b.norm())  # noqa: E731
    out_p = prod[0]()
    log(f"{name} T=1: production rel err {rel(out_p, ref):.2e}")
    words = stored(w13, s13, 8192) + stored(w2, s2, 8192)
    biases = (torch.randn(E, 2 * I, device="cuda", generator=gen), torch.randn(E, H, device="cuda", generator=gen))
    others = []  # the other activations' references and production outputs, the same for every configuration
    for act, params, bias in CHECKS[1:]:
        b13, b2 = biases if bias else (None, None)
        po = fused_moe_triton(xs[0], *prod_w, routes[0][1], routes[0][0], activation=act, activation_params=params,
                              w13_bias=b13, w2_bias=b2, layout="hopper_mma_rot")
        r = reference(xs[0], w13, s13, w2, s2, *routes[0], act, params, b13, b2)
        others.append((act, params, bias, b13, b2, r, po))
    rows = []
    for splits1, splits2, kb2, pdl in ((4, 1, 1, True), (4, 1, 1, False), (2, 1, 1, True), (8, 1, 1, True),
                                       (4, 2, 1, True), (4, 1, 2, True)):
        if H % (splits1 * 128) or I % (splits2 * 64 * kb2):
            continue
        g = GluonT1(words, H, I, k, splits1, splits2, kb2=kb2, pdl=pdl)
        label = f"{name} gluon splits {splits1}/{splits2} KB2 {kb2}{'' if pdl else ' no PDL'}"
        try:
            out_g = g(xs[0], *routes[0])
            torch.cuda.synchronize()
        except Exception as exc:  # a configuration that does not compile or launch is a row, not a crash
            log(f"  {label}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        again = g(xs[0], *routes[0])
        err, between, det = rel(out_g, ref), rel(out_g, out_p.double()), bool(torch.equal(out_g, again))
        for act, params, bias, b13, b2, r, po in others:
            go = g(xs[0], *routes[0], act, params, b13, b2)
            log(f"    {act}{' with biases' if bias else ''}: rel err gluon {rel(go, r):.2e}, production "
                f"{rel(po, r):.2e}, between them {rel(go, po.double()):.2e}")
        glu = [lambda c=c: g(xs[c], *routes[c]) for c in range(calls)]
        tg, tp = [], []
        for _ in range(rounds):
            tg.append(graph_time_us(glu))
            tp.append(graph_time_us(prod))
        ratio = statistics.median(a / b for a, b in zip(tg, tp))
        rows.append((name, splits1, splits2, kb2, pdl, statistics.median(tg), statistics.median(tp), ratio, err,
                     between, det))
        log(f"  {label}: {statistics.median(tg):.1f} us, production "
            f"{statistics.median(tp):.1f} us, gluon / production {ratio:.3f} (rounds {' '.join(f'{t:.1f}' for t in tg)}"
            f"; {' '.join(f'{t:.1f}' for t in tp)}); rel err {err:.2e}, against production {between:.2e}, "
            f"deterministic {det}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="dsv3,k3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    log, lines, _ = start_log()
    table = []
    for name in args.shapes.split(","):
        table += bench(name, args.rounds, log)
    log(f"{'shape':6s} {'S1':>3s} {'S2':>3s} {'KB2':>3s} {'PDL':>5s} {'gluon us':>9s} {'prod us':>8s} {'ratio':>6s} "
        f"{'rel err':>8s} {'vs prod':>8s} {'determ':>6s}")
    for r in table:
        log(f"{r[0]:6s} {r[1]:3d} {r[2]:3d} {r[3]:3d} {str(r[4]):>5s} {r[5]:9.1f} {r[6]:8.1f} {r[7]:6.3f} {r[8]:8.1e} "
            f"{r[9]:8.1e} {str(r[10]):>6s}")
    write_log(lines, args.out, "gluon_t1_moe.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
