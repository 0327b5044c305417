"""Every config value the decision or the runtime reads is validated (type, range, and vLLM's
own accepted values where vLLM defines them), and 0xFF (NaN) is found in every e8m0 tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkpoint_fixtures import copy_of, run_cli, synth, tree_digest  # noqa: F401
from mxfp4conv.checkpoint.safetensors_io import read_header
from console import one_paragraph_error

ARCH = ["--arch", "gfx950"]


def edited(synth, tmp_path, family, key, value, scheme=None) -> Path:
    root = copy_of(synth(family, scheme), tmp_path / "src")
    p = root / "config.json"
    cfg = json.loads(p.read_text())
    tc = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) and "hidden_size" in cfg["text_config"] else cfg
    tc[key] = value
    p.write_text(json.dumps(cfg))
    return root


def refused(root, tmp_path, capsys, *needles):
    before = tree_digest(root)
    rc, out, err = run_cli(["inspect", root], capsys)
    assert rc == 1 and all(n in " ".join((out + err).split()) for n in needles), out + err
    rc, _, err = run_cli(["convert", root, tmp_path / "out", *ARCH], capsys)
    one_paragraph_error(rc, err, "config.json", *needles)
    assert not (tmp_path / "out").exists() and tree_digest(root) == before


@pytest.mark.parametrize("family", ["quark", "compressed_tensors"])
@pytest.mark.parametrize("value", [{}, "bogus", 5, ""])
def test_scoring_func_outside_vllms_values_is_refused(synth, tmp_path, capsys, family, value):
    root = edited(synth, tmp_path, family, "scoring_func", value)
    refused(root, tmp_path, capsys, "'scoring_func' is", "softmax, sigmoid, sqrtsoftplus")


@pytest.mark.parametrize("value, routing", [("sigmoid", "SigmoidRenorm"), ("softmax", "RenormalizeNaive")])
def test_scoring_funcs_vllm_knows_still_decide_the_routing(synth, tmp_path, capsys, value, routing):
    root = edited(synth, tmp_path, "quark", "scoring_func", value)
    cfg = json.loads((root / "config.json").read_text())
    for k in ("topk_method", "n_group", "num_expert_group"):
        cfg.pop(k, None)
    cfg["model_type"] = "qwen3_moe"
    (root / "config.json").write_text(json.dumps(cfg))
    rc, out, err = run_cli(["inspect", root, "--json"], capsys)
    assert rc == 0, err
    assert json.loads(out)["routing"] == routing


@pytest.mark.parametrize("family, key, value, needle", [
    ("deepseek_v4", "scoring_func", "softmax", "sqrtsoftplus (DeepSeek-V4's routing)"),
    ("kimi_k3", "moe_router_activation_func", "softmax", "sigmoid (Kimi-K3's DeepSeekV3 routing)"),
    ("quark", "norm_topk_prob", "false", "must be true or false"),
    ("quark", "n_group", -1, "whole number from 0"),
    ("quark", "topk_method", 7, "must be a name"),
    ("quark", "routed_scaling_factor", -2.5, "'routed_scaling_factor' is -2.5"),
    ("deepseek_v4", "swiglu_limit", 2 ** 63, "at most 65504"),
    ("gpt_oss", "swiglu_limit", 1e300, "at most 65504"),
    ("kimi_k3", "activation_situ_beta", 1e6, "at most 65504"),
    ("kimi_k3", "activation_situ_linear_beta", -1e9, "at most 65504"),
])
def test_config_value_out_of_range_or_type_is_refused(synth, tmp_path, capsys, family, key, value, needle):
    root = edited(synth, tmp_path, family, key, value)
    refused(root, tmp_path, capsys, repr(key), needle)


def test_quark_is_dynamic_must_be_a_boolean(synth, tmp_path, capsys):
    root = copy_of(synth("quark"), tmp_path / "src")
    p = root / "config.json"
    cfg = json.loads(p.read_text())
    qc = cfg["quantization_config"]["global_quant_config"]
    qc["input_tensors"] = {**(qc.get("input_tensors") or {"dtype": "fp4", "qscheme": "per_group",
                                                         "group_size": 32, "scale_format": "e8m0"}),
                           "is_dynamic": "false"}
    p.write_text(json.dumps(cfg))
    refused(root, tmp_path, capsys, "'is_dynamic' is 'false'")


@pytest.mark.parametrize("part, key", [("weights", "symmetric"), ("weights", "dynamic")])
def test_compressed_tensors_flags_must_be_booleans(synth, tmp_path, capsys, part, key):
    root = copy_of(synth("compressed_tensors"), tmp_path / "src")
    p = root / "config.json"
    cfg = json.loads(p.read_text())
    qc = cfg.get("quantization_config") or cfg["text_config"]["quantization_config"]
    group = next(iter(qc["config_groups"].values()))
    group[part][key] = "false"
    p.write_text(json.dumps(cfg))
    refused(root, tmp_path, capsys, f"{part}.{key} is 'false'", "true or false")


# ---- 0xFF in an e8m0 tensor outside the routed experts --------------------------------------

NAME = "layers.0.attn.wo_b.scale"


def with_nan_byte(src: Path, dst: Path, name: str = NAME, offset: int = 1) -> Path:
    root = copy_of(src, dst)
    wm = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    h = read_header(root / wm[name])
    assert h.tensors[name].dtype == "F8_E8M0"
    b, end = h.absolute(name)
    assert b + offset < end
    with open(root / wm[name], "r+b") as f:
        f.seek(b + offset)
        f.write(b"\xff")
    return root


def test_nan_in_a_non_routed_e8m0_tensor_is_found_by_inspect_full(synth, tmp_path, capsys):
    root = with_nan_byte(synth("deepseek_v4"), tmp_path / "src")
    rc, out, err = run_cli(["inspect", root, "--full"], capsys)
    text = " ".join((out + err).split())
    assert rc == 1 and f"{NAME}: 1 bytes" in text and "outside the routed experts" in text, text
    rc, out, err = run_cli(["inspect", root, "--full", "--json"], capsys)
    scan = json.loads(out)["scale_scan"]
    assert scan["bytes_read"] == scan["bytes_total"]


def test_nan_in_a_non_routed_e8m0_tensor_is_refused_by_convert(synth, tmp_path, capsys):
    root = with_nan_byte(synth("deepseek_v4"), tmp_path / "src")
    before = tree_digest(root)
    out = tmp_path / "out"
    rc, _, err = run_cli(["convert", root, out, *ARCH, "-q"], capsys)
    one_paragraph_error(rc, err, f"tensor {NAME} holds a NaN scale byte (0xFF) at byte offset 1",
                        "--allow-nan-scales")
    assert tree_digest(root) == before
    assert not (out / "mxfp4conv.json").exists() and not list(out.glob(".*partial"))
    rc, _, err = run_cli(["convert", root, out, *ARCH, "-q", "--allow-nan-scales", "--force"], capsys)
    assert rc == 0, err
    assert run_cli(["verify", out, "--source", root], capsys)[0] == 0


def test_clean_deepseek_v4_converts_with_its_e8m0_tensors(synth, tmp_path, capsys):
    root = synth("deepseek_v4")
    rc, out, err = run_cli(["inspect", root, "--full", "--json"], capsys)
    assert rc == 0, err
    rc, _, err = run_cli(["convert", root, tmp_path / "out", *ARCH, "-q"], capsys)
    assert rc == 0, err
