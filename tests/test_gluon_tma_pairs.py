"""The per-pair kernels fed by TMA rings (mxfp4conv/runtime/gluon_tma_pairs.py) without a GPU: their plan (rings and
K splits) and their compilation for sm_90a with this Triton (benchmarks/gpu_check.py checks their results on a GPU)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from mxfp4conv.errors import RuntimeInputError
from mxfp4conv.runtime import triton_moe
from mxfp4conv.runtime.triton_moe import MoEConfig, tma_rings


def test_rings_and_splits_of_the_measured_layers():
    # DSV3-like T = 1: 8 pairs; GEMM1 128 slabs a pair, 28 stages of 4 steps: 2 splits give 2048 programs; GEMM2 448
    # slabs a pair (3584 programs) unsplit, 8 stages of 256 codes
    assert tma_rings(MoEConfig(), 7168, 2048, 8) == ((1, 1, 4, 2), (1, 1, 4, 3), 2, 1)
    # K3-like T = 1: 16 pairs; GEMM1 24 slabs a pair (384 programs): 6 splits asked, lowered to 2, the largest divisor
    # of its 14 stages under that; GEMM2's 384 codes hold no stage of 256: stages of 128, two slabs a program (a
    # stage's scale words fill a 128-byte line), 3 stages, unsplit
    assert tma_rings(MoEConfig(), 3584, 384, 16) == ((1, 1, 4, 2), (2, 1, 2, 3), 2, 1)
    # programs of 4 slabs: a quarter of the programs, so more K splits: GEMM1 22 asked, 14 taken (one stage each),
    # GEMM2 3 (one stage each)
    cfg = MoEConfig(gluon_tma_nb1=4, gluon_tma_nb2=4, gluon_tma_sub1=2, gluon_tma_sub2=2)
    assert tma_rings(cfg, 3584, 384, 16) == ((4, 1, 2, 2), (4, 1, 2, 1), 14, 3)


def test_rings_are_lowered_to_what_a_split_holds():
    cfg = MoEConfig(gluon_tma_kb2=2, gluon_tma_sub2=2, gluon_tma_stages2=8, gluon_tma_split1=7, gluon_tma_stages1=8,
                    gluon_tma_nb1=4, gluon_tma_sub1=2, gluon_tma_split2=1)
    (nb1, kb1, sub1, st1), (nb2, kb2, sub2, st2), s1, s2 = tma_rings(cfg, 3584, 192, 16)
    # GEMM2's rows are 192 codes: stages of 256 or 128 do not divide them, 64 does (3 stages): 8 stages lowered to 3,
    # and 4 slabs a program
    assert (nb2, kb2, sub2, st2, s2) == (4, 1, 1, 3, 1)
    # GEMM1: 28 stages of 128 codes in 7 splits, 4 stages each; 12 slabs a matrix, programs of 4
    assert (nb1, kb1, sub1, st1, s1) == (4, 1, 2, 4, 7)


@pytest.mark.parametrize("bad", [dict(gluon_tma_kb1=4), dict(gluon_tma_sub2=3), dict(gluon_tma_kb1=2, gluon_tma_sub1=4),
                                 dict(gluon_tma_stages2=0), dict(gluon_tma_stages1=9), dict(gluon_tma_nb2=3)])
def test_bad_rings_are_refused(bad):
    with pytest.raises(RuntimeInputError, match="TMA ring"):
        tma_rings(MoEConfig(**bad), 7168, 2048, 8)


# Compiled in a child process: this session runs Triton in its interpreter, which cannot compile.
_COMPILE = r"""
import json, os, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from mxfp4conv.runtime import gluon_tma_pairs as G

