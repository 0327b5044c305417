"""The Triton fused MoE kernels run on CPU through TRITON_INTERPRET=1 on tiny shapes.

fp16 and fp32 only: bf16 tl.dot is broken in the interpreter. The reference is an
independent float64 computation from the raw bytes (codec dequantiser, activations written
out here), so a layout, decode, routing or reduction bug in the kernels shows up as error.
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    if torch.cuda.is_available():
        pytest.skip("CPU-interpreter tests; on a GPU benchmarks/gpu_check.py runs the kernels", allow_module_level=True)
    raise RuntimeError("TRITON_INTERPRET=1 must be set before triton is imported (tests/conftest.py does it)")

from mxfp4conv.codec import dequantize_mxfp4  # noqa: E402
from mxfp4conv.errors import RuntimeInputError  # noqa: E402
from mxfp4conv.kernels import triton_moe  # noqa: E402
from layer_shapes import DSV3, K3  # noqa: E402


def _act64(name, params, g, u):
    if name == "situ":
        beta, lin = params.get("beta", 1.0), params.get("linear_beta")
        gate = beta * torch.tanh(g / beta) * torch.sigmoid(g)
        if lin is not None and lin > 0:
            u = lin * torch.tanh(u / lin)
        return gate * u
    if name == "silu":
        lim = params.get("swiglu_limit")
        if lim is not None:
            g, u = g.clamp(max=lim), u.clamp(-lim, lim)
        return g * torch.sigmoid(g) * u
    alpha, lim = params.get("alpha", 1.702), params.get("limit", 7.0)
    g, u = g.clamp(max=lim), u.clamp(-lim, lim)
    return (u + 1) * g * torch.sigmoid(alpha * g)


def reference(x, w13, s13, w2, s2, tw, ids, act, params, b13=None, b2=None):
    W13 = dequantize_mxfp4(w13, s13).double()
    W2 = dequantize_mxfp4(w2, s2).double()
    i_pad = W13.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0:
                continue
            h = W13[e] @ x[t].double() + (b13[e].double() if b13 is not None else 0)
            a = _act64(act, params, h[:i_pad], h[i_pad:])
            y = W2[e] @ a + (b2[e].double() if b2 is not None else 0)
            out[t] += float(tw[t, j]) * y
    return out


def make_problem(seed, T, H, I, E, k, *, bias=False, ids=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), generator=g, dtype=torch.uint8)
    s13 = torch.randint(122, 128, (E, 2 * I, H // 32), generator=g, dtype=torch.uint8)
    w2 = torch.randint(0, 256, (E, H, I // 2), generator=g, dtype=torch.uint8)
    s2 = torch.randint(120, 126, (E, H, I // 32), generator=g, dtype=torch.uint8)
    if ids is None:
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    tw = torch.rand(ids.shape, generator=g)
    b13 = torch.randn(E, 2 * I, generator=g) if bias else None
    b2 = torch.randn(E, H, generator=g) if bias else None
    return x, w13, s13, w2, s2, tw, ids, b13, b2


def rel_err(out, ref):
    return float((out.double() - ref).norm() / ref.norm())


ACTS = [
    ("situ", {"beta": 4.0, "linear_beta": 25.0}, False),
    ("situ", {"beta": 2.0}, False),
    ("silu", {}, False),
    ("silu", {"swiglu_limit": 1.5}, False),
    ("swigluoai", {"alpha": 1.702, "limit": 7.0}, True),
]


@pytest.mark.parametrize("split", [False, True], ids=["fused-epilogue", "split-k"])
@pytest.mark.parametrize("act,params,bias", ACTS)
def test_activations_fp32_ragged(act, params, bias, split):
    # expert 0: many pairs (two blocks of 16), expert 1: one, expert 2: none, expert 3: a few; -1 skipped
    T, k, E, H, I = 20, 2, 4, 64, 32
    ids = torch.zeros(T, k, dtype=torch.int64)
    ids[:, 1] = -1
    ids[0, 1], ids[1, 1], ids[2, 1], ids[3, 1] = 1, 3, 3, 3
    ids[5] = torch.tensor([-1, -1])  # a token routed to no local expert: output must be 0
    x, w13, s13, w2, s2, tw, ids, b13, b2 = make_problem(1, T, H, I, E, k, bias=bias, ids=ids)
    ref = reference(x, w13, s13, w2, s2, tw, ids, act, params, b13, b2)
    cfg = triton_moe.MoEConfig(block_t=16, block_n1=16, block_n2=32, block_k=32,
                               split_k1=2 if split else 1, split_k2=2 if split else 1)
    out = triton_moe.fused_moe_triton(x, w13, s13, w2, s2, tw, ids, activation=act,
                                      activation_params=params, w13_bias=b13, w2_bias=b2, config=cfg)
    assert out.dtype == torch.float32 and out.shape == x.shape
    assert torch.isfinite(out).all()
    assert torch.all(out[5] == 0)
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("cfg", [
    triton_moe.MoEConfig(block_t=16, block_n1=16, block_n2=16, block_k=32),
    triton_moe.MoEConfig(block_t=32, block_n1=32, block_n2=64, block_k=64),
    triton_moe.MoEConfig(block_t=16, block_n1=32, block_n2=32, block_k=64),
    triton_moe.MoEConfig(block_t=16, block_n1=16, block_n2=32, block_k=128),
    triton_moe.MoEConfig(block_t=16, block_n1=16, block_n2=16, block_k=32, split_k1=2, split_k2=3),
    triton_moe.MoEConfig(block_t=32, block_n1=32, block_n2=16, block_k=256),
])  # mode 1 (bf16 bit decode) relies on bf16 subnormals, which the interpreter flushes: gpu_check covers it
def test_fp16_multi_k_steps_and_tile_tails(cfg):
    # H = 96 and I = 96 are not multiples of the K or N tiles; top-k 3 over 5 experts
    T, k, E, H, I = 7, 3, 5, 96, 96
    x, w13, s13, w2, s2, tw, ids, _, _ = make_problem(2, T, H, I, E, k)
    ids[2, 0] = -1
    params = {"beta": 4.0, "linear_beta": 25.0}
    ref = reference(x.half().float(), w13, s13, w2, s2, tw, ids, "situ", params)
    out = triton_moe.fused_moe_triton(x.half(), w13, s13, w2, s2, tw, ids, activation="situ",
                                      activation_params=params, config=cfg)
    assert out.dtype == torch.float16
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("mode", [2, 3, -1])
def test_decode_modes_other_than_bytes_and_words_are_refused(mode):
    x, w13, s13, w2, s2, tw, ids, _, _ = make_problem(3, 2, 64, 64, 4, 2)
    with pytest.raises(RuntimeInputError, match="mode must be 0"):
        triton_moe.fused_moe_triton(x, w13, s13, w2, s2, tw, ids, activation="silu", activation_params={},
                                    config=triton_moe.MoEConfig(mode=mode, gemv_max_pairs=0))


@pytest.mark.parametrize("grid", [0, 1])
def test_align_blocks_cover_every_pair_once(grid):
    ids = torch.tensor([[2, 0], [2, -1], [2, 1], [0, 2], [-1, -1]], dtype=torch.int32)
    sorted_ids, block_expert, npp, max_blocks = triton_moe.launch.moe_align(ids, 4, 4, grid)
    n = int(npp)
    assert n == 4 * 3  # expert 0: 2 pairs, 1: 1, 2: 4 -> one block each
    flat = ids.reshape(-1)
    got = sorted_ids[:n]
    real = got[got < flat.numel()]
    assert sorted(real.tolist()) == [i for i in range(flat.numel()) if flat[i] >= 0]
    for b in range(n // 4):
        e = int(block_expert[b])
        members = got[b * 4:(b + 1) * 4]
        members = members[members < flat.numel()]
        assert len(members) > 0 and all(int(flat[m]) == e for m in members)
    assert torch.all(block_expert[n // 4:max_blocks] == -1)


def test_align_many_programs_matches_one_program():
    # several CHUNKs of pairs, many experts, skipped slots: same blocks, same members per expert
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(-1, 37, (700, 4), generator=g, dtype=torch.int32)
    one = triton_moe.launch.moe_align(ids, 37, 16, 0)
    many = triton_moe.launch.moe_align(ids, 37, 16, 1)
    n = int(one[2])
    assert int(many[2]) == n
    assert torch.equal(one[1], many[1])
    for e in range(37):
        blocks = (one[1][:n // 16] == e).nonzero().flatten().tolist()
        got = lambda s: sorted(v for b in blocks for v in s[b * 16:(b + 1) * 16].tolist() if v < ids.numel())
        assert got(one[0]) == got(many[0]) == (ids.reshape(-1) == e).nonzero().flatten().tolist()


def test_fp4_decode_every_code_and_special_scales():
    # one expert, identity-like check of the in-register decode: every byte value, scales 0x7F..0x81 and 0xFF
    H, I, E = 512, 32, 1
    x, w13, s13, w2, s2, tw, ids, _, _ = make_problem(3, 1, H, I, E, 1)
    w13[0, :, :256] = torch.arange(256, dtype=torch.uint8)
    s13[0, 0, 0] = 0xFF  # NaN scale in a gate row: NaN must propagate to the output
    out = triton_moe.fused_moe_triton(x, w13, s13, w2, s2, tw, ids, activation="silu", activation_params={})
    assert torch.isnan(out).any()
    s13[0, 0, 0] = 127
    ref = reference(x, w13, s13, w2, s2, tw, ids, "silu", {})
    out = triton_moe.fused_moe_triton(x, w13, s13, w2, s2, tw, ids, activation="silu", activation_params={})
    assert rel_err(out, ref) < 1e-5


def test_bad_inputs_raise_clear_errors():
    x, w13, s13, w2, s2, tw, ids, _, _ = make_problem(4, 2, 64, 32, 2, 1)
    call = triton_moe.fused_moe_triton
    with pytest.raises(RuntimeInputError, match="layout"):
        call(x, w13, s13, w2, s2, tw, ids, activation="silu", activation_params={}, layout="aiter_p16")
    with pytest.raises(RuntimeInputError, match="w2 "):
        call(x, w13, s13, w2[:, :32], s2, tw, ids, activation="silu", activation_params={})
    with pytest.raises(RuntimeInputError, match="gelu"):
        call(x, w13, s13, w2, s2, tw, ids, activation="gelu", activation_params={})
    with pytest.raises(RuntimeInputError, match="uint8"):
        call(x, w13.float(), s13, w2, s2, tw, ids, activation="silu", activation_params={})
    with pytest.raises(RuntimeInputError, match="topk_weights"):
        call(x, w13, s13, w2, s2, tw[:, :0], ids, activation="silu", activation_params={})
    assert math.isfinite(float(call(x, w13, s13, w2, s2, tw, ids, activation="silu", activation_params={}).sum()))


@pytest.mark.parametrize("H,I,E,k", [DSV3, K3, (2880, 2880, 128, 4), (1024, 256, 64, 6),
                                     (512, 128, 8, 2)])
def test_one_token_gemm1_splits_keep_six_k_steps(H, I, E, k):
    # hopper_mma, one token: GEMM1's K splits are at least six block_k steps long (or there is one),
    # never more than the automatic count, and they cover K
    cfg = triton_moe.select_config(k, E, H, I, "hopper_mma_rot")
    programs = k * -(-I // cfg.block_n1)
    splits, per = triton_moe.tiles._splits(cfg.split_k1, programs, H, cfg.block_k)
    auto, _ = triton_moe.tiles._splits(0, programs, H, cfg.block_k)
    assert splits == 1 or per >= 6 * cfg.block_k
    assert 1 <= splits <= auto and splits * per >= H > (splits - 1) * per


@pytest.mark.parametrize("T", [2, 4, 8, 16, 32, 64])
@pytest.mark.parametrize("H,I,E,k", [K3, DSV3], ids=["k3", "dsv3"])
def test_short_gemm2_rows_take_several_row_tiles_once_there_are_programs_enough(T, H, I, E, k):
    # hopper_mma_rot, decode tiles: GEMM2 rows of at most 512 codes go several 128-row tiles a
    # program when one tile a program would give >= 3 * _TARGET_PROGRAMS programs (or past one
    # pair per expert); long rows (DSV3-like) keep one tile a program
    cfg = triton_moe.select_config(T * k, E, H, I, "hopper_mma_rot")
    one_tile_programs = T * k * -(-H // cfg.block_n2)  # <= one pair a block at these T
    many = I <= 512 and (T * k > E or one_tile_programs >= 3 * triton_moe.tiles._TARGET_PROGRAMS)
    assert (cfg.rows2 > 1) == many
    assert cfg.maxnreg2 == (0 if cfg.rows2 > 1 else -1)


@pytest.mark.parametrize("requested,programs,k", [(0, 96, 3584), (0, 448, 384), (0, 5000, 7168), (3, 10, 96), (1, 1, 4096)])
def test_split_k_ranges_cover_k_without_empty_splits(requested, programs, k):
    splits, per = triton_moe.tiles._splits(requested, programs, k, 128)
    assert per % 128 == 0 and splits >= 1
    assert splits * per >= k and (splits - 1) * per < k  # every split has work, together all of K
    if requested == 0 and programs >= 1024:
        assert splits == 1  # enough programs already: no split


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_default_config_expert_parallel_ids(dtype):
    # an expert-parallel rank: most slots are -1, one token has no local expert at all
    x, w13, s13, w2, s2, tw, _, b13, b2 = make_problem(5, 6, 64, 32, 4, 4, bias=True)
    ids = torch.tensor([[0, -1, -1, -1], [-1, -1, 2, -1], [0, -1, -1, 3], [-1, -1, -1, -1], [0, 1, -1, -1],
                        [0, -1, -1, -1]], dtype=torch.int32)
    params = {"beta": 4.0, "linear_beta": 25.0}
    ref = reference(x.to(dtype).float(), w13, s13, w2, s2, tw, ids, "situ", params, b13, b2)
    out = triton_moe.fused_moe_triton(x.to(dtype), w13, s13, w2, s2, tw, ids, activation="situ",
                                      activation_params=params, w13_bias=b13, w2_bias=b2)
    assert torch.isfinite(out).all() and torch.all(out[3] == 0)
    assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 1e-2)


# --- decode path without tensor cores (moe_gemv*_kernel): no tl.dot, so bf16 runs here too ---

def _spy_gemv(monkeypatch):
    calls = []
    real = triton_moe.forward._gemv_forward

    def spy(*a, **kw):
        calls.append(a[-2])  # the config it ran with
        return real(*a, **kw)

    monkeypatch.setattr(triton_moe.forward, "_gemv_forward", spy)
    return calls


def _ragged_ids():
    # expert 0: 6 pairs (two blocks of 4, or several of 1-2), expert 1: one, expert 2: none,
    # expert 3: three; -1 slots skipped; token 4 routed to no local expert (its output must be 0)
    return torch.tensor([[0, 3], [0, -1], [0, 1], [3, 0], [-1, -1], [0, 3], [0, -1]], dtype=torch.int64)


GEMV_CASES = [
    # dtype, activation, params, bias, pairs per block, K splits
    (torch.float32, *ACTS[0], 1, 1),
    (torch.float32, *ACTS[1], 2, 2),
    (torch.float32, *ACTS[2], 4, 1),
    (torch.float16, *ACTS[3], 0, 3),
    (torch.float16, *ACTS[4], 1, 1),
    (torch.bfloat16, *ACTS[4], 2, 1),
    (torch.bfloat16, *ACTS[0], 4, 2),
]


@pytest.mark.parametrize("dtype,act,params,bias,block_t,split", GEMV_CASES)
def test_gemv_path_ragged_every_activation_and_dtype(dtype, act, params, bias, block_t, split, monkeypatch):
    # H = 160 and I = 96: not multiples of the 64-code K step or of the 64-row N tiles (masked tails)
    T, k, E, H, I = 7, 2, 4, 160, 96
    x, w13, s13, w2, s2, tw, ids, b13, b2 = make_problem(6, T, H, I, E, k, bias=bias, ids=_ragged_ids())
    ref = reference(x.to(dtype).float(), w13, s13, w2, s2, tw, ids, act, params, b13, b2)
    cfg = triton_moe.MoEConfig(gemv_max_pairs=8, gemv_block_t=block_t, gemv_block_n1=64, gemv_block_n2=64,
                               gemv_block_k=64, split_k1=split, split_k2=split, gemv_kmajor=block_t % 2)
    calls = _spy_gemv(monkeypatch)
    out = triton_moe.fused_moe_triton(x.to(dtype), w13, s13, w2, s2, tw, ids, activation=act,
                                      activation_params=params, w13_bias=b13, w2_bias=b2, config=cfg)
    assert len(calls) == 1
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.isfinite(out).all() and torch.all(out[4] == 0)
    # fp16/bf16: x and the intermediate are rounded to the activation dtype, as in the MMA path
    assert rel_err(out, ref) < {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}[dtype]


@pytest.mark.parametrize("gemv", [True, False], ids=["gemv", "mma"])
def test_fp4_decode_every_code_and_nan_scale_both_paths(gemv, monkeypatch):
    H, I, E = 512, 32, 1
    x, w13, s13, w2, s2, tw, ids, _, _ = make_problem(7, 1, H, I, E, 1)
    w13[0, :, :256] = torch.arange(256, dtype=torch.uint8)
    w2[0, :, :16] = torch.arange(256, dtype=torch.uint8).reshape(16, 16).repeat(H // 16, 1)
    cfg = triton_moe.MoEConfig(gemv_max_pairs=4 if gemv else 0, gemv_block_k=128)
    calls = _spy_gemv(monkeypatch)
    ref = reference(x, w13, s13, w2, s2, tw, ids, "silu", {})
    out = triton_moe.fused_moe_triton(x, w13, s13, w2, s2, tw, ids, activation="silu", activation_params={},
                                      config=cfg)
    assert rel_err(out, ref) < 1e-5
    s13[0, 3, 5] = 0xFF  # NaN scale in one gate row: NaN must reach the output
    out = triton_moe.fused_moe_triton(x, w13, s13, w2, s2, tw, ids, activation="silu", activation_params={},
                                      config=cfg)
    assert torch.isnan(out).any()
    assert len(calls) == (2 if gemv else 0)


def test_dispatcher_picks_gemv_for_few_pairs_per_expert(monkeypatch):
    calls = _spy_gemv(monkeypatch)
    x, w13, s13, w2, s2, tw, ids, _, _ = make_problem(8, 2, 64, 32, 8, 2)  # 4 pairs over 8 experts
    out = triton_moe.fused_moe_triton(x, w13, s13, w2, s2, tw, ids, activation="silu", activation_params={})
    assert len(calls) == 1 and torch.isfinite(out).all()
    ids = torch.zeros(12, 1, dtype=torch.int64)  # 12 pairs on one expert: above the default threshold
    x, w13, s13, w2, s2, tw, ids, _, _ = make_problem(9, 12, 64, 32, 2, 1, ids=ids)
    ref = reference(x, w13, s13, w2, s2, tw, ids, "silu", {})
    out = triton_moe.fused_moe_triton(x, w13, s13, w2, s2, tw, ids, activation="silu", activation_params={})
    assert len(calls) == 1 and rel_err(out, ref) < 1e-5
    assert triton_moe.uses_gemv(triton_moe.MoEConfig(), 4, 256)
    assert not triton_moe.uses_gemv(triton_moe.MoEConfig(), 12, 2)
    assert not triton_moe.uses_gemv(triton_moe.MoEConfig(gemv_max_pairs=0), 1, 256)


# ---- the hopper_mma layouts (weights in the wgmma operand order, mxfp4conv.shuffle.hopper) ----


HOP = "hopper_mma_rot"  # one order the kernels read (convert writes hopper_mma_xor); the earlier order is checked against it below


def _hopper(w13, s13, w2, s2, layout=HOP):
    from mxfp4conv.shuffle.layouts import get_layout

    W, S = (get_layout(n) for n in triton_moe.LAYOUT_SETS[layout])
    return W.forward(w13), S.forward(s13), W.forward(w2), S.forward(s2)


@pytest.mark.parametrize("split", [False, True], ids=["fused-epilogue", "split-k"])
@pytest.mark.parametrize("act,params,bias", ACTS)
def test_hopper_layout_kernels_fp32_ragged(act, params, bias, split):
    # H = 320: five 64-code blocks, so 128-code K steps end on a half step; I = 192: three 64-row
    # tiles in GEMM1 and a K tail in GEMM2; GEMM2's 128-row tiles end on a half tile
    T, k, E, H, I = 20, 2, 4, 320, 192
    ids = torch.zeros(T, k, dtype=torch.int64)
    ids[:, 1] = -1
    ids[0, 1], ids[1, 1], ids[2, 1], ids[3, 1] = 1, 3, 3, 3
    ids[5] = torch.tensor([-1, -1])
    x, w13, s13, w2, s2, tw, ids, b13, b2 = make_problem(5, T, H, I, E, k, bias=bias, ids=ids)
    ref = reference(x, w13, s13, w2, s2, tw, ids, act, params, b13, b2)
    cfg = triton_moe.select_config(T * k, E, H, I, HOP)
    if split:
        cfg = triton_moe.MoEConfig(**{**cfg.__dict__, "split_k1": 2, "split_k2": 2})
    out = triton_moe.fused_moe_triton(x, *_hopper(w13, s13, w2, s2), tw, ids, activation=act,
                                      activation_params=params, w13_bias=b13, w2_bias=b2, config=cfg,
                                      layout=HOP)
    assert out.dtype == torch.float32 and out.shape == x.shape
    assert torch.all(out[5] == 0)
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("block_t", [16, 32])
def test_hopper_layout_fp16_and_larger_blocks(block_t):
    T, k, E, H, I = 9, 3, 5, 128, 128
    x, w13, s13, w2, s2, tw, ids, _, _ = make_problem(6, T, H, I, E, k)
    params = {"beta": 4.0, "linear_beta": 25.0}
    ref = reference(x.half().float(), w13, s13, w2, s2, tw, ids, "situ", params)
    cfg = triton_moe.MoEConfig(block_t=block_t, block_n1=64, block_n2=128, block_k=64)
    out = triton_moe.fused_moe_triton(x.half(), *_hopper(w13, s13, w2, s2), tw, ids, activation="situ",
                                      activation_params=params, config=cfg, layout=HOP)
    assert out.dtype == torch.float16 and rel_err(out, ref) < 1e-2


def test_hopper_layout_every_code_special_scales_and_big_scale_flag():
    H, I, E = 256, 64, 1
    x, w13, s13, w2, s2, tw, ids, _, _ = make_problem(7, 1, H, I, E, 1)
    w13[0, :, :128] = torch.arange(128, dtype=torch.uint8) * 2 + 1
    s13[0, 3, 1] = 0  # 2**-127
    s2[0, 5, 0] = 140  # a scale above 2: the kernels' two-multiply decode
    ref = reference(x, w13, s13, w2, s2, tw, ids, "silu", {})
    stored = _hopper(w13, s13, w2, s2)
    out = triton_moe.fused_moe_triton(x, *stored, tw, ids, activation="silu", activation_params={},
                                      layout=HOP)
    assert rel_err(out, ref) < 1e-5
    assert triton_moe._big_scales(stored[1], stored[3]) and not triton_moe._big_scales(stored[1])
    stored[3][stored[3] == 140] = 120  # in place: the remembered flag follows the tensor's version
    assert not triton_moe._big_scales(stored[3])
    s13[0, 2, 3] = 0xFF  # NaN scale: NaN must reach the output
    stored = _hopper(w13, s13, w2, s2)
    out = triton_moe.fused_moe_triton(x, *stored, tw, ids, activation="silu", activation_params={},
                                      layout=HOP)
    assert torch.isnan(out).any()


def test_hopper_layout_bad_inputs():
    x, w13, s13, w2, s2, tw, ids, _, _ = make_problem(8, 2, 96, 64, 2, 1)
    with pytest.raises(RuntimeInputError, match="multiples of 64"):
        triton_moe.fused_moe_triton(x, w13, s13, w2, s2, tw, ids, activation="silu", activation_params={},
                                    layout=HOP)
    with pytest.raises(RuntimeInputError, match="readable"):
        triton_moe.fused_moe_triton(x, w13, s13, w2, s2, tw, ids, activation="silu", activation_params={},
                                    layout="aiter_p16")
    assert triton_moe.layout_of({"w13": "hopper_mma_w", "w13_scale": "hopper_mma_s", "w2": "hopper_mma_w",
                                 "w2_scale": "hopper_mma_s"}) == "hopper_mma"
    assert triton_moe.layout_of({"w13": "hopper_mma_w_rot", "w13_scale": "hopper_mma_s", "w2": "hopper_mma_w_rot",
                                 "w2_scale": "hopper_mma_s"}) == "hopper_mma_rot"
    assert triton_moe.layout_of({"w13": "hopper_mma_w", "w13_scale": "identity", "w2": "hopper_mma_w",
                                 "w2_scale": "hopper_mma_s"}) is None
    assert triton_moe.layout_of({"w13": "hopper_mma_w_rot", "w13_scale": "hopper_mma_s", "w2": "hopper_mma_w",
                                 "w2_scale": "hopper_mma_s"}) is None


@pytest.mark.parametrize("T,direct,fused,split,rows2", [
    (1, -1, -1, False, 1), (1, -1, -1, True, 1), (1, 0, 1, True, 1), (6, 1, 1, True, 1), (6, 0, 1, True, 1),
    (6, 0, 0, True, 3),
], ids=["T1-auto", "T1-auto-splitk", "T1-sorted-fused", "direct-fused-splitk", "fused-splitk", "rows3-splitk"])
def test_hopper_one_block_per_pair_and_fused_reductions(T, direct, fused, split, rows2):
    # direct: block m = pair m (no align); fused: the split-K activation and the sum over k done by
    # the last program to arrive; rows2: GEMM2 programs of 3 row tiles (H = 320: 5 tiles, so the
    # second program has 2). Ragged ids: a skipped slot, a token with no local expert (its output
    # row must be 0), two tokens on one expert; bias on both GEMMs.
    k, E, H, I = 3, 5, 320, 128
    ids = torch.tensor([[0, -1, 3], [4, 0, 2], [-1, -1, -1], [1, 3, 0], [2, 4, -1], [0, 1, 2]])[:T]
    x, w13, s13, w2, s2, tw, ids, b13, b2 = make_problem(9, T, H, I, E, k, bias=True, ids=ids)
    ref = reference(x, w13, s13, w2, s2, tw, ids, "silu", {"swiglu_limit": 1.5}, b13, b2)
    cfg = triton_moe.MoEConfig(block_t=16, block_n1=64, block_n2=64, block_k=64, direct=direct, fused=fused,
                               split_k1=2 if split else 1, split_k2=3 if split else 1, rows2=rows2)
    assert triton_moe.hopper_forward.hopper_options(cfg, T, T * k, False)[:2] == (direct == 1 or (direct < 0 and T == 1),
                                                                 fused == 1 or (fused < 0 and T == 1))
    out = triton_moe.fused_moe_triton(x, *_hopper(w13, s13, w2, s2), tw, ids, activation="silu",
                                      activation_params={"swiglu_limit": 1.5}, w13_bias=b13, w2_bias=b2,
                                      config=cfg, layout=HOP)
    assert out.shape == x.shape and out.dtype == x.dtype
    if T > 2:
        assert torch.all(out[2] == 0)
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("T,overrides", [(1, {}), (6, {"rows2": 3}), (6, {"block_t": 32, "tail_t": 16}),
                                         (12, {"block_t": 64, "tail_t": 32, "dual": 1})],
                         ids=["T1-direct-fused", "rows3", "small-tiles", "two-tiles"])
def test_hopper_word_orders_decode_to_the_same_result(T, overrides):
    # layouts "hopper_mma" (weights in hopper_mma_w, the 11-instruction decode) and "hopper_mma_xor" (hopper_mma_w_xor,
    # the 8-instruction one) must give exactly the hopper_mma_rot result, on every kernel path

    k, E, H, I = 3, 5, 320, 128
    x, w13, s13, w2, s2, tw, ids, b13, b2 = make_problem(12, T, H, I, E, k, bias=True)
    cfg = dataclasses.replace(triton_moe.MoEConfig(block_t=16, block_n1=64, block_n2=64, block_k=64, split_k1=2,
                                                   split_k2=1), **overrides)
    outs = [triton_moe.fused_moe_triton(x, *_hopper(w13, s13, w2, s2, layout), tw, ids, activation="silu",
                                        activation_params={}, w13_bias=b13, w2_bias=b2, config=cfg, layout=layout)
            for layout in ("hopper_mma", "hopper_mma_rot", "hopper_mma_xor")]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[2], outs[1])
    assert rel_err(outs[1], reference(x, w13, s13, w2, s2, tw, ids, "silu", {}, b13, b2)) < 1e-5


@pytest.mark.parametrize("rows2,stages2", [(1, 0), (3, 2)], ids=["rows1", "rows3-stages2"])
def test_hopper_rows_first_program_order(rows2, stages2):
    # row tiles on grid axis 0 in both GEMMs (and GEMM2's own pipeline depth): same result as the
    # default order; ragged ids, K split, H = 320 (GEMM2 tiles end on a half tile)
    T, k, E, H, I = 6, 3, 5, 320, 128
    ids = torch.tensor([[0, -1, 3], [4, 0, 2], [-1, -1, -1], [1, 3, 0], [2, 4, -1], [0, 1, 2]])
    x, w13, s13, w2, s2, tw, ids, b13, b2 = make_problem(10, T, H, I, E, k, bias=True, ids=ids)
    ref = reference(x, w13, s13, w2, s2, tw, ids, "silu", {}, b13, b2)
    cfg = triton_moe.MoEConfig(block_t=16, block_n1=64, block_n2=64, block_k=64, split_k1=2, split_k2=1,
                               rows2=rows2, rows_first1=1, rows_first2=1, num_stages2=stages2)
    out = triton_moe.fused_moe_triton(x, *_hopper(w13, s13, w2, s2), tw, ids, activation="silu",
                                      activation_params={}, w13_bias=b13, w2_bias=b2, config=cfg,
                                      layout=HOP)
    assert torch.all(out[2] == 0)
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("split", [1, 2], ids=["one-split", "split-k"])
def test_hopper_small_tiles_for_partly_filled_blocks(split):
    # tail_t: a block of at most tail_t pairs runs both GEMMs on [rows, tail_t] tiles. Expert 0 has
    # 40 pairs (a full 32-pair block, then a block of 8: small tiles), expert 1 20 (more than
    # tail_t: full tiles), expert 2 5 (small tiles), expert 3 none; bias on both GEMMs.
    T, k, E, H, I = 40, 2, 4, 320, 128
    ids = torch.full((T, k), -1, dtype=torch.int64)
    ids[:, 0] = 0
    ids[:20, 1] = 1
    ids[20:25, 1] = 2
    x, w13, s13, w2, s2, tw, ids, b13, b2 = make_problem(11, T, H, I, E, k, bias=True, ids=ids)
    ref = reference(x, w13, s13, w2, s2, tw, ids, "silu", {}, b13, b2)
    cfg = triton_moe.MoEConfig(block_t=32, block_n1=64, block_n2=64, block_k=64, split_k1=split, split_k2=split,
                               tail_t=16, rows_first1=1, rows_first2=1)
    out = triton_moe.fused_moe_triton(x, *_hopper(w13, s13, w2, s2), tw, ids, activation="silu",
                                      activation_params={}, w13_bias=b13, w2_bias=b2, config=cfg,
                                      layout=HOP)
    assert rel_err(out, ref) < 1e-5
    for bad in (8, 24, 32):
        with pytest.raises(RuntimeInputError, match="tail_t"):
            triton_moe.fused_moe_triton(x, *_hopper(w13, s13, w2, s2), tw, ids, activation="silu",
                                        activation_params={}, config=dataclasses.replace(cfg, tail_t=bad),
                                        layout=HOP)


@pytest.mark.parametrize("absorb,absorb2,split", [(16, 16, 1), (16, 0, 2), (0, 16, 1)],
                         ids=["both", "gemm1-split-k", "gemm2"])
def test_hopper_last_small_block_in_the_program_before(absorb, absorb2, split):
    # absorb: an expert's last block of at most tail_t pairs runs as a second tile in the program of
    # the expert's block before it. 32-pair blocks, tail_t 16. Expert 1 has 70 pairs (two full blocks,
    # then 6: the second full block takes them, the first does not), expert 0 40 (full, then 8),
    # expert 4 48 (full, then exactly 16), expert 5 50 (full, then 18: a block of its own), expert 2
    # 20 and expert 3 5 (one block each, nothing before them of their expert); skipped slots too.
    T, k, E, H, I = 70, 4, 6, 320, 128
    ids = torch.full((T, k), -1, dtype=torch.int64)
    ids[:, 0] = 1
    ids[:40, 1] = 0
    ids[40:60, 1] = 2
    ids[60:65, 1] = 3
    ids[:48, 2] = 4
    ids[:50, 3] = 5
    x, w13, s13, w2, s2, tw, ids, b13, b2 = make_problem(13, T, H, I, E, k, bias=True, ids=ids)
    ref = reference(x, w13, s13, w2, s2, tw, ids, "silu", {}, b13, b2)
    cfg = triton_moe.MoEConfig(block_t=32, block_n1=64, block_n2=64, block_k=64, split_k1=split, split_k2=1,
                               tail_t=16, absorb=absorb, absorb2=absorb2)
    hop = _hopper(w13, s13, w2, s2)
    out = triton_moe.fused_moe_triton(x, *hop, tw, ids, activation="silu", activation_params={}, w13_bias=b13,
                                      w2_bias=b2, config=cfg, layout=HOP)
    apart = triton_moe.fused_moe_triton(x, *hop, tw, ids, activation="silu", activation_params={}, w13_bias=b13,
                                        w2_bias=b2, config=dataclasses.replace(cfg, absorb=0, absorb2=0), layout=HOP)
    assert torch.all(out[65:] == apart[65:]) and not torch.all(out == 0)
    assert rel_err(out, ref) < 1e-5 and rel_err(out, apart) < 1e-6
    for bad in ({"absorb": 8}, {"absorb": 24}, {"absorb2": 32}):
        with pytest.raises(RuntimeInputError, match="absorb"):
            triton_moe.fused_moe_triton(x, *hop, tw, ids, activation="silu", activation_params={},
                                        config=dataclasses.replace(cfg, **bad), layout=HOP)


def _pick(T, shape):
    """select_config's choice for T tokens on a layer (H, I, E, k) in hopper_mma_rot."""
    H, I, E, k = shape
    return triton_moe.select_config(T * k, E, H, I, HOP)


