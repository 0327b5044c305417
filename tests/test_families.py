"""Family detection, the canonical MoE description, and per-expert byte reads."""

import json

import pytest
import torch
from safetensors import safe_open

from checkpoint_fixtures import CASES, copy_of, synth  # noqa: F401
from mxfp4conv.checkpoint import load_model, open_source
from mxfp4conv.checkpoint.experts import read_expert
from mxfp4conv.checkpoint.synthetic import make_checkpoint
from mxfp4conv.codec import dequantize_mxfp4
from mxfp4conv.errors import CheckpointError

EXPECT = {
    "kimi_k3": dict(moe_method="mxfp4", activation=("situ", {"beta": 4.0, "linear_beta": 25.0}),
                    routing="DeepSeekV3", variants={"weight": "U8", "scale": "U8"},
                    layers=["language_model.model.layers.1.block_sparse_moe",
                            "language_model.model.layers.2.block_sparse_moe"]),
    "deepseek_v4": dict(moe_method="mxfp4", activation=("silu", {"swiglu_limit": 10.0}),
                        routing="DeepseekV4", variants={"weight": "I8", "scale": "F8_E8M0"},
                        layers=["layers.0.ffn", "layers.1.ffn", "mtp.0.ffn"]),
    "quark": dict(moe_method="quark", activation=("silu", {}), routing="DeepSeekV3",
                  variants={"weight": "U8", "scale": "U8"},
                  layers=["model.layers.1.mlp", "model.layers.2.mlp"]),
    "gpt_oss": dict(moe_method="gpt_oss_mxfp4", activation=("swigluoai", {"alpha": 1.702, "limit": 7.0}),
                    routing="Renormalize", variants={"weight": "U8", "scale": "U8"},
                    layers=["model.layers.0.mlp", "model.layers.1.mlp"]),
}


@pytest.mark.parametrize("family, scheme", CASES)
def test_canonical_description(synth, family, scheme):
    m = load_model(open_source(synth(family, scheme)))
    want = EXPECT[family]
    assert m.family == family and m.quant_scheme == (scheme or "w_mxfp4")
    assert m.moe_method == want["moe_method"] and m.routing == want["routing"]
    assert (m.activation.name, m.activation.params) == want["activation"]
    assert [layer.prefix for layer in m.layers] == want["layers"]
    assert (m.geometry.hidden, m.geometry.intermediate, m.geometry.num_experts, m.geometry.top_k) == (256, 256, 8, 2)
    assert m.dtype_variants == want["variants"]
    assert m.has_bias == (family == "gpt_oss")
    assert m.static_input_scales == (scheme == "w_mxfp4_a_fp8")
    if family == "kimi_k3":
        assert m.extra["min_moe_intermediate_per_partition"] == 256
        assert m.extra["first_k_dense_replace"] == 1 and m.extra["model_hidden"] == 512
    if family == "deepseek_v4":
        assert m.extra["mtp_layers"] == ["mtp.0.ffn"]
    if m.layers[0].experts:
        assert len(m.layers[0].experts) == 8
        ex = m.layers[0].experts[5]
        assert ex.gate.name.endswith(".5.w1.weight_packed" if family == "kimi_k3" else
                                     ".5.w1.weight" if family == "deepseek_v4" else ".5.gate_proj.weight")
        assert (ex.gate_input_scale is not None) == (scheme == "w_mxfp4_a_fp8")


def _get(root, name):
    idx = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(root / idx[name], "pt") as f:
        return f.get_tensor(name)


