"""benchmarks/decode_probe.py's timing probes compiled for sm_90a with this Triton (its ptxas) without a GPU: in every
K loop of the hopper_mma GEMMs a probe issues the same global loads and MMAs as the hopper_mma_w_xor decode it stands
in for; ``nodecode`` keeps the e8m0 factor multiplies and drops at least 4 of the decode's 8 instructions a word,
``noscale`` has no factor multiplies and one logic instruction a word. What the probes time is then the decode's
cost and nothing else of the kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import triton

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_COMPILE = r"""
import json, sys
sys.path.insert(0, "benchmarks")
import decode_probe, hopper_sass as S
from mxfp4conv.runtime import triton_hopper_kernels as HK, triton_moe as M
layouts = ["hopper_mma_xor"] + list(decode_probe.register_probes().values())
out = []
for shape, T in json.loads(sys.argv[1]):
    for layout in layouts:
        cfg, c1, c2 = S.point_constants(shape, T, {}, layout)
        for fn, consts, second in ((HK.moe_hgemm1_kernel, c1, False), (HK.moe_hgemm2_kernel, c2, True)):
            launch = M._launch_options(cfg, second=second)
            sass, _ = S.compile_sass(fn, consts, launch["num_warps"], launch["num_stages"], None, "",
                                     launch.get("maxnreg"))
            out.append([shape, T, layout, int(second), [[n, dict(ops)] for n, ops in S.loops(sass)]])
print("RESULT" + json.dumps(out))
"""

POINTS = [("k3", 1024)]  # 32-pair blocks: GEMM1 in 64-code steps, GEMM2's rows four 128-code steps


def _tools_available() -> bool:
    return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))


@pytest.mark.skipif(not _tools_available(), reason="this Triton ships no NVIDIA tools")
def test_probes_drop_the_decode_and_keep_the_loads_and_mmas():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(POINTS)], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(next(x for x in run.stdout.splitlines() if x.startswith("RESULT"))[len("RESULT"):])
    loops = {(shape, T, layout.removeprefix("hopper_mma_probe_"), second): lp for shape, T, layout, second, lp in rows}
    assert len(loops) == len(POINTS) * 3 * 2
    for shape, T in POINTS:
        for second in (0, 1):
            xor, nodecode, noscale = (loops[shape, T, name, second] for name in ("hopper_mma_xor", "nodecode", "noscale"))
            assert xor and len(xor) == len(nodecode) == len(noscale), (shape, T, second)
            for (n_x, x), (n_d, d), (n_s, s) in zip(xor, nodecode, noscale):
                for op in ("HGMMA", "LDGSTS", "LDG", "LDS", "LDSM"):  # the MMAs, the weight, scale and x loads
                    assert x.get(op, 0) == d.get(op, 0) == s.get(op, 0), (shape, T, second, op)
                assert x["HGMMA"] > 0 and x.get("LDGSTS", 0) + x.get("LDG", 0) > 0, (shape, T, second, x)
                words = s["LOP3"]  # noscale: one xor a word, nothing else of the kind
                assert words > 0 and "HMUL2" not in s, (shape, T, second, s)
                assert d["HMUL2"] == x["HMUL2"] > 0, (shape, T, second)
                assert n_x - n_d >= 4 * words and n_d - n_s >= x["HMUL2"], (shape, T, second, n_x, n_d, n_s)
