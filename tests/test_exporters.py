"""Checkpoints written by the real exporting libraries (tests/data/exporters, made by its
make_fixtures.py): read, planned as vLLM 0.33.0 decides, converted and verified, with every
expert's values equal to the exporting library's own dequantisation (recorded beside each
checkpoint as NAME.reference.safetensors)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from checkpoint_fixtures import run_cli
from mxfp4conv.checkpoint import load_model, open_source
from mxfp4conv.checkpoint.experts import read_expert
from mxfp4conv.codec import dequantize_mxfp4
from mxfp4conv.convert.run import convert
from mxfp4conv.convert.verify import verify
from mxfp4conv.oracle import decide
from mxfp4conv.oracle.decision import Target
from mxfp4conv.runtime import load_moe_layers
from mxfp4conv.runtime.reference import dequant_expert
from mxfp4conv.runtime.relayout import canonical

pytestmark = pytest.mark.filterwarnings("ignore:.*cannot consume them")
DATA = Path(__file__).parent / "data" / "exporters"

# name -> (family, quant scheme, moe_method, vLLM class, declared activations, MoE prefixes)
EXPORTS = {
    "ct_qwen3_moe_w_mxfp4": ("compressed_tensors", "w_mxfp4", "compressed_tensors_mxfp4",
                             "CompressedTensorsW4A4Mxfp4MoEMethod", None, ["model.layers.0.mlp"]),
    "ct_qwen3_moe_w_mxfp4_a_mxfp4": ("compressed_tensors", "w_mxfp4_a_mxfp4",
                                     "compressed_tensors_mxfp4",
                                     "CompressedTensorsW4A4Mxfp4MoEMethod",
                                     "mxfp4_dynamic_group32", ["model.layers.0.mlp"]),
    "ct_qwen3_moe_w_mxfp4_a_fp8": ("compressed_tensors", "w_mxfp4_a_fp8", "mxfp4",
                                   "CompressedTensorsW4A8Mxfp4MoEMethod", "fp8_dynamic_group128",
                                   ["model.layers.0.mlp"]),
    "ct_deepseek_v3_w_mxfp4": ("compressed_tensors", "w_mxfp4", "compressed_tensors_mxfp4",
                               "CompressedTensorsW4A4Mxfp4MoEMethod", None, ["model.layers.1.mlp"]),
    "ct_kimi_linear_w_mxfp4": ("compressed_tensors", "w_mxfp4", "compressed_tensors_mxfp4",
                               "CompressedTensorsW4A4Mxfp4MoEMethod", None,
                               ["model.layers.1.block_sparse_moe"]),
    "quark_gpt_oss_w_mxfp4_a_fp8": ("quark", "w_mxfp4_a_fp8", "quark", "QuarkOCP_MX_MoEMethod",
                                    "fp8_static_tensor", ["model.layers.0.mlp"]),
    "quark_qwen3_moe_w_mxfp4": ("quark", "w_mxfp4", "quark", "QuarkOCP_MX_MoEMethod", None,
                                ["model.layers.0.mlp"]),
    "quark_deepseek_v3_w_mxfp4_a_mxfp4": ("quark", "w_mxfp4_a_mxfp4", "quark",
                                          "QuarkOCP_MX_MoEMethod", "mxfp4_dynamic_group32",
                                          ["model.layers.1.mlp"]),
}
# sm90: mxfp4conv's own format, asked for (vLLM 0.33's converter raises for Quark w_mxfp4 there)
TARGETS = [Target("gfx950", tp=2), Target("sm90", layout="hopper_mma")]


def reference(name: str) -> dict[str, torch.Tensor]:
    return load_file(DATA / f"{name}.reference.safetensors")


def expert_weights(name: str, prefix: str, e: int) -> dict[str, torch.Tensor]:
    """The exporter's dequantised gate, up and down of one expert (fp32 [out, in])."""
    ref = reference(name)
    base = f"{prefix}.experts.{e}"
    if f"{base}.gate_up_proj" in ref:  # rows interleaved g0, u0, g1, u1, ...
        gu = ref[f"{base}.gate_up_proj"].float()
        return {"gate": gu[0::2], "up": gu[1::2], "down": ref[f"{base}.down_proj"].float()}
    return {p: ref[f"{base}.{p}_proj"].float() for p in ("gate", "up", "down")}


