"""The torch reference backend and the activations against independent float64 computations."""

import math

import pytest
import torch

from mxfp4conv.errors import Mxfp4convError, RuntimeInputError
from mxfp4conv.runtime import fused_moe
from mxfp4conv.runtime.activations import resolve_activation
from runtime_fixtures import dequant64, expert64, global_experts, make_experts, moe64, mxfp4_qdq64, rel_err


# ---- activations ---------------------------------------------------------------------------
def _sig(v):
    return 1.0 / (1.0 + math.exp(-v))


def _situ(g, u, b, lb):
    up = lb * math.tanh(u / lb) if lb is not None and lb > 0 else u
    return b * math.tanh(g / b) * _sig(g) * up


def _silu(g, u, lim):
    if lim is not None:
        g, u = min(g, lim), max(-lim, min(u, lim))
    return g * _sig(g) * u


def _oai(g, u, a, lim):
    g, u = min(g, lim), max(-lim, min(u, lim))
    return (u + 1.0) * g * _sig(a * g)


GRID = [-40.0, -9.5, -3.0, -0.7, 0.0, 0.3, 2.0, 6.9, 7.1, 12.0, 55.0]
CASES = [
    ("situ", {"beta": 4.0, "linear_beta": 25.0}, lambda g, u: _situ(g, u, 4.0, 25.0)),
    ("situ", {"beta": 2.0}, lambda g, u: _situ(g, u, 2.0, None)),
    ("situ", {"beta": 1.0, "linear_beta": -1.0}, lambda g, u: _situ(g, u, 1.0, -1.0)),
    ("silu", {}, lambda g, u: _silu(g, u, None)),
    ("silu", {"swiglu_limit": 10.0}, lambda g, u: _silu(g, u, 10.0)),
    ("swigluoai", {"alpha": 1.702, "limit": 7.0}, lambda g, u: _oai(g, u, 1.702, 7.0)),
    ("swigluoai", {}, lambda g, u: _oai(g, u, 1.702, 7.0)),
]


@pytest.mark.parametrize("name,params,formula", CASES)
def test_activation_matches_scalar_formula(name, params, formula):
    g = torch.tensor([[a for a in GRID for _ in GRID]], dtype=torch.float64)
    u = torch.tensor([[b for _ in GRID for b in GRID]], dtype=torch.float64)
    got = resolve_activation(name, params)(g, u)
    want = torch.tensor([[formula(a, b) for a in GRID for b in GRID]], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_activation_clamps_matter():
    g = torch.tensor([20.0], dtype=torch.float64)
    u = torch.tensor([30.0], dtype=torch.float64)
    clamped = resolve_activation("silu", {"swiglu_limit": 10.0})(g, u)
    plain = resolve_activation("silu", {})(g, u)
    assert float(clamped) == pytest.approx(10.0 * _sig(10.0) * 10.0) and float(plain) > 500
    situ = resolve_activation("situ", {"beta": 4.0, "linear_beta": 25.0})(torch.tensor([1e4]), torch.tensor([1e4]))
    assert float(situ) <= 100.0  # |out| < beta * linear_beta (fp32 rounds to the bound)


def test_unknown_activation_is_refused():
    with pytest.raises(RuntimeInputError, match="gelu"):
        resolve_activation("gelu", {})


# ---- the torch reference against float64 from the global experts ---------------------------
ACTS = [
    ("situ", {"beta": 4.0, "linear_beta": 25.0}, False),
    ("silu", {"swiglu_limit": 10.0}, False),
    ("silu", {}, False),
    ("swigluoai", {"alpha": 1.702, "limit": 7.0}, True),
]


def _routing(T, k, E, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    w = torch.softmax(torch.randn(T, k, generator=g), dim=-1)
    return w, ids


@pytest.mark.parametrize("name,params,bias", ACTS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 1e-2)])
def test_reference_matches_float64_with_padding(name, params, bias, dtype, tol):
    d = global_experts(1, E=6, H=64, I=64, bias=bias)
    ex = make_experts(d, H_pad=128, I_pad=96, activation=name, params=params)
    x = (torch.randn(7, 64, generator=torch.Generator().manual_seed(2)) * 0.5).to(dtype)
    w, ids = _routing(7, 3, 6, 3)
    got = fused_moe(x, ex, w, ids, backend="torch")
    assert got.dtype == dtype and got.shape == (7, 64)
    want = moe64(x, w, ids, expert64(d, name, params))
    assert rel_err(got, want) < tol


