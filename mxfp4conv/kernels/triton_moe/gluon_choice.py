"""Which calls the Gluon paths take and with which tiles: the per-pair kernels (``gluon_plan``) up to a few
tokens, the expert-block kernels (``grouped_plan``) past that, their K steps, splits, loops and
register caps.
"""

from __future__ import annotations

import functools
import os

import torch
import triton

from mxfp4conv.errors import RuntimeInputError
from mxfp4conv.kernels.triton_moe.config import MoEConfig
from mxfp4conv.kernels.triton_moe.gluon_load import _GLUON_BROKEN, _gluon_module
from mxfp4conv.kernels.triton_moe.launch import _big_scales
from mxfp4conv.kernels.triton_moe.layouts import GLUON_SETS


def _divisor_splits(requested: int, steps: int) -> int:
    """The largest number of splits <= requested that divides steps."""
    s = max(1, min(requested, steps))
    while steps % s:
        s -= 1
    return s


# programs the few-token Gluon kernels' automatic K splits aim for, measured on an H200 at T = 1
# (benchmarks/probes/gluon_moe.py): GEMM1 (gate and up, 64-code steps) DSV3-like 4 splits (1024 programs)
# 44.0 us against 54.5 for 2 and 49.0 for 8, K3-like 8 splits (768) 13.5 us against 16.6 for 4;
# GEMM2 (128-code steps) is fastest unsplit on both (896 programs)
_GLUON_PROGRAMS1 = 1024


_GLUON_PROGRAMS2 = 512


# from two tokens on, with 128-code steps (gluon_moe.py at T = 2-8, GEMM1 alone, L2 flushed): DSV3-like T = 3 / 6 / 8
# unsplit 106.0 / 198.0 / 260.3 us, K3-like T = 2 / 4 / 8 4 / 2 / 1 splits (768 programs) 19.7 / 33.8 / 57.0 us, the
# fastest on each; 1024-1535 programs were slow on both (DSV3-like T = 2 2 splits 89.0 against 80.7 with 4, T = 4
# unsplit 156.8 against 141.3 with 2; K3-like T = 6 2 splits 51.7 against 48.7-50.1; K3-like T = 8 2 splits 62.4)
_GLUON_PROGRAMS1_T = 768


# The expert-block kernels' GEMM1 is unsplit unless asked: in 128-code steps (benchmarks/moe_bench.py, three runs)
# unsplit against 2 K splits K3-like T = 12 0.966 / 0.983 / 0.979, T = 24 0.973 / 0.977 / 0.982, T = 16 1.002 /
# 1.004, DSV3-like T = 8 0.992; 4 splits 1.018-1.040. Their GEMM2 runs _GROUPED_BLOCKS2 64-row blocks a program
# where its rows are short (at most _GROUPED_SHORT_STEPS K steps) and that still gives _GROUPED_PROGRAMS2 programs
# over min(E, pairs) blocks: K3-like (3 steps of 128 codes) T = 32 / 64 / 128 4 blocks 0.966 / 0.943 / 0.950 of
# one, T = 24 (5376 programs) 0.979 / 1.002 (two runs), T = 16 (3584) 0.987 / 1.018, T = 12 (2688) 1.000 / 1.027;
# 2 blocks 0.992-1.018, 7 0.960-1.014; DSV3-like (16 steps) 4 blocks 1.015-1.038 at T = 12-32
_GROUPED_BLOCKS2 = 4


_GROUPED_SHORT_STEPS = 4


_GROUPED_PROGRAMS2 = 4096


# Both Gluon GEMM2s in programs of this many rows where the rows are short (each warp two 16-row slabs on one B
# operand: half the x loads and the fixed code a weight): against 64, K3-like (3 steps) per pair T = 1 / 4 / 6 / 8
# 0.984 / 0.990 / 0.992 / 0.987 (T = 2 1.002), expert blocks T = 10 / 12 / 16 0.987 / 0.987 / 0.983, and with one
# row block a program against the 4 of _GROUPED_BLOCKS2 T = 24 / 32 0.976 / 0.983; DSV3-like (16 steps) T = 1 / 8
# / 16 / 64 1.002 / 1.002 / 1.002 / 0.998, T = 4 0.986
_GLUON_ROWS2_SHORT = 128


