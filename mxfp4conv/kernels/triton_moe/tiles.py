"""The tile choice of the Triton paths: ``select_config`` (the configuration a call runs by default, by its
pairs an expert and the layer's shape) and the K splits sized from it.
"""

from __future__ import annotations

import triton

from mxfp4conv.errors import RuntimeInputError
from mxfp4conv.kernels.triton_moe.config import MoEConfig
from mxfp4conv.kernels.triton_moe.layouts import HOPPER_SETS


def select_config(num_pairs: int, num_experts: int, hidden: int, inter: int, layout: str = "identity") -> MoEConfig:
    """Tiles measured best on an H200 (benchmarks/moe_bench.py --sweep / --gemv-sweep,
    benchmarks/results/performance-notebook.md): the decode path without tensor cores at <= 1 pair per touched expert,
    swap-AB 16-pair blocks with the int32-word decode while experts see few tokens (K split
    automatically when that leaves SMs idle), 64/128-pair blocks with the byte decode in prefill."""
    per_expert = num_pairs / max(1, min(num_experts, num_pairs))
    if layout in HOPPER_SETS:  # measured on an H200 (moe_bench.py --layout hopper_mma --sweep, both layers)
        short = inter <= 512  # short GEMM2 rows (I_pad <= 512: three 128-code steps a tile)
        if per_expert > 48:
            # prefill: row tiles first in both grids (a block's tiles side by side: its activation rows
            # come from DRAM about once); short rows: GEMM2 in 128-row tiles, 4 warps, one stage
            gemm2 = dict(block_n2=128, num_warps2=4, num_stages2=1) if short else dict(block_n2=256)
            # partly filled blocks in smaller tiles: past 96 pairs an expert, most experts' second block
            # holds <= 32 pairs; below, most blocks fit 64 or 64 + 32 (dual)
            tail = 32 if per_expert > 96 else 64
            # past 96 pairs an expert, an expert's last block of at most 32 pairs in the program of its block
            # before (GEMM1; GEMM2 too up to 16 where its rows are short): DSV3-like T = 3584 / 4096 / 4608 0.993 /
            # 0.931-0.962 / 0.914, T = 6144 / 8192 1.008 / 1.000; K3-like T = 6144 / 8192 0.964 / 0.964. DSV3-like
            # GEMM2 in 256-row tiles spills with a 32-wide second tile, and at 16 it was inside the spread (0.992 /
            # 1.028 in two runs)
            absorb = dict(absorb=32, absorb2=16 if short else 0) if tail == 32 else {}
            # the e8m0 factors two to a word measured 1.02x faster at 64 pairs an expert (DSV3 T = 2048) and
            # within the run's spread past it (DSV3 / K3 T = 4096): there the v13 instructions stay.
            # 64-pair tails in 64 + 16 too (dual 2), fewer empty slots through the MMAs: on an H100 DSV3-like
            # T = 1792 / 2048 / 2560 / 3072 0.988-0.997 / 0.977-0.988 / 0.972-0.980 / 1.000-1.002, K3-like T = 3072 /
            # 4096 0.989-0.993 / 0.975 of dual 1's time (two runs)
            return MoEConfig(block_t=128, block_n1=128, block_k=128, num_warps=8, num_stages=3, rows_first1=1,
                             rows_first2=1, tail_t=tail, dual=2 if tail == 64 else 0,
                             factor_pairs=int(per_expert <= 64), **gemm2, **absorb)
        bt = 16 if per_expert <= 12 else 32 if per_expert <= 24 else 64
        if num_pairs <= 16:  # one token (T = 1: one block per pair, fused reductions): 64-row GEMM2 tiles,
            # and no GEMM2 K split once those tiles alone give enough programs; GEMM1's K splits at least
            # six 128-code steps long (K3-like: 4 splits of 7 steps, not 10 of 3: the fused tail and the
            # pipeline fill of each program weigh less)
            split2 = 1 if num_pairs * (hidden // 64) >= 768 else 0
            auto1, _ = _splits(0, num_pairs * triton.cdiv(inter, 64), hidden, 128)
            return MoEConfig(block_t=16, block_n1=64, block_n2=64, block_k=128, num_warps=4, num_stages=3,
                             split_k1=max(1, min(auto1, hidden // 128 // 6)), split_k2=split2)
        # short GEMM2 rows: past one pair per expert four GEMM2 row tiles per program in one flat loop
        # (uncapped), at most one pair per expert three once one-tile programs would number three
        # times _TARGET_PROGRAMS (K3-like T = 8-32: 0.951-0.985 of one tile a program; T = 2 and 4,
        # fewer programs, 1.003-1.073); row tiles first in both grids, so a block's row tiles run side
        # by side (time over pair blocks first, benchmarks/results/performance-notebook.md: H100 DSV3-like T =
        # 192-768 0.864-0.962,
        # K3-like T = 320-1024 0.956-0.972; H200 DSV3-like T = 384-1024 0.95-0.99 in nine timings of ten, the rest
        # within the spread; below 5.5 pairs an expert, where the Gluon kernels take bf16 calls, not timed)
        # register caps on 16-pair blocks, and on 32-pair ones where GEMM2's rows are short (both GEMMs where
        # GEMM2 runs one row tile a program): under them ptxas schedules GEMM1 in 54 / 78 registers, not 116 /
        # 138, with the same instructions and nothing spilled, so 7 / 5 programs share an SM, not 4 / 3
        # (time capped / uncapped, five runs: DSV3-like T = 160-384 0.948-1.016, median 0.975; K3-like T = 384 /
        # 512 0.972-0.995 / 0.962-0.983, T = 1024 0.965-1.010; DSV3-like 32-pair blocks 0.969-1.019, left uncapped)
        maxnreg = 96 if bt == 16 else 112 if bt == 32 and short else 0
        # blocks of 32 / 64 pairs: those holding at most half that in half-width tiles, 64-pair ones up
        # to 48 in 32 + 16 (GEMM2's too where it runs one row tile a program: the multi-tile loop has
        # no small tiles)
        tail = bt // 2 if bt >= 32 else 0
        rows2 = 1
        if short and bt < 64:
            rows2 = 4 if per_expert > 1.05 else 3 if num_pairs * triton.cdiv(hidden, 128) >= 3 * _TARGET_PROGRAMS else 1
        # GEMM1 of 32-pair blocks in gluon_wgmma where it can run (wgmma1_runs): warpgroup MMAs, the words and x
        # through a cp.async ring 3 stages deep (MoEConfig.wgmma1 says what was measured, and why 16-pair blocks
        # keep moe_hgemm1_kernel); of 64-pair ones from 32 pairs an expert where GEMM2's rows are long, the ring 2
        # stages deep with 32 + 8 and 32 + 16 tiles (wgmma_dual 2): fewer empty slots through the MMAs. H100s,
        # five runs, of moe_hgemm1_kernel's time: DSV3-like T = 1024 / 1280 / 1536 0.975-0.995 / 0.944-0.986 /
        # 0.979-0.992 (T = 896 0.991-1.006, K3-like T = 1536 / 2048 1.021 / 1.003: left out)
        wgmma = dict(wgmma1=1) if bt == 32 else {}
        if bt == 64 and not short and per_expert >= 32:
            wgmma = dict(wgmma1=1, wgmma1_stages=2, wgmma_dual=2)
        return MoEConfig(block_t=bt, block_n1=64, block_n2=128, block_k=128, num_warps=4, num_stages=3, maxnreg=maxnreg,
                         rows2=rows2, maxnreg2=0 if rows2 > 1 else -1, rows_first1=1, rows_first2=1,
                         tail_t=tail, dual=int(tail >= 32), **wgmma)
    if per_expert <= 32:
        # decode path without tensor cores (taken at <= 1 pair per touched expert): 16-row tiles
        # with 256-code K steps where I_pad allows them in GEMM2 (DSV3-like), else 32-row tiles
        # with 128-code steps (K3-like, I 384); each the faster of the two on its layer shape
        gemv = (dict(gemv_block_n1=16, gemv_block_n2=16, gemv_block_k=256) if inter % 256 == 0
                else dict(gemv_block_n1=32, gemv_block_n2=32, gemv_block_k=128))
        return MoEConfig(block_t=16, block_n1=64, block_n2=128, block_k=128, num_warps=4, num_stages=2,
                         mode=1, maxnreg=96, **gemv)
    return MoEConfig(block_t=64 if per_expert <= 64 else 128, block_n1=128, block_n2=128, block_k=64,
                     num_warps=8, num_stages=3, mode=0)


_TARGET_PROGRAMS = 1024  # about 8 programs per SM on 132 SMs: enough warps to hide latency


def _splits(requested: int, programs: int, k: int, block_k: int) -> tuple[int, int]:
    """(number of K splits, K elements per split); requested 0 = enough splits to reach
    _TARGET_PROGRAMS programs, keeping at least two K steps per split."""
    steps = triton.cdiv(k, block_k)
    want = requested or max(1, min(steps // 2, triton.cdiv(_TARGET_PROGRAMS, max(1, programs))))
    per = triton.cdiv(steps, max(1, want))
    return triton.cdiv(steps, per), per * block_k


def gemm_splits(cfg: MoEConfig, num_pairs: int, E: int, H: int, i_pad: int, direct: bool, rows2: int = 1):
    """((splits, K per split) of GEMM1, the same of GEMM2) of the tensor-core paths: the automatic
    counts size the grid from the blocks the align can make (one per pair with ``direct``)."""
    blocks = num_pairs if direct else num_pairs // cfg.block_t + min(E, num_pairs)
    programs2 = blocks * triton.cdiv(triton.cdiv(H, cfg.block_n2), rows2)
    return (_splits(cfg.split_k1, blocks * triton.cdiv(i_pad, cfg.block_n1), H, cfg.block_k),
            _splits(cfg.split_k2, programs2, i_pad, cfg.block_k))


def _gemv_block_t(cfg: MoEConfig, per_expert: float) -> int:
    if cfg.gemv_block_t:
        if cfg.gemv_block_t not in (1, 2, 4):
            raise RuntimeInputError(f"fused_moe_triton: gemv_block_t must be 1, 2 or 4, got {cfg.gemv_block_t}.")
        return cfg.gemv_block_t
    return 1 if per_expert <= 1.25 else 2 if per_expert <= 2.5 else 4


def _gemv_block_k(block_k: int, k: int) -> int:
    """Largest of block_k, block_k/2, ... (>= 128) dividing k, else block_k (masked tail)."""
    bk = block_k
    while bk > 128 and k % bk:
        bk //= 2
    return bk if k % bk == 0 else block_k


def uses_gemv(cfg: MoEConfig, num_pairs: int, num_experts: int) -> bool:
    """Whether fused_moe_triton takes the decode path without tensor cores for this routing."""
    per_expert = num_pairs / max(1, min(num_experts, num_pairs))
    return cfg.gemv_max_pairs > 0 and per_expert <= cfg.gemv_max_pairs
