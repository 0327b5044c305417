"""Two other bit orders for the hopper_mma words, judged before any layout would change, and another decode of
hopper_mma_w_rot's own: their instructions from sm_90a SASS (no GPU), and on the GPU the one-token weight stream of
gluon_t1_bench.py in each (benchmarks/results/performance-notebook.md, "Other decodes of the words").

The words keep hopper_mma_w's places (a lane's 4 words a 64-code block, word kt the codes 16 kt + 8 c + 2 t + kk
of rows 8 h + g); an order only moves the bits inside a word. Each order is a decode, registers R = mask &
(xor of shifts of w), and the stored bits are what makes every R hold its codes' bits where they decode: a linear
map over GF(2) (order_matrix), not a bit permutation as hopper_np.BITS_ROT is.

- ``xor``: bf16 pairs as hopper_mma_w_rot decodes them (e2m1 2**-126 at (6, 7, 8, 15) + 16 kk in R0..R3), with R1 =
  (w << 6) & M, R2 = rotl(w, 12) & M and R3 = ((w << 2) ^ (w >> 6)) & M: 8 instructions a word against 9, one
  fewer on the integer pipe (R3's two masks and an or become one xor-and).
- ``f8``: e4m3 bytes (an e2m1 code is e4m3 2**6 with its sign at bit 7, m e0 e1 at bits 2-4): R_lo = w & 0x9C9C9C9C
  holds row g's 4 codes and R_hi = ((w << 2) ^ (w >> 2)) & 0x9C9C9C9C row g + 8's, 4 instructions a word and no
  multiply, for fp8 MMAs (mma.sync m16n8k32: one MMA a 32-code e8m0 group, from zero, its factor applied by one fp32
  multiply-add an accumulator entry; x as three e4m3 pieces in the B operand's free columns). sm_90 has no fp8
  mma.sync: ptxas lowers it to F2FP e4m3 -> f16 unpacks, byte permutes and two HMMA.16816 on f16 operands, so this
  order is judged from SASS only.
- ``rotw`` (no order of its own): hopper_mma_w_rot's words with its two rotations as 64-bit products by 2**10 and
  2**14 whose halves or-ed are the rotation (IMAD.WIDE on the FMA pipe instead of SHF.L.W on the integer pipe).

    python benchmarks/probes/gluon_decode_bench.py --sass            # instructions a K step, no GPU
    python benchmarks/probes/gluon_decode_bench.py [--points dsv3:1,k3:1,k3:10] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(_HERE, ".."), os.path.join(_HERE, "..", "..")]  # the probes, the tools, the repository

from mxfp4conv.shuffle.hopper_np import MASK, XOR_DECODE, _bf16_lands, _byte_tables, _order_matrix  # noqa: E402

F8_MASK = 0x9C9C9C9C
# (mask, the registers' sources as (op, shift): "shl", "shr" or "rotl"; where code (r, kk, j) of the plain word
# (plain bit 8 r + 4 kk + j; r = 2 h + c, j = m, e0, e1, s) must land: (register, bit))
ORDERS = {
    "xor": (MASK, XOR_DECODE, _bf16_lands),
    "f8": (F8_MASK, ([("shl", 0)], [("shl", 2), ("shr", 2)]),
           lambda r, kk, j: (r // 2, 8 * (2 * (r % 2) + kk) + (2, 3, 4, 7)[j])),
}


def order_matrix(name: str) -> np.ndarray:
    """[32 stored bits, 32 plain bits] over GF(2) for ORDERS[name]: decode(stored) puts every code where it lands."""
    mask, regs, lands = ORDERS[name]
    return _order_matrix(regs, mask, lands)


def order_tables(name: str) -> np.ndarray:
    """[4, 256] int64: the stored word's bits from plain byte p = v (xor the four)."""
    return _byte_tables(order_matrix(name))


