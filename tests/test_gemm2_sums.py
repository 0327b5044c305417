"""moe_hgemm2_kernel with the sum over k in its grid (SUMS, MoEConfig.ksum_sums) compiled for sm_90a with this Triton
(its ptxas) without a GPU, at the tiles fused_moe_triton launches it with: nothing spilled, no more registers than
without it as allocated (in eights), GEMM2's K loop as long as without it (within 2%), and the tickets and counts as global atomics. Its
results are checked on the CPU by tests/test_triton_interpret.py and on a GPU by benchmarks/gpu_check.py (variant
"ksum")."""

from __future__ import annotations

import pytest

from sm90_child import nvidia_tools, run_child

_COMPILE = r"""
import json, sys
sys.path.insert(0, "benchmarks")
import hopper_sass as S
from mxfp4conv.runtime import triton_hopper_kernels as HK, triton_moe as M
out = []
for shape, T in json.loads(sys.argv[1]):
    cfg, c1, c2 = S.point_constants(shape, T, {})
    launch = M._launch_options(cfg, second=True)
    for sums in (0, 32):
        sass, usage = S.compile_sass(HK.moe_hgemm2_kernel, dict(c2, SUMS=sums, ROWS_FIRST=False), launch["num_warps"],
                                     launch["num_stages"], None, "", launch.get("maxnreg"))
        loops = [[n, dict(ops)] for n, ops in S.loops(sass)]
        out.append([shape, T, sums, usage, "STL" in sass or "LDL" in sass, loops, sass.count("ATOMG"), sass.count("RED")])
print("RESULT" + json.dumps(out))
"""

# 32-pair blocks with GEMM2 over four row tiles a program (K3-like T = 1024), 64-pair ones with one (DSV3-like)
POINTS = [("k3", 1024), ("dsv3", 1024)]


@pytest.mark.skipif(not nvidia_tools(), reason="this Triton ships no NVIDIA tools")
def test_sums_in_gemm2_cost_its_k_loop_nothing():
    rows = run_child(_COMPILE, POINTS)
    assert len(rows) == 2 * len(POINTS)
    for (shape, T, _, base, _, base_loops, _, _), (_, _, sums, usage, local, loops, atoms, reds) in zip(rows[::2],
                                                                                                     rows[1::2]):
        regs, stack = (int(usage.split(key)[1].split()[0]) for key in ("REG:", "STACK:"))
        assert stack == 0 and not local, (shape, T, usage)  # nothing spilled to local memory
        # no more registers as allocated (in eights), so as many programs an SM
        assert -(-regs // 8) <= -(-int(base.split("REG:")[1].split()[0]) // 8), (shape, T, usage, base)
        mma = lambda ls: [n for n, ops in ls if ops.get("HGMMA")]  # noqa: E731  (GEMM2's K loops)
        assert len(mma(loops)) == len(mma(base_loops)), (loops, base_loops)
        assert max(mma(loops)) <= 1.02 * max(mma(base_loops)), (loops, base_loops)
        assert atoms >= 1 and reds >= 1, (shape, T, atoms, reds)  # the ticket (returned) and the counts (not)
