"""The few-token Gluon MoE kernels (mxfp4conv/kernels/triton_moe/gluon_few_tokens.py) without a GPU: their tiles
and K splits, the gates that keep every other call on the hopper_mma kernels, and their compilation
for sm_90a with this Triton (Gluon kernels do not run in the interpreter; benchmarks/gpu_check.py
checks their results on a GPU)."""

from __future__ import annotations

import dataclasses
import os
import re
import sys

import pytest
import torch
import triton
from hypothesis import given, strategies as st

from mxfp4conv.errors import RuntimeInputError
from mxfp4conv.kernels import triton_moe
from mxfp4conv.kernels.triton_moe.gluon_few_tokens import WORDS32_PTX
from sm90_child import nvidia_tools, run_child
from mxfp4conv.kernels.triton_moe import MoEConfig, fused_moe_triton, select_config
from mxfp4conv.kernels.triton_moe.gluon_choice import (expected_experts, gluon_plan, gluon_rows2, gluon_tiles,
                                                       grouped_masks, grouped_programs1, grouped_takes, grouped_tiles,
                                                       loop_tuning, pairs_take, sum2_by_kernel)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "probes"))
import hopper_sass  # noqa: E402  (the benchmarks' SASS loop counter)


def test_tiles_of_the_measured_layers():
    # the configurations measured fastest on an H200 (benchmarks/results/gluon_moe_h200_t1.txt)
    assert gluon_tiles(select_config(8, 256, 7168, 2048, "hopper_mma_rot"), 7168, 2048, 8) == (64, 128, 4, 1)
    assert gluon_tiles(select_config(16, 896, 3584, 384, "hopper_mma_rot"), 3584, 384, 16) == (64, 128, 8, 1)
    # from two tokens 128-code steps in GEMM1 and 768 programs: K3-like T = 2 / 4 / 8 4 / 2 / 1 splits
    assert [gluon_tiles(MoEConfig(), 3584, 384, 16 * T, T)[:3] for T in (2, 4, 8)] == [(128, 128, 4), (128, 128, 2),
                                                                                      (128, 128, 1)]
    # stepping past 1024-1535 programs: DSV3-like T = 2 (512 programs unsplit) 4 splits, T = 4 2, T = 3 / 6 / 8 unsplit;
    # K3-like T = 6 (576) 4
    assert [gluon_tiles(MoEConfig(), 7168, 2048, 8 * T, T)[2] for T in (2, 3, 4, 6, 8)] == [4, 1, 2, 1, 1]
    assert gluon_tiles(MoEConfig(), 3584, 384, 96, 6)[2] == 4
    # 1088 = 17 x 64, 192 = 3 x 64: 64-code steps in both, splits lowered to divisors of 17 and 3
    assert gluon_tiles(MoEConfig(), 1088, 192, 3) == (64, 64, 17, 3)
    assert gluon_tiles(MoEConfig(), 1088, 192, 6, 2)[:2] == (64, 64)


@given(h=st.integers(1, 160), i=st.integers(1, 64), top_k=st.integers(1, 16), tokens=st.integers(1, 8),
       k1=st.sampled_from([0, 64, 128]), k2=st.sampled_from([64, 128]), s1=st.integers(0, 40), s2=st.integers(0, 40))