def decode_np(name: str, w: np.ndarray) -> list[np.ndarray]:
    """ORDERS[name]'s decode of uint32 words, as the kernels run it."""
    mask, regs, _ = ORDERS[name]
    w = w.astype(np.uint64)
    ops = {"shl": lambda s: (w << np.uint64(s)) & np.uint64(0xFFFFFFFF), "shr": lambda s: w >> np.uint64(s),
           "rotl": lambda s: ((w << np.uint64(s)) | (w >> np.uint64(32 - s))) & np.uint64(0xFFFFFFFF)}
    out = []
    for srcs in regs:
        r = np.zeros_like(w)
        for op, s in srcs:
            r ^= ops[op](s)
        out.append((r & np.uint64(mask)).astype(np.uint32))
    return out


def self_check(n: int = 1 << 16, seed: int = 0) -> None:
    """Random plain words through each order's tables and decode: every code where ORDERS says (raises otherwise)."""
    rng = np.random.default_rng(seed)
    plain = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    for name, (mask, regs, lands) in ORDERS.items():
        tab = order_tables(name)
        stored = np.zeros(n, dtype=np.int64)
        for p in range(4):
            stored ^= tab[p][(plain >> (8 * p)) & 0xFF]
        regs_out = decode_np(name, stored.astype(np.uint32))
        got = np.zeros(n, dtype=np.uint32)
        for r in range(4):
            for kk in range(2):
                for j in range(4):
                    reg, bit = lands(r, kk, j)
                    got |= ((regs_out[reg] >> np.uint32(bit)) & np.uint32(1)) << np.uint32(8 * r + 4 * kk + j)
        if not np.array_equal(got, plain):
            raise AssertionError(f"order {name}: the decode does not give the plain codes back")
        for reg in regs_out:
            if np.any(reg & ~np.uint32(mask)):
                raise AssertionError(f"order {name}: bits outside the mask")


def _ptx_regs(name: str, w: str, out: list[str]) -> str:
    """PTX of ORDERS[name]'s decode of register w into out (scratch a, b)."""
    mask, regs, _ = ORDERS[name]
    lines = []
    for dst, srcs in zip(out, regs):
        parts = []
        for i, (op, s) in enumerate(srcs):
            t = "ab"[i]
            if s == 0:
                parts.append(w)
                continue
            lines.append({"shl": f"shl.b32 {t}, {w}, {s}", "shr": f"shr.b32 {t}, {w}, {s}",
                          "rotl": f"shf.l.wrap.b32 {t}, {w}, {w}, {s}"}[op])
            parts.append(t)
        if len(parts) == 2:
            lines.append(f"xor.b32 a, {parts[0]}, {parts[1]}")
            parts = ["a"]
        lines.append(f"and.b32 {dst}, {parts[0]}, {mask:#010x}")
    return "".join(f"{line};\n" for line in lines)


# the f8 order's word -> 2 registers (the xor order's decode is the runtime's, gluon_few_tokens.WORDS32_PTX["xor"])
F8_DECODE_PTX = "{\n.reg .b32 a, b;\n" + _ptx_regs("f8", "$2", ["$0", "$1"]) + "}"
# hopper_mma_w_rot's own words with its two rotations (by 10 and 14) as 32 x 32 -> 64-bit multiplies by 2**10 and
# 2**14, whose halves or-ed are the rotation: IMAD.WIDE on the FMA pipe in place of SHF.L.W on the integer pipe
ROT_WIDE_PTX = ("{\n.reg .b32 a, b, c, r0, r1, r2, r3;\n.reg .b64 d;\n"
                "and.b32 r0, $8, 0x81C081C0;\nshl.b32 a, $8, 4;\nand.b32 r1, a, 0x81C081C0;\n"
                "mul.wide.u32 d, $8, 1024;\nmov.b64 {a, b}, d;\nor.b32 a, a, b;\nand.b32 r2, a, 0x81C081C0;\n"
                "shl.b32 c, $8, 6;\nand.b32 c, c, 0x00400040;\nmul.wide.u32 d, $8, 16384;\nmov.b64 {a, b}, d;\n"
                "or.b32 a, a, b;\nand.b32 a, a, 0x81808180;\nor.b32 r3, a, c;\n"
                "mov.b32 {$0, $1}, r0;\nmov.b32 {$2, $3}, r1;\nmov.b32 {$4, $5}, r2;\nmov.b32 {$6, $7}, r3;\n}")


