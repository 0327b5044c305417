"""The exact argument set the AITER backend would pass to aiter.fused_moe (checked without aiter)."""

import dataclasses
import importlib.util

import pytest
import torch

from mxfp4conv.errors import CheckpointError, RuntimeInputError
from mxfp4conv.runtime import fused_moe
from mxfp4conv.runtime.aiter_backend import aiter_call_args
from runtime_fixtures import global_experts, make_experts

A16W4 = {"w13": "aiter_p16", "w13_scale": "aiter_scale_a16w4", "w2": "aiter_p16", "w2_scale": "aiter_e8m0_shuffle"}
GU16 = {"w13": "aiter_p16_gu16", "w13_scale": "aiter_scale_a16w4_gu16", "w2": "aiter_p16", "w2_scale": "aiter_scale_a16w4"}


def _aiter_experts(layout, gate_mode, *, H=96, H_pad=256, I=128, I_pad=256, tp=1, ep=False, rank=0,
                   activation="situ", params=None, bias=False):
    d = global_experts(3, E=4, H=H, I=I, bias=bias)
    ex = make_experts(d, tp=tp, ep=ep, rank=rank, H_pad=H_pad, I_pad=I_pad, activation=activation,
                      params=params if params is not None else {"beta": 4.0, "linear_beta": 25.0})
    ex = dataclasses.replace(ex, layout=dict(layout), stored_layout=dict(layout), gate_mode=gate_mode,
                             is_shuffled=True, arch="gfx950", backend="AITER_MXFP4_BF16")
    return ex


def _inputs(H=96, T=3):
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    return x, torch.full((T, 2), 0.5, dtype=torch.bfloat16), torch.tensor([[0, 1], [2, 3], [1, 3]][:T])


def test_k3_situ_a16w4_separated():
    ex = _aiter_experts(A16W4, "separated", I=100, I_pad=256)  # I_rank 100 -> pads 156 (no rounding for SiTU)
    x, w, ids = _inputs()
    a = aiter_call_args(ex, x, w, ids)
    assert a["gate_mode"] == "SEPARATED" and a["activation"] == "Situv2" and a["quant_type"] == "per_1x32"
    assert (a["beta"], a["linear_beta"]) == (4.0, 25.0)
    assert (a["hidden_pad"], a["intermediate_pad"]) == (256 - 96, 256 - 100)
    assert a["w1"] is ex.w13_weight and a["w2"] is ex.w2_weight
    assert a["w1_scale"] is ex.w13_weight_scale and a["w2_scale"] is ex.w2_weight_scale
    assert a["hidden_states"].shape == (3, 256) and a["hidden_states"].dtype == torch.bfloat16
    assert torch.equal(a["hidden_states"][:, :96], x) and bool((a["hidden_states"][:, 96:] == 0).all())
    assert a["topk_ids"].dtype == torch.int32 and torch.equal(a["topk_ids"].long(), ids)
    assert a["topk_weight"].dtype == torch.float32 and a["expert_mask"] is None
    assert a["doweight_stage1"] is False and a["dtype"] == torch.bfloat16
    assert a["bias1"] is None and a["bias2"] is None


def test_situ_without_linear_beta_passes_minus_one():
    ex = _aiter_experts(A16W4, "separated", params={"beta": 2.0})
    a = aiter_call_args(ex, *_inputs())
    assert (a["beta"], a["linear_beta"]) == (2.0, -1.0)


@pytest.mark.parametrize("tp,want_inter_pad", [(1, 128), (2, 64)])
def test_dsv4_silu_interleave_pads_rounded_down(tp, want_inter_pad):
    # H 96 -> 256 (pad 160 -> 128); I_rank 128/tp with I_pad = I_rank + 100 (-> 64, x2 when tp == 1)
    i_rank = 128 // tp
    ex = _aiter_experts(GU16, "interleave", tp=tp, I=128, I_pad=i_rank + 100 - (i_rank + 100) % 32,
                        activation="silu", params={"swiglu_limit": 10.0})
    a = aiter_call_args(ex, *_inputs())
    raw = ex.intermediate_per_rank_padded - ex.intermediate_per_rank
    assert a["gate_mode"] == "INTERLEAVE" and a["activation"] == "Silu"
    assert "beta" not in a and "linear_beta" not in a
    assert a["hidden_pad"] == 128
    assert a["intermediate_pad"] == raw // 64 * 64 * (2 if tp == 1 else 1) == want_inter_pad


def test_gpt_oss_swiglu_with_biases():
    ex = _aiter_experts(GU16, "interleave", activation="swigluoai", params={"alpha": 1.702, "limit": 7.0}, bias=True)
    a = aiter_call_args(ex, *_inputs())
    assert a["activation"] == "Swiglu" and a["gate_mode"] == "INTERLEAVE"
    assert a["bias1"] is ex.w13_bias and a["bias2"] is ex.w2_bias