def test_absorb_where_measured():
    # past 96 pairs an expert (32-pair last-block tiles) GEMM1 absorbs up to 32 pairs, GEMM2 up to 16 where its rows
    # are short; below, off (the measured points, benchmarks/results/performance-notebook.md)
    assert [(_pick(T, DSV3).absorb, _pick(T, DSV3).absorb2) for T in (2048, 3072, 3584, 4096, 8192)] == [
        (0, 0), (0, 0), (32, 0), (32, 0), (32, 0)]
    assert [(_pick(T, K3).absorb, _pick(T, K3).absorb2) for T in (1024, 4096, 6144, 8192)] == [
        (0, 0), (0, 0), (32, 16), (32, 16)]
    for T, shape in ((4096, DSV3), (8192, K3)):  # the widths fit the tails they absorb into
        cfg = _pick(T, shape)
        assert cfg.absorb <= cfg.tail_t and cfg.absorb2 <= cfg.tail_t


def test_quarter_tiles_where_measured():
    # dual 2 (64 + 16 tiles) on the 64-pair tails of 128-pair prefill blocks, where it was timed faster; never on a
    # smaller tail, which it refuses (benchmarks/results/performance-notebook.md)
    assert [_pick(T, DSV3).dual for T in (1024, 1536, 1792, 2048, 3072, 4096)] == [1, 1, 2, 2, 2, 0]
    assert [_pick(T, K3).dual for T in (1024, 2048, 3072, 4096, 6144)] == [0, 1, 2, 2, 0]
    for T in (16, 64, 256, 512, 1024, 1536, 2048, 3072, 4096, 8192):
        for shape in (DSV3, K3):
            cfg = _pick(T, shape)
            assert cfg.dual != 2 or cfg.tail_t >= 64