def test_tiles_always_cover_k_in_whole_steps(h, i, top_k, tokens, k1, k2, s1, s2):
    H, I = 64 * h, 64 * i
    cfg = MoEConfig(gluon_k1=k1, gluon_k2=k2, gluon_split1=s1, gluon_split2=s2)
    t1, t2, n1, n2 = gluon_tiles(cfg, H, I, top_k * tokens, tokens)
    k1 = k1 or (64 if tokens == 1 else 128)
    for K, step, asked, splits, wanted in ((H, t1, k1, n1, s1), (I, t2, k2, n2, s2)):
        assert step == (asked if K % asked == 0 else 64)
        assert splits >= 1 and (K // step) % splits == 0
        if wanted:
            assert splits <= wanted
            # the largest such divisor
            assert all((K // step) % s for s in range(splits + 1, min(wanted, K // step) + 1))


@given(kb=st.sampled_from([1, 2]), steps=st.integers(1, 12))
def test_fragment_order_puts_each_lanes_mma_fragments_side_by_side(kb, steps):
    order = pytest.importorskip("mxfp4conv.kernels.triton_moe.gluon_few_tokens").fragment_order.fn  # the kernels' own code
    step = 64 * kb
    pos = [order(k, kb) for k in range(step * steps)]
    # a permutation of every GEMM2 step's codes within that step
    assert sorted(pos) == list(range(step * steps)) and all(p // step == k // step for k, p in enumerate(pos))
    # lane t's m16n8k16 B fragments of a step (chunk c: codes 16 c + 8 h + 2 t + i), in register order, lie at
    # 16 kb consecutive positions: the lane's kb 16-byte loads
    for s0 in range(0, step * steps, step):
        for t in range(4):
            frag = [s0 + 16 * c + 8 * h + 2 * t + i for c in range(4 * kb) for h in (0, 1) for i in (0, 1)]
            assert [pos[k] for k in frag] == list(range(s0 + 16 * kb * t, s0 + 16 * kb * (t + 1)))


def test_gemm2_rows_a_program():
    # automatic: 128 where GEMM2's rows are at most 4 K steps (K3-like: 384 codes, 3 steps of 128), else 64
    # (DSV3-like: 16 steps; K3-like in 64-code steps: 6); 64 where H is no multiple of the rows
    assert gluon_rows2(MoEConfig(), 3584, 384, 128) == 128
    assert gluon_rows2(MoEConfig(), 7168, 2048, 128) == 64
    assert gluon_rows2(MoEConfig(), 3584, 384, 64) == 64
    assert gluon_rows2(MoEConfig(), 1088, 192, 64) == 64  # 1088 = 17 x 64
    assert [gluon_rows2(MoEConfig(gluon_rows2=r), 7168, 2048, 128) for r in (64, 128, 256)] == [64, 128, 256]
    assert gluon_rows2(MoEConfig(gluon_rows2=256), 3584 + 128, 384, 128) == 64
    with pytest.raises(RuntimeInputError, match="gluon_rows2 must be 0, 64, 128 or 256"):
        gluon_rows2(MoEConfig(gluon_rows2=96), 3584, 384, 128)


def test_k_loops_over_pairs_of_steps_where_measured_faster():
    # automatic: the per-pair kernels' GEMMs over pairs of steps, capped at 80 registers where GEMM1 takes 128-code
    # steps (94 registers uncapped) and where GEMM2 takes 128 rows (95); the expert blocks' GEMM1 over single steps,
    # their GEMM2 over pairs where it takes 128 rows (capped), single steps at 64 rows
    auto = MoEConfig()
    assert loop_tuning(auto, False, 64, 64) == {"unroll": (2, 2), "maxnreg": (0, 0)}  # DSV3-like T = 1
    assert loop_tuning(auto, False, 128, 64) == {"unroll": (2, 2), "maxnreg": (80, 0)}  # DSV3-like T = 2-6
    assert loop_tuning(auto, False, 128, 128) == {"unroll": (2, 2), "maxnreg": (80, 80)}  # K3-like T = 2-8
    assert loop_tuning(auto, True, 128, 128) == {"unroll": (1, 2), "maxnreg": (0, 80)}  # K3-like T = 10-54
    assert loop_tuning(auto, True, 128, 64) == {"unroll": (1, 1), "maxnreg": (0, 0)}  # DSV3-like expert blocks
    # a knob set wins; single steps are never capped automatically, nor 256-row programs
    assert loop_tuning(MoEConfig(gluon_unroll1=1, gluon_unroll2=1), False, 128, 128)["maxnreg"] == (0, 0)
    assert loop_tuning(MoEConfig(gluon_unroll1=2, gluon_unroll2=2), True, 128, 64)["unroll"] == (2, 2)
    assert loop_tuning(MoEConfig(gluon_maxnreg1=0, gluon_maxnreg2=72), False, 128, 128)["maxnreg"] == (0, 72)
    assert loop_tuning(auto, False, 128, 256)["maxnreg"] == (80, 0)
    # hopper_mma_w_xor's words: the per-pair 128-row GEMM2 over single steps, GEMM1 in 128-code single steps capped
    assert loop_tuning(auto, False, 128, 128, order="xor") == {"unroll": (2, 1), "maxnreg": (80, 0)}
    assert loop_tuning(auto, False, 64, 64, order="xor") == {"unroll": (2, 2), "maxnreg": (0, 0)}
    assert loop_tuning(auto, False, 128, 128, 864, 132, "xor") == {"unroll": (1, 1), "maxnreg": (72, 0)}
    assert loop_tuning(auto, True, 128, 64, order="xor") == {"unroll": (1, 1), "maxnreg": (96, 0)}
    assert loop_tuning(auto, True, 128, 128, order="xor") == {"unroll": (1, 2), "maxnreg": (96, 80)}
    assert loop_tuning(MoEConfig(gluon_maxnreg1=0, gluon_unroll2=2), True, 128, 64, order="xor") == \
        {"unroll": (1, 2), "maxnreg": (0, 0)}


@given(tokens=st.integers(2, 16), top_k=st.integers(1, 16), i=st.integers(1, 32), h=st.integers(1, 112),
       sms=st.sampled_from([0, 78, 108, 132, 144]))
def test_per_pair_gemm1_grid_fits_a_wave_where_it_just_would_not(tokens, top_k, i, h, sms):
    # K splits: one fewer where that fits the grid in a wave of 6 programs an SM (the pairs loop under its cap of 80
    # registers) and the split chosen without the SMs does not; single steps (7 programs an SM) where one wave of 7
    # holds the grid and one of 6 does not
    H, I, pairs = 64 * h, 64 * i, tokens * top_k
    k1, _, s, _ = gluon_tiles(MoEConfig(), H, I, pairs, tokens, sms)
    k0, _, s0, _ = gluon_tiles(MoEConfig(), H, I, pairs, tokens)
    programs = I // 64 * pairs
    # over a wave of 7 and at most one of 8: 64-code steps unsplit (the pairs loop uncapped, 62 registers)
    if 7 * sms < programs <= 8 * sms:
        assert (k0, k1, s) == (128 if H % 128 == 0 else 64, 64, 1)
        assert loop_tuning(MoEConfig(), False, k1, 128, programs, sms) == {"unroll": (2, 2), "maxnreg": (0, 80)}
        return
    assert k1 == k0 and (H // k1) % s == 0 and s <= s0
    if s != s0:
        assert programs * s <= 6 * sms < programs * s0 and s == max(d for d in range(1, s0) if (H // k1) % d == 0)
    elif sms and s0 > 1:
        fewer = max(d for d in range(1, s0) if (H // k1) % d == 0)
        assert programs * s0 <= 6 * sms or programs * fewer > 6 * sms
    tune = loop_tuning(MoEConfig(), False, k1, 128, programs * s, sms)
    single = k1 == 128 and 6 * sms < programs * s <= 7 * sms
    assert tune == ({"unroll": (1, 2), "maxnreg": (0, 80)} if single else {"unroll": (2, 2), "maxnreg": (80 * (k1 == 128), 80)})


def test_wave_fits_of_the_measured_layers():
    # K3-like on 132 SMs: T = 5 unsplit (480 programs; 2 splits are 960, over a wave of 792), T = 9 (864) over single
    # steps; T = 2 / 4 / 6 / 8 as without the SMs; DSV3-like T = 2-6 as without them
    assert [gluon_tiles(MoEConfig(), 3584, 384, 16 * T, T, 132)[2] for T in (2, 4, 5, 6, 8, 9)] == [4, 2, 1, 4, 1, 1]
    assert gluon_tiles(MoEConfig(), 3584, 384, 80, 5)[2] == 2
    assert [gluon_tiles(MoEConfig(), 7168, 2048, 8 * T, T, 132)[2] for T in (2, 3, 5, 6)] == [4, 1, 2, 1]
    # a grid over a wave of 7 and at most one of 8 in 64-code steps unsplit: K3-like T = 10 / 11 (960 / 1056 programs),
    # DSV3-like T = 4 (1024; 2 splits of 128-code steps without the SMs); T = 12 (1152) as before
    assert [gluon_tiles(MoEConfig(), 3584, 384, 16 * T, T, 132)[::2] for T in (10, 11, 12)] == [(64, 1), (64, 1),
                                                                                               (128, 2)]
    assert gluon_tiles(MoEConfig(), 7168, 2048, 32, 4, 132)[::2] == (64, 1)
    assert gluon_tiles(MoEConfig(), 7168, 2048, 32, 4)[::2] == (128, 2)
    # asked for, steps or splits stay as asked
    assert gluon_tiles(MoEConfig(gluon_k1=128), 3584, 384, 160, 10, 132)[::2] == (128, 1)
    assert gluon_tiles(MoEConfig(gluon_split1=2), 3584, 384, 160, 10, 132)[::2] == (64, 2)
    assert loop_tuning(MoEConfig(), False, 128, 128, 864, 132) == {"unroll": (1, 2), "maxnreg": (0, 80)}
    assert loop_tuning(MoEConfig(), False, 128, 128, 768, 132) == {"unroll": (2, 2), "maxnreg": (80, 80)}
    # a knob set wins
    assert loop_tuning(MoEConfig(gluon_unroll1=2), False, 128, 128, 864, 132)["unroll"] == (2, 2)


@pytest.mark.parametrize("T, top_k, E", [(12, 16, 896), (8, 8, 256), (3, 4, 32), (40, 2, 16)])
def test_expected_experts_touched_is_the_mean_under_uniform_routing(T, top_k, E):
    # each token's top_k distinct experts drawn uniformly, as moe_bench's and gpu_check's uniform routing draws them
    g = torch.Generator().manual_seed(T * E + top_k)
    touched = [torch.rand(T, E, generator=g).topk(top_k, dim=1).indices.unique().numel() for _ in range(400)]
    mean = sum(touched) / len(touched)
    spread = (sum((t - mean) ** 2 for t in touched) / len(touched)) ** 0.5
    assert abs(expected_experts(T, top_k, E) - mean) < 4 * spread / len(touched) ** 0.5 + 1e-9


def test_expert_blocks_gemm1_over_pairs_where_its_expected_grid_fits_two_waves():
    # 4 programs an SM over pairs: on 132 SMs two waves are 1056 programs; K3-like (6 row blocks) T = 12 expects 1045,
    # T = 13 1123; DSV3-like (32 row blocks) from T = 7 on is over them
    k3 = [grouped_programs1(T, 16, 896, 384, 1) for T in (9, 10, 11, 12, 13, 16)]
    assert k3 == [805, 886, 967, 1045, 1123, 1346]
    assert [loop_tuning(MoEConfig(), True, 128, 128, p, 132)["unroll"][0] for p in k3] == [2, 2, 2, 2, 1, 1]
    assert all(loop_tuning(MoEConfig(), True, 128, 64, grouped_programs1(T, 8, 256, 2048, 1), 132)["unroll"] == (1, 1)
               for T in range(7, 17))
    # K splits count: K3-like T = 12 in 2 splits is over two waves
    assert loop_tuning(MoEConfig(), True, 128, 128, grouped_programs1(12, 16, 896, 384, 2), 132)["unroll"][0] == 1
    # fewer SMs, SMs not known, 64-code steps or a knob set: as before
    assert loop_tuning(MoEConfig(), True, 128, 128, 1045, 114)["unroll"][0] == 1
    assert loop_tuning(MoEConfig(), True, 128, 128, 1045, 0)["unroll"][0] == 1
    assert loop_tuning(MoEConfig(), True, 64, 128, 1045, 132)["unroll"][0] == 1
    assert loop_tuning(MoEConfig(gluon_unroll1=1), True, 128, 128, 1045, 132)["unroll"][0] == 1
    # the expert blocks' GEMM1 is never capped automatically
    assert loop_tuning(MoEConfig(), True, 128, 128, 1045, 132)["maxnreg"] == (0, 80)


@pytest.mark.parametrize("knob, value, message", [("gluon_unroll1", 3, "gluon_unroll1 must be 0, 1 or 2"),
                                                   ("gluon_unroll2", -1, "gluon_unroll2 must be 0, 1 or 2"),
                                                   ("gluon_maxnreg1", 16, "gluon_maxnreg1 must be -1, 0 or 24-255"),
                                                   ("gluon_maxnreg2", 256, "gluon_maxnreg2 must be -1, 0 or 24-255")])
def test_bad_loop_knob_is_a_clear_error(knob, value, message):
    with pytest.raises(RuntimeInputError, match=message):
        gluon_tiles(MoEConfig(**{knob: value}), 7168, 2048, 8)
    with pytest.raises(RuntimeInputError, match=message):
        grouped_tiles(MoEConfig(**{knob: value}), 3584, 384, 256, 896)


def test_bad_gluon_xmask_is_a_clear_error():
    with pytest.raises(RuntimeInputError, match="gluon_xmask must be -1, 0 or 1"):
        gluon_tiles(MoEConfig(gluon_xmask=2), 7168, 2048, 8)


def test_expert_blocks_x_masks_where_measured_faster():
    # automatic: GEMM1 unmasked where a pair block's rows make >= 16 64-row blocks (DSV3-like I = 2048: 32), masked
    # below (K3-like I = 384: 6); an explicit value as given
    assert grouped_masks(MoEConfig(), 2048) == 0
    assert grouped_masks(MoEConfig(), 1024) == 0
    assert grouped_masks(MoEConfig(), 960) == 1
    assert grouped_masks(MoEConfig(), 384) == 1
    assert grouped_masks(MoEConfig(gluon_xmask=1), 2048) == 1
    assert grouped_masks(MoEConfig(gluon_xmask=0), 384) == 0


def test_sum_over_k_in_the_k_sum_kernel_where_measured_faster():
    # automatic: short GEMM2 rows and both GEMMs unsplit (K3-like T = 8); the sum in GEMM2 where GEMM1 is split
    # (K3-like T = 1-6) or the rows are long (DSV3-like, also unsplit at T = 3 / 6)
    def by_kernel(H, I, k, T, **knobs):
        cfg = MoEConfig(**knobs)
        return sum2_by_kernel(cfg, I, gluon_tiles(cfg, H, I, k * T, T))
    assert [by_kernel(3584, 384, 16, T) for T in (1, 2, 4, 6, 8)] == [False, False, False, False, True]
    assert not any(by_kernel(7168, 2048, 8, T) for T in (1, 3, 6))
    assert not by_kernel(3584, 384, 16, 8, gluon_split2=3)  # GEMM2's K splits: their arrivals are counted anyway
    assert by_kernel(7168, 2048, 8, 1, gluon_sum2=0) and not by_kernel(3584, 384, 16, 8, gluon_sum2=1)
    with pytest.raises(RuntimeInputError, match="gluon_sum2 must be -1, 0 or 1"):
        by_kernel(3584, 384, 16, 8, gluon_sum2=2)


@pytest.mark.parametrize("knob", ["gluon_k1", "gluon_k2"])
def test_bad_step_is_a_clear_error(knob):
    with pytest.raises(RuntimeInputError, match=f"{knob} must be 64 or 128"):
        gluon_tiles(MoEConfig(**{knob: 96}), 7168, 2048, 8)


def test_expert_blocks_automatic_where_measured_faster():
    cfg = MoEConfig()
    dsv3, k3 = 256, 896
    # DSV3-like (top-8): per pair to T = 6 (48 pairs, under a fifth of the experts), expert blocks from T = 7 to
    # 176 (up to 5.5 pairs an expert), T = 177 on off
    assert pairs_take(cfg, 6, 48, dsv3) and not grouped_takes(cfg, 6, 48, dsv3)
    assert all(grouped_takes(cfg, T, 8 * T, dsv3) and not pairs_take(cfg, T, 8 * T, dsv3)
               for T in (7, 8, 9, 16, 32, 64, 96, 112, 128, 144, 160, 176))
    assert not any(grouped_takes(cfg, T, 8 * T, dsv3) or pairs_take(cfg, T, 8 * T, dsv3) for T in (177, 192, 256))
    # K3-like (top-16): per pair to T = 11 (176 pairs, under a fifth of the experts), expert blocks T = 12-308,
    # T = 309 on off
    assert all(pairs_take(cfg, T, 16 * T, k3) and not grouped_takes(cfg, T, 16 * T, k3)
               for T in (1, 2, 4, 8, 9, 10, 11))
    assert all(grouped_takes(cfg, T, 16 * T, k3) for T in (12, 16, 32, 128, 160, 192, 224, 256, 288, 308))
    # a twelfth token takes the expert blocks, where the share would still allow per pair
    assert not pairs_take(cfg, 12, 12, 896) and grouped_takes(cfg, 12, 12, 896)
    assert not any(grouped_takes(cfg, T, 16 * T, k3) for T in (309, 352, 512))
    # one token stays per pair however few the experts (its pairs share none); the share is a knob
    assert pairs_take(cfg, 1, 8, 8) and not grouped_takes(cfg, 1, 8, 8)
    assert pairs_take(dataclasses.replace(cfg, gluon_pair_share=1.0), 8, 64, dsv3)
    # off, forced on, and never with more pair blocks than grid axis 1 holds
    assert not grouped_takes(dataclasses.replace(cfg, gluon_grouped=0), 16, 128, dsv3)
    assert grouped_takes(dataclasses.replace(cfg, gluon_grouped=1), 4096, 32768, dsv3)
    assert not grouped_takes(dataclasses.replace(cfg, gluon_grouped=1), 70000, 8 * 70000, dsv3)


def test_expert_block_tiles():
    # K3-like T = 16-54: GEMM1 unsplit; GEMM2's rows of 3 steps in 128-row programs, one row block each, under 12288
    # programs of 4 row blocks (T = 54: 864 x 14); from T = 55 (880 x 14) in 4 64-row blocks a program
    assert [grouped_tiles(MoEConfig(), 3584, 384, 16 * T, 896) for T in (16, 24, 40, 54)] == [(128, 128, 1, 1)] * 4
    assert [grouped_tiles(MoEConfig(), 3584, 384, 16 * T, 896)[3] for T in (55, 64, 256)] == [4, 4, 4]
    # in 64-row programs, 4 row blocks a program from 4096 such programs over min(E, pairs) blocks: T = 24 (384 x
    # 14), not T = 16 (256 x 14)
    assert grouped_tiles(MoEConfig(gluon_rows2=64), 3584, 384, 256, 896) == (128, 128, 1, 1)
    assert grouped_tiles(MoEConfig(gluon_rows2=64), 3584, 384, 384, 896) == (128, 128, 1, 4)
    # DSV3-like (GEMM2 rows of 16 steps): one row block a program
    assert grouped_tiles(MoEConfig(), 7168, 2048, 4096, 256) == (128, 128, 1, 1)
    # 64-code steps asked for; splits and row blocks lowered to divisors (1088 = 17 steps of 64 / row blocks)
    assert grouped_tiles(MoEConfig(gluon_k1=64, gluon_rows2=64), 3584, 384, 512, 896) == (64, 128, 1, 4)
    assert grouped_tiles(MoEConfig(gluon_split1=4), 1088, 192, 64, 8) == (64, 64, 1, 1)
    assert grouped_tiles(MoEConfig(gluon_split1=4), 7168, 2048, 4096, 256)[2] == 4
    assert [grouped_tiles(MoEConfig(gluon_blocks2=b), 3584, 384, 256, 896)[3] for b in (1, 5, 7, 100)] == [1, 4, 7, 56]
    assert grouped_tiles(MoEConfig(gluon_blocks2=7), 7168, 2048, 128, 256)[3] == 7


@given(h=st.integers(1, 160), i=st.integers(1, 64), pairs=st.integers(1, 5000), experts=st.integers(1, 1024),
       k1=st.sampled_from([0, 64, 128]), k2=st.sampled_from([64, 128]), s1=st.integers(0, 40), b2=st.integers(0, 80))
def test_expert_block_tiles_always_divide_their_loops(h, i, pairs, experts, k1, k2, s1, b2):
    H, I = 64 * h, 64 * i
    cfg = MoEConfig(gluon_k1=k1, gluon_k2=k2, gluon_split1=s1, gluon_blocks2=b2)
    t1, t2, splits, blocks = grouped_tiles(cfg, H, I, pairs, experts)
    assert t1 == ((k1 or 128) if H % (k1 or 128) == 0 else 64) and t2 == (k2 if I % k2 == 0 else 64)
    assert (H // t1) % splits == 0 and splits <= max(1, s1)
    assert (H // 64) % blocks == 0 and blocks <= (b2 or triton_moe.gluon_choice._GROUPED_BLOCKS2)
    if not b2 and blocks > 1:  # automatic: short GEMM2 rows and programs enough (more where the rows a program are)
        assert I // t2 <= triton_moe.gluon_choice._GROUPED_SHORT_STEPS
        least = triton_moe.gluon_choice._GROUPED_PROGRAMS2_WIDE if gluon_rows2(cfg, H, I, t2) > 64 else triton_moe.gluon_choice._GROUPED_PROGRAMS2
        assert min(experts, pairs) * (H // 64 // blocks) >= least


def _hopper_rot_case(T=1, dtype=torch.bfloat16, H=128, I=128, E=4, k=2):
    from mxfp4conv.shuffle import get_layout

    g = torch.Generator().manual_seed(3)
    Wl, Sl = get_layout("hopper_mma_w_rot"), get_layout("hopper_mma_s")
    w13 = Wl.forward(torch.randint(0, 256, (E, 2 * I, H // 2), generator=g, dtype=torch.uint8))
    s13 = Sl.forward(torch.randint(120, 128, (E, 2 * I, H // 32), generator=g, dtype=torch.uint8))
    w2 = Wl.forward(torch.randint(0, 256, (E, H, I // 2), generator=g, dtype=torch.uint8))
    s2 = Sl.forward(torch.randint(120, 128, (E, H, I // 32), generator=g, dtype=torch.uint8))
    x = torch.randn(T, H, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    return x, (w13, s13, w2, s2), torch.rand(T, k, generator=g), ids


def test_plan_leaves_every_other_call_to_the_hopper_kernels():
    x, w, tw, ids = _hopper_rot_case()
    cfg = MoEConfig()
    assert gluon_plan(cfg, x, w, 2, "hopper_mma_rot") is None  # no CUDA tensor here
    assert gluon_plan(dataclasses.replace(cfg, gluon=1), x, w, 2, "hopper_mma_rot") is None
    assert gluon_plan(cfg, x, w, 2, "hopper_mma") is None


def test_one_token_off_gpu_runs_the_hopper_kernels(monkeypatch):
    """fused_moe_triton at T = 1 over hopper_mma_rot without a GPU: the plan declines, the Gluon path is
    never entered and the hopper_mma kernels (interpreted) run."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a CUDA GPU is present: gpu_check covers this call there")
    called = []
    monkeypatch.setattr(triton_moe.forward, "_gluon_forward", lambda *a, **k: called.append(1))
    x, w, tw, ids = _hopper_rot_case()
    out = fused_moe_triton(x, *w, tw, ids, activation="silu", activation_params={}, layout="hopper_mma_rot")
    ref = fused_moe_triton(x, *w, tw, ids, activation="silu", activation_params={}, layout="hopper_mma_rot",
                           config=dataclasses.replace(select_config(2, 4, 128, 128, "hopper_mma_rot"), gluon=0))
    assert not called
    assert torch.equal(out, ref) and bool(torch.isfinite(out).all())
    # the expert-block kernels, asked for past the per-pair limit, are not entered either
    monkeypatch.setattr(triton_moe.gluon_forward, "_gluon_grouped_module", lambda: called.append(2))
    x2, w2, tw2, ids2 = _hopper_rot_case(T=3)
    cfg = dataclasses.replace(select_config(6, 4, 128, 128, "hopper_mma_rot"), gluon_grouped=1, gluon_max_tokens=1)
    out = fused_moe_triton(x2, *w2, tw2, ids2, activation="silu", activation_params={}, layout="hopper_mma_rot",
                           config=cfg)
    assert not called and bool(torch.isfinite(out).all())


# Compiled in a child process: this session runs Triton in its interpreter, which cannot compile.
_COMPILE = r"""
import json, sys
sys.path.insert(0, "benchmarks/probes")
import hopper_sass
from mxfp4conv.kernels.triton_moe import gluon_few_tokens, gluon_grouped

# as a launch specialises them: the shape arguments (H_pad, I_pad and whole K splits of them) are multiples of 64
SHAPE_ARGS = {"K", "N", "I", "K_SPLIT"}
TYPES = {"x_ptr": "*bf16", "ids_ptr": "*i32", "b_ptr": "*fp32", "inter_ptr": "*bf16", "part_ptr": "*fp32",
         "tw_ptr": "*fp32", "out_ptr": "*bf16", "pair_out_ptr": "*bf16", "p0": "fp32", "p1": "fp32"}
out = []
for name, consts, *options in json.loads(sys.argv[1]):
    fn = getattr(gluon_few_tokens if name.startswith("few_") else gluon_grouped, name)
    out.append(hopper_sass.compile_gluon_sass(fn, consts, TYPES, SHAPE_ARGS, (options or [{}])[0]))
print("RESULT" + json.dumps(out))
"""


def _tools_available() -> bool:
    try:
        from triton.experimental import gluon  # noqa: F401
    except ImportError:
        return False
    return nvidia_tools()


ACTS = {"silu+limit": (triton_moe.launch._ACT_IDS["silu"], True, False), "situ": (triton_moe.launch._ACT_IDS["situ"], False, True),
        "swigluoai": (triton_moe.launch._ACT_IDS["swigluoai"], False, False)}
# activation, KB, splits, bias, PDL (GEMM2 a programmatic dependent of GEMM1), GEMM2's sum over k (in its last program
# or after it)
VARIANTS = [("silu+limit", 1, 4, False, False, True), ("situ", 2, 1, False, True, False),
            ("swigluoai", 1, 8, True, True, True), ("silu+limit", 2, 1, False, False, False)]
KB_STEPS = {1: 4, 2: 8}  # m16n8k16 MMAs a warp's 16-row slab takes for a 64 KB-code K step


# the expert-block kernels (8-pair blocks): KB, GEMM1's K splits, GEMM2's 64-row blocks a program, GEMM1's x operand
# masked (unmasked, a padding slot reads row 0 and is never stored)
GROUPED = [(2, 1, 1, True), (2, 2, 4, True), (1, 1, 1, False), (1, 4, 2, True), (2, 1, 7, False), (2, 1, 4, False),
           (1, 1, 4, True)]
# GEMM2 in 64- and 128-row programs (NB 4 / 8 slabs): per pair (KB, sum in GEMM2) and on 8-pair blocks
ROWS2 = [("few_gemm2", dict(KB=2, HAS_BIAS=True, SPLITS=1, PDL=True, SUM=False)),
         ("few_gemm2", dict(KB=1, HAS_BIAS=False, SPLITS=2, PDL=False, SUM=True)),
         ("grp_gemm2", dict(KB=2, BT=8, HAS_BIAS=True, BLOCKS=1))]


# K loops over single steps and pairs of them (with loop_tuning's automatic cap where it sets one): the per-pair GEMM1 in
# 64- and 128-code steps, GEMM2 in 64- and 128-row programs, the expert blocks' 128-row GEMM2, and their GEMM1 (an odd
# number of steps is the runtime's concern: the pairs loop skips a last missing step)
UNROLLED = [("few_gemm1", dict(KB=1, ACT=ACTS["silu+limit"][0], HAS_LIMIT=True, HAS_LINEAR=False, HAS_BIAS=False,
                               SPLITS=4, PDL=True, FRAG_KB=2), 0),
            ("few_gemm1", dict(KB=2, ACT=ACTS["situ"][0], HAS_LIMIT=False, HAS_LINEAR=True, HAS_BIAS=True, SPLITS=1,
                               PDL=True, FRAG_KB=2), 80),
            ("few_gemm2", dict(KB=2, HAS_BIAS=False, SPLITS=1, PDL=True, SUM=True, NB=4), 0),
            ("few_gemm2", dict(KB=2, HAS_BIAS=True, SPLITS=1, PDL=True, SUM=False, NB=8), 80),
            ("grp_gemm2", dict(KB=2, BT=8, HAS_BIAS=True, BLOCKS=1, NB=8), 80),
            ("grp_gemm1", dict(KB=2, BT=8, ACT=ACTS["situ"][0], HAS_LIMIT=False, HAS_LINEAR=True, HAS_BIAS=True,
                               SPLITS=1, FRAG_KB=2, MASKED=True), 0)]

# hopper_mma_w_xor's loops as loop_tuning runs them: the per-pair 128-row GEMM2 over single steps uncapped, the per-pair
# GEMM1 in 128-code single steps capped at 72, the expert blocks' GEMM1 at 96
XOR_TUNED = [("few_gemm2", dict(KB=2, HAS_BIAS=False, SPLITS=1, PDL=True, SUM=False, NB=8, UNROLL=1), 0),
             ("few_gemm1", dict(KB=2, ACT=ACTS["situ"][0], HAS_LIMIT=False, HAS_LINEAR=True, HAS_BIAS=True, SPLITS=1,
                                PDL=True, FRAG_KB=2, UNROLL=1), 72),
             ("grp_gemm1", dict(KB=2, BT=8, ACT=ACTS["situ"][0], HAS_LIMIT=False, HAS_LINEAR=True, HAS_BIAS=True,
                                SPLITS=1, FRAG_KB=2, MASKED=True, UNROLL=1), 96)]

# programmatic dependent launches on the GEMM2s' two sides: the per-pair GEMM1 releasing GEMM2 after its K loop, the
# per-pair GEMM2 releasing the k-sum kernel after it, the expert blocks' GEMM1 waiting for the align before it and
# releasing their GEMM2 after its K loop, which waits for it (one block a program and four) and releases the k-sum
# kernel
CHAINED = [("few_gemm1", dict(KB=2, ACT=ACTS["situ"][0], HAS_LIMIT=False, HAS_LINEAR=True, HAS_BIAS=True, SPLITS=1,
                              PDL=True, FRAG_KB=2)),
           ("few_gemm2", dict(KB=2, HAS_BIAS=False, SPLITS=1, PDL=True, SUM=False, NB=8, RELEASE=True)),
           ("grp_gemm1", dict(KB=2, BT=8, ACT=ACTS["situ"][0], HAS_LIMIT=False, HAS_LINEAR=True, HAS_BIAS=True,
                              SPLITS=1, FRAG_KB=2, MASKED=True, PDL=True)),
           ("grp_gemm1", dict(KB=2, BT=8, ACT=ACTS["situ"][0], HAS_LIMIT=False, HAS_LINEAR=True, HAS_BIAS=True,
                              SPLITS=2, FRAG_KB=2, MASKED=False, PDL=True)),
           ("grp_gemm2", dict(KB=2, BT=8, HAS_BIAS=True, BLOCKS=1, NB=8, PDL=True, RELEASE=True)),
           ("grp_gemm2", dict(KB=2, BT=8, HAS_BIAS=True, BLOCKS=4, PDL=True))]


@pytest.fixture(scope="module")
def compiled():
    """{(variant, kernel): (SASS, resource usage)} of both kernels in every VARIANTS configuration."""
    jobs, keys = [], []
    for variant in VARIANTS:
        act, kb, splits, bias, pdl, sum2 = variant
        a, limit, linear = ACTS[act]
        jobs.append(("few_gemm1", dict(KB=kb, ACT=a, HAS_LIMIT=limit, HAS_LINEAR=linear, HAS_BIAS=bias, SPLITS=splits,
                                       PDL=pdl, FRAG_KB=kb)))
        jobs.append(("few_gemm2", dict(KB=kb, HAS_BIAS=bias, SPLITS=splits, PDL=pdl, SUM=sum2)))
        keys += [(variant, "few_gemm1"), (variant, "few_gemm2")]
    for key in GROUPED:
        kb, splits, blocks, masked = key
        jobs.append(("grp_gemm1", dict(KB=kb, BT=8, ACT=ACTS["situ"][0], HAS_LIMIT=False, HAS_LINEAR=True,
                                       HAS_BIAS=True, SPLITS=splits, FRAG_KB=kb, MASKED=masked)))
        jobs.append(("grp_gemm2", dict(KB=kb, BT=8, HAS_BIAS=True, BLOCKS=blocks)))
        keys += [(key, "grp_gemm1"), (key, "grp_gemm2")]
    for i, (name, consts) in enumerate(ROWS2):
        for nb in (4, 8):
            jobs.append((name, dict(consts, NB=nb)))
            keys.append((("rows2", i, nb), name))
    for i, (name, consts, cap) in enumerate(UNROLLED):
        for unroll in (1, 2):
            jobs.append((name, dict(consts, UNROLL=unroll), {"maxnreg": cap} if cap and unroll == 2 else {}))
            keys.append((("unroll", i, unroll), name))
    for i, (name, consts) in enumerate(CHAINED):
        jobs.append((name, consts))
        keys.append((("chained", i), name))
    for i, (name, consts, cap) in enumerate(UNROLLED):  # the same kernels decoding hopper_mma_w_xor's words
        jobs.append((name, dict(consts, UNROLL=2, WPTX=WORDS32_PTX["xor"]), {"maxnreg": cap} if cap else {}))
        keys.append((("xor", i), name))
    for i, (name, consts, cap) in enumerate(XOR_TUNED):
        jobs.append((name, dict(consts, WPTX=WORDS32_PTX["xor"]), {"maxnreg": cap} if cap else {}))
        keys.append((("xor_tuned", i), name))
    for _, consts, *_ in jobs:  # the kernels take the decode from their caller: the others decode hopper_mma_w_rot's
        consts.setdefault("WPTX", WORDS32_PTX["rot"])
    return dict(zip(keys, run_child(_COMPILE, jobs)))


@pytest.mark.skipif(not _tools_available(), reason="this Triton has no Gluon or ships no NVIDIA tools")
@pytest.mark.parametrize("variant", VARIANTS)
def test_kernels_compile_for_sm90_without_spills(compiled, variant):
    kb = variant[1]
    for kernel, mmas in (("few_gemm1", 2 * KB_STEPS[kb]), ("few_gemm2", KB_STEPS[kb])):  # gate and up; one matrix
        sass, res = compiled[(variant, kernel)]
        assert re.search(r"STACK:0\b", res), f"{kernel}: {res}"  # nothing spilled to local memory
        assert len(re.findall(r"HMMA\.16816\.F32\.BF16", sass)) >= mmas, kernel
        assert "LDL" not in sass and "STL" not in sass, kernel
    # programmatic dependent launch: GEMM1 releases GEMM2, GEMM2 waits for GEMM1's output
    pdl = variant[4]
    assert ("PREEXIT" in compiled[(variant, "few_gemm1")][0]) == pdl
    assert ("ACQBULK" in compiled[(variant, "few_gemm2")][0]) == pdl
    # the sum over k in GEMM2: each program counts its arrival with one atomic add; without it, none
    assert ("ATOMG.E.ADD" in compiled[(variant, "few_gemm2")][0]) == variant[5]
    # the program that arrives last on a counter stores zero to it (counters.zeroed_counters' buffer stays zero)
    for kernel, counted in (("few_gemm1", variant[2] > 1), ("few_gemm2", variant[5])):
        atom = re.findall(r"ATOMG\.E\.ADD\S* PT, R\d+, desc\[\w+\]\[(R\d+\.64)\]", compiled[(variant, kernel)][0])
        resets = re.findall(r"STG\.E desc\[\w+\]\[(R\d+\.64)\], RZ", compiled[(variant, kernel)][0])
        assert (len(atom) == 1 and atom[0] in resets) if counted else not atom, (kernel, atom, resets)
    # the B operand from rows in fragment order: a lane's 16 KB codes of a step in KB 16-byte loads beside the
    # weights' KB (in the loop and the first step's); no shuffle through shared memory (the one shared word is the
    # arrival count's, with the sum in GEMM2)
    sass = compiled[(variant, "few_gemm2")][0]
    assert len(re.findall(r"LDG\.E\.128", sass)) >= 4 * kb
    assert len(re.findall(r"\bLDS\b|\bSTS\b", sass)) <= (2 if variant[5] else 0)


@pytest.mark.skipif(not _tools_available(), reason="this Triton has no Gluon or ships no NVIDIA tools")
@pytest.mark.parametrize("kb, splits, blocks, masked", GROUPED)
def test_expert_block_kernels_compile_for_sm90_without_spills(compiled, kb, splits, blocks, masked):
    # a warp's slab: (64 KB / 16) m16n8k16 MMAs a K step for the block's 8 pairs, gate and up in GEMM1
    key = (kb, splits, blocks, masked)
    for kernel, matrices in (("grp_gemm1", 2), ("grp_gemm2", 1)):
        sass, res = compiled[(key, kernel)]
        assert re.search(r"STACK:0\b", res), f"{kernel}: {res}"  # nothing spilled to local memory
        assert "LDL" not in sass and "STL" not in sass, kernel
        assert len(re.findall(r"HMMA\.16816\.F32\.BF16", sass)) >= matrices * KB_STEPS[kb], kernel
    # GEMM1's K splits: the last split of a tile counts its arrival with one atomic add
    assert ("ATOMG.E.ADD" in compiled[(key, "grp_gemm1")][0]) == (splits > 1)
    # unsplit, GEMM1's only predicated loads are its masked x operand's
    if splits == 1:
        assert bool(re.findall(r"@!?P\d+ LDG", compiled[(key, "grp_gemm1")][0])) == masked
    # the shared x tile: a lane's 4 KB codes of a column in one load (16 / 8 bytes), stored once and read by the
    # warps as MMA fragments (ldmatrix)
    sass1 = compiled[(key, "grp_gemm1")][0]
    assert "LDSM" in sass1 and "STS" in sass1
    assert re.search(r"LDG\.E\.%s" % ("128" if kb == 2 else "64"), sass1)
    # GEMM2's B operand from rows in fragment order: in 16-byte loads, no shuffle through shared memory
    sass = compiled[(key, "grp_gemm2")][0]
    assert len(re.findall(r"LDG\.E\.128", sass)) >= 4 * kb
    assert "STS" not in sass and "LDS" not in sass
    # its x loads unmasked: the one predicated loads are a lane's routing weights (two for the block's 8 pairs)
    assert len(re.findall(r"@!?P\d+ LDG", sass)) <= 2


@pytest.mark.skipif(not _tools_available(), reason="this Triton has no Gluon or ships no NVIDIA tools")
@pytest.mark.parametrize("i", range(len(ROWS2)))
def test_gemm2_in_128_row_programs_shares_a_steps_b_operand(compiled, i):
    name, consts = ROWS2[i]
    (sass4, _), (sass8, _) = (compiled[(("rows2", i, nb), name)] for nb in (4, 8))
    (_, loop4), (_, loop8) = (hopper_sass.loops(s, 50)[0] for s in (sass4, sass8))
    # each warp's two slabs: twice the MMAs a K step, each slab's weight and scale words (KB 16-byte and KB 4-byte
    # loads a lane), and the step's B operand loaded once for both
    kb = consts["KB"]
    assert loop4["HMMA"] == KB_STEPS[kb] and loop8["HMMA"] == 2 * KB_STEPS[kb]
    assert loop8["LDG"] == loop4["LDG"] + 2 * kb


# The kernels' register and instruction budgets are tuned on the SASS Triton 3.9's compiler (its ptxas 12.9)
# makes. Older compilers make other, still correct, code: Triton 3.7.1 (ptxas 12.8) spills 16 bytes of the
# grouped GEMM2 (STACK:16), Triton 3.8.0 keeps more register copies (IMAD) in the paired K loop. The checks of
# that tuning run on 3.9 and later; what the code does (MMAs, loads, shared operands) is checked everywhere.
TUNED_TRITON = tuple(int(v) for v in re.findall(r"\d+", triton.__version__)[:2]) >= (3, 9)
TUNED = pytest.mark.skipif(not TUNED_TRITON, reason=f"checks the SASS Triton 3.9's compiler makes of the kernels "
                           f"(their register and instruction tuning); Triton {triton.__version__}'s compiler makes "
                           "other code")


@pytest.mark.skipif(not _tools_available(), reason="this Triton has no Gluon or ships no NVIDIA tools")
@TUNED
@pytest.mark.parametrize("i", range(len(ROWS2)))
def test_gemm2_in_128_row_programs_spill_nothing(compiled, i):
    name, _ = ROWS2[i]
    sass8, res8 = compiled[(("rows2", i, 8), name)]
    assert all(not ops["LDL"] and not ops["STL"] for _, ops in hopper_sass.loops(sass8, 50)), res8  # none in the loop
    # the per-pair GEMM2 keeps nothing on the stack; the expert blocks' (x unmasked) two words across its K loop
    assert re.search(r"STACK:%d\b" % (8 if name == "grp_gemm2" else 0), res8), res8


@pytest.mark.skipif(not _tools_available(), reason="this Triton has no Gluon or ships no NVIDIA tools")
@pytest.mark.parametrize("i", range(len(UNROLLED)))
def test_k_loop_over_pairs_of_steps_holds_two_steps(compiled, i):
    name, consts, cap = UNROLLED[i]
    (sass1, _), (sass2, _) = (compiled[(("unroll", i, u), name)] for u in (1, 2))
    (_, loop1), (_, loop2) = (hopper_sass.loops(s, 50)[0] for s in (sass1, sass2))
    # one loop body holds two steps: twice the MMAs and the loads
    assert loop2["HMMA"] == 2 * loop1["HMMA"] and loop2["LDG"] == 2 * loop1["LDG"]


@pytest.mark.skipif(not _tools_available(), reason="this Triton has no Gluon or ships no NVIDIA tools")
@TUNED
@pytest.mark.parametrize("i", range(len(UNROLLED)))
def test_k_loop_over_pairs_of_steps_copies_no_registers_between_them(compiled, i):
    name, consts, cap = UNROLLED[i]
    (sass1, res1), (sass2, res2) = (compiled[(("unroll", i, u), name)] for u in (1, 2))
    (n1, loop1), (n2, loop2) = (hopper_sass.loops(s, 50)[0] for s in (sass1, sass2))
    # fewer instructions a step (the register copies of the loaded words, the loop's counter, clamp and branch once
    # a pair)
    assert n2 < 2 * n1 * 0.97, (n1, n2)
    assert loop2["IMAD"] < 2 * loop1["IMAD"]  # (IMAD.MOV, the copies, counts as IMAD)
    # a word's decode (one word an MMA a lane): its two shifts where no bit wraps run as IMAD.SHL on the FMA pipe,
    # so the integer pipe's funnel shifts are two a word (and a few for addresses), not four
    words = loop2["HMMA"]
    assert loop2["SHF"] < 3 * words and len(re.findall(r"IMAD\.SHL", sass2)) >= 2 * words, (loop2, words)
    regs = int(re.search(r"REG:(\d+)", res2).group(1))
    assert regs <= cap if cap else re.search(r"STACK:0\b", res2), res2  # uncapped: nothing spilled


@pytest.mark.skipif(not _tools_available(), reason="this Triton has no Gluon or ships no NVIDIA tools")
@pytest.mark.parametrize("i", range(len(UNROLLED)))
def test_xor_order_decodes_in_fewer_instructions(compiled, i):
    name, consts, cap = UNROLLED[i]
    (sass_r, _), (sass_x, res_x) = compiled[(("unroll", i, 2), name)], compiled[(("xor", i), name)]
    (n_r, loop_r), (n_x, loop_x) = (hopper_sass.loops(s, 50)[0] for s in (sass_r, sass_x))
    # the same MMAs and loads; a word's R3 one xor-and (a LOP3) in place of two masks and an or (two LOP3): one logic
    # instruction fewer a word (one word an MMA a lane), and at least half an instruction fewer a word in all
    assert loop_x["HMMA"] == loop_r["HMMA"] and loop_x["LDG"] == loop_r["LDG"]
    words = loop_x["HMMA"]
    assert loop_x["LOP3"] == loop_r["LOP3"] - words, (loop_r, loop_x)
    assert n_x <= n_r - words // 2, (n_r, n_x, words)
    regs = int(re.search(r"REG:(\d+)", res_x).group(1))
    assert regs <= cap if cap else re.search(r"STACK:0\b", res_x), res_x


@pytest.mark.skipif(not _tools_available(), reason="this Triton has no Gluon or ships no NVIDIA tools")
@pytest.mark.parametrize("i", range(len(XOR_TUNED)))
def test_xor_order_loops_fit_their_caps_without_spills(compiled, i):
    name, consts, cap = XOR_TUNED[i]
    sass, res = compiled[(("xor_tuned", i), name)]
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    assert re.search(r"STACK:0\b", res) and "LDL" not in sass and "STL" not in sass, res
    assert regs <= (cap or 80), res  # uncapped, the 128-row GEMM2 keeps to 6 programs an SM


def _ops(sass: str) -> list[str]:
    """The opcodes of a SASS listing in order (predicates dropped)."""
    return [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)", sass)]


@pytest.mark.skipif(not _tools_available(), reason="this Triton has no Gluon or ships no NVIDIA tools")
@pytest.mark.parametrize("i", range(len(CHAINED)))
def test_gemm2s_chain_to_the_kernels_beside_them(compiled, i):
    name, consts = CHAINED[i]
    ops = _ops(compiled[(("chained", i), name)][0])
    # a release (griddepcontrol.launch_dependents) where one is asked for: GEMM2's before its first load, GEMM1's
    # after its K loop's loads
    gemm1 = name.endswith("gemm1")
    releases = [n for n, op in enumerate(ops) if op == "PREEXIT"]
    loads = [n for n, op in enumerate(ops) if op.startswith("LDG")]
    assert len(releases) == (1 if consts.get("RELEASE") or gemm1 else 0), (name, releases)
    if releases:
        assert (releases[0] < loads[0]) == (not gemm1), (releases, loads[:3])
    # GEMM2 waits for GEMM1 (griddepcontrol.wait) once, after its first weight loads are issued; the expert blocks'
    # GEMM1 for the align, before it reads anything; the per-pair GEMM1 (launched first) for nothing
    waits = [n for n, op in enumerate(ops) if op.startswith("ACQBULK")]
    assert len(waits) == (0 if name == "few_gemm1" else 1), (name, waits)
    assert not waits or (waits[0] < loads[0]) == (name == "grp_gemm1"), (waits, loads[:3])
    # neither is in the kernels built without them
    plain = {"grp_gemm1": (GROUPED[0], name), "grp_gemm2": (GROUPED[0], name), "few_gemm1": (VARIANTS[0], name),
             "few_gemm2": (("unroll", 3, 1), name)}[name]
    assert "PREEXIT" not in compiled[plain][0] and ("ACQBULK" in compiled[plain][0]) == (name == "few_gemm2")


def test_reused_counters_are_one_zeroed_buffer_a_device_that_grows():
    from mxfp4conv.kernels.triton_moe import counters
    counters._BUFFERS.clear()
    a = counters.zeroed_counters(torch.device("cpu"), 10)
    assert a.dtype == torch.int32 and a.shape == (10,) and not a.any()
    b = counters.zeroed_counters(torch.device("cpu"), 100)
    assert b.data_ptr() == a.data_ptr()  # the same storage: no fill per call
    # the kernels leave every counter they count at zero; a larger request gets a larger zeroed buffer
    big = counters.zeroed_counters(torch.device("cpu"), 5000)
    assert big.numel() == 5000 and not big.any() and big.data_ptr() != a.data_ptr()
    assert counters.zeroed_counters(torch.device("cpu"), 10).data_ptr() == big.data_ptr()
    # not reused: a fresh zeroed tensor each call
    fresh = counters.zeroed_counters(torch.device("cpu"), 10, reuse=False)
    assert fresh.data_ptr() != big.data_ptr() and not fresh.any()
    counters._BUFFERS.clear()


def test_bad_gluon_counters_is_a_clear_error():
    with pytest.raises(RuntimeInputError, match="gluon_counters must be 0 or 1"):
        gluon_tiles(MoEConfig(gluon_counters=2), 7168, 2048, 8)
