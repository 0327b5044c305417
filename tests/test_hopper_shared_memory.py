"""The hopper_mma kernels fit an sm_90 program's shared memory (227 KiB) at select_config's prefill tiles with fp32
x too: compiled for sm_90a with this Triton without a GPU, at the launch options fused_moe_triton passes
(hopper_launch_options). Three stages of fp32 [128, block_k] x tiles need 232-280 KiB there, which a GPU refuses at
launch."""

from __future__ import annotations

import pytest
import torch

from mxfp4conv.kernels import triton_moe
from layer_shapes import SHAPES
from sm90_child import nvidia_tools, run_child

SM90_SHARED = 227 * 1024  # the most shared memory one program may have on sm_90

_COMPILE = r"""
import json, sys
sys.path.insert(0, "benchmarks/probes")
import triton.language as tl
import hopper_sass as S
from mxfp4conv.kernels.triton_moe import hopper_kernels as HK
from mxfp4conv.kernels import triton_moe as M
out = []
for shape, T, second, stages in json.loads(sys.argv[1]):
    cfg, c1, c2 = S.point_constants(shape, T, {}, dtype=tl.float32)
    fn, consts = (HK.moe_hgemm2_kernel, c2) if second else (HK.moe_hgemm1_kernel, c1)
    launch = M.launch.hopper_launch_options(cfg, 4, second=bool(second))
    if stages:
        launch["num_stages"] = stages
    k = S.compile_kernel(fn, consts, launch["num_warps"], launch["num_stages"], launch.get("maxnreg"), x_type="fp32")
    out.append([shape, T, second, launch["num_stages"], k.metadata.shared])
print("RESULT" + json.dumps(out))
"""


def test_fp32_prefill_takes_two_stages_and_bf16_three():
    for shape, T in (("dsv3", 2048), ("dsv3", 4096), ("k3", 4096)):
        H, I, E, k = SHAPES[shape]
        cfg = triton_moe.select_config(T * k, E, H, I, "hopper_mma_xor")
        assert cfg.block_t == 128 and cfg.num_stages == 3, (shape, T)
        for second in (False, True):
            bf16 = triton_moe.launch.hopper_launch_options(cfg, torch.bfloat16.itemsize, second)
            fp32 = triton_moe.launch.hopper_launch_options(cfg, torch.float32.itemsize, second)
            assert bf16 == triton_moe.launch._launch_options(cfg, second), (shape, T, second)
            assert fp32 == dict(bf16, num_stages=min(bf16["num_stages"], 2)), (shape, T, second)
    # 64-pair blocks keep their stages with fp32 x (their tiles fit three deep)
    cfg = triton_moe.select_config(2048 * 16, 896, 3584, 384, "hopper_mma_xor")
    assert cfg.block_t == 64
    assert triton_moe.launch.hopper_launch_options(cfg, 4) == triton_moe.launch._launch_options(cfg)


@pytest.mark.skipif(not nvidia_tools(), reason="this Triton ships no NVIDIA tools")
def test_fp32_prefill_kernels_fit_sm90_shared_memory():
    # DSV3-like T = 2048: 64-pair tails in 64 + 16 tiles; T = 4096: an expert's last 32 pairs in its block before
    # (a second x tile); both GEMMs at the launch options, and GEMM1 of T = 2048 three stages deep beside them
    points = [("dsv3", 2048, 0, 0), ("dsv3", 2048, 1, 0), ("dsv3", 4096, 0, 0), ("dsv3", 2048, 0, 3)]
    rows = run_child(_COMPILE, points, timeout=900)
    assert len(rows) == len(points)
    for shape, T, second, stages, shared in rows[:3]:
        assert stages == 2 and shared <= SM90_SHARED, (shape, T, second, stages, shared)
    assert rows[3][4] > SM90_SHARED, rows[3]  # what three stages would ask for: the launch error this avoids