@pytest.mark.parametrize("tp,ep", [(2, False), (4, False), (2, True), (3, True)])
def test_ranks_sum_to_the_whole(tp, ep):
    d = global_experts(4, E=6, H=64, I=128, bias=True)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(5))
    w, ids = _routing(5, 2, 6, 6)
    total = sum(
        fused_moe(x, make_experts(d, tp=tp, ep=ep, rank=r, H_pad=96, I_pad=(128 if ep else 128 // tp) + 32,
                                  activation="swigluoai"), w, ids, backend="torch").double()
        for r in range(tp)
    )
    want = moe64(x, w, ids, expert64(d, "swigluoai", {}))
    assert rel_err(total, want) < 2e-5


def test_ragged_routing_and_topk_above_tokens():
    d = global_experts(7, E=8, H=64, I=32)
    ex = make_experts(d, activation="silu")
    # expert 0: many tokens, expert 5: exactly one, experts 6/7: none; k=5 > T=3 tokens
    ids = torch.tensor([[0, 1, 2, 3, 4], [0, 2, 3, 4, 1], [0, 5, 1, 2, 3]])
    w = torch.rand(3, 5, generator=torch.Generator().manual_seed(8))
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(9))
    got = fused_moe(x, ex, w, ids, backend="torch")
    assert rel_err(got, moe64(x, w, ids, expert64(d, "silu", {}))) < 2e-5
    # a single token and a single expert
    got1 = fused_moe(x[:1], ex, w[:1, :1], ids[:1, :1], backend="torch")
    assert rel_err(got1, moe64(x[:1], w[:1, :1], ids[:1, :1], expert64(d, "silu", {}))) < 2e-5


def test_zero_tokens():
    ex = make_experts(global_experts(1, E=4, H=32, I=32))
    out = fused_moe(torch.zeros(0, 32), ex, torch.zeros(0, 2), torch.zeros(0, 2, dtype=torch.int64), backend="torch")
    assert out.shape == (0, 32)


def test_poisoned_output_is_fully_written():
    d = global_experts(3, E=4, H=64, I=64)
    ex = make_experts(d, tp=2, ep=True, rank=1, activation="silu")  # owns experts 2, 3
    ids = torch.tensor([[0, 1], [2, 0], [3, 2], [1, 0]])  # tokens 0 and 3 touch no local expert
    w = torch.full((4, 2), 0.5)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    for dtype in (torch.float32, torch.bfloat16):
        out = torch.full((4, 64), float("nan"), dtype=dtype)
        res = fused_moe(x.to(dtype), ex, w, ids, backend="torch", out=out)
        assert res is out and bool(torch.isfinite(out).all())
        assert bool((out[0] == 0).all()) and bool((out[3] == 0).all())
        assert bool((out[1] != 0).any()) and bool((out[2] != 0).any())


# ---- activation quantisation ----------------------------------------------------------------
def test_mxfp4_activation_quant_matches_float64():
    d = global_experts(11, E=4, H=64, I=64)
    ex = make_experts(d, activation="silu", act_quant="mxfp4")
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(12))
    w, ids = _routing(6, 2, 4, 13)
    got = fused_moe(x, ex, w, ids, backend="torch")  # auto -> the target's mxfp4
    want = moe64(x, w, ids, expert64(d, "silu", {}, act_q=lambda v, _: mxfp4_qdq64(v)))
    plain = moe64(x, w, ids, expert64(d, "silu", {}))
    assert rel_err(got, want) < 1e-5
    assert rel_err(want, plain) > 1e-3  # the quantisation is visible at this tolerance
    none = fused_moe(x, ex, w, ids, backend="torch", act_quant="none")
    assert rel_err(none, plain) < 1e-5