def test_gluon_two_tiles_where_measured():
    # GEMM1 in gluon_wgmma's ring with 32 + 8 and 32 + 16 tiles (wgmma_dual 2) on DSV3-like 64-pair blocks from 32
    # pairs an expert, where an H100 timed it faster; not at T = 896 (within the spread) nor on K3-like 64-pair blocks
    # (short GEMM2 rows: slower). GEMM2 stays in moe_hgemm2_kernel (benchmarks/results/performance-notebook.md)
    cfgs = [_pick(T, DSV3) for T in (768, 896, 1024, 1280, 1536, 1792)]
    assert [c.wgmma_dual for c in cfgs] == [0, 0, 2, 2, 2, 0]
    assert all((c.wgmma1, c.wgmma1_stages, c.block_t, c.tail_t) == (1, 2, 64, 32) for c in cfgs[2:5])
    assert [_pick(T, K3).wgmma_dual for T in (512, 1024, 1536, 2048)] == [0, 0, 0, 0]


def test_hopper_two_tiles_for_blocks_up_to_one_and_a_half_tails():
    # dual: a block of more than tail_t but at most 1.5 tail_t pairs runs [rows, tail_t] and
    # [rows, tail_t / 2] tiles on the same decoded weights. 64-pair blocks, tail_t 32: expert 0 has
    # 70 pairs (a full block, then 6: small tiles), expert 1 40 (two tiles), expert 2 20 (small
    # tiles), expert 3 50 (more than 48: full tiles); K split and bias on both GEMMs.
    T, k, E, H, I = 70, 3, 4, 320, 128
    ids = torch.full((T, k), -1, dtype=torch.int64)
    ids[:, 0] = 0
    ids[:40, 1] = 1
    ids[40:60, 1] = 2
    ids[:50, 2] = 3
    x, w13, s13, w2, s2, tw, ids, b13, b2 = make_problem(12, T, H, I, E, k, bias=True, ids=ids)
    ref = reference(x, w13, s13, w2, s2, tw, ids, "silu", {}, b13, b2)
    cfg = triton_moe.MoEConfig(block_t=64, block_n1=64, block_n2=64, block_k=64, split_k1=2, split_k2=1,
                               tail_t=32, dual=1)
    out = triton_moe.fused_moe_triton(x, *_hopper(w13, s13, w2, s2), tw, ids, activation="silu",
                                      activation_params={}, w13_bias=b13, w2_bias=b2, config=cfg,
                                      layout=HOP)
    assert rel_err(out, ref) < 1e-5
    with pytest.raises(RuntimeInputError, match="dual needs tail_t "):
        triton_moe.fused_moe_triton(x, *_hopper(w13, s13, w2, s2), tw, ids, activation="silu",
                                    activation_params={}, config=dataclasses.replace(cfg, block_t=32, tail_t=16),
                                    layout=HOP)


