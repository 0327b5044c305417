"""benchmarks/probes/decode_probe.py's timing probes compiled for sm_90a with this Triton (its ptxas) without a GPU: in every
K loop of the hopper_mma GEMMs and of the Gluon kernels a probe issues the same loads and MMAs as the hopper_mma_w_xor
decode it stands in for; ``nodecode`` keeps the e8m0 factor multiplies and drops at least 4 of the decode's 8
instructions a word, ``noscale`` (hopper_mma kernels) has no factor multiplies and one logic instruction a word. What
the probes time is then the decode's cost and nothing else of the kernels."""

from __future__ import annotations

import os
import sys

import pytest

import test_gluon_few_tokens as gluon_tests
from mxfp4conv.kernels.triton_moe.gluon_few_tokens import WORDS32_PTX, words32_ptx
from sm90_child import ROOT, nvidia_tools, run_child

_COMPILE = r"""
import json, sys
sys.path.insert(0, "benchmarks/probes")
import decode_probe, hopper_sass as S
from mxfp4conv.kernels.triton_moe import hopper_kernels as HK
from mxfp4conv.kernels import triton_moe as M
layouts = ["hopper_mma_xor"] + list(decode_probe.register_probes().values())
out = []
for shape, T in json.loads(sys.argv[1]):
    for layout in layouts:
        cfg, c1, c2 = S.point_constants(shape, T, {}, layout)
        for fn, consts, second in ((HK.moe_hgemm1_kernel, c1, False), (HK.moe_hgemm2_kernel, c2, True)):
            launch = M.launch._launch_options(cfg, second=second)
            sass, _ = S.compile_sass(fn, consts, launch["num_warps"], launch["num_stages"], None, "",
                                     launch.get("maxnreg"))
            out.append([shape, T, layout, int(second), [[n, dict(ops)] for n, ops in S.loops(sass)]])
print("RESULT" + json.dumps(out))
"""

POINTS = [("k3", 1024)]  # 32-pair blocks: GEMM1 in 64-code steps, GEMM2's rows four 128-code steps


@pytest.mark.skipif(not nvidia_tools(), reason="this Triton ships no NVIDIA tools")
def test_probes_drop_the_decode_and_keep_the_loads_and_mmas():
    rows = run_child(_COMPILE, POINTS, timeout=900)
    loops = {(shape, T, layout.removeprefix("hopper_mma_probe_"), second): lp for shape, T, layout, second, lp in rows}
    assert len(loops) == len(POINTS) * 3 * 2
    for shape, T in POINTS:
        for second in (0, 1):
            xor, nodecode, noscale = (loops[shape, T, name, second]
                                      for name in ("hopper_mma_xor", "nodecode", "noscale"))
            assert xor and len(xor) == len(nodecode) == len(noscale), (shape, T, second)
            for (n_x, x), (n_d, d), (n_s, s) in zip(xor, nodecode, noscale):
                for op in ("HGMMA", "LDGSTS", "LDG", "LDS", "LDSM"):  # the MMAs, the weight, scale and x loads
                    assert x.get(op, 0) == d.get(op, 0) == s.get(op, 0), (shape, T, second, op)
                assert x["HGMMA"] > 0 and x.get("LDGSTS", 0) + x.get("LDG", 0) > 0, (shape, T, second, x)
                words = s["LOP3"]  # noscale: one xor a word, nothing else of the kind
                assert words > 0 and "HMUL2" not in s, (shape, T, second, s)
                assert d["HMUL2"] == x["HMUL2"] > 0, (shape, T, second)
                assert n_x - n_d >= 4 * words and n_d - n_s >= x["HMUL2"], (shape, T, second, n_x, n_d, n_s)


@pytest.mark.skipif(not gluon_tests._tools_available(), reason="this Triton has no Gluon or ships no NVIDIA tools")
def test_gluon_probe_drops_the_decode_and_keeps_the_loads_and_mmas():
    jobs = []
    for name, consts, cap in gluon_tests.XOR_TUNED:  # the per-pair GEMMs and the expert blocks' GEMM1, as tuned
        for ptx in (WORDS32_PTX["xor"], words32_ptx("nodecode")):
            jobs.append((name, dict(consts, WPTX=ptx), {"maxnreg": cap} if cap else {}))
    out = run_child(gluon_tests._COMPILE, jobs, timeout=900)
    for i, (name, _, _) in enumerate(gluon_tests.XOR_TUNED):
        (xor_sass, _), (probe_sass, _) = out[2 * i], out[2 * i + 1]
        xor, probe = gluon_tests.hopper_sass.loops(xor_sass), gluon_tests.hopper_sass.loops(probe_sass)
        assert xor and len(xor) == len(probe), name
        for (n_x, x), (n_p, p) in zip(xor, probe):
            for op in ("HMMA", "LDG", "LDS", "LDSM", "HMUL2"):  # the MMAs, the loads, the factor multiplies
                assert x.get(op, 0) == p.get(op, 0), (name, op)
            assert x["HMMA"] > 0 and x["HMUL2"] > 0, (name, x)
            assert n_x - n_p >= x["HMUL2"], (name, n_x, n_p)  # 4 factor multiplies a word, >= 4 fewer a word


def test_programs_an_sm_by_registers_and_shared_memory():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "probes"))
    from decode_probe import programs_an_sm
    # DSV3-like T = 1024's GEMM1 (4 warps, 68 KB): 168 registers hold 3 programs an SM, 169-184 only 2
    assert [programs_an_sm(r, 68, 4) for r in (168, 169, 184)] == [3, 2, 2]
    # 32 KB of shared memory and the 1 KB the driver keeps a program: 6; 255 registers at 8 warps: 1
    assert programs_an_sm(56, 32, 4) == 6 and programs_an_sm(255, 160, 8) == 1
