"""gluon_wgmma's GEMMs compiled for sm_90a with this Triton (its ptxas) without a GPU, at the tiles fused_moe_triton
launches them with: nothing spilled, every K step's MMAs as warpgroup MMAs that read the x tile from shared memory
(eight a matrix, one fence before them), the weights loaded straight into registers (no shared-memory round trip),
and fewer instructions a 128-code step than moe_hgemm1_kernel / moe_hgemm2_kernel take for the same tile. Their
results are checked on a GPU by benchmarks/gpu_check.py (variant "wgmma1") against a float64 reference."""

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
TYPES = {"x_ptr": "*bf16", "a_ptr": "*bf16", "inter_ptr": "*bf16", "out_ptr": "*bf16", "b_ptr": "*fp32",
         "tw_ptr": "*fp32", "p0": "fp32", "p1": "fp32"}
out = []
for name, consts, cap in json.loads(sys.argv[1]):
    sass, res = S.compile_gluon_sass(getattr(G, name), dict(consts, WPTX=WORDS32_PTX["xor"]), TYPES, ("K", "I", "N"),
                                     {"maxnreg": cap} if cap else {})
    out.append([res, [[n, dict(ops)] for n, ops in S.loops(sass)], sass.count("LDL")])
# the hopper_mma kernels' K loops at the same points, for the instruction counts
from mxfp4conv.kernels.triton_moe import hopper_kernels as HK
from mxfp4conv.kernels import triton_moe as M
ref = {}
for shape, T in (("dsv3", 1024), ("k3", 1024)):
    cfg, c1, c2 = S.point_constants(shape, T, {})
    for fn, consts, second in ((HK.moe_hgemm1_kernel, c1, False), (HK.moe_hgemm2_kernel, c2, True)):
        launch = M.launch._launch_options(cfg, second=second)
        sass, _ = S.compile_sass(fn, consts, launch["num_warps"], launch["num_stages"], None, "", launch.get("maxnreg"))
        ref[f"{shape}{int(second) + 1}"] = [n for n, _ in S.loops(sass)]
