"""``mxfp4conv inspect``: the --json contract, the checks it reports, header-only reads."""

import json
import struct

import pytest
from safetensors import safe_open
from safetensors.torch import save_file
import torch

from checkpoint_fixtures import CASES, copy_of, load_index, run_cli, save_index, synth  # noqa: F401
from mxfp4conv.checkpoint import open_source, safetensors_io as st
from mxfp4conv.checkpoint.summary import inspect_source

CONTRACT_KEYS = {"family", "quant_scheme", "activation", "activation_params", "moe", "tensors",
                 "bytes", "expert_bytes", "kernel_layout", "problems"}


_SIZE = {"U8": 1, "I8": 1, "F8_E8M0": 1, "F8_E4M3": 1, "BOOL": 1, "BF16": 2, "F16": 2, "F32": 4,
         "I32": 4, "I64": 8}


def _header_totals(root):
    """(tensor count, data bytes, routed-expert bytes) computed with the safetensors library."""
    count = total = experts = 0
    for shard in sorted(set(load_index(root)["weight_map"].values())):
        with safe_open(root / shard, "pt") as f:
            for name in f.keys():
                t = f.get_slice(name)
                nbytes = _SIZE[t.get_dtype()]
                for d in t.get_shape():
                    nbytes *= d
                count += 1
                total += nbytes
                if ".experts." in name and "shared" not in name:
                    experts += nbytes
    return count, total, experts


