"""gluon_wgmma's GEMM1 compiled for sm_90a with this Triton (its ptxas) without a GPU, at the tiles fused_moe_triton
launches it with: nothing spilled, every K step's MMAs as warpgroup MMAs that read the x tile from shared memory
(eight a matrix, one fence before them), the weights and x by cp.async into the ring (no other shared-memory traffic),
and fewer instructions a 128-code step than moe_hgemm1_kernel takes for the same tile. Its results are checked on a
GPU by benchmarks/gpu_check.py (variants "wgmma1" and "wgdual") against a float64 reference."""

from __future__ import annotations

import re

import pytest

from sm90_child import nvidia_tools, run_child

_COMPILE = r"""
import json, sys
sys.path.insert(0, "benchmarks/probes")
import hopper_sass as S
from mxfp4conv.kernels.triton_moe import gluon_wgmma as G
from mxfp4conv.kernels.triton_moe.gluon_few_tokens import WORDS32_PTX
TYPES = {"x_ptr": "*bf16", "inter_ptr": "*bf16", "b_ptr": "*fp32", "p0": "fp32", "p1": "fp32"}
out = []
for consts, cap in json.loads(sys.argv[1]):
    sass, res = S.compile_gluon_sass(G.wg_gemm1, dict(consts, WPTX=WORDS32_PTX["xor"]), TYPES, ("K", "I"),
                                     {"maxnreg": cap} if cap else {})
    out.append([res, [[n, dict(ops)] for n, ops in S.loops(sass)], sass.count("LDL")])
# moe_hgemm1_kernel's K loops at the same points, for the instruction counts
from mxfp4conv.kernels.triton_moe import hopper_kernels as HK
from mxfp4conv.kernels import triton_moe as M
ref = {}
for shape, T in (("dsv3", 1024), ("k3", 1024)):
    cfg, c1, _ = S.point_constants(shape, T, {})
    launch = M.launch._launch_options(cfg, second=False)
    sass, _ = S.compile_sass(HK.moe_hgemm1_kernel, c1, launch["num_warps"], launch["num_stages"], None, "",
                             launch.get("maxnreg"))
    ref[shape] = [n for n, _ in S.loops(sass)]
print("RESULT" + json.dumps([out, ref]))
"""

# (compile-time arguments, register cap, the point whose moe_hgemm1_kernel it is compared with) as fused_moe_triton
# launches wg_gemm1: 64-pair blocks with 32-pair tail tiles (DSV3-like T = 1024) and 32-pair blocks with 16-pair
# ones (K3-like T = 1024), and in two tiles a block (wgmma_dual): 32 + 8 and 32 + 16 on 64-pair blocks two stages deep
# (the default there), 16 + 8 on 32-pair ones
_ACT = dict(ACT=0, HAS_LIMIT=False, HAS_LINEAR=False, HAS_BIAS=False)
JOBS = [
    (dict(KB=2, BT=64, TAIL=32, STAGES=3, **_ACT), 168, "dsv3"),
    (dict(KB=2, BT=32, TAIL=16, STAGES=3, **_ACT), 0, "k3"),
    (dict(KB=2, BT=64, TAIL=32, STAGES=2, DUAL=2, **_ACT), 168, "dsv3"),
    (dict(KB=2, BT=32, TAIL=16, STAGES=3, DUAL=1, **_ACT), 0, "k3"),
]


def _widths(consts: dict) -> list[tuple[int, ...]]:
    """The tiles of each K loop the kernel compiles: the block's width, the tail's, and the two-tile forms."""
    bt, tail, dual = consts["BT"], consts["TAIL"], consts.get("DUAL", 0)
    out = [(bt,)] + ([(tail,)] if tail else [])
    if tail and dual:
        out += [(tail, tail // 2)] + ([(tail, tail // 4)] if dual == 2 else [])
    return out


def _tools_available() -> bool:
    try:
        from triton.experimental import gluon  # noqa: F401
    except ImportError:
        return False
    return nvidia_tools()


@pytest.fixture(scope="module")
def compiled():
    return run_child(_COMPILE, [[consts, cap] for consts, cap, _ in JOBS], timeout=900)


@pytest.mark.skipif(not _tools_available(), reason="this Triton has no Gluon or ships no NVIDIA tools")
@pytest.mark.parametrize("job", range(len(JOBS)))
def test_kernel_compiles_with_warpgroup_mmas_and_no_spills(compiled, job):
    (res, loops, ldl), ref = compiled[0][job], compiled[1]
    consts, cap, shape = JOBS[job]
    assert re.search(r"STACK:0\b", res) and ldl == 0, res  # nothing spilled to local memory
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    assert regs <= (cap or 255)
    k_loops = [(n, ops) for n, ops in loops if ops.get("HGMMA")]
    widths = _widths(consts)
    assert len(k_loops) == len(widths), loops  # one K loop a tile form
    mma_widths = sorted(len(w) for w in widths)
    assert sorted(ops["HGMMA"] // 16 for _, ops in k_loops) == mma_widths, k_loops
    for n, ops in k_loops:
        assert ops["HGMMA"] % 16 == 0, ops  # 128 codes: 8 k16 MMAs a matrix (gate, up) and tile
        tiles = ops["HGMMA"] // 16
        assert ops.get("WARPGROUP", 0) <= (tiles + 1) * 2, ops  # a fence a matrix and tile and a wait, not one a k16
        # MMA
        # weights and x by cp.async, the words read back once a step (no other shared-memory traffic: no stores)
        assert ops.get("LDGSTS", 0) >= 8 and "LDG" not in ops and "STS" not in ops, ops
    # fewer instructions a step than moe_hgemm1_kernel's loops for this point (the same 64 rows a program)
    assert max(n for n, _ in k_loops) < min(ref[shape]), (k_loops, ref[shape])


def test_the_forms_select_config_asks_for_are_compiled_here():
    """Every gluon_wgmma GEMM1 that select_config asks for on the two layer shapes is among JOBS, so the checks above
    cover the kernels the default runs."""
    from mxfp4conv.kernels import triton_moe as M
    asked = set()
    for E, H, I, k in ((256, 7168, 2048, 8), (896, 3584, 384, 16)):
        for T in (64, 128, 256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 2048, 3072, 4096):
            cfg = M.select_config(T * k, E, H, I, "hopper_mma_xor")
            if cfg.wgmma1:
                asked.add((cfg.block_t, cfg.tail_t, cfg.wgmma1_stages, cfg.wgmma_dual))
    assert asked  # the default runs it somewhere
    jobs = {(c["BT"], c["TAIL"], c["STAGES"], c.get("DUAL", 0)) for c, _, _ in JOBS}
    assert asked <= jobs, asked - jobs