@pytest.mark.parametrize("name", EXPORTS)
def test_reads_the_export(name):
    family, scheme, method, cls, declared, prefixes = EXPORTS[name]
    m = load_model(open_source(DATA / name))
    assert (m.family, m.quant_scheme, m.moe_method, m.moe_class, m.declared_act) == (
        family, scheme, method, cls, declared)
    assert [layer.prefix for layer in m.layers] == prefixes
    assert (m.geometry.hidden, m.geometry.intermediate, m.geometry.num_experts, m.geometry.top_k) == (
        128, 64, 4, 2)
    assert m.dtype_variants == {"weight": "U8", "scale": "U8"}
    gpt_oss = "gpt_oss" in name
    assert m.gate_up_interleaved == gpt_oss and m.has_bias == gpt_oss
    assert m.static_input_scales == (name == "quark_gpt_oss_w_mxfp4_a_fp8")
    assert m.activation.name == ("swigluoai" if gpt_oss else "silu")


@pytest.mark.parametrize("name", EXPORTS)
def test_values_equal_the_exporters_dequantisation(name):
    src = open_source(DATA / name)
    m = load_model(src)
    for layer in m.layers:
        for e in range(m.geometry.num_experts):
            ex = read_expert(src, layer, e)
            want = expert_weights(name, layer.prefix, e)
            w13 = dequantize_mxfp4(ex.w13, ex.w13_scale, dtype=torch.float32)
            assert torch.equal(w13, torch.cat([want["gate"], want["up"]])), (layer.prefix, e)
            assert torch.equal(dequantize_mxfp4(ex.w2, ex.w2_scale, dtype=torch.float32), want["down"])


def test_quark_gpt_oss_biases_and_bf16_scalar_input_scales():
    name = "quark_gpt_oss_w_mxfp4_a_fp8"
    src = open_source(DATA / name)
    m = load_model(src)
    layer = m.layers[0]
    ref = reference(name)
    p = f"{layer.prefix}.experts"
    with safe_open(DATA / name / "model.safetensors", "pt") as f:
        stored = {k: f.get_tensor(k) for k in f.keys() if ".input_scale" in k}
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    assert {tuple(t.shape) for t in stored.values()} == {()}
    for e in range(4):
        ex = read_expert(src, layer, e)
        gu_bias = ref[f"{p}.{e}.gate_up_proj.bias"].float()
        assert torch.equal(ex.w13_bias, torch.cat([gu_bias[0::2], gu_bias[1::2]]))
        assert torch.equal(ex.w2_bias, ref[f"{p}.{e}.down_proj.bias"].float())
        # carried as vLLM reads them: the stored BF16 value as float32 (one per GEMM and expert)
        assert ex.w13_input_scale == float(stored[f"{p}.{e}.gate_up_proj.input_scale"].float())
        assert ex.w2_input_scale == float(stored[f"{p}.{e}.down_proj.input_scale"].float())
        assert ex.w13_input_scale == pytest.approx(float(ref[f"{p}.{e}.gate_up_proj.input_scale"]),
                                                   rel=2 ** -8)


