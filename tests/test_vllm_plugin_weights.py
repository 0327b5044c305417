"""The plugin's tensor forms without vLLM: gpt-oss row interleave, and identity bytes put into a
layer when vLLM converts itself (any stored layout undone first)."""

from __future__ import annotations

import types
import warnings

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint_fixtures import synth  # noqa: F401 (fixture)
from mxfp4conv.convert import convert
from mxfp4conv.integrations.vllm.checks import LayerPlan
from mxfp4conv.integrations.vllm.layer import install
from mxfp4conv.integrations.vllm.rank_tensors import canonical_shapes, read_layer
from mxfp4conv.integrations.vllm.weights import interleave_gate_up, loaded_form
from mxfp4conv.oracle import Target
from mxfp4conv.runtime import load_moe_layers
from mxfp4conv.runtime.loader import _weight_map, read_manifest


@settings(max_examples=30, deadline=None)
@given(e=st.integers(1, 3), i=st.integers(1, 6), k=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_interleave_is_undone_by_vllms_gpt_oss_deinterleave(e, i, k, seed):
    t = torch.randint(0, 256, (e, 2 * i, k), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    w = interleave_gate_up(t)
    assert torch.equal(w[:, 0::2], t[:, :i]) and torch.equal(w[:, 1::2], t[:, i:])
    # vLLM's AITER_MXFP4_BF16 converter for GptOssMxfp4MoEMethod, written out
    back = w.view(e, i, 2, k).permute(0, 2, 1, 3).contiguous().view(e, 2 * i, k)
    assert torch.equal(back, t)


class FakeMethod:  # stands for vLLM's method class by name
    pass


def fake_layer(manifest, method: str):
    shapes = canonical_shapes(manifest)
    layer = torch.nn.Module()
    for kind, name in (("w13", "w13_weight"), ("w13_scale", "w13_weight_scale"), ("w2", "w2_weight"),
                       ("w2_scale", "w2_weight_scale")):
        layer.register_parameter(name, torch.nn.Parameter(torch.zeros(shapes[kind], dtype=torch.uint8), requires_grad=False))
    if manifest["moe"]["has_bias"]:
        for kind, name in (("w13_bias", "w13_bias"), ("w2_bias", "w2_bias")):
            layer.register_parameter(name, torch.nn.Parameter(torch.zeros(shapes[kind], dtype=torch.bfloat16), requires_grad=False))
    layer.quant_method = type(method, (FakeMethod,), {})()
    layer.activation = types.SimpleNamespace(value=manifest["target"]["activation"])
    return layer


def test_aiter_layouts_are_undone_for_vllms_own_conversion(synth, tmp_path):  # noqa: F811
    out = tmp_path / "gpt-oss-gfx950"
    convert(synth("gpt_oss"), out, Target("gfx950", tp=2), force=True, progress="off")
    m = read_manifest(out)
    assert m["layout"]["w13"].startswith("aiter_")
    prefix = m["moe"]["layers"][0]
    stored = read_layer(out, _weight_map(out), m, prefix, 1)
    layer = fake_layer(m, "GptOssMxfp4MoEMethod")
    install(layer, LayerPlan(prefix, "vllm_transforms", 1), stored, m, str(out))
    # independent: the runtime loader's own inversion to the canonical layout
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the loader says it converts the layout
        canon = load_moe_layers(out, rank=1, backend="torch")[prefix]
    assert torch.equal(layer.w13_weight.data, interleave_gate_up(canon.w13_weight))
    assert torch.equal(layer.w13_weight_scale.data, interleave_gate_up(canon.w13_weight_scale))
    assert torch.equal(layer.w2_weight.data, canon.w2_weight)
    assert torch.equal(layer.w2_weight_scale.data, canon.w2_weight_scale)
    assert torch.equal(layer.w13_bias.data.float(), interleave_gate_up(canon.w13_bias.unsqueeze(-1)).squeeze(-1))
    assert layer.w13_weight.any() and not hasattr(layer.w13_weight, "is_shuffled")


def test_other_methods_keep_gate_up_rows():
    t = {"w13": torch.arange(8, dtype=torch.uint8).view(1, 4, 2), "w2": torch.zeros(1, 2, 2, dtype=torch.uint8)}
    assert torch.equal(loaded_form("Mxfp4MoEMethod", t)["w13_weight"], t["w13"])
    assert torch.equal(loaded_form("QuarkOCP_MX_MoEMethod", t)["w13_weight"], t["w13"])
    assert not torch.equal(loaded_form("GptOssMxfp4MoEMethod", t)["w13_weight"], t["w13"])