# where those are more than 64, the expert blocks' GEMM2 runs _GROUPED_BLOCKS2 64-row blocks a program only from this
# many such programs: one 128-row block a program against 4 64-row ones, K3-like T = 24 / 32 / 40 (5376 / 7168 /
# 8960 programs of 4) 0.976 / 0.983 / 0.992, T = 64 / 128 / 256 (12544) 0.997 / 1.003 / 1.014
_GROUPED_PROGRAMS2_WIDE = 12288


# The expert-block kernels' pairs a block: 16-pair blocks (an n16 tile, twice the MMAs and B loads for blocks holding
# 1-2 pairs) ran 1.16-1.47x the hopper_mma kernels' time at T = 16-256 on both layers, 8-pair ones 0.918-1.011 at
# T = 16-64 (benchmarks/results/performance-notebook.md, "Past 8 tokens: the same decode on expert blocks")
GROUPED_BLOCK_T = 8


# Their GEMM1 reads x unmasked (74 registers, 6 programs an SM) where a pair block's rows make this many 64-row
# blocks or more (DSV3-like 32: its tiles fill many waves), masked (84, 5 an SM) below (K3-like 6, where the last
# wave's fill decides, and most often for the masked kernel); see MoEConfig.gluon_xmask
_GROUPED_UNMASKED_ROWS = 16