def test_hopper_two_tiles_in_quarter_steps():
    # dual 2: also [rows, tail_t] and [rows, tail_t / 4] tiles up to 1.25 tail_t pairs. 128-pair blocks, tail_t 64, an
    # expert in each of the block's cases: 40 (a 64-pair tile), 65 and 73 (64 + 16), 80 (64 + 16, full), 81 and 90
    # (64 + 32), 110 (128), 140 (128, then 12); K split and bias on both GEMMs. Less than 64 is refused.
    counts = [40, 65, 73, 80, 81, 90, 110, 140]
    T, k, E, H, I = 140, len(counts), len(counts), 320, 128
    ids = torch.full((T, k), -1, dtype=torch.int64)
    for e, c in enumerate(counts):
        ids[T - c:, e] = e
    x, w13, s13, w2, s2, tw, ids, b13, b2 = make_problem(13, T, H, I, E, k, bias=True, ids=ids)
    ref = reference(x, w13, s13, w2, s2, tw, ids, "silu", {}, b13, b2)
    cfg = triton_moe.MoEConfig(block_t=128, block_n1=64, block_n2=64, block_k=64, split_k1=2, split_k2=1,
                               tail_t=64, dual=1)
    run = lambda c: triton_moe.fused_moe_triton(x, *_hopper(w13, s13, w2, s2), tw, ids, activation="silu",  # noqa: E731
                                                activation_params={}, w13_bias=b13, w2_bias=b2, config=c, layout=HOP)
    out = run(dataclasses.replace(cfg, dual=2))
    assert rel_err(out, ref) < 1e-5
    assert rel_err(out, run(cfg)) < 1e-6
    with pytest.raises(RuntimeInputError, match="dual 2 needs tail_t of 64"):
        run(dataclasses.replace(cfg, block_t=64, tail_t=32, dual=2))