def test_fp8_static_activation_quant_matches_float64():
    d = global_experts(21, E=4, H=64, I=64, input_scales=True)
    ex = make_experts(d, activation="silu", act_quant="fp8")
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(22))
    w, ids = _routing(6, 2, 4, 23)
    scale = {"w13": float(d["is13"].max()), "w2": float(d["is2"].max())}

    def q(v, which):
        s = scale[which]
        return (v / s).clamp(-448, 448).to(torch.float8_e4m3fn).double() * s

    got = fused_moe(x, ex, w, ids, backend="torch")
    want = moe64(x, w, ids, expert64(d, "silu", {}, act_q=q))
    assert rel_err(got, want) < 1e-5
    assert rel_err(want, moe64(x, w, ids, expert64(d, "silu", {}))) > 1e-3


def test_dequant_of_padding_is_zero_for_both_pad_bytes():
    d = global_experts(5, E=2, H=64, I=32)
    for pad in (0x00, 0x01):
        ex = make_experts(d, H_pad=128, I_pad=64, scale_pad=pad)
        full = dequant64(ex.w13_weight[0], ex.w13_weight_scale[0])
        assert bool((full[32:64] == 0).all()) and bool((full[:, 64:] == 0).all())


# ---- bad input ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small():
    d = global_experts(31, E=4, H=64, I=32)
    return make_experts(d, H_pad=96), torch.randn(3, 64), torch.full((3, 2), 0.5), torch.tensor([[0, 1], [2, 3], [1, 2]])


@pytest.mark.parametrize("mutate,match", [
    (lambda x, w, i: (torch.randn(3, 48), w, i), "hidden size 48.*expects 64"),
    (lambda x, w, i: (torch.randn(3, 96), w, i), "padded width"),
    (lambda x, w, i: (x, w, torch.tensor([[0, 1], [2, 4], [1, 2]])), "expert id 4, outside \\[0, 4\\)"),
    (lambda x, w, i: (x, w, torch.tensor([[0, -1], [2, 3], [1, 2]])), "expert id -1"),
    (lambda x, w, i: (x, w, i.float()), "integer tensor"),
    (lambda x, w, i: (x.to(torch.int32), w, i), "bf16/fp16/fp32"),
    (lambda x, w, i: (x, w[:, :1], i), "shape of topk_ids"),
    (lambda x, w, i: (x, w, i[:2]), "tokens=3"),
    (lambda x, w, i: (x[0], w, i), "2-D"),
    (lambda x, w, i: (x.to("meta"), w, i), "is on meta"),
])
def test_bad_inputs_are_refused(small, mutate, match):
    ex, x, w, ids = small
    x2, w2, i2 = mutate(x, w, ids)
    with pytest.raises(RuntimeInputError, match=match):
        fused_moe(x2, ex, w2, i2, backend="torch")


def test_bad_backend_and_act_quant(small):
    ex, x, w, ids = small
    with pytest.raises(RuntimeInputError, match="backend='cuda'"):
        fused_moe(x, ex, w, ids, backend="cuda")
    with pytest.raises(RuntimeInputError, match="act_quant='int8'"):
        fused_moe(x, ex, w, ids, act_quant="int8")
    with pytest.raises(Mxfp4convError, match="MoEExperts"):
        fused_moe(x, {"w13": 1}, w, ids)
    with pytest.raises(RuntimeInputError, match="out must be"):
        fused_moe(x, ex, w, ids, out=torch.empty(3, 96))


def test_nan_scale_in_a_touched_expert_is_an_error():
    d = global_experts(41, E=4, H=64, I=32)
    ex = make_experts(d)
    ex.w2_weight_scale[2, 5, 0] = 0xFF
    x, w = torch.randn(2, 64), torch.full((2, 2), 0.5)
    ok = fused_moe(x, ex, w, torch.tensor([[0, 1], [3, 1]]), backend="torch")  # expert 2 untouched
    assert bool(torch.isfinite(ok).all())
    with pytest.raises(Mxfp4convError, match="w2 scale of local expert 2.*0xFF"):
        fused_moe(x, ex, w, torch.tensor([[0, 2], [3, 1]]), backend="torch")