if __name__ == "__main__" and "--self-check" in sys.argv:
    self_check()
    print("bit orders " + ", ".join(ORDERS) + ": decode of 65536 random words checked")
    sys.exit(0)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402

from mxfp4conv.kernels.triton_moe.gluon_few_tokens import WORDS32_PTX, _along  # noqa: E402


# f8_stream's group bytes [nb, g, t, j, byte] (warp = slab, lane 4 g + t, its 8 bytes, words 2 c and 2 c + 1, in
# registers) and scale words [nb, g, t], each axis's 1-D layout for its arange
_F8_WL = gl.BlockedLayout([1, 1, 1, 2, 4], [1, 8, 4, 1, 1], [4, 1, 1, 1, 1], [4, 3, 2, 1, 0])
F8_W0, F8_W1, F8_W2, F8_W3, F8_W4 = (_along(_F8_WL, d, 5) for d in range(5))
F8_S0, F8_S1, F8_S2 = (_along(gl.BlockedLayout([1, 1, 1], [1, 8, 4], [4, 1, 1], [2, 1, 0]), d, 3) for d in range(3))


@gluon.jit
def f8_stream(w_ptr, s_ptr, x_ptr, cw_ptr, out_ptr, K, ROWS, K_SPLIT, X_STRIDE, GATE_UP: gl.constexpr,
              DPTX: gl.constexpr):
    """Program (row block, pair, split): rows [64 rb, 64 rb + 64) of pair e's matrix (and with GATE_UP the same
    rows of its up half) over codes [K_SPLIT sp, K_SPLIT (sp + 1)), in 64-code steps of two k32 MMAs. w_ptr: bytes
    (hopper_mma_w places, the f8 bit order); s_ptr: hopper_mma_s as int32 words; x_ptr: e4m3 [pairs, 8, K], each
    32-code group in the MMA's k order (k 16 j + 4 t + i holds code 16 j + 2 t + 8 (i // 2) + i % 2); cw_ptr: fp32
    [pairs, 8], the weight of each B column in the sum (2**(6 - kx - 4 n)). out [splits, pairs, ROWS] fp32. Compiled
    for its SASS only (sass_table)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=4)
    rb = gl.program_id(0)
    e = gl.program_id(1)
    sp = gl.program_id(2)
    half = ROWS // 2 if GATE_UP else ROWS
    w_ptr += e * (ROWS * (K // 2)) + rb * 4 * (8 * K)
    s_ptr += e * (ROWS * (K // 128)) + rb * 4 * (K // 8)
    up_w = (half // 16) * (8 * K)
    up_s = (half // 16) * (K // 8)
    w0 = gl.arange(0, 4, layout=F8_W0)
    w1 = gl.arange(0, 8, layout=F8_W1)
    w2 = gl.arange(0, 4, layout=F8_W2)
    w3 = gl.arange(0, 2, layout=F8_W3)
    w4 = gl.arange(0, 4, layout=F8_W4)
    w_off = (w0[:, None, None, None, None] * (8 * K) + w1[None, :, None, None, None] * 64
             + w2[None, None, :, None, None] * 16 + w3[None, None, None, :, None] * 4 + w4[None, None, None, None, :])
    s0 = gl.arange(0, 4, layout=F8_S0)
    s1 = gl.arange(0, 8, layout=F8_S1)
    s2 = gl.arange(0, 4, layout=F8_S2)
    s_off = s0[:, None, None] * (K // 8) + s1[None, :, None] + s2[None, None, :] * 0
    xk = gl.arange(0, 32, layout=gl.SliceLayout(1, b_op))
    xn = gl.arange(0, 8, layout=gl.SliceLayout(0, b_op))
    x_ptr += e * X_STRIDE + xk[:, None] + xn[None, :] * K
    acc_g = gl.zeros([64, 8], gl.float32, layout=mma)
    acc_u = gl.zeros([64, 8], gl.float32, layout=mma)
    zero = gl.zeros([64, 8], gl.float32, layout=mma)
    k_lo = sp * K_SPLIT
    last = k_lo + K_SPLIT - 64
    # a step: 512 bytes a slab (two groups of 8 bytes a lane), one scale word a row group
    ga0 = gl.load(w_ptr + w_off + k_lo * 8)
    ga1 = gl.load(w_ptr + w_off + k_lo * 8 + 8)
    sa = gl.load(s_ptr + s_off + k_lo // 8)
    ua0 = ga0
    ua1 = ga1
    va = sa
    if GATE_UP:
        ua0 = gl.load(w_ptr + up_w + w_off + k_lo * 8)
        ua1 = gl.load(w_ptr + up_w + w_off + k_lo * 8 + 8)
        va = gl.load(s_ptr + up_s + s_off + k_lo // 8)
    for k0 in range(k_lo, k_lo + K_SPLIT, 64):
        k1 = gl.minimum(k0 + 64, last)
        gb0 = gl.load(w_ptr + w_off + k1 * 8)
        gb1 = gl.load(w_ptr + w_off + k1 * 8 + 8)
        sb = gl.load(s_ptr + s_off + k1 // 8)
        x0 = gl.load(x_ptr + k0)
        x1 = gl.load(x_ptr + k0 + 32)
        acc_g = _f8_group(acc_g, zero, ga0, sa, x0, 0, a_op, mma, DPTX)
        acc_g = _f8_group(acc_g, zero, ga1, sa, x1, 1, a_op, mma, DPTX)
        if GATE_UP:
            ub0 = gl.load(w_ptr + up_w + w_off + k1 * 8)
            ub1 = gl.load(w_ptr + up_w + w_off + k1 * 8 + 8)
            vb = gl.load(s_ptr + up_s + s_off + k1 // 8)
            acc_u = _f8_group(acc_u, zero, ua0, va, x0, 0, a_op, mma, DPTX)
            acc_u = _f8_group(acc_u, zero, ua1, va, x1, 1, a_op, mma, DPTX)
            ua0 = ub0
            ua1 = ub1
            va = vb
        ga0 = gb0
        ga1 = gb1
        sa = sb
    on = gl.arange(0, 8, layout=gl.SliceLayout(0, mma))
    om = gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
    cw = gl.load(cw_ptr + e * 8 + on)
    o_ptr = out_ptr + (sp * gl.num_programs(1) + e) * ROWS + rb * 64 + om
    gl.store(o_ptr, gl.sum(acc_g * cw[None, :], axis=1))
    if GATE_UP:
        gl.store(o_ptr + half, gl.sum(acc_u * cw[None, :], axis=1))


@gluon.jit
def _f8_group(acc, zero, wb, sw, x, C: gl.constexpr, a_op: gl.constexpr, mma: gl.constexpr, DPTX: gl.constexpr):
    """acc + the group's factor times its codes (bytes wb [4, 8, 4, 2, 4]) times x (its [32, 8] B operand): group
    C of the step, factor bytes C (row g) and 2 + C (row g + 8) of the scale words sw [4, 8, 4]."""
    lo, hi = gl.inline_asm_elementwise(asm=DPTX, constraints="=r,=r,r", args=[wb],
                                       dtype=(gl.float8e4nv, gl.float8e4nv), is_pure=True, pack=4)
    a = gl.join(lo, hi).permute(0, 5, 1, 3, 2, 4).reshape(64, 32)  # nb h g j t byte
    d = mma_v2(gl.convert_layout(a, a_op), x, zero)
    if C == 0:
        f_lo = (sw << 23) & 0x7F800000
        f_hi = (sw << 7) & 0x7F800000
    else:
        f_lo = (sw << 15) & 0x7F800000
        f_hi = (sw >> 1) & 0x7F800000
    f = gl.join(f_lo, f_hi).to(gl.float32, bitcast=True)  # nb g t h
    f = gl.join(f, f).permute(0, 3, 1, 2, 4).reshape(64, 8)  # nb h g t q: column 2 t + q
    return acc + d * gl.convert_layout(f, mma)


def ordered_words(w: torch.Tensor, name: str) -> torch.Tensor:
    """Canonical [E, N, K/2] bytes -> ORDERS[name]'s words in hopper_mma_w's places, as int32 (flat)."""
    from mxfp4conv.shuffle import hopper

    return hopper._forward_torch(w, fwd8=order_tables(name)).reshape(-1).view(torch.int32)


def loop_sass(fn, consts: dict, types: dict) -> tuple[str, int, collections.Counter]:
    """(registers, instructions and opcodes of the longest loop) of a Gluon kernel compiled for sm_90a."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from benchmarks.probes.hopper_sass import _tool, loops

    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(sig)
             if n.endswith("_ptr") or n in ("K", "ROWS", "K_SPLIT", "X_STRIDE")}
    kernel = triton.compile(GluonASTSource(fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=4))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        sass = subprocess.run([_tool("cuobjdump"), "-sass", cubin], check=True, capture_output=True, text=True).stdout
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", cubin], check=True, capture_output=True,
                             text=True).stdout
    regs = re.search(r"REG:\d+", res)
    n, ops = max(loops(sass, 1))
    return regs.group(0) if regs else "?", n, ops


