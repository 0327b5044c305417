"""verify (library and CLI) and the convert command line."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint_fixtures import patch_tensor_byte
from mxfp4conv.checkpoint import load_model, open_source
from mxfp4conv.checkpoint.synthetic import make_checkpoint
from mxfp4conv.convert.run import convert
from mxfp4conv.convert.verify import VerifyError, verify
from mxfp4conv.oracle.decision import Target


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "mxfp4conv", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_checkpoint("quark", tmp_path_factory.mktemp("s") / "quark", scheme="w_mxfp4_a_fp8",
                           hidden=128, intermediate=128, num_experts=4, seed=9)


@pytest.fixture(scope="module")
def converted(src, tmp_path_factory):
    out = tmp_path_factory.mktemp("c") / "out"
    r = cli("convert", src, out, "--arch", "mi355x", "--tp", "2", "--shard-size", "100KB")
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture
def copy(converted, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(converted, d)
    return d


def test_cli_convert_is_quiet_without_tty_and_verify_passes(src, converted):
    r = cli("verify", converted, "--source", src, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    model = load_model(open_source(str(src)))
    assert rep["ok"] and rep["error"] is None
    assert [x["prefix"] for x in rep["layers"]] == [layer.prefix for layer in model.layers]
    assert all(x["status"] == "ok" and x["bytes"] > 0 for x in rep["layers"])
    manifest = json.loads((converted / "mxfp4conv.json").read_text())
    assert manifest["target"]["arch"] == "gfx950" and manifest["target"]["tp"] == 2
    assert manifest["moe"]["static_input_scales"] and manifest["pad_bytes"]["scale"] == 1


def test_cli_progress_lines_and_quiet(src, tmp_path):
    r = cli("convert", src, tmp_path / "a", "--arch", "gfx942")
    assert r.returncode == 0 and "finished model-00001-of-" in r.stderr and "converted" in r.stderr
    r = cli("convert", src, tmp_path / "b", "--arch", "gfx942", "--quiet")
    assert r.returncode == 0 and r.stderr == "" and r.stdout == ""


def test_cli_errors_are_one_paragraph(src, converted, tmp_path):
    r = cli("convert", src, converted, "--arch", "gfx950")
    assert r.returncode == 1 and "not empty" in r.stderr and "Traceback" not in r.stderr
    r = cli("convert", src, tmp_path / "x", "--arch", "gfx950", "--tp", "3")
    assert r.returncode == 1 and r.stderr.startswith("error:") and "Traceback" not in r.stderr
    assert not (tmp_path / "x").exists()
    r = cli("convert", src, tmp_path / "y", "--arch", "nosuchgpu")
    assert r.returncode == 2 and "--arch" in r.stderr and "Traceback" not in r.stderr  # usage
    r = cli("verify", tmp_path / "nothing-here")
    assert r.returncode == 1 and "Traceback" not in r.stderr


def test_structure_only_verify(converted):
    rep = verify(converted)
    assert rep.ok and "index and shard headers" in rep.checks and rep.bytes_compared == 0


def test_missing_manifest_means_unfinished(copy):
    (copy / "mxfp4conv.json").unlink()
    with pytest.raises(VerifyError, match="did not finish"):
        verify(copy)


def pad_offset(manifest: dict) -> int:
    """Byte offset, in a stored rank tensor w13_weight, of a byte that is vLLM padding
    (found by pushing a marker through the layout itself)."""
    import torch

    from mxfp4conv.shuffle.layouts import get_layout

    m = manifest["moe"]
    H, Hp, Ir, Ip = m["hidden"], m["hidden_padded"], m["intermediate_per_rank"], m["intermediate_per_rank_padded"]
    x = torch.zeros((m["experts_per_rank"], 2 * Ip, Hp // 2), dtype=torch.uint8)
    assert Hp > H or Ip > Ir, "the fixture must have padding"
    if Hp > H:
        x[-1, :, H // 2:] = 1
    else:
        x[-1, Ir:Ip] = 1
    y = get_layout(manifest["layout"]["w13"]).forward(x).reshape(-1)
    return int((y == 1).nonzero()[-1, 0])


def test_flipped_pad_byte_is_found(tmp_path):
    # Kimi-K3 at tp 2: I per rank 64 is padded to 256 (the model-level rule), shuffled by aiter_p16
    k3 = make_checkpoint("kimi_k3", tmp_path / "k3", hidden=128, intermediate=128, num_experts=4)
    out = tmp_path / "out"
    convert(str(k3), out, Target(arch="gfx950", tp=2), progress="none")
    manifest = json.loads((out / "mxfp4conv.json").read_text())
    assert manifest["layout"]["w13"] == "aiter_p16"
    prefix = manifest["moe"]["layers"][0]
    name = f"{prefix}.experts.rank1.w13_weight"
    patch_tensor_byte(out, name, pad_offset(manifest))
    r = cli("verify", out, "--source", k3, "--json")
    assert r.returncode == 1
    err = json.loads(r.stdout)["error"]
    assert err["class"] == "pad bytes" and err["tensor"] == name and err["rank"] == 1 and err["layer"] == prefix
    assert err["expert"] == 3 and "expected 0x00" in err["message"]


def test_flipped_input_scale_is_found(src, copy):
    model = load_model(open_source(str(src)))
    name = f"{model.layers[-1].prefix}.experts.rank0.w2_input_scale"
    patch_tensor_byte(copy, name, 4 * 2 + 1)  # expert 2
    with pytest.raises(VerifyError) as ei:
        verify(copy, str(src))
    assert ei.value.where["tensor"] == name and ei.value.where["expert"] == 2


def test_flipped_non_expert_byte_is_found(src, copy):
    wm = json.loads((copy / "model.safetensors.index.json").read_text())["weight_map"]
    name = next(n for n in sorted(wm) if ".experts." not in n)
    patch_tensor_byte(copy, name, 3)
    with pytest.raises(VerifyError) as ei:  # without the source: the recorded checksums
        verify(copy)
    assert ei.value.cls == "checksum" and ei.value.where == {"shard": wm[name]}
    with pytest.raises(VerifyError) as ei:
        verify(copy, str(src))
    assert ei.value.cls == "tensor bytes" and ei.value.where == {"tensor": name, "offset": 3}


def test_flipped_expert_byte_is_found_without_the_source(copy):
    wm = json.loads((copy / "model.safetensors.index.json").read_text())["weight_map"]
    name = next(n for n in sorted(wm) if ".experts.rank" in n and n.endswith("w2_weight"))
    patch_tensor_byte(copy, name, 100)
    with pytest.raises(VerifyError) as ei:
        verify(copy)
    assert ei.value.cls == "checksum" and wm[name] in str(ei.value) and "changed since convert" in str(ei.value)


def test_verify_without_record_checks_expert_bytes_by_the_manifest(copy):
    from mxfp4conv.convert.run import INDEX_RECORD

    index = json.loads((copy / "model.safetensors.index.json").read_text())
    del index["metadata"][INDEX_RECORD]  # a finished conversion's record of the shard checksums
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    rep = verify(copy)
    assert rep.ok and any("other tensors not checked" in c for c in rep.checks)
    wm = json.loads((copy / "model.safetensors.index.json").read_text())["weight_map"]
    name = next(n for n in sorted(wm) if ".experts.rank" in n and n.endswith("w13_weight_scale"))
    patch_tensor_byte(copy, name, 3)
    with pytest.raises(VerifyError) as ei:
        verify(copy)
    assert ei.value.cls == "checksum" and name in str(ei.value) and "mxfp4conv.json records" in str(ei.value)


def test_manifest_tampering_is_found(src, copy):
    m = json.loads((copy / "mxfp4conv.json").read_text())
    m["moe"]["top_k"] += 1
    (copy / "mxfp4conv.json").write_text(json.dumps(m))
    with pytest.raises(VerifyError, match="stamped in __metadata__ differs"):
        verify(copy)


def test_truncated_shard_is_found(copy):
    shard = sorted(copy.glob("model-*.safetensors"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[:-10])
    with pytest.raises(Exception) as ei:
        verify(copy)
    assert shard.name in str(ei.value)


def test_unknown_manifest_version_refused(copy):
    m = json.loads((copy / "mxfp4conv.json").read_text())
    m["version"] = 99
    (copy / "mxfp4conv.json").write_text(json.dumps(m))
    r = cli("verify", copy)
    assert r.returncode == 1 and "version 99" in r.stderr


def test_verify_against_a_different_source(copy, tmp_path):
    other = make_checkpoint("quark", tmp_path / "other", scheme="w_mxfp4_a_fp8", hidden=128,
                            intermediate=128, num_experts=4, seed=10)
    # same names and shapes (so the same index hash), different bytes
    with pytest.raises(VerifyError) as ei:
        verify(copy, str(other))
    assert ei.value.cls == "tensor bytes" and ei.value.where["offset"] >= 0


def test_stored_header_length_is_consistent(converted):
    for p in converted.glob("model-*.safetensors"):
        raw = p.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        assert n % 8 == 0
        json.loads(raw[8:8 + n])