def test_gluon_two_tiles_are_checked_before_launch():
    # wgmma_dual (gluon_wgmma's GEMM1 in two tiles a block, second tiles down to 8 pairs) needs a tail that leaves
    # 8-pair second tiles; refused before any launch. Where gluon_wgmma cannot run (this interpreter), the hopper_mma
    # kernels take the block with their own tiles.
    T, k, E, H, I = 48, 2, 4, 256, 128
    ids = torch.stack([torch.arange(T) % 2, 2 + torch.arange(T) % 2], dim=1).to(torch.int64)
    x, w13, s13, w2, s2, tw, ids, _, _ = make_problem(14, T, H, I, E, k, ids=ids)
    ref = reference(x, w13, s13, w2, s2, tw, ids, "silu", {})
    cfg = triton_moe.MoEConfig(block_t=64, block_n1=64, block_n2=64, block_k=64, tail_t=32, dual=1, wgmma1=1,
                               wgmma_dual=2)
    run = lambda c: triton_moe.fused_moe_triton(x, *_hopper(w13, s13, w2, s2), tw, ids, activation="silu",  # noqa: E731
                                                activation_params={}, config=c, layout=HOP)
    assert rel_err(run(cfg), ref) < 1e-5
    with pytest.raises(RuntimeInputError, match="wgmma_dual 2 needs tail_t of 32 or more"):
        run(dataclasses.replace(cfg, block_t=32, tail_t=16, dual=0))
    assert rel_err(run(dataclasses.replace(cfg, block_t=32, tail_t=16, dual=0, wgmma_dual=1)), ref) < 1e-5