def sass_table(log) -> None:
    """Instructions a 64-code step of the one-token stream (gluon_t1_bench.stream) in hopper_mma_w_rot's decode (rot;
    rotw: its rotations as wide multiplies) and the xor order's, and of f8_stream, each GEMM1 (gate and up) and
    GEMM2-like (one matrix)."""
    from benchmarks.probes.gluon_t1_bench import stream
    from mxfp4conv.kernels.triton_moe.gluon_few_tokens import FACTORS32_PTX, WORDS32_PTX

    types = {"w_ptr": "*i32", "s_ptr": "*i32", "x_ptr": "*bf16", "out_ptr": "*fp32"}
    f8_types = {"w_ptr": "*u8", "s_ptr": "*i32", "x_ptr": "*fp8e4nv", "cw_ptr": "*fp32", "out_ptr": "*fp32"}
    for gate_up in (True, False):
        for label, fn, consts, tys in (
                ("rot", stream, dict(WPTX=WORDS32_PTX["rot"]), types),
                ("rotw", stream, dict(WPTX=ROT_WIDE_PTX), types),
                ("xor", stream, dict(WPTX=WORDS32_PTX["xor"]), types),
                ("f8", f8_stream, dict(DPTX=F8_DECODE_PTX), f8_types)):
            if fn is stream:
                consts = dict(consts, NB=4, KB=1, FPTX=FACTORS32_PTX, DEPTH=1, READ_ONLY=False, CONTIG=False)
            regs, n, ops = loop_sass(fn, dict(consts, GATE_UP=gate_up), tys)
            log(f"{'gemm1' if gate_up else 'gemm2'} {label:4s} {regs:7s} {n:4d} instructions a 64-code step: "
                + ", ".join(f"{op} {n}" for op, n in ops.most_common(10)))