def _converted_expert(layers_by_rank, prefix: str, e: int) -> dict[str, torch.Tensor]:
    """gate / up / down of global expert ``e``, reassembled from every rank's canonical bytes."""
    parts = {"gate": [], "up": [], "down": []}
    for layers in layers_by_rank:
        ex = canonical(layers[prefix])
        local = e - ex.expert_offset
        if not 0 <= local < ex.experts_per_rank:
            continue
        ir, ip, h = ex.intermediate_per_rank, ex.intermediate_per_rank_padded, ex.hidden
        w13 = dequant_expert(ex, "w13", local)
        parts["gate"].append(w13[:ir, :h])
        parts["up"].append(w13[ip:ip + ir, :h])
        parts["down"].append(dequant_expert(ex, "w2", local)[:h, :ir])
    return {"gate": torch.cat(parts["gate"]), "up": torch.cat(parts["up"]),
            "down": torch.cat(parts["down"], dim=1)}


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{t.arch}-tp{t.tp}")
@pytest.mark.parametrize("name", EXPORTS)
def test_converts_and_verifies_with_the_exporters_values(tmp_path, name, target):
    src = open_source(DATA / name)
    m = load_model(src)
    out = tmp_path / "out"
    convert(src, out, target, force=True, progress="off")
    verify(out, source=src)
    ranks = [load_moe_layers(out, rank=r) for r in range(target.tp)]
    for layer in m.layers:
        for e in range(m.geometry.num_experts):
            got = _converted_expert(ranks, layer.prefix, e)
            want = expert_weights(name, layer.prefix, e)
            for k in ("gate", "up", "down"):
                assert torch.equal(got[k], want[k]), (layer.prefix, e, k)
    if m.static_input_scales:  # one max scale per GEMM, as vLLM's process_weights_after_loading
        ex0 = ranks[0][m.layers[0].prefix]
        scales = [read_expert(src, m.layers[0], e) for e in range(4)]
        assert float(ex0.w13_input_scale.max()) == max(s.w13_input_scale for s in scales)
        assert float(ex0.w2_input_scale.max()) == max(s.w2_input_scale for s in scales)


# What vLLM 0.33.0 runs for each export: (arch, vLLM's experts pick, activations it runs).
DECISIONS = [
    ("ct_qwen3_moe_w_mxfp4_a_mxfp4", "sm90", "MARLIN", "bf16"),
    ("ct_qwen3_moe_w_mxfp4_a_mxfp4", "sm100", "CUTLASS_MXFP4_MXFP4", "mxfp4"),
    ("ct_qwen3_moe_w_mxfp4", "sm100", "CUTLASS_MXFP4_MXFP4", "mxfp4"),
    ("ct_qwen3_moe_w_mxfp4", "gfx950", "MARLIN", "bf16"),
    ("ct_kimi_linear_w_mxfp4", "sm120", "MARLIN", "bf16"),
]


@pytest.mark.parametrize("name, arch, pick, act", DECISIONS)
def test_compressed_tensors_w4a4_method_decides_like_vllm(name, arch, pick, act):
    d = decide(load_model(open_source(DATA / name)), Target(arch))
    assert d.options["vllm_backend"] == pick and d.act_quant == act
    assert d.options["selector"] == "CompressedTensorsW4A4Mxfp4MoEMethod.__init__"
    assert d.backend == "EMULATION"  # neither Marlin's repack nor CUTLASS's swizzle is written
    chosen = next(c for c in d.candidates if c.backend == pick)
    declared = load_model(open_source(DATA / name)).declared_act
    if declared and pick == "MARLIN":
        assert f"input_activations {declared} are not read" in chosen.reason
    if arch.startswith("gfx"):
        assert "cannot serve it on gfx950" in chosen.reason


def test_compressed_tensors_w4a4_method_ignores_the_int4_weight_option():
    """vLLM 0.33.0 reads quantization_config.moe.weight only in Mxfp4MoEMethod."""
    model = load_model(open_source(DATA / "ct_qwen3_moe_w_mxfp4"))
    plain = decide(model, Target("gfx942"))
    d = decide(model, Target("gfx942", moe_weight="int4_per_group_32"))
    assert d.options["vllm_backend"] == plain.options["vllm_backend"] and d.backend == plain.backend
    assert any("ignores --quantization-config.moe.weight int4_per_group_32" in n
               and "never reads quantization_config.moe.weight" in n for n in d.notes)


