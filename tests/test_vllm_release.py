"""The vLLM release is a named input of the decision: recorded by convert, checked at load."""

from __future__ import annotations

import json

import pytest

from mxfp4conv.checkpoint.synthetic import make_checkpoint
from checkpoint_fixtures import run_cli
from mxfp4conv.convert.manifest import MANIFEST_NAME
from mxfp4conv.errors import CheckpointError
from mxfp4conv.oracle.releases import RELEASES, resolve_release
from mxfp4conv.runtime import load_moe_layers


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    src = make_checkpoint("deepseek_v4", root / "src", seed=5)
    out = root / "out"
    from mxfp4conv.commands.convert import target_from_options
    from mxfp4conv.convert import convert

    convert(src, out, target_from_options("cpu", 1, False, "auto", False, None, vllm="0.33"),
            progress="none")
    return out


def test_convert_records_the_release(converted):
    m = json.loads((converted / MANIFEST_NAME).read_text())
    assert m["vllm"] == RELEASES["0.33"] == "0.33.0"
    assert m["target"]["request"]["vllm"] == "0.33"
    assert load_moe_layers(converted, rank=0, backend="torch")


def test_loader_refuses_another_release(converted, tmp_path):
    import shutil

    copy = tmp_path / "other"
    shutil.copytree(converted, copy)
    m = json.loads((copy / MANIFEST_NAME).read_text())
    m["vllm"] = "0.32.0"
    (copy / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(CheckpointError) as e:
        load_moe_layers(copy, rank=0, backend="torch")
    text = str(e.value)
    assert "vLLM 0.32.0" in text and "0.33.0" in text and MANIFEST_NAME in text and "\n" not in text


@pytest.mark.parametrize("edit", ["absent", None, ""])
def test_a_manifest_without_the_release_is_refused(converted, tmp_path, capsys, edit):
    import shutil

    copy = tmp_path / "old"
    shutil.copytree(converted, copy)
    m = json.loads((copy / MANIFEST_NAME).read_text())
    if edit == "absent":
        del m["vllm"]
    else:
        m["vllm"] = edit
    (copy / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(CheckpointError) as e:
        load_moe_layers(copy, rank=0, backend="torch")
    text = str(e.value)
    assert "does not name the vLLM release" in text and MANIFEST_NAME in text and "convert the source again" in text.lower()
    rc, _, err = run_cli(["verify", str(copy)], capsys)
    assert rc == 1 and "does not name the vLLM release" in " ".join(err.split()) and "Traceback" not in err


def test_convert_refuses_unknown_release(tmp_path, capsys):
    src = make_checkpoint("deepseek_v4", tmp_path / "src", seed=5)
    rc, _, err = run_cli(["convert", str(src), str(tmp_path / "out"), "--arch", "cpu", "--vllm", "0.40"],
                         capsys)
    assert rc == 1 and "Unknown --vllm release '0.40'" in " ".join(err.split()) and "Traceback" not in err
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


@pytest.mark.parametrize("value,want", [(None, "0.33"), ("0.33", "0.33"), ("0.33.0", "0.33"),
                                        ("v0.33", "0.33")])
def test_release_names(value, want):
    assert resolve_release(value) == want