def _u8(t):
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("family, scheme", [c for c in CASES if c[0] != "gpt_oss"])
def test_read_expert_per_expert_formats(synth, family, scheme):
    root = synth(family, scheme)
    src = open_source(root)
    m = load_model(src)
    layer = m.layers[-1]
    ex = layer.experts[6]
    got = read_expert(src, layer, 6)
    assert torch.equal(got.w13, torch.cat([_u8(_get(root, ex.gate.name)), _u8(_get(root, ex.up.name))]))
    assert torch.equal(got.w13_scale, torch.cat([_u8(_get(root, ex.gate_scale.name)),
                                                 _u8(_get(root, ex.up_scale.name))]))
    assert torch.equal(got.w2, _u8(_get(root, ex.down.name)))
    assert torch.equal(got.w2_scale, _u8(_get(root, ex.down_scale.name)))
    assert got.w13.shape == (512, 128) and got.w13_scale.shape == (512, 8)
    assert got.w2.shape == (256, 128) and got.w2_scale.shape == (256, 8)
    assert got.w13_bias is None and got.w2_bias is None
    if scheme == "w_mxfp4_a_fp8":
        g, u, d = (float(_get(root, r.name)) for r in (ex.gate_input_scale, ex.up_input_scale, ex.down_input_scale))
        assert got.w13_input_scale == max(g, u) and got.w2_input_scale == d
    else:
        assert got.w13_input_scale is None and got.w2_input_scale is None
    # Valid MXFP4 of random normal values: finite, plausible magnitudes, no NaN scales.
    x = dequantize_mxfp4(got.w13, got.w13_scale)
    assert torch.isfinite(x).all() and 0.5 < float(x.std()) < 2.0
    assert int(got.w13_scale.max()) < 0xFF