def test_compressed_tensors_w4a8_is_an_mxfp4_method_that_says_why(capsys):
    name = "ct_qwen3_moe_w_mxfp4_a_fp8"
    d = decide(load_model(open_source(DATA / name)), Target("gfx950", tp=2))
    assert d.options["selector"] == "select_deepseek_v4_mxfp4_moe_backend"
    assert d.backend == "AITER_MXFP4_BF16" and d.act_quant == "bf16"
    assert any("CompressedTensorsW4A8Mxfp4MoEMethod" in n and "fp8_dynamic_group128" in n
               for n in d.notes)
    rc, out, _ = run_cli(["plan", DATA / name, "--arch", "gfx950", "--tp", "2"], capsys)
    assert rc == 0 and "CompressedTensorsW4A8Mxfp4MoEMethod" in out.replace("\n", "")


def test_quark_gpt_oss_is_not_the_quark_deinterleave_bug():
    d = decide(load_model(open_source(DATA / "quark_gpt_oss_w_mxfp4_a_fp8")),
               Target("gfx950", tp=2, act_quant="auto"))
    assert not any("Suspected vLLM bug" in n for n in d.notes)
    assert d.act_quant == "fp8"


def test_compressed_tensors_w4a4_refuses_a_forced_backend():
    from mxfp4conv.errors import OracleError

    m = load_model(open_source(DATA / "ct_qwen3_moe_w_mxfp4"))
    with pytest.raises(OracleError, match="picks its kernel itself"):
        decide(m, Target("sm90", backend="marlin"))
    with pytest.raises(OracleError, match="takes no activation override"):
        decide(m, Target("sm90", act_quant="mxfp4"))


