"""The register caps select_config gives the hopper_mma kernels on 16-pair blocks (and on 32-pair blocks where
GEMM2's rows are short), compiled for sm_90a with this Triton (its ptxas) without a GPU, with the decode of
hopper_mma_w_xor (what convert writes): ptxas fits both GEMMs under them with nothing spilled
(benchmarks/results/performance-notebook.md,
"The power limit; register caps on 16- and 32-pair blocks")."""

from __future__ import annotations

import pytest

from mxfp4conv.kernels import triton_moe
from layer_shapes import SHAPES
from sm90_child import nvidia_tools, run_child

_COMPILE = r"""
import json, sys
sys.path.insert(0, "benchmarks/probes")
import hopper_sass as S
from mxfp4conv.kernels.triton_moe import hopper_kernels as HK
from mxfp4conv.kernels import triton_moe as M
out = []
for shape, T in json.loads(sys.argv[1]):
    cfg, c1, c2 = S.point_constants(shape, T, {})
    for fn, consts, second in ((HK.moe_hgemm1_kernel, c1, False), (HK.moe_hgemm2_kernel, c2, True)):
        launch = M.launch._launch_options(cfg, second=second)
        sass, usage = S.compile_sass(fn, consts, launch["num_warps"], launch["num_stages"], None, "", launch.get("maxnreg"))
        out.append([shape, T, int(second), launch.get("maxnreg", 0), usage, "STL" in sass or "LDL" in sass])
print("RESULT" + json.dumps(out))
"""

# 16-pair blocks (DSV3-like T = 256, K3-like T = 512) and 32-pair blocks with short GEMM2 rows (K3-like T = 1024)
POINTS = [("dsv3", 256), ("k3", 512), ("k3", 1024)]


def test_caps_where_measured():
    for shape, T, block_t, cap in (("dsv3", 160, 16, 96), ("dsv3", 384, 16, 96), ("k3", 512, 16, 96),
                                   ("dsv3", 512, 32, 0), ("k3", 1024, 32, 112), ("dsv3", 1024, 64, 0),
                                   ("k3", 4096, 128, 0)):
        H, I, E, k = SHAPES[shape]
        cfg = triton_moe.select_config(T * k, E, H, I, "hopper_mma_xor")
        assert (cfg.block_t, cfg.maxnreg) == (block_t, cap), (shape, T)


@pytest.mark.skipif(not nvidia_tools(), reason="this Triton ships no NVIDIA tools")
def test_capped_kernels_compile_for_sm90_without_spills():
    rows = run_child(_COMPILE, POINTS)
    assert len(rows) == 2 * len(POINTS)
    capped = 0
    for shape, T, second, cap, usage, local in rows:
        regs, stack = (int(usage.split(key)[1].split()[0]) for key in ("REG:", "STACK:"))
        assert stack == 0 and not local, (shape, T, second, usage)  # nothing spilled to local memory
        if cap:
            capped += 1
            assert regs <= cap, (shape, T, second, usage)
    # GEMM1 capped at every point; GEMM2 too where it runs one row tile a program (DSV3-like)
    assert capped == len(POINTS) + 1