def test_read_expert_gpt_oss_deinterleaves_one_slice(synth, monkeypatch):
    root = synth("gpt_oss")
    src = open_source(root)
    layer = load_model(src).layers[1]
    blocks = _get(root, layer.fused.gate_up_blocks.name)  # [E, 2I, H/32, 16]
    scales = _get(root, layer.fused.gate_up_scales.name)
    bias = _get(root, layer.fused.gate_up_bias.name)
    reads = []
    real = src.read_range
    monkeypatch.setattr(src, "read_range", lambda s, off, n: reads.append((s, off, n)) or real(s, off, n))
    got = read_expert(src, layer, 3)
    I = 256
    gate_rows = [2 * i for i in range(I)]
    up_rows = [2 * i + 1 for i in range(I)]
    e_blocks = blocks[3].reshape(2 * I, -1)
    assert torch.equal(got.w13[:I], e_blocks[gate_rows]) and torch.equal(got.w13[I:], e_blocks[up_rows])
    assert torch.equal(got.w13_scale[:I], scales[3][gate_rows]) and torch.equal(got.w13_scale[I:], scales[3][up_rows])
    assert torch.equal(got.w13_bias, torch.cat([bias[3][gate_rows], bias[3][up_rows]]).float())
    assert torch.equal(got.w2, _get(root, layer.fused.down_blocks.name)[3].reshape(256, -1))
    assert torch.equal(got.w2_bias, _get(root, layer.fused.down_bias.name)[3].float())
    # One pread per fused tensor, each exactly this expert's share.
    info = src.tensor_info(layer.fused.gate_up_blocks.name)
    assert (info.shard, info.begin + 3 * info.nbytes // 8, info.nbytes // 8) in reads
    assert len(reads) == 6 and sum(n for _, _, n in reads) == sum(
        src.tensor_info(r.name).nbytes // 8 for r in layer.fused.refs())


@pytest.mark.parametrize("family, weight_dtype, scale_dtype", [
    ("kimi_k3", "F4", "F8_E8M0"), ("deepseek_v4", "U8", "U8"), ("quark", "I8", "F8_E8M0"),
    ("gpt_oss", "F4", "F8_E8M0"), ("deepseek_v4", "F4", "I8"),
])
def test_dtype_variants_give_the_same_bytes(synth, family, weight_dtype, scale_dtype):
    base = open_source(synth(family))
    var = open_source(synth(family, weight_dtype=weight_dtype, scale_dtype=scale_dtype))
    mb, mv = load_model(base), load_model(var)
    assert mv.dtype_variants == {"weight": weight_dtype, "scale": scale_dtype}
    for e in (0, 7):
        a, b = read_expert(base, mb.layers[0], e), read_expert(var, mv.layers[0], e)
        for k in ("w13", "w13_scale", "w2", "w2_scale"):
            assert getattr(b, k).dtype == torch.uint8 and torch.equal(getattr(a, k), getattr(b, k)), k


def test_kimi_quant_config_at_top_level(synth):
    m = load_model(open_source(synth("kimi_k3", quant_config_location="top")))
    assert m.family == "kimi_k3" and m.quant_scheme == "w_mxfp4"


def test_geometry_overrides(tmp_path):
    root = make_checkpoint("gpt_oss", tmp_path / "g", hidden=2880, intermediate=384, num_experts=2,
                           top_k=1, num_layers=1, num_shards=3)
    src = open_source(root)
    m = load_model(src)
    assert (m.geometry.hidden, m.geometry.intermediate, m.geometry.num_experts) == (2880, 384, 2)
    assert src.tensor_info("model.layers.0.mlp.experts.gate_up_proj_blocks").shape == (2, 768, 90, 16)
    assert len(src.shards()) == 3
    ex = read_expert(src, m.layers[0], 1)
    assert ex.w13.shape == (768, 1440) and ex.w2_scale.shape == (2880, 12)
    k3 = load_model(open_source(make_checkpoint("kimi_k3", tmp_path / "k", intermediate=384, num_layers=1)))
    assert k3.geometry.intermediate == 384 and len(k3.layers) == 1


def _edit_config(root, fn):
    cfg = json.loads((root / "config.json").read_text())
    fn(cfg)
    (root / "config.json").write_text(json.dumps(cfg))


def test_quark_scheme_names_and_unsupported(synth, tmp_path):
    root = copy_of(synth("quark"), tmp_path / "q")

    def set_input(dtype):
        def fn(cfg):
            spec = dict(cfg["quantization_config"]["global_quant_config"]["weight"], dtype=dtype, is_dynamic=True)
            cfg["quantization_config"]["global_quant_config"]["input_tensors"] = spec
        return fn

    _edit_config(root, set_input("fp6_e3m2"))
    assert load_model(open_source(root)).quant_scheme == "w_mxfp4_a_mxfp6_e3m2"
    _edit_config(root, lambda c: c["quantization_config"]["global_quant_config"]["weight"].update(dtype="fp6_e2m3"))
    with pytest.raises(CheckpointError, match="w_mxfp6_e2m3_a_mxfp6_e3m2"):
        load_model(open_source(root))


def test_quark_layer_config_and_exclude(synth, tmp_path):
    root = copy_of(synth("quark"), tmp_path / "q")
    fp8 = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": True}

    def override(cfg):
        qc = cfg["quantization_config"]
        qc["layer_quant_config"] = {"*mlp.experts*": dict(qc["global_quant_config"], input_tensors=fp8)}
    _edit_config(root, override)
    m = load_model(open_source(root))
    assert m.quant_scheme == "w_mxfp4_a_fp8" and not m.static_input_scales
    _edit_config(root, lambda c: c["quantization_config"]["exclude"].append("re:.*experts.*"))
    with pytest.raises(CheckpointError, match="exclude list leaves the routed experts"):
        load_model(open_source(root))


def test_config_matching_no_family(synth, tmp_path):
    root = copy_of(synth("quark"), tmp_path / "q")
    _edit_config(root, lambda c: c.update(model_type="llama", quantization_config={"quant_method": "awq"}))
    with pytest.raises(CheckpointError) as err:
        load_model(open_source(root))
    assert "'llama'" in str(err.value) and "'awq'" in str(err.value) and "config.json" in str(err.value)


def test_deepseek_v4_fp8_experts_refused(synth, tmp_path):
    root = copy_of(synth("deepseek_v4"), tmp_path / "d")
    _edit_config(root, lambda c: c.update(expert_dtype="fp8"))
    with pytest.raises(CheckpointError, match="expert_dtype 'fp8'"):
        load_model(open_source(root))


def test_wrong_geometry_is_refused(synth, tmp_path):
    root = copy_of(synth("deepseek_v4"), tmp_path / "d")
    _edit_config(root, lambda c: c.update(moe_intermediate_size=512))
    with pytest.raises(CheckpointError, match="wrong shape") as err:
        load_model(open_source(root))
    assert "layers.0.ffn" in str(err.value) and "intermediate=512" in str(err.value)


def test_converted_checkpoint_is_not_a_source(synth, tmp_path):
    root = copy_of(synth("gpt_oss"), tmp_path / "g")
    (root / "mxfp4conv.json").write_text("{}")
    with pytest.raises(CheckpointError, match="converted by mxfp4conv"):
        load_model(open_source(root))


@pytest.mark.parametrize("family, scheme", CASES)
def test_synthetic_matches_the_real_layout(synth, family, scheme):
    root = synth(family, scheme)
    src = open_source(root)
    m = load_model(src)
    assert len(src.shards()) >= 2
    first = m.layers[0].source_tensor_names()
    assert len({src.weight_map[n] for n in first}) >= 2  # one MoE layer straddles two shards
    for shard in src.shards():
        assert src.header(shard).metadata == {"format": "pt"}
    assert {"tokenizer_config.json", "generation_config.json", "config.json"} <= set(src.sidecar_files())
    cfg = src.config
    if family == "kimi_k3":
        assert cfg["model_type"] == "kimi_k3" and cfg["text_config"]["model_type"] == "kimi_linear"
        assert cfg["text_config"]["quantization_config"]["format"] == "mxfp4-pack-quantized"
        assert "language_model.model.layers.0.mlp.gate_proj.weight" in src.weight_map  # dense layer 0
        assert src.tensor_info("language_model.model.layers.1.block_sparse_moe.routed_expert_down_proj.weight").dtype == "BF16"
    elif family == "deepseek_v4":
        assert cfg["expert_dtype"] == "fp4" and cfg["quantization_config"]["quant_method"] == "fp8"
        assert src.tensor_info("layers.0.attn.wq_a.weight").dtype == "F8_E4M3"
        assert src.tensor_info("layers.0.attn.wq_a.scale").dtype == "F8_E8M0"
        assert src.tensor_info("layers.0.ffn.gate.tid2eid").dtype == "I64"
        assert src.tensor_info("layers.1.ffn.gate.bias").dtype == "F32"
    elif family == "quark":
        qc = cfg["quantization_config"]
        assert qc["quant_method"] == "quark" and qc["global_quant_config"]["weight"]["dtype"] == "fp4"
        assert src.tensor_info("model.layers.1.self_attn.o_proj.weight").dtype == "BF16"  # excluded
        has_input = "model.layers.1.mlp.experts.0.gate_proj.input_scale" in src.weight_map
        assert has_input == (scheme == "w_mxfp4_a_fp8")
        if has_input:
            assert src.tensor_info("model.layers.1.mlp.experts.0.gate_proj.input_scale").shape == ()
    else:
        assert cfg["quantization_config"]["quant_method"] == "mxfp4"
        assert src.shards()[0] == "model-00000-of-00001.safetensors"
        assert src.tensor_info("model.layers.0.mlp.experts.gate_up_proj_bias").dtype == "BF16"
    # e8m0 exponents near 127, never the NaN byte.
    ex = read_expert(src, m.layers[-1], m.geometry.num_experts - 1)
    for s in (ex.w13_scale, ex.w2_scale):
        assert 110 <= int(s.min()) and int(s.max()) <= 135


def test_synthetic_is_deterministic_per_seed(tmp_path):
    a = make_checkpoint("quark", tmp_path / "a", seed=5, num_layers=1)
    b = make_checkpoint("quark", tmp_path / "b", seed=5, num_layers=1)
    c = make_checkpoint("quark", tmp_path / "c", seed=6, num_layers=1)
    shards = sorted(p.name for p in a.glob("*.safetensors"))
    assert all((a / s).read_bytes() == (b / s).read_bytes() for s in shards)
    assert any((a / s).read_bytes() != (c / s).read_bytes() for s in shards)
    assert not list(tmp_path.glob(".*partial*"))


def test_synthetic_refuses_bad_options(tmp_path):
    with pytest.raises(CheckpointError, match="multiple of 32"):
        make_checkpoint("quark", tmp_path / "x", hidden=100)
    with pytest.raises(CheckpointError, match="Quark and compressed-tensors exports only"):
        make_checkpoint("gpt_oss", tmp_path / "x", scheme="w_mxfp4_a_fp8")
    with pytest.raises(CheckpointError, match="unknown option"):
        make_checkpoint("gpt_oss", tmp_path / "x", hiden=64)
    assert not (tmp_path / "x").exists()


def test_quark_export_with_deepseek_v4_native_names(synth, tmp_path):
    from mxfp4conv.checkpoint.synthetic import _quark_config

    root = copy_of(synth("deepseek_v4"), tmp_path / "d")
    _edit_config(root, lambda c: c.update(quantization_config=_quark_config("w_mxfp4_a_mxfp4")))
    m = load_model(open_source(root))
    assert (m.family, m.quant_scheme, m.moe_method, m.routing) == ("quark", "w_mxfp4_a_mxfp4", "quark", "DeepseekV4")
    assert (m.activation.name, m.activation.params) == ("silu", {"swiglu_limit": 10.0})
    assert [layer.prefix for layer in m.layers] == ["layers.0.ffn", "layers.1.ffn", "mtp.0.ffn"]
    assert m.dtype_variants == {"weight": "I8", "scale": "F8_E8M0"}


def test_deepseek_v4_dimensions_under_text_config(synth):
    nested = load_model(open_source(synth("deepseek_v4", text_config=True)))
    flat = load_model(open_source(synth("deepseek_v4")))
    cfg = open_source(synth("deepseek_v4", text_config=True)).config
    assert "hidden_size" not in cfg and cfg["text_config"]["expert_dtype"] == "fp4"
    assert (nested.family, nested.geometry, nested.activation, nested.routing) == (
        flat.family, flat.geometry, flat.activation, flat.routing)
    assert [layer.prefix for layer in nested.layers] == [layer.prefix for layer in flat.layers]


def test_kimi_linear_top_level_is_not_kimi_k3(synth, tmp_path):
    # transformers' Kimi-Linear (model_type kimi_linear at the top) is served by vLLM's
    # compressed-tensors MoE method, not by Kimi-K3's mxfp4 rewrite.
    root = copy_of(synth("kimi_k3"), tmp_path / "k")

    def flatten(cfg):
        text = cfg.pop("text_config")
        cfg.clear()
        cfg.update(text, architectures=["KimiLinearForCausalLM"])
    _edit_config(root, flatten)
    m = load_model(open_source(root))
    assert (m.family, m.moe_method, m.moe_class) == (
        "compressed_tensors", "compressed_tensors_mxfp4", "CompressedTensorsW4A4Mxfp4MoEMethod")
    assert m.activation.name == "situ" and m.activation.params == {"beta": 4.0, "linear_beta": 25.0}


def test_kimi_k3_declared_activations_are_rewritten_away(synth, tmp_path):
    root = copy_of(synth("kimi_k3"), tmp_path / "k")
    fp8 = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}
    _edit_config(root, lambda c: c["text_config"]["quantization_config"]["config_groups"]["group_0"]
                 .update(input_activations=fp8))
    m = load_model(open_source(root))
    assert (m.quant_scheme, m.moe_method, m.moe_class, m.declared_act) == (
        "w_mxfp4_a_fp8", "mxfp4", "Mxfp4MoEMethod", "fp8_dynamic_token")
    from mxfp4conv.oracle import decide
    from mxfp4conv.oracle.decision import Target

    d = decide(m, Target("gfx950", tp=2))
    assert d.act_quant == "mxfp4"  # vLLM 0.33.0's SiTUv2 default (auto = a4w4), not the declared fp8
    assert any("KimiK3ForConditionalGenerationConfig" in n for n in d.notes)