@pytest.mark.parametrize("family, scheme", CASES)
def test_inspect_json_contract(synth, capsys, family, scheme):
    root = synth(family, scheme)
    rc, out, err = run_cli(["inspect", root, "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert CONTRACT_KEYS <= d.keys()
    assert d["family"] == family and d["quant_scheme"] == (scheme or "w_mxfp4")
    assert d["kernel_layout"] is None and d["problems"] == []
    act = {"kimi_k3": ("situ", {"beta": 4.0, "linear_beta": 25.0}),
           "deepseek_v4": ("silu", {"swiglu_limit": 10.0}), "quark": ("silu", {}),
           "gpt_oss": ("swigluoai", {"alpha": 1.702, "limit": 7.0})}[family]
    assert (d["activation"], d["activation_params"]) == act
    moe = d["moe"]
    assert set(moe) == {"layers", "num_experts", "top_k", "hidden", "intermediate"}
    assert (moe["num_experts"], moe["top_k"], moe["hidden"], moe["intermediate"]) == (8, 2, 256, 256)
    assert len(moe["layers"]) == (3 if family == "deepseek_v4" else 2)
    count, total, experts = _header_totals(root)
    assert (d["tensors"], d["bytes"], d["expert_bytes"]) == (count, total, experts)
    assert sum(g["bytes"] for g in d["groups"]) == total


def test_kimi_hidden_is_the_latent_width(tmp_path, capsys):
    from mxfp4conv.checkpoint.synthetic import make_checkpoint

    root = make_checkpoint("kimi_k3", tmp_path / "k", hidden=128, intermediate=64, num_layers=1)
    d = json.loads(run_cli(["inspect", root, "--json"], capsys)[1])
    assert d["moe"]["hidden"] == 128 and json.loads((root / "config.json").read_text())["text_config"]["hidden_size"] == 256


def test_rich_summary(synth, capsys):
    rc, out, err = run_cli(["inspect", synth("deepseek_v4")], capsys)
    assert rc == 0
    for text in ("deepseek_v4", "w_mxfp4", "silu", "swiglu_limit=10", "mtp.0.ffn", "routed experts",
                 "I8", "F8_E8M0", "no problems found"):
        assert text in out, text


def _problems(root, **kw):
    return [p["message"] for p in inspect_source(str(root), **kw).data["problems"] if p["severity"] == "error"]


def test_missing_expert_tensor_reported(synth, tmp_path, capsys):
    root = copy_of(synth("quark"), tmp_path / "q")
    index = load_index(root)
    del index["weight_map"]["model.layers.2.mlp.experts.3.up_proj.weight_scale"]
    save_index(root, index)
    msgs = _problems(root)
    assert any("model.layers.2.mlp" in m and "up scale" in m and "experts 3" in m for m in msgs)
    assert any("not in the index" in m for m in msgs)
    rc, out, err = run_cli(["inspect", root, "--json"], capsys)
    assert rc == 1 and "problem(s) found" in err and json.loads(out)["problems"]


def test_duplicate_tensors_reported(synth, tmp_path):
    root = copy_of(synth("kimi_k3"), tmp_path / "k")
    # A tensor listed twice in the index, and a stale copy of an expert in the other shard.
    raw = (root / "model.safetensors.index.json").read_text()
    name = "language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_packed"
    dup = f'"{name}": "model-00001-of-00002.safetensors", '
    (root / "model.safetensors.index.json").write_text(raw.replace('"weight_map": {', '"weight_map": {' + dup, 1))
    msgs = _problems(root)
    assert any("listed more than once" in m and name in m for m in msgs)

    root2 = copy_of(synth("kimi_k3"), tmp_path / "k2")
    idx = load_index(root2)["weight_map"]
    shard1 = [n for n, s in idx.items() if s == "model-00001-of-00002.safetensors"]
    with safe_open(root2 / "model-00001-of-00002.safetensors", "pt") as f:
        tensors = {n: f.get_tensor(n) for n in shard1}
    late = "language_model.model.layers.2.block_sparse_moe.experts.7.w2.weight_scale"
    tensors[late] = torch.zeros(256, 8, dtype=torch.uint8)
    save_file(tensors, str(root2 / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    msgs = _problems(root2)
    assert any("mapped by the index to another shard" in m and late in m for m in msgs)


def test_index_lists_tensor_missing_from_shard(synth, tmp_path):
    root = copy_of(synth("gpt_oss"), tmp_path / "g")
    index = load_index(root)
    index["weight_map"]["model.layers.9.ghost.weight"] = "model-00000-of-00001.safetensors"
    save_index(root, index)
    assert any("header does not contain" in m and "model.layers.9.ghost.weight" in m for m in _problems(root))


def test_shape_inconsistent_with_config_reported(synth, tmp_path):
    root = copy_of(synth("gpt_oss"), tmp_path / "g")
    cfg = json.loads((root / "config.json").read_text())
    cfg["intermediate_size"] = 320  # a multiple of 32 but not what the tensors hold
    (root / "config.json").write_text(json.dumps(cfg))
    msgs = _problems(root)
    assert any("gate_up_proj_blocks" in m and "[8, 640, 8, 16]" in m for m in msgs)
    cfg["intermediate_size"] = 250  # not a multiple of the group size
    (root / "config.json").write_text(json.dumps(cfg))
    assert any("not a positive multiple of the MXFP4 group size 32" in m for m in _problems(root))


def _poison_scale(root, name, byte_index):
    info = open_source(root).tensor_info(name)
    path = root / info.shard
    raw = bytearray(path.read_bytes())
    raw[info.begin + byte_index] = 0xFF
    path.write_bytes(bytes(raw))


def test_nan_scales_sampled_and_full(synth, tmp_path):
    root = copy_of(synth("deepseek_v4"), tmp_path / "d")
    first = "layers.0.ffn.experts.0.w1.scale"
    _poison_scale(root, first, 5)
    assert any("0xFF" in m and first in m for m in _problems(root))
    root2 = copy_of(synth("deepseek_v4"), tmp_path / "d2")
    middle = "layers.1.ffn.experts.3.w2.scale"  # not in the cheap sample
    _poison_scale(root2, middle, 100)
    assert _problems(root2) == []
    assert any("0xFF" in m and middle in m for m in _problems(root2, full=True))


def test_nan_scales_in_fused_gpt_oss(synth, tmp_path):
    root = copy_of(synth("gpt_oss"), tmp_path / "g")
    _poison_scale(root, "model.layers.1.mlp.experts.down_proj_scales", 4 * 256 * 8 + 17)  # expert 4
    assert _problems(root) == []
    assert any("down_proj_scales" in m for m in _problems(root, full=True))


def test_converted_checkpoint_shows_manifest(tmp_path, capsys):
    root = tmp_path / "conv"
    root.mkdir()
    manifest = {"format": "mxfp4conv-kernel-layout", "version": 1, "tool_version": "0.1.0", "vllm": "0.33.0",
                "target": {"arch": "gfx950", "backend": "AITER_MXFP4_BF16", "activation": "silu",
                           "activation_params": {"swiglu_limit": 10.0}, "act_quant": "bf16",
                           "tp": 1, "ep": False, "gate_mode": "separated", "is_shuffled": True},
                "layout": {"gate_up": "[gate; up]", "w13": "aiter_p16_gu16", "w13_scale": "aiter_scale_a16w4_gu16",
                           "w2": "aiter_p16", "w2_scale": "e8m0_shuffle"},
                "moe": {"hidden": 256, "hidden_padded": 256, "intermediate": 256, "intermediate_per_rank": 256,
                        "intermediate_per_rank_padded": 256, "num_experts": 8, "experts_per_rank": 8,
                        "top_k": 2, "layers": ["layers.0.ffn"]},
                "runtime_env": {}, "source": {"family": "deepseek_v4", "quant_scheme": "w_mxfp4",
                                              "sha256": "0" * 64}}
    (root / "mxfp4conv.json").write_text(json.dumps(manifest))
    (root / "config.json").write_text(json.dumps({"model_type": "deepseek_v4", "expert_dtype": "fp4"}))
    t = {"layers.0.ffn.experts.rank0.w13_weight": torch.zeros(8, 512, 128, dtype=torch.uint8),
         "layers.0.ffn.gate.weight": torch.zeros(8, 256, dtype=torch.bfloat16)}
    save_file(t, str(root / "model-00001-of-00001.safetensors"), metadata={"format": "pt"})
    save_index(root, {"metadata": {"total_size": 8 * 512 * 128 + 8 * 256 * 2},
                      "weight_map": {n: "model-00001-of-00001.safetensors" for n in t}})
    rc, out, err = run_cli(["inspect", root, "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert d["family"] == "deepseek_v4" and d["kernel_layout"] == manifest
    assert d["moe"]["layers"] == ["layers.0.ffn"] and d["expert_bytes"] == 8 * 512 * 128
    rc, out, _ = run_cli(["inspect", root], capsys)
    assert rc == 0 and "converted by mxfp4conv" in out and "aiter_p16_gu16" in out and "[gate; up]" in out


def test_inspect_recognises_a_real_conversion(synth, tmp_path, capsys):
    src = synth("deepseek_v4")
    rc, _, err = run_cli(["convert", src, tmp_path / "out", "--arch", "gfx950", "--tp", "2"], capsys)
    assert rc == 0, err
    rc, out, err = run_cli(["inspect", tmp_path / "out", "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    manifest = json.loads((tmp_path / "out" / "mxfp4conv.json").read_text())
    assert d["kernel_layout"] == manifest and d["family"] == "deepseek_v4" and d["problems"] == []
    assert d["moe"]["layers"] == ["layers.0.ffn", "layers.1.ffn", "mtp.0.ffn"]
    source_json = json.loads(run_cli(["inspect", src, "--json"], capsys)[1])
    # Same non-expert bytes; the experts were re-laid-out per rank (padding may add bytes).
    assert d["bytes"] - d["expert_bytes"] == source_json["bytes"] - source_json["expert_bytes"]
    assert d["expert_bytes"] >= source_json["expert_bytes"]


def test_hundred_shards_read_headers_only(tmp_path, monkeypatch):
    """100 shards whose (sparse) tensor data would be 5.3 GB: inspect reads headers only,
    plus the capped NaN-scale sample."""
    H, I, E = 2048, 2048, 8
    root = tmp_path / "big"
    root.mkdir()
    weight_map, header_bytes, data_bytes = {}, 0, 0
    for layer in range(100):
        entries, off = {}, 0
        for e in range(E):
            for w, n, k in (("w1", I, H), ("w3", I, H), ("w2", H, I)):
                for suffix, dt, shape in (("weight", "I8", [n, k // 2]), ("scale", "F8_E8M0", [n, k // 32])):
                    size = shape[0] * shape[1]
                    entries[f"layers.{layer}.ffn.experts.{e}.{w}.{suffix}"] = {
                        "dtype": dt, "shape": shape, "data_offsets": [off, off + size]}
                    off += size
        shard = f"model-{layer + 1:05d}-of-00100.safetensors"
        hb = json.dumps({"__metadata__": {"format": "pt"}, **entries}).encode()
        with open(root / shard, "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb)
            f.truncate(8 + len(hb) + off)  # sparse: no data blocks on disk
        weight_map.update({n: shard for n in entries})
        header_bytes += 8 + len(hb)
        data_bytes += off
    save_index(root, {"metadata": {"total_size": data_bytes}, "weight_map": weight_map})
    (root / "config.json").write_text(json.dumps({
        "model_type": "deepseek_v4", "expert_dtype": "fp4", "hidden_size": H,
        "moe_intermediate_size": I, "n_routed_experts": E, "num_experts_per_tok": 2,
        "hidden_act": "silu", "swiglu_limit": 10.0}))
    read = []
    real = st.pread_exact
    monkeypatch.setattr(st, "pread_exact", lambda fd, off, n: read.append(n) or real(fd, off, n))
    report = inspect_source(str(root))
    assert report.data["problems"] == [] and len(report.data["moe"]["layers"]) == 100
    assert report.data["bytes"] == data_bytes > 5 * 10**9
    from mxfp4conv.checkpoint.checks import SAMPLE_BYTES

    assert sum(read) <= header_bytes + SAMPLE_BYTES
    assert sum(read) < data_bytes / 1000


def test_duplicate_expert_spellings_reported(synth, tmp_path, capsys):
    root = copy_of(synth("kimi_k3"), tmp_path / "k")
    shard = "model-00002-of-00002.safetensors"
    with safe_open(root / shard, "pt") as f:
        tensors = {n: f.get_tensor(n) for n in f.keys()}
    packed = "language_model.model.layers.2.block_sparse_moe.experts.5.w3.weight_packed"
    alias = packed.replace("weight_packed", "weight")  # the spelling vLLM renames it to
    tensors[alias] = tensors[packed].clone()
    save_file(tensors, str(root / shard), metadata={"format": "pt"})
    index = load_index(root)
    index["weight_map"][alias] = shard
    save_index(root, index)
    rc, out, err = run_cli(["inspect", root, "--json", "--full"], capsys)
    msgs = [p["message"] for p in json.loads(out)["problems"]]
    assert rc == 1 and any("duplicate expert tensors" in m and alias in m and packed in m for m in msgs)