TOOL = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
out = []
for name, consts in json.loads(sys.argv[1]):
    fn = getattr(G, name)
    span, nb = consts["KB"] * consts["SUB"], consts["NB"]
    types = {"wdesc": f"tensordesc<i32[{nb}, {span}, 128],{G._NVMMA3!r}>",
             "sdesc": f"tensordesc<i32[{nb}, {span}, 8],{G._NVMMA3!r}>",
             "xdesc": f"tensordesc<bf16[1, {64 * span}],{G._NVMMA_X!r}>", "inter_ptr": "*bf16", "b_ptr": "*fp32",
             "part_ptr": "*fp32", "tw_ptr": "*fp32", "out_ptr": "*bf16", "p0": "fp32", "p1": "fp32"}
    sig = {n: "constexpr" if n in consts else types.get(n, "*i32" if n.endswith("_ptr") else "i32")
           for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(sig) if n.endswith("_ptr") or n in ("I", "N")}
    kernel = triton.compile(GluonASTSource(fn, sig, constexprs=consts, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32), options=dict(num_warps=1))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        sass = subprocess.run([TOOL, "-sass", cubin], check=True, capture_output=True, text=True).stdout
        res = subprocess.run([TOOL, "-res-usage", cubin], check=True, capture_output=True, text=True).stdout
    out.append((sass, res))
print("RESULT" + json.dumps(out))
"""

_ACT = dict(ACT=triton_moe._ACT_IDS["silu"], HAS_LIMIT=True, HAS_LINEAR=False)
# (kernel, constexprs): GEMM1 split and unsplit, with and without biases; GEMM2 with its sum in its last programs or
# not, after GEMM1 (PDL) or not
JOBS = [("tma_gemm1", dict(KB=1, SUB=4, STAGES=2, **_ACT, HAS_BIAS=False, SPLITS=2, PDL=2, NB=1)),
        ("tma_gemm1", dict(KB=2, SUB=2, STAGES=2, **_ACT, HAS_BIAS=True, SPLITS=1, PDL=0, NB=2)),
        ("tma_gemm2", dict(KB=1, SUB=2, STAGES=3, HAS_BIAS=False, SPLITS=1, PDL=True, SUM=True, RELEASE=False, NB=2)),
        ("tma_gemm2", dict(KB=2, SUB=1, STAGES=4, HAS_BIAS=True, SPLITS=2, PDL=False, SUM=False, RELEASE=True,
                           NB=4))]


def _tools_available() -> bool:
    try:
        import triton
        from triton.experimental.gluon.language.nvidia.hopper import tma  # noqa: F401
    except ImportError:
        return False
    return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(JOBS)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def _ops(sass: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)", sass)]


@pytest.mark.skipif(not _tools_available(), reason="this Triton has no Gluon TMA or ships no NVIDIA tools")
@pytest.mark.parametrize("i", range(len(JOBS)))
def test_ring_kernels_compile_for_sm90_without_spills(compiled, i):
    name, consts = JOBS[i]
    sass, res = compiled[i]
    assert re.search(r"STACK:0\b", res) and "LDL" not in sass and "STL" not in sass, res
    ops = _ops(sass)
    matrices = 2 if name == "tma_gemm1" else 1
    # a stage's loads are TMA copies (words and scale words of each matrix, and x), issued for the first STAGES
    # stages and again in the loop; the weights never come through the registers' global loads
    tma = [n for n, op in enumerate(ops) if op.startswith("UTMALDG")]
    assert len(tma) == (2 * matrices + 1) * (consts["STAGES"] + 1), len(tma)
    # a stage's words read back as one 16-byte shared load a lane a step of 64 codes, x as ldmatrix fragments
    steps = consts["KB"] * consts["SUB"]
    assert ops.count("LDS.128") >= matrices * consts["SUB"] * consts["NB"] and any(op.startswith("LDSM") for op in ops)
    assert sum(op.startswith("HMMA.16816.F32.BF16") for op in ops) >= matrices * 4 * steps * consts["NB"]
    assert not any(op == "LDG.E.128" for op in ops)
    # GEMM2 after GEMM1 (PDL) asks for its first stages' weights, then waits for GEMM1, then asks for x
    waits = [n for n, op in enumerate(ops) if op.startswith("ACQBULK")]
    assert len(waits) == (1 if consts.get("PDL") is True else 0)
    if waits:
        assert tma[0] < waits[0] < tma[2 * consts["STAGES"]], (tma, waits)
    # one arrival count where partials are summed in the kernel (GEMM1's splits, GEMM2's sum over k)
    counted = consts.get("SPLITS", 1) > 1 if name == "tma_gemm1" else consts["SUM"]
    assert ("ATOMG.E.ADD" in sass) == counted