def _header(root: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    src = open_source(root)
    return {n: (src.tensor_info(n).dtype, tuple(src.tensor_info(n).shape)) for n in src.tensor_names()}


@pytest.mark.parametrize("family, scheme, export", [
    ("compressed_tensors", "w_mxfp4", "ct_qwen3_moe_w_mxfp4"),
    ("compressed_tensors", "w_mxfp4_a_mxfp4", "ct_qwen3_moe_w_mxfp4_a_mxfp4"),
    ("compressed_tensors", "w_mxfp4_a_fp8", "ct_qwen3_moe_w_mxfp4_a_fp8"),
    ("quark_gpt_oss", "w_mxfp4_a_fp8", "quark_gpt_oss_w_mxfp4_a_fp8"),
])
def test_example_matches_the_real_export(tmp_path, family, scheme, export):
    from mxfp4conv.checkpoint.synthetic import make_checkpoint

    root = make_checkpoint(family, tmp_path / "x", scheme=scheme, hidden=128, intermediate=64,
                           num_experts=4, top_k=2, num_layers=1, vocab=64)
    assert _header(root) == _header(DATA / export)  # names, dtype strings, shapes
    got, real = open_source(root).config, open_source(DATA / export).config
    assert got["quantization_config"] == real["quantization_config"]
    assert set(got) == set(real)
    a, b = load_model(open_source(root)), load_model(open_source(DATA / export))
    for k in ("family", "quant_scheme", "moe_method", "moe_class", "declared_act", "activation",
              "routing", "geometry", "has_bias", "static_input_scales", "gate_up_interleaved"):
        assert getattr(a, k) == getattr(b, k), k


def _vllm_record() -> dict:
    import json

    return json.loads((DATA / "vllm033_ct_methods.json").read_text())["results"]


def _k3_declaring_fp8(tmp_path) -> Path:
    import json

    from mxfp4conv.checkpoint.synthetic import make_checkpoint

    root = make_checkpoint("kimi_k3", tmp_path / "k3", num_layers=1)
    cfg = json.loads((root / "config.json").read_text())
    cfg["text_config"]["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {
        "num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}
    (root / "config.json").write_text(json.dumps(cfg))
    return root


@pytest.mark.parametrize("name", sorted(_vllm_record()))
def test_moe_method_is_the_one_vllm_033_builds(tmp_path, name):
    """vllm033_ct_methods.json: what vLLM 0.33.0's own code built for these configs
    (probe_vllm_ct.py); mxfp4conv names the same method, experts class and activations."""
    root = _k3_declaring_fp8(tmp_path) if name == "kimi_k3_declared_fp8" else DATA / name
    m = load_model(open_source(root))
    for arch, rec in _vllm_record()[name].items():
        assert m.moe_class == rec["method"], arch
        assert m.moe_method == ("compressed_tensors_mxfp4" if rec["quant_method"] == "compressed-tensors"
                                and rec["method"] == "CompressedTensorsW4A4Mxfp4MoEMethod" else "mxfp4")
        key = rec["activation_key"]
        if key is None:  # the declared activations (if any) are not carried by the method
            assert m.moe_method == "compressed_tensors_mxfp4" or m.moe_class == "Mxfp4MoEMethod"
        else:
            group = m.declared_act.rsplit("group", 1)[1]
            assert m.declared_act.startswith("fp8_dynamic_") and "f8e4m3fn" in key
            assert "dynamic" in key and f"col={group}" in key
        if rec["method"] == "CompressedTensorsW4A4Mxfp4MoEMethod":
            d = decide(m, Target(arch))
            assert d.options["vllm_expert_class"] == rec["experts_cls"], arch
            assert d.act_quant == ("mxfp4" if rec["use_cutlass_mxfp4"] else "bf16")


def _ct_copy(tmp_path, edit) -> Path:
    import json
    import shutil

    root = tmp_path / "ct"
    shutil.copytree(DATA / "ct_qwen3_moe_w_mxfp4", root)
    cfg = json.loads((root / "config.json").read_text())
    edit(cfg["quantization_config"])
    (root / "config.json").write_text(json.dumps(cfg))
    return root


@pytest.mark.parametrize("edit, message", [
    (lambda qc: qc["config_groups"]["group_0"]["weights"].update(num_bits=8),
     "is not MXFP4 .float, 4 bits, strategy group, group_size 32, symmetric"),
    (lambda qc: qc["config_groups"]["group_0"]["weights"].update(group_size=16),
     "is not MXFP4"),
    (lambda qc: qc.update(format="nvfp4-pack-quantized") or qc["config_groups"]["group_0"].update(
        format="nvfp4-pack-quantized"), "not 'mxfp4-pack-quantized'"),
    (lambda qc: qc["ignore"].append("re:.*experts.*"), "leaves the routed experts .* unquantised"),
    (lambda qc: qc["ignore"].append("re:.*experts\\.0\\.down_proj$"), "needs all MoE projections"),
    (lambda qc: qc.update(config_groups=[1]), "config_groups must be an object"),
])
def test_compressed_tensors_configs_it_cannot_convert(tmp_path, capsys, edit, message):
    root = _ct_copy(tmp_path, edit)
    rc, _, err = run_cli(["inspect", root], capsys)
    assert rc == 1 and "Traceback" not in err
    assert "config.json" in err
    import re
    assert re.search(message, " ".join(err.split())), err


def test_quark_gpt_oss_weight_only_example_converts_without_the_deinterleave_note(tmp_path):
    from mxfp4conv.checkpoint.synthetic import make_checkpoint

    root = make_checkpoint("quark_gpt_oss", tmp_path / "q", scheme="w_mxfp4", hidden=128,
                           intermediate=64, num_experts=4, num_layers=1)
    m = load_model(open_source(root))
    assert m.gate_up_interleaved and m.quant_scheme == "w_mxfp4" and m.has_bias
    d = decide(m, Target("gfx950", tp=2))
    assert d.backend == "AITER_MXFP4_BF16"
    assert not any("Suspected vLLM bug" in n for n in d.notes)
    convert(root, tmp_path / "out", Target("gfx950", tp=2), force=True, progress="off")
    verify(tmp_path / "out", source=root)


def test_kimi_linear_transformers_names_get_a_vllm_loader_warning():
    from mxfp4conv.checkpoint.summary import inspect_source

    rep = inspect_source(str(DATA / "ct_kimi_linear_w_mxfp4"))
    warnings = [p.message for p in rep.problems if p.severity == "warning"]
    assert any("maps only 'experts.E.w1/w3/w2'" in w for w in warnings)
    assert not rep.problems.errors
    rep = inspect_source(str(DATA / "ct_qwen3_moe_w_mxfp4"))
    assert not list(rep.problems)