def bench(name, T, copy_bw, log):
    """Production per kernel at T tokens, then the one-token stream (gluon_t1_bench's, one token a touched expert's
    matrices) in hopper_mma_w_rot's decode (rot), the same words with its rotations as wide multiplies (rotw) and the
    xor order, each checked against a float64 product."""
    from benchmarks.probes.gluon_t1_bench import layer_point, run_stream, stored
    from benchmarks.probes.kernel_split import split as kernel_times
    from benchmarks.moe_bench import graph_time_us
    from mxfp4conv.codec import dequantize_mxfp4
    from mxfp4conv.kernels.triton_moe import LAYOUT_SETS, fused_moe_triton
    from mxfp4conv.shuffle import get_layout

    (H, I, _, _), gen, (w13, s13, w2, s2), (ids, tw), x, touched = layer_point(name, T)
    pairs = int(touched.numel())
    Wl, Sl = (get_layout(n) for n in LAYOUT_SETS["hopper_mma_rot"])
    prod = (Wl.forward(w13), Sl.forward(s13), Wl.forward(w2), Sl.forward(s2))
    moe = lambda p=prod: fused_moe_triton(x, *p, tw, ids, activation="silu", activation_params={},  # noqa: E731
                                          layout="hopper_mma_rot")
    ktimes = kernel_times(moe, 20, flush=torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    log(f"{name} T={T} production kernels ({pairs} experts touched; us, L2 flushed, mean of 20): "
        + ", ".join(f"{n[:40]} {t:.1f}" for n, t in ktimes))
    del prod, moe
    w13, s13, w2, s2 = (t[touched] for t in (w13, s13, w2, s2))
    x2 = torch.randn(pairs, I, device="cuda", generator=gen).bfloat16()
    ref1 = torch.einsum("erk,k->er", dequantize_mxfp4(w13, s13).double(), x[0].double())
    ref2 = torch.einsum("erk,ek->er", dequantize_mxfp4(w2, s2).double(), x2.double())
    rows = []
    for gemm, (w, s, K, nrows, gate_up, xin, ref) in (("gemm1", (w13, s13, H, 2 * I, True, x[0], ref1)),
                                                       ("gemm2", (w2, s2, I, H, False, x2, ref2))):
        nbytes = pairs * nrows * (K // 2 + K // 32)
        copies = max(2, -(-400_000_000 // nbytes))
        rot = [stored(w, s, 8192) for _ in range(copies)]
        pad = torch.zeros(8192, dtype=torch.int32, device="cuda")
        xw = torch.cat([ordered_words(w, "xor"), pad])
        xor = [(xw.clone(), rot[c][1]) for c in range(copies)]
        for split in (1, 2, 4, 8):
            if K % (split * 64) or K // split < 128:
                continue
            programs = (nrows // 2 if gate_up else nrows) // 64 * pairs * split
            for order, st, ptx in (("rot", rot, None), ("rotw", rot, ROT_WIDE_PTX), ("xor", xor, WORDS32_PTX["xor"])):
                outs = [torch.empty(split, pairs, nrows, device="cuda") for _ in range(copies)]
                call = [lambda c=c: run_stream(*st[c], xin, outs[c], K, nrows, split, gate_up, 1, 1, False, pairs,
                                               wptx=ptx) for c in range(copies)]
                call[0]()
                torch.cuda.synchronize()
                err = float((outs[0].double().sum(0) - ref).norm() / ref.norm())
                t = graph_time_us(call)
                rows.append((name, T, gemm, order, split, programs, t, nbytes / (t * 1e-6) / copy_bw, err))
                log(f"  {name} {gemm} {order} split={split}: {programs} programs, {t:.1f} us, "
                    f"{100 * rows[-1][7]:.1f}% copy, rel err {err:.2e}")
    return rows


def main() -> int:
    from benchmarks.probes.gluon_t1_bench import start_log, write_log

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", default="dsv3:1,k3:1,k3:10", help="shape:T, comma-separated")
    ap.add_argument("--sass", action="store_true", help="instructions a K step from sm_90a SASS only (no GPU)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    self_check()
    if args.sass:
        lines = []

        def log(msg):
            print(msg, flush=True)
            lines.append(msg)
        sass_table(log)
        write_log(lines, args.out, "gluon_decode_sass.txt")
        return 0
    log, lines, copy_bw = start_log()
    table = []
    for point in args.points.split(","):
        name, T = point.split(":")
        table += bench(name, int(T), copy_bw, log)
    log(f"{'shape':6s} {'T':>4s} {'gemm':6s} {'order':5s} {'split':>5s} {'progs':>6s} {'us':>8s} {'%copy':>6s} "
        f"{'relerr':>9s}")
    for r in table:
        log(f"{r[0]:6s} {r[1]:4d} {r[2]:6s} {r[3]:5s} {r[4]:5d} {r[5]:6d} {r[6]:8.1f} {100 * r[7]:5.1f}% {r[8]:9.2e}")
    write_log(lines, args.out, "gluon_decode_bench.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
