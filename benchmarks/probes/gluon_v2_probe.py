"""Instructions per K step of a one-token MMA v2 (mma.sync) decode written in Gluon, from its sm_90a
SASS without a GPU: what Triton's own MMA v2 lowering cannot reach (benchmarks/results/performance-notebook.md, "MMA
v2").

Gluon (triton.experimental.gluon, triton 3.6) states every layout, so the decoded tile can be
given the hardware's operand order (DotOperandLayout k_width 2) directly: each lane's int32 words
of a hopper_mma_w_rot 16 x 64 block decode, with the production PTX (triton_hopper_kernels), into
exactly its m16n8k16 A fragment, and the conversion to the operand layout is free. Two kernels,
64 rows (4 warps, a 16-row slab each), one K step of 64 * KB codes a loop iteration, e8m0 factors
two to a word: ``probe``, one weight matrix with x [K, 16] held in registers and nothing pipelined
(the decode, the scale multiply and the MMAs alone), and ``probe_step``, one token's GEMM1 or GEMM2 step
as a kernel would run it (gate and up, or one matrix; x's slice loaded each step; the next step's
words prefetched into registers).

    python benchmarks/probes/gluon_v2_probe.py [--kb 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(_HERE, ".."), os.path.join(_HERE, "..", "..")]  # the probes, the tools, the repository

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402

from benchmarks.probes.hopper_sass import _tool, loops  # noqa: E402
from mxfp4conv.kernels.triton_moe.gluon_few_tokens import FACTORS32_PTX, WORDS32_PTX, _decode, _offsets  # noqa: E402


@gluon.jit
def probe(w_ptr, s_ptr, x_ptr, out_ptr, K, NB: gl.constexpr, KB: gl.constexpr, WPTX: gl.constexpr,
          FPTX: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    w_off, s_off = _offsets(K, NB, KB)
    xk = gl.arange(0, 64 * KB, layout=gl.SliceLayout(1, b_op))
    xn = gl.arange(0, 16, layout=gl.SliceLayout(0, b_op))
    x = gl.load(x_ptr + xk[:, None] * 16 + xn[None, :])
    acc = gl.zeros([16 * NB, 16], gl.float32, layout=mma)
    for k0 in range(0, K, 64 * KB):
        v = _decode(gl.load(w_ptr + w_off + k0 * 2), gl.load(s_ptr + s_off + k0 // 8), NB, KB, WPTX, FPTX)
        acc = mma_v2(gl.convert_layout(v, a_op), x, acc)
    om = gl.arange(0, 16 * NB, layout=gl.SliceLayout(1, mma))
    on = gl.arange(0, 16, layout=gl.SliceLayout(0, mma))
    gl.store(out_ptr + om[:, None] * 16 + on[None, :], acc)


@gluon.jit
def probe_step(w_ptr, s_ptr, x_ptr, out_ptr, K, I_pad, NB: gl.constexpr, KB: gl.constexpr, WPTX: gl.constexpr,
               FPTX: gl.constexpr, GATE_UP: gl.constexpr):
    """One token's GEMM step as a kernel would run it: gate and up tiles (GATE_UP, GEMM1) or one tile
    (GEMM2), x's slice loaded each step as the B fragments of an n8 MMA (x broadcast over the 8
    columns: the token's one row), and the next step's weight and scale words loaded into
    registers before this step's decode."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    w_off, s_off = _offsets(K, NB, KB)
    up_w = (I_pad // 16) * (2 * K)  # the up rows' slabs follow the gate rows'
    up_s = (I_pad // 16) * (K // 8)
    xk = gl.arange(0, 64 * KB, layout=gl.SliceLayout(1, b_op))
    xn = gl.arange(0, 8, layout=gl.SliceLayout(0, b_op))
    acc_g = gl.zeros([16 * NB, 8], gl.float32, layout=mma)
    acc_u = gl.zeros([16 * NB, 8], gl.float32, layout=mma)
    wg = gl.load(w_ptr + w_off)
    sg = gl.load(s_ptr + s_off)
    wu = wg
    su = sg
    if GATE_UP:
        wu = gl.load(w_ptr + up_w + w_off)
        su = gl.load(s_ptr + up_s + s_off)
    for k0 in range(0, K, 64 * KB):
        k1 = k0 + 64 * KB  # (the last step's prefetch reads one step past K: a probe, not a kernel)
        wg_n = gl.load(w_ptr + w_off + k1 * 2)
        sg_n = gl.load(s_ptr + s_off + k1 // 8)
        x = gl.load(x_ptr + k0 + xk[:, None] + xn[None, :] * 0)
        acc_g = mma_v2(gl.convert_layout(_decode(wg, sg, NB, KB, WPTX, FPTX), a_op), x, acc_g)
        if GATE_UP:
            wu_n = gl.load(w_ptr + up_w + w_off + k1 * 2)
            su_n = gl.load(s_ptr + up_s + s_off + k1 // 8)
            acc_u = mma_v2(gl.convert_layout(_decode(wu, su, NB, KB, WPTX, FPTX), a_op), x, acc_u)
            wu = wu_n
            su = su_n
        wg = wg_n
        sg = sg_n
    om = gl.arange(0, 16 * NB, layout=gl.SliceLayout(1, mma))
    on = gl.arange(0, 8, layout=gl.SliceLayout(0, mma))
    gl.store(out_ptr + om[:, None] * 8 + on[None, :], acc_g + acc_u)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kb", type=int, default=2, help="64-code blocks a K step (2: 128 codes)")
    ap.add_argument("--keep", default=None, help="directory for the TTGIR and SASS")
    args = ap.parse_args()
    consts = {"NB": 4, "KB": args.kb, "WPTX": WORDS32_PTX["rot"], "FPTX": FACTORS32_PTX}
    words = 16 * 4 * 64 * args.kb // 8 // 128  # int32 words a thread a step, a matrix
    print(f"triton {triton.__version__}, sm_90a, Gluon MMA v2, 4 warps, 64 rows x {64 * args.kb} codes a step "
          f"({words} words a thread a matrix)")
    kernels = (("decode + MMA, one matrix", probe, {}, {}, 1),
               ("one-token GEMM1 step (gate + up, x, prefetch)", probe_step, {"I_pad": "i32"}, {"GATE_UP": True}, 2),
               ("one-token GEMM2 step (x, prefetch)", probe_step, {"I_pad": "i32"}, {"GATE_UP": False}, 1))
    for name, fn, extra, flags, matrices in kernels:
        sig = {"w_ptr": "*i32", "s_ptr": "*i32", "x_ptr": "*bf16", "out_ptr": "*fp32", "K": "i32", **extra,
               **{c: "constexpr" for c in {**consts, **flags}}}
        attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(sig)
                 if a.endswith("_ptr") or a in ("K", "I_pad")}
        kernel = triton.compile(GluonASTSource(fn, sig, constexprs={**consts, **flags}, attrs=attrs),
                                target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
        with tempfile.TemporaryDirectory() as tmp:
            cubin = os.path.join(tmp, "k.cubin")
            with open(cubin, "wb") as f:
                f.write(kernel.asm["cubin"])
            sass = subprocess.run([_tool("cuobjdump"), "-sass", cubin], check=True, capture_output=True,
                                  text=True).stdout
            res = subprocess.run([_tool("cuobjdump"), "-res-usage", cubin], check=True, capture_output=True,
                                 text=True).stdout
        if args.keep:
            os.makedirs(args.keep, exist_ok=True)
            for ext, text in (("ttgir", kernel.asm["ttgir"]), ("sass", sass)):
                with open(os.path.join(args.keep, f"{fn.__name__}{matrices}.{ext}"), "w") as f:
                    f.write(text)
        usage = re.search(r"REG:\d+ STACK:\d+", res)
        for n, ops in loops(sass, least=50):
            print(f"{name}: {usage.group(0) if usage else '?'}, K loop {n} instructions "
                  f"({n / (words * matrices):.1f} a word): {', '.join(f'{op} {c}' for op, c in ops.most_common(8))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