print("RESULT" + json.dumps([out, ref]))
"""

# (kernel, compile-time arguments, register cap) as fused_moe_triton launches them: DSV3-like T = 1024 (64-pair
# blocks, 32-pair tiles) and K3-like T = 1024 (32-pair blocks, 16-pair tiles) and a 16-pair block; GEMM2 in 128- and
# 64-row programs
_ACT = dict(ACT=0, HAS_LIMIT=False, HAS_LINEAR=False, HAS_BIAS=False)
JOBS = [
    ("wg_gemm1", dict(KB=2, BT=64, TAIL=32, STAGES=3, OVERLAP=2, **_ACT), 168, "dsv3"),
    ("wg_gemm1", dict(KB=2, BT=32, TAIL=16, STAGES=3, OVERLAP=3, **_ACT), 0, "k3"),
    ("wg_gemm1", dict(KB=2, BT=16, TAIL=0, STAGES=3, OVERLAP=3, **_ACT), 0, None),
    # the words through the ring of shared-memory stages (wgmma1_ring)
    ("wg_gemm1", dict(KB=2, BT=64, TAIL=32, STAGES=3, RING=True, **_ACT), 168, "dsv3"),
    ("wg_gemm1", dict(KB=2, BT=32, TAIL=16, STAGES=3, RING=True, **_ACT), 0, "k3"),
    ("wg_gemm2", dict(KB=2, BT=64, TAIL=32, ROWS=128, STAGES=3, HAS_BIAS=True), 0, "dsv3"),
    ("wg_gemm2", dict(KB=2, BT=32, TAIL=16, ROWS=64, STAGES=3, HAS_BIAS=False), 0, None),
    # GEMM2's words through the intermediate tile's ring (wgmma2_ring) on 32-pair blocks
    ("wg_gemm2", dict(KB=2, BT=32, TAIL=16, ROWS=128, STAGES=3, HAS_BIAS=False, RING=True), 0, "k3"),
    # two tiles a block (wgmma_dual): 32 + 8 and 32 + 16 on 64-pair blocks, 16 + 8 on 32-pair ones
    ("wg_gemm1", dict(KB=2, BT=64, TAIL=32, STAGES=2, RING=True, DUAL=2, **_ACT), 168, "dsv3"),
    ("wg_gemm1", dict(KB=2, BT=32, TAIL=16, STAGES=3, RING=True, DUAL=1, **_ACT), 0, "k3"),
    ("wg_gemm2", dict(KB=2, BT=64, TAIL=32, ROWS=128, STAGES=3, HAS_BIAS=False, RING=True, DUAL=2), 0, "dsv3"),
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
    return run_child(_COMPILE, [[name, consts, cap] for name, consts, cap, _ in JOBS], timeout=900)


@pytest.mark.skipif(not _tools_available(), reason="this Triton has no Gluon or ships no NVIDIA tools")
@pytest.mark.parametrize("job", range(len(JOBS)))
def test_kernel_compiles_with_warpgroup_mmas_and_no_spills(compiled, job):
    (res, loops, ldl), ref = compiled[0][job], compiled[1]
    name, consts, cap, shape = JOBS[job]
    assert re.search(r"STACK:0\b", res) and ldl == 0, res  # nothing spilled to local memory
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    assert regs <= (cap or 255)
    gate_up = 2 if name == "wg_gemm1" else 1
    rows = consts.get("ROWS", 64)
    k_loops = [(n, ops) for n, ops in loops if ops.get("HGMMA")]
    widths = _widths(consts)
    assert len(k_loops) == len(widths), loops  # one K loop a tile form
    mma_widths = sorted(len(w) for w in widths)
    assert sorted(ops["HGMMA"] // (gate_up * 8 * rows // 64) for _, ops in k_loops) == mma_widths, k_loops
    for n, ops in k_loops:
        assert ops["HGMMA"] % (gate_up * 8 * rows // 64) == 0, ops  # 128 codes: 8 k16 MMAs a matrix, 64 rows, tile
        tiles = ops["HGMMA"] // (gate_up * 8 * rows // 64)
        assert ops.get("WARPGROUP", 0) <= (tiles + 1) * gate_up, ops  # a fence a matrix and tile and a wait, not
        # one a k16 MMA
        if consts.get("RING"):  # weights and x by cp.async, the words read back once a step (no other shared-memory
            # traffic: no stores)
            assert ops.get("LDGSTS", 0) >= 8 and "LDG" not in ops and "STS" not in ops, ops
        else:  # weights into registers, x into shared memory; no operand through shared memory but x
            assert ops.get("LDG", 0) > 0 and ops.get("LDGSTS", 0) > 0, ops
            assert "STS" not in ops and "LDSM" not in ops, ops
            assert ops.get("LDS", 0) <= 8, ops  # (ptxas' predicated-off placeholders only)
    if shape:  # fewer instructions a step than the hopper_mma kernel's loops for this point
        theirs = ref[shape + ("1" if gate_up == 2 else "2")]  # (the same rows a program: 64, GEMM2 128)
        assert max(n for n, _ in k_loops) < min(theirs), (k_loops, theirs)


def test_the_forms_select_config_asks_for_are_compiled_here():
    """Every gluon_wgmma GEMM1 that select_config asks for on the two layer shapes is among JOBS, so the checks above
    cover the kernels the default runs."""
    from mxfp4conv.kernels import triton_moe as M
    asked = set()
    for E, H, I, k in ((256, 7168, 2048, 8), (896, 3584, 384, 16)):
        for T in (64, 128, 256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 2048, 3072, 4096):
            cfg = M.select_config(T * k, E, H, I, "hopper_mma_xor")
            if cfg.wgmma1:
                asked.add((cfg.block_t, cfg.tail_t, cfg.wgmma1_stages, bool(cfg.wgmma1_ring), bool(cfg.wgmma1_early),
                           cfg.wgmma_dual))
    assert asked  # the default runs it somewhere
    jobs = {(c["BT"], c["TAIL"], c["STAGES"], bool(c.get("RING")), bool(c.get("EARLY")), c.get("DUAL", 0))
            for n, c, _, _ in JOBS if n == "wg_gemm1"}
    assert asked <= jobs, asked - jobs
