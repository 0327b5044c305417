"""Instructions per K step of a one-token MMA v2 (mma.sync) decode written in Gluon, from its sm_90a
SASS without a GPU: what Triton's own MMA v2 lowering cannot reach (docs/performance.md, "MMA v2").

Gluon (triton.experimental.gluon, triton 3.6) states every layout, so the decoded tile can be
given the hardware's operand order (DotOperandLayout k_width 2) directly: each lane's int32 words
of a hopper_mma_w_rot 16 x 64 block decode, with the production PTX (triton_hopper_kernels), into
exactly its m16n8k16 A fragment, and the conversion to the operand layout is free. The probe is one
weight matrix of 64 rows (4 warps, a 16-row slab each), one K step of 64 * KB codes a loop iteration,
e8m0 factors two to a word, x [K, 16] held in registers (it is not re-loaded each step, and
nothing is pipelined): it counts the decode, the scale multiply and the MMAs, the part a kernel
built this way would add to its loads.

    python benchmarks/gluon_v2_probe.py [--kb 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402

from benchmarks.hopper_sass import _tool, loops  # noqa: E402
from mxfp4conv.runtime import triton_hopper_kernels as HK  # noqa: E402


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


@gluon.jit
def probe(w_ptr, s_ptr, x_ptr, out_ptr, K, NB: gl.constexpr, KB: gl.constexpr, WPTX: gl.constexpr,
          FPTX: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    w_off = (gl.arange(0, NB, layout=W0)[:, None, None, None, None] * (2 * K)
             + gl.arange(0, KB, layout=W1)[None, :, None, None, None] * 128
             + gl.arange(0, 8, layout=W2)[None, None, :, None, None] * 16
             + gl.arange(0, 4, layout=W3)[None, None, None, :, None] * 4
             + gl.arange(0, 4, layout=W4)[None, None, None, None, :])
    s_off = (gl.arange(0, NB, layout=S0)[:, None, None, None] * (K // 8)
             + gl.arange(0, KB, layout=S1)[None, :, None, None] * 8
             + gl.arange(0, 8, layout=S2)[None, None, :, None]
             + gl.arange(0, 4, layout=S3)[None, None, None, :] * 0)
    xk = gl.arange(0, 64 * KB, layout=gl.SliceLayout(1, b_op))
    xn = gl.arange(0, 16, layout=gl.SliceLayout(0, b_op))
    x = gl.load(x_ptr + xk[:, None] * 16 + xn[None, :])
    acc = gl.zeros([16 * NB, 16], gl.float32, layout=mma)
    for k0 in range(0, K, 64 * KB):
        o = gl.inline_asm_elementwise(asm=WPTX, constraints="=h,=h,=h,=h,=h,=h,=h,=h,r",
                                      args=[gl.load(w_ptr + w_off + k0 * 2)], dtype=(gl.bfloat16,) * 8,
                                      is_pure=True, pack=1)
        a = gl.join(gl.join(o[0], o[2]), gl.join(o[1], o[3])).reshape(NB, KB, 8, 4, 4, 4)
        b = gl.join(gl.join(o[4], o[6]), gl.join(o[5], o[7])).reshape(NB, KB, 8, 4, 4, 4)
        v = gl.join(a, b).reshape(NB, KB, 8, 4, 2, 2, 2, 2, 2)  # nb b g t (j kt) (c kk) h
        f4 = gl.inline_asm_elementwise(asm=FPTX, constraints="=h,=h,=h,=h,r", args=[gl.load(s_ptr + s_off + k0 // 8)],
                                       dtype=(gl.bfloat16,) * 4, is_pure=True, pack=1)
        f = gl.join(gl.join(f4[0], f4[2]), gl.join(f4[1], f4[3])).permute(0, 1, 2, 3, 5, 4)  # nb b g t j h
        v = v * gl.convert_layout(f.reshape(NB, KB, 8, 4, 2, 1, 1, 1, 2), v.type.layout)
        v = v.reshape(NB, KB, 8, 4, 4, 2, 2, 2).permute(0, 7, 2, 1, 4, 5, 3, 6).reshape(NB * 16, KB * 64)
        acc = mma_v2(gl.convert_layout(v, a_op), x, acc)
    om = gl.arange(0, 16 * NB, layout=gl.SliceLayout(1, mma))
    on = gl.arange(0, 16, layout=gl.SliceLayout(0, mma))
    gl.store(out_ptr + om[:, None] * 16 + on[None, :], acc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kb", type=int, default=2, help="64-code blocks a K step (2: 128 codes)")
    ap.add_argument("--keep", default=None, help="directory for the TTGIR and SASS")
    args = ap.parse_args()
    sig = {"w_ptr": "*i32", "s_ptr": "*i32", "x_ptr": "*bf16", "out_ptr": "*fp32", "K": "i32", "NB": "constexpr",
           "KB": "constexpr", "WPTX": "constexpr", "FPTX": "constexpr"}
    consts = {"NB": 4, "KB": args.kb, "WPTX": HK._WORDS32_ROT_PTX.value, "FPTX": HK._FACTORS32_PTX.value}
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 4)}
    kernel = triton.compile(GluonASTSource(probe, sig, constexprs=consts, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        sass = subprocess.run([_tool("cuobjdump"), "-sass", cubin], check=True, capture_output=True, text=True).stdout
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", cubin], check=True, capture_output=True, text=True).stdout
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        for ext, text in (("ttgir", kernel.asm["ttgir"]), ("sass", sass)):
            with open(os.path.join(args.keep, f"gluon_v2_probe.{ext}"), "w") as f:
                f.write(text)
    words = 16 * 4 * 64 * args.kb // 8 // 128  # int32 words a thread a step
    usage = re.search(r"REG:\d+ STACK:\d+", res)
    print(f"triton {triton.__version__}, sm_90a, Gluon MMA v2, 64 rows x {64 * args.kb} codes a step, "
          f"{words} words a thread; {usage.group(0) if usage else '?'}")
    for n, ops in loops(sass, least=50):
        print(f"K loop: {n} instructions ({n / words:.1f} a word): {', '.join(f'{op} {c}' for op, c in ops.most_common(8))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
