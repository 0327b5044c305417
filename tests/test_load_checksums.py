"""The loader, and so the vLLM plugin, checks every expert byte it reads against the crc32 the
manifest records: one flipped byte is refused, naming shard, tensor and rank."""

from __future__ import annotations

import json
import shutil
import warnings
import zlib
from pathlib import Path

import pytest
import torch

from checkpoint_fixtures import patch_tensor_byte, synth  # noqa: F401
from mxfp4conv.convert.run import convert
from mxfp4conv.errors import CheckpointError
from mxfp4conv.integrations.vllm.rank_tensors import read_layer
from mxfp4conv.oracle.decision import Target
from mxfp4conv.runtime.loader import SKIP_CHECKSUMS_ENV, _weight_map, load_moe_layers, read_manifest


@pytest.fixture(scope="module")
def converted(synth, tmp_path_factory):
    out = tmp_path_factory.mktemp("conv") / "out"
    convert(str(synth("kimi_k3")), out, Target(arch="gfx950", tp=2), progress="none")
    return out


@pytest.fixture
def copy(converted, tmp_path):
    return Path(shutil.copytree(converted, tmp_path / "copy"))


def load(root, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_moe_layers(root, **kw)


def weight_map(root: Path) -> dict[str, str]:
    return json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]


def test_manifest_records_the_crc32_of_every_expert_tensor(converted):
    m = json.loads((converted / "mxfp4conv.json").read_text())
    from safetensors import safe_open

    table, wm = m["checksums"]["crc32"], weight_map(converted)
    assert set(table) == {n for n in wm if ".experts.rank" in n} and len(table) > 8
    for name, crc in table.items():  # the stored bytes, as an independent zlib sees them
        with safe_open(str(converted / wm[name]), framework="pt") as f:
            t = f.get_tensor(name)
        assert zlib.crc32(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()) == crc, name


@pytest.mark.parametrize("kind, offset", [("w13_weight", 0), ("w2_weight_scale", 5), ("w2_weight", -1)])
def test_one_flipped_expert_byte_is_refused_at_load(copy, kind, offset):
    wm = weight_map(copy)
    name = sorted(n for n in wm if n.endswith(f".experts.rank1.{kind}"))[-1]
    if offset < 0:
        offset = _nbytes(copy, name) - 1
    patch_tensor_byte(copy, name, offset, xor=0x10)
    with pytest.raises(CheckpointError) as exc:
        load(copy, rank=1)
    msg = str(exc.value)
    assert wm[name] in msg and name in msg and "(rank 1)" in msg and "crc32" in msg
    load(copy, rank=0)  # rank 0 reads none of rank 1's bytes
    layers = load(copy, rank=1, check_checksums=False)  # the opt-out loads what is there
    assert name.rsplit(".experts.", 1)[0] in layers


def _nbytes(root: Path, name: str) -> int:
    from mxfp4conv.checkpoint.safetensors_io import read_header

    return read_header(root / weight_map(root)[name]).tensors[name].nbytes


def test_plugin_reader_refuses_a_flipped_byte_unless_told(copy, monkeypatch):
    manifest, wm = read_manifest(copy), _weight_map(copy)
    prefix = manifest["moe"]["layers"][0]
    before = {k: t.clone() for k, t in read_layer(copy, wm, manifest, prefix, 0).items()}
    patch_tensor_byte(copy, f"{prefix}.experts.rank0.w13_weight_scale", 7)
    with pytest.raises(CheckpointError, match=r"w13_weight_scale \(rank 0\) changed since convert"):
        read_layer(copy, wm, manifest, prefix, 0)
    monkeypatch.setenv(SKIP_CHECKSUMS_ENV, "1")
    after = read_layer(copy, wm, manifest, prefix, 0)
    diff = (after["w13_scale"] != before["w13_scale"]).nonzero()
    assert diff.shape[0] == 1  # exactly the flipped byte, loaded because checking was switched off


def test_env_var_switches_the_check_off_for_load_moe_layers(copy, monkeypatch):
    name = sorted(n for n in weight_map(copy) if n.endswith(".experts.rank0.w2_weight"))[0]
    patch_tensor_byte(copy, name, 1)
    with pytest.raises(CheckpointError):
        load(copy, rank=0)
    monkeypatch.setenv(SKIP_CHECKSUMS_ENV, "1")
    load(copy, rank=0)


def test_manifest_without_checksums_is_refused_unless_told(copy):
    p = copy / "mxfp4conv.json"
    m = json.loads(p.read_text())
    del m["checksums"]
    p.write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="records no crc32 of the expert tensors.*check_checksums=False"):
        load(copy, rank=0)
    assert load(copy, rank=0, check_checksums=False)


def test_edited_checksum_is_refused_by_the_loader_and_verify(copy):
    from mxfp4conv.convert.verify import VerifyError, verify

    p = copy / "mxfp4conv.json"
    m = json.loads(p.read_text())
    name = sorted(m["checksums"]["crc32"])[0]
    m["checksums"]["crc32"][name] ^= 1
    p.write_text(json.dumps(m))
    rank = int(name.split(".experts.rank")[1].split(".")[0])
    with pytest.raises(CheckpointError, match="changed since convert"):
        load(copy, rank=rank)
    with pytest.raises(VerifyError, match="records"):
        verify(copy)


def test_loaded_bytes_are_unchanged_by_the_check(converted):
    a, b = load(converted, rank=0), load(converted, rank=0, check_checksums=False)
    for prefix in a:
        for kind in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"):
            assert torch.equal(getattr(a[prefix], kind), getattr(b[prefix], kind))


@pytest.mark.parametrize("edit", ["drop_other_rank", "add"])
def test_crc32_table_must_name_exactly_the_expert_tensors(copy, edit):
    p = copy / "mxfp4conv.json"
    m = json.loads(p.read_text())
    table = m["checksums"]["crc32"]
    if edit == "add":
        table["model.layers.1.mlp.experts.rank9.w13_weight"] = 1
    else:
        del table[sorted(n for n in table if ".experts.rank1." in n)[0]]
    p.write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="crc32 table"):
        load(copy, rank=0)
    wm, manifest = _weight_map(copy), read_manifest(copy)
    with pytest.raises(CheckpointError, match="crc32 table"):
        read_layer(copy, wm, manifest, manifest["moe"]["layers"][0], 0)


def test_verify_with_the_source_checks_the_crc32_table(synth, copy):
    from mxfp4conv.convert.verify import VerifyError, verify

    src = str(synth("kimi_k3"))
    rep = verify(copy, src)
    assert rep.ok and any("crc32 of" in c for c in rep.checks)
    p = copy / "mxfp4conv.json"
    m = json.loads(p.read_text())
    name = sorted(m["checksums"]["crc32"])[-1]
    m["checksums"]["crc32"][name] ^= 0x100
    p.write_text(json.dumps(m))
    with pytest.raises(VerifyError, match=f"records crc32 .* for {name}"):
        verify(copy, src)