def gluon_tiles(cfg: MoEConfig, H: int, i_pad: int, pairs: int, tokens: int = 1, sms: int = 0
                ) -> tuple[int, int, int, int]:
    """(k1, k2, splits1, splits2) of the per-pair Gluon kernels for this layer, number of pairs and
    of tokens: codes a K step of GEMM1 / GEMM2 (cfg's; for GEMM1 by default 64 at one token and 128
    from two; 64 where K is no multiple) and their K splits (cfg's, or gemm1_splits on a GPU of sms SMs and the fewest
    that give GEMM2 its target of programs), each lowered to a divisor of its K steps; from two tokens, where
    short_steps_fit, GEMM1 in 64-code steps unsplit."""
    _check_gluon_knobs(cfg)
    short = not cfg.gluon_k1 and tokens > 1 and short_steps_fit(i_pad // 64 * pairs, sms)
    k1 = cfg.gluon_k1 or (64 if tokens == 1 or short else 128)
    k1 = k1 if H % k1 == 0 else 64
    k2 = cfg.gluon_k2 if i_pad % cfg.gluon_k2 == 0 else 64
    if cfg.gluon_split1:
        s1 = _divisor_splits(cfg.gluon_split1, H // k1)
    else:
        s1 = 1 if short else gemm1_splits(i_pad // 64 * pairs, H // k1, tokens, sms)
    s2 = cfg.gluon_split2 or triton.cdiv(_GLUON_PROGRAMS2, H // 64 * pairs)
    return k1, k2, s1, _divisor_splits(s2, i_pad // k2)


def sum2_by_kernel(cfg: MoEConfig, i_pad: int, plan: tuple[int, int, int, int]) -> bool:
    """Whether the per-pair GEMM2's sum over k runs in the Triton k-sum kernel after it (cfg.gluon_sum2 0; 1: in
    GEMM2's last programs), automatically where GEMM2's rows are at most _GROUPED_SHORT_STEPS K steps and neither GEMM
    is split (gluon_tiles' plan): then no arrival is counted and no counter cleared. On an H200, against the sum in
    GEMM2 (two runs): K3-like T = 8 (3 steps, unsplit) 0.979 / 0.980; where it is not taken, K3-like T = 1 / 2 / 4 / 6
    1.025-1.040 / 1.006-1.009 / 0.987-0.998 / 1.001-1.004 (GEMM1 split), DSV3-like (16 steps) T = 1-6 1.021-1.047."""
    if cfg.gluon_sum2 >= 0:
        return cfg.gluon_sum2 == 0
    _, k2, splits1, splits2 = plan
    return i_pad // k2 <= _GROUPED_SHORT_STEPS and splits1 == 1 and splits2 == 1


# From two tokens the per-pair GEMM1 runs over pairs of steps under _UNROLLED_MAXNREG registers: _PAIRS_AN_SM programs
# an SM; over single steps (72 registers uncapped) _SINGLE_AN_SM. Where K splits would make its grid just over a wave
# of the former, one split fewer fills under one wave: K3-like T = 5 (480 programs unsplit, 960 in 2 splits, 132 SMs)
# unsplit 0.928 of the time in 2. Where one split is just over a wave, single steps take it in one: K3-like T = 9 (864
# programs) 0.902 of the time over pairs capped at 80 (0.923 over pairs capped at 72: they spill); T = 8 (768, a wave
# either way) over pairs capped at 72 1.051
_PAIRS_AN_SM = 6


_SINGLE_AN_SM = 7


# In 64-code steps (pairs, 62 registers uncapped) it fits _SHORT_AN_SM programs an SM. Where the unsplit grid is over a
# wave of _SINGLE_AN_SM and at most one of those, 64-code steps unsplit run it in one wave: K3-like T = 10 / 11 (960 /
# 1056 programs on 132 SMs) 0.945 / 0.912 of the expert blocks' time (their path otherwise), DSV3-like T = 4 (1024)
# 0.987 of 128-code steps in 2 splits; where 128-code steps already fit a wave, 64-code ones are slower (K3-like T = 9
# 1.012)
_SHORT_AN_SM = 8


def short_steps_fit(programs: int, sms: int) -> bool:
    """Whether the per-pair GEMM1's unsplit grid of `programs` fits one wave in 64-code steps and not in 128-code ones
    on a GPU of sms SMs (0: not known, False)."""
    return bool(sms) and _SINGLE_AN_SM * sms < programs <= _SHORT_AN_SM * sms


def gemm1_splits(programs: int, steps: int, tokens: int, sms: int = 0) -> int:
    """The per-pair GEMM1's automatic K splits for `programs` programs unsplit and `steps` K steps: at
    one token the fewest giving _GLUON_PROGRAMS1 programs; from two tokens the fewest giving
    _GLUON_PROGRAMS1_T, stepping past totals in [1024, 1536), each a divisor of the steps; then, on a GPU of sms SMs
    (0: not known), the next smaller divisor where that fits the grid in a wave of _PAIRS_AN_SM programs an SM and
    this does not."""
    if tokens == 1:
        return _divisor_splits(triton.cdiv(_GLUON_PROGRAMS1, programs), steps)
    s = _divisor_splits(triton.cdiv(_GLUON_PROGRAMS1_T, programs), steps)
    while 1024 <= programs * s < 1536 and s < steps:
        s = next(d for d in range(s + 1, steps + 1) if steps % d == 0)
    wave = _PAIRS_AN_SM * sms
    if sms and s > 1 and programs * s > wave:
        fewer = _divisor_splits(s - 1, steps)
        if programs * fewer <= wave:
            return fewer
    return s


def gluon_rows2(cfg: MoEConfig, H: int, i_pad: int, k2: int) -> int:
    """GEMM2's rows a program in the Gluon kernels (steps of k2 codes): cfg.gluon_rows2, or automatically
    _GLUON_ROWS2_SHORT where its rows are at most _GROUPED_SHORT_STEPS K steps, else 64; 64 where H is no multiple."""
    _check_gluon_knobs(cfg)
    rows = cfg.gluon_rows2 or (_GLUON_ROWS2_SHORT if i_pad // k2 <= _GROUPED_SHORT_STEPS else 64)
    return rows if H % rows == 0 else 64


def _check_gluon_knobs(cfg: MoEConfig) -> None:
    for name, k in (("gluon_k1", cfg.gluon_k1), ("gluon_k2", cfg.gluon_k2)):
        if k not in (64, 128) and not (name == "gluon_k1" and k == 0):
            raise RuntimeInputError(f"fused_moe_triton: {name} must be 64 or 128, got {k}.")
    for name in ("gluon_xmask", "gluon_sum2"):
        if getattr(cfg, name) not in (-1, 0, 1):
            raise RuntimeInputError(f"fused_moe_triton: {name} must be -1, 0 or 1, got {getattr(cfg, name)}.")
    if cfg.gluon_rows2 not in (0, 64, 128, 256):
        raise RuntimeInputError(f"fused_moe_triton: gluon_rows2 must be 0, 64, 128 or 256, got {cfg.gluon_rows2}.")
    if cfg.gluon_counters not in (0, 1):
        raise RuntimeInputError(f"fused_moe_triton: gluon_counters must be 0 or 1, got {cfg.gluon_counters}.")
    for name in ("gluon_unroll1", "gluon_unroll2"):
        if getattr(cfg, name) not in (0, 1, 2):
            raise RuntimeInputError(f"fused_moe_triton: {name} must be 0, 1 or 2, got {getattr(cfg, name)}.")
    for name in ("gluon_maxnreg1", "gluon_maxnreg2"):
        if getattr(cfg, name) not in (-1, 0) and not 24 <= getattr(cfg, name) <= 255:
            raise RuntimeInputError(f"fused_moe_triton: {name} must be -1, 0 or 24-255, got {getattr(cfg, name)}.")


def pairs_take(cfg: MoEConfig, T: int, num_pairs: int, E: int) -> bool:
    """Whether a call of T tokens is the per-pair Gluon kernels' (the device and weights aside:
    gluon_runnable): up to gluon_max_tokens tokens, and from two tokens pairs under gluon_pair_share x E."""
    return T <= cfg.gluon_max_tokens and (T == 1 or num_pairs < cfg.gluon_pair_share * E)


def grouped_takes(cfg: MoEConfig, T: int, num_pairs: int, E: int) -> bool:
    """Whether the expert-block Gluon kernels take a call of T tokens that is not the per-pair
    kernels' (pairs_take; the device and weights aside: gluon_runnable): gluon_grouped 1, or
    automatic (-1) at up to gluon_grouped_pairs pairs an expert on average; and the pair blocks fit
    grid axis 1."""
    if pairs_take(cfg, T, num_pairs, E) or cfg.gluon_grouped == 0:
        return False
    if num_pairs // GROUPED_BLOCK_T + min(E, num_pairs) >= 65535:
        return False
    return cfg.gluon_grouped == 1 or num_pairs <= cfg.gluon_grouped_pairs * E


def grouped_tiles(cfg: MoEConfig, H: int, i_pad: int, pairs: int, E: int) -> tuple[int, int, int, int]:
    """(k1, k2, splits1, blocks2) of the expert-block kernels: steps of cfg.gluon_k1 (default 128) and
    gluon_k2 codes (64 where K is no multiple); GEMM1's K splits (cfg.gluon_split1, default 1), lowered
    to a divisor of the K steps; and GEMM2's 64-row blocks a program (cfg.gluon_blocks2, or
    _GROUPED_BLOCKS2 where its rows are at most _GROUPED_SHORT_STEPS K steps long and its programs over
    min(E, pairs) blocks still number _GROUPED_PROGRAMS2, _GROUPED_PROGRAMS2_WIDE where one block a program would
    be of more rows (gluon_rows2), else 1), lowered to a divisor of H / 64."""
    _check_gluon_knobs(cfg)
    k1 = cfg.gluon_k1 or 128
    k1 = k1 if H % k1 == 0 else 64
    k2 = cfg.gluon_k2 if i_pad % cfg.gluon_k2 == 0 else 64
    b2 = _divisor_splits(cfg.gluon_blocks2 or _GROUPED_BLOCKS2, H // 64)
    least = _GROUPED_PROGRAMS2_WIDE if gluon_rows2(cfg, H, i_pad, k2) > 64 else _GROUPED_PROGRAMS2
    if not cfg.gluon_blocks2 and (i_pad // k2 > _GROUPED_SHORT_STEPS or min(E, pairs) * (H // 64 // b2) < least):
        b2 = 1
    return k1, k2, _divisor_splits(cfg.gluon_split1 or 1, H // k1), b2


def grouped_masks(cfg: MoEConfig, i_pad: int) -> int:
    """Whether the expert blocks' GEMM1 masks its x operand (1) or not (0; their GEMM2 never does): cfg.gluon_xmask,
    or automatically unmasked where a pair block's rows make at least _GROUPED_UNMASKED_ROWS 64-row blocks (its
    tiles then fill enough waves for the sixth program an SM to win over the last wave's fill)."""
    _check_gluon_knobs(cfg)
    if cfg.gluon_xmask >= 0:
        return cfg.gluon_xmask
    return 0 if i_pad // 64 >= _GROUPED_UNMASKED_ROWS else 1


def device_sms(device: torch.device) -> int:
    """The SMs of a CUDA device (0 for any other); looked up once a device."""
    if device.type != "cuda":
        return 0
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def gluon_runnable(cfg: MoEConfig, x: torch.Tensor, weights, layout: str) -> bool:
    """Whether the Gluon kernels can take this call, the number of tokens aside (gluon_plan)."""
    w13, w13_scale, w2, w2_scale = weights
    if cfg.gluon == 0 or layout not in GLUON_SETS or x.dtype != torch.bfloat16:
        return False
    if not x.is_cuda or torch.version.cuda is None or os.environ.get("TRITON_INTERPRET") == "1" or _GLUON_BROKEN:
        return False
    major = torch.cuda.get_device_capability(x.device)[0]
    if major < 8 or (cfg.gluon < 0 and major != 9):
        return False
    return not (any(t.data_ptr() % 4 for t in weights) or _big_scales(w13_scale, w2_scale) or _gluon_module() is None)


def gluon_plan(cfg: MoEConfig, x: torch.Tensor, weights, top_k: int, layout: str) -> tuple[int, int, int, int] | None:
    """gluon_tiles for this call (on its GPU's SMs), or None where other kernels run it: not pairs_take's, another
    layout, x not bf16, no CUDA GPU of compute capability 8.0 or more (9.x when automatic), an e8m0
    byte above 128 (the one-multiply factor decode), storage not 4-byte aligned, no Gluon in this
    Triton, or cfg.gluon = 0."""
    T = x.shape[0]
    # (before the gates: a bad knob raises on any device)
    tiles = gluon_tiles(cfg, x.shape[1], weights[0].shape[1] // 2, T * top_k, T, device_sms(x.device))
    if not pairs_take(cfg, T, T * top_k, weights[0].shape[0]) or not gluon_runnable(cfg, x, weights, layout):
        return None
    return tiles


def grouped_plan(cfg: MoEConfig, x: torch.Tensor, weights, top_k: int, layout: str, E: int
                 ) -> tuple[int, int, int, int] | None:
    """grouped_tiles for this call where the expert-block kernels take it (grouped_takes and
    gluon_runnable), else None."""
    T, H = x.shape
    if not grouped_takes(cfg, T, T * top_k, E) or not gluon_runnable(cfg, x, weights, layout):
        return None
    return grouped_tiles(cfg, H, weights[0].shape[1] // 2, T * top_k, E)


# The Gluon K loops over pairs of steps (gluon_unroll1 / 2) drop the 7-15 register copies a step that a loop over single
# steps makes (sm_90a SASS a step: per-pair GEMM1 155 -> 146.5 instructions with 64-code steps, 292 -> 281.5 with
# 128-code ones, GEMM2 64 / 128 rows 150 -> 142.5 / 290 -> 272.5, the expert blocks' GEMM1 304 -> 281, GEMM2 128 rows
# 289 -> 271.5) for more registers (GEMM1 59 -> 63, 72 -> 94, GEMM2 56 -> 64, 80 -> 95, the expert blocks' 95 -> 109,
# 84 -> 93). Where that costs programs an SM, a cap of _UNROLLED_MAXNREG gives them back without spilling in the loop:
# the per-pair GEMM1 in 128-code steps and both GEMM2s of 128 rows. On an H200 against single steps (one run): per
# pair DSV3-like T = 1 / 2 / 4 0.976 / 0.969 / 0.980 (GEMM1 0.988 / 0.969 / 0.980 alone, GEMM2 0.996 / 0.996 / 0.987),
# K3-like T = 1 / 4 / 8 GEMM1 0.979 / 0.987 / 0.983, GEMM2 1.003 / 0.976 / 0.995; expert blocks K3-like (128-row GEMM2)
# T = 12 / 16 / 24 / 40 GEMM2 0.979 / 0.980 / 0.978 / 0.973 (the cap alone 0.989 / 0.992 / 0.986 / 0.984). Left on
# single steps: the expert blocks' GEMM1 (4 programs an SM, and spills under a cap; K3-like T = 12 / 16 / 24 0.972 /
# 1.001 / 1.020, DSV3-like T = 8-32 1.024-1.027) and their 64-row GEMM2 (DSV3-like T = 8 / 16 / 32 0.995 / 0.995 /
# 1.015)
_UNROLLED_MAXNREG = 80


# The expert blocks' GEMM1 over pairs holds 4 programs an SM (single steps 5). It wins where its expected grid fits two
# waves of those: on an H200 (5 rounds) K3-like T = 12 (1045 expected of 1056 slots) 0.967-0.973 of single steps in
# three routing draws of six, 0.996-1.002 in the other three; with the expert blocks forced below their range, T = 9 /
# 10 / 11 0.970 / 0.979 / 0.955. Past that it loses: K3-like T = 13 / 14 / 16 / 20 / 24 / 32 1.051-1.064 / 1.041 /
# 1.017 / 1.018 / 1.030 / 1.022, DSV3-like T = 8 / 12 / 16 1.054 / 1.033 / 1.047 (3 rounds)
_GROUPED_PAIRS_AN_SM = 4


# hopper_mma_w_xor's decode moves three loops' registers (sm_90a SASS, triton 3.6): the per-pair 128-row GEMM2 over
# pairs of steps spills in its loop under the cap of 80, so it runs over single steps (80 registers, nothing spilled); the
# per-pair GEMM1 in 128-code single steps takes 74 (6 programs an SM where BITS_ROT's 72 fit 7), the expert blocks'
# GEMM1 100 (4 where 96 fit 5), so they are capped at those. On an H100 against hopper_mma_w_rot: K3-like T = 1 / 8 / 9
# / 10 0.974 / 0.999 / 0.994 / 1.000 with them, 0.989 / 1.017 / 1.130 / 1.014 without; on an H200 with them 0.965-0.969 /
# 0.996-0.999 / 0.977-0.979 / 0.983-0.988 (benchmarks/results/performance-notebook.md)
_XOR_MAXNREG1 = {False: 72, True: 96}  # grouped -> the cap of GEMM1 in 128-code single steps


def expected_experts(T: int, top_k: int, E: int) -> float:
    """The mean number of distinct experts that T tokens touch when each picks top_k of E uniformly at random."""
    return E * (1.0 - (1.0 - top_k / E) ** T)


def loop_tuning(cfg: MoEConfig, grouped: bool, k1: int, rows2: int, programs1: int = 0, sms: int = 0,
                order: str = "rot") -> dict:
    """The Gluon kernels' K loops (1 single steps, 2 pairs) and register caps (0 none), (GEMM1, GEMM2) each, for the
    per-pair kernels (grouped False; GEMM1 of programs1 programs on a GPU of sms SMs, 0 where not known) or the expert
    blocks' with GEMM1 steps of k1 codes and GEMM2 programs of rows2 rows: cfg's, or automatically (see
    _UNROLLED_MAXNREG) pairs but for the expert blocks' GEMM1 and 64-row GEMM2, capped where the per-pair GEMM1 takes
    128-code steps and where GEMM2 takes 128 rows; the per-pair GEMM1 in 128-code steps over single steps where its
    grid is over a wave of _PAIRS_AN_SM programs an SM and at most one of _SINGLE_AN_SM; the expert blocks' GEMM1 in
    128-code steps over pairs where its expected programs1 fit two waves of _GROUPED_PAIRS_AN_SM programs an SM. order:
    the weight words' bit order ("xor": see _XOR_MAXNREG1)."""
    if grouped:
        two_waves = sms and 0 < programs1 <= 2 * _GROUPED_PAIRS_AN_SM * sms
        u1 = cfg.gluon_unroll1 or (2 if k1 == 128 and two_waves else 1)
    else:
        one_wave = sms and _PAIRS_AN_SM * sms < programs1 <= _SINGLE_AN_SM * sms
        u1 = cfg.gluon_unroll1 or (1 if k1 == 128 and one_wave else 2)
    xor = order == "xor"
    u2 = cfg.gluon_unroll2 or (1 if xor and not grouped and rows2 == 128 else 2 if not grouped or rows2 > 64 else 1)
    capped1 = u1 == 2 and k1 == 128 and not grouped
    capped2 = u2 == 2 and rows2 == 128
    auto1 = _XOR_MAXNREG1[grouped] if xor and u1 == 1 and k1 == 128 else _UNROLLED_MAXNREG * capped1
    m1 = cfg.gluon_maxnreg1 if cfg.gluon_maxnreg1 >= 0 else auto1
    m2 = cfg.gluon_maxnreg2 if cfg.gluon_maxnreg2 >= 0 else _UNROLLED_MAXNREG * capped2
    return {"unroll": (u1, u2), "maxnreg": (m1, m2)}


def grouped_programs1(T: int, top_k: int, E: int, i_pad: int, splits1: int) -> int:
    """The expert blocks' GEMM1 programs with work that a call of T tokens is expected to have: 64-row blocks x K
    splits x the expected experts touched (each one pair block at the few pairs an expert where it matters)."""
    return round(i_pad // 64 * splits1 * expected_experts(T, top_k, E))