def test_expert_parallel_mask():
    ex = _aiter_experts(A16W4, "separated", tp=2, ep=True, rank=1)
    a = aiter_call_args(ex, *_inputs())
    assert a["expert_mask"].dtype == torch.int32 and a["expert_mask"].tolist() == [0, 0, 1, 1]
    assert torch.equal(a["topk_ids"].long(), _inputs()[2])  # AITER takes global ids plus the mask
    # not tensor-split under EP: the x2 intermediate rounding applies for non-SiTU
    ex2 = dataclasses.replace(ex, activation="silu", activation_params={})
    raw = ex2.intermediate_per_rank_padded - ex2.intermediate_per_rank
    assert aiter_call_args(ex2, *_inputs())["intermediate_pad"] == raw // 64 * 64 * 2


def test_gate_mode_disagreeing_with_layout_is_refused():
    ex = _aiter_experts(GU16, "separated")
    with pytest.raises(CheckpointError, match="gate_mode 'separated'.*INTERLEAVE"):
        aiter_call_args(ex, *_inputs())


def test_non_aiter_layout_and_fp32_are_refused():
    ex = _aiter_experts(A16W4, "separated")
    with pytest.raises(RuntimeInputError, match="bf16 or fp16"):
        aiter_call_args(ex, _inputs()[0].float(), *_inputs()[1:])
    ident = dataclasses.replace(ex, layout={k: "identity" for k in A16W4},
                                stored_layout={k: "identity" for k in A16W4})
    with pytest.raises(RuntimeInputError, match="not an AITER weight layout"):
        aiter_call_args(ident, *_inputs())


@pytest.mark.skipif(importlib.util.find_spec("aiter") is not None, reason="aiter is installed here")
def test_aiter_backend_without_aiter_says_so():
    ex = _aiter_experts(A16W4, "separated")
    with pytest.raises(RuntimeInputError, match="needs the aiter package"):
        fused_moe(*_inputs()[:1], ex, *_inputs()[1:], backend="aiter")


def _on(ex, version):
    return dataclasses.replace(ex, manifest={**ex.manifest, "vllm": version})


@pytest.mark.parametrize("tp", [1, 2])
def test_pads_follow_the_manifests_release(tp):
    """vLLM 0.34's aiter_moe_pads no longer doubles the W4A16 intermediate pad at tp 1 (AITER
    doubles it), and declares none for a bias-less W4A16 layer; 0.33 doubles it at tp 1."""
    i_rank = 128 // tp
    silu = _aiter_experts(GU16, "interleave", tp=tp, I=128, I_pad=i_rank + 100 - (i_rank + 100) % 32,
                          activation="silu", params={"swiglu_limit": 10.0})
    raw = silu.intermediate_per_rank_padded - silu.intermediate_per_rank
    assert raw // 64 * 64 > 0
    assert aiter_call_args(_on(silu, "0.33.0"), *_inputs())["intermediate_pad"] == raw // 64 * 64 * (2 if tp == 1 else 1)
    a34 = aiter_call_args(_on(silu, "0.34.0"), *_inputs())
    assert a34["intermediate_pad"] == 0 and a34["hidden_pad"] == 128  # bias-less W4A16
    oss = _aiter_experts(GU16, "interleave", tp=tp, I=128, I_pad=i_rank + 100 - (i_rank + 100) % 32,
                         activation="swigluoai", params={"alpha": 1.702, "limit": 7.0}, bias=True)
    assert aiter_call_args(_on(oss, "0.34.0"), *_inputs())["intermediate_pad"] == raw // 64 * 64
    assert aiter_call_args(_on(oss, "0.33.0"), *_inputs())["intermediate_pad"] == raw // 64 * 64 * (2 if tp == 1 else 1)
    # SiTU passes its pads through on both
    situ = _aiter_experts(A16W4, "separated", tp=tp, I=100, I_pad=256)
    assert (aiter_call_args(_on(situ, "0.34.0"), *_inputs())["intermediate_pad"]
            == aiter_call_args(_on(situ, "0.33.0"), *_inputs())["intermediate_pad"] == 256 - situ.intermediate_per_rank)


def test_w4a4_silu_pad_is_not_doubled():
    """AITER doubles the W4A4 SiLU intermediate pad itself (vLLM 0.33 and 0.34 pass it undoubled)."""
    ex = _aiter_experts(A16W4, "separated", tp=1, I=128, I_pad=256, activation="silu", params={})
    ex = dataclasses.replace(ex, backend="AITER_MXFP4_MXFP4")
    for version in ("0.33.0", "0.34.0"):
        assert aiter_call_args(_on(ex, version), *_inputs())["intermediate_pad"] == 128
