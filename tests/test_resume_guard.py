"""--resume finishes only the conversion OUT already holds: any other source, target, parallel
layout, shard size or format is refused before a byte of OUT changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkpoint_fixtures import copy_of, run_cli, synth, tree_digest  # noqa: F401
from mxfp4conv.convert.run import INDEX_RECORD, PROGRESS_NAME
from console import one_paragraph_error


def drop_record(out: Path) -> None:
    """Remove a finished conversion's record (kept in the index's metadata)."""
    p = out / "model.safetensors.index.json"
    index = json.loads(p.read_text())
    del index["metadata"][INDEX_RECORD]
    p.write_text(json.dumps(index))


def test_resume_into_another_models_output_is_refused(synth, tmp_path, capsys):
    a, b, out = synth("gpt_oss"), synth("kimi_k3"), tmp_path / "OUT"
    assert run_cli(["convert", a, out, "--arch", "sm90", "-q"], capsys)[0] == 0
    before = tree_digest(out)
    rc, _, err = run_cli(["convert", b, out, "--arch", "gfx950", "--resume"], capsys)
    one_paragraph_error(rc, err, "source.family: gpt_oss in OUT, kimi_k3 now",
                        "target.arch: sm90 in OUT, gfx950 now", "Nothing in", "--force",
                        "another output directory")
    assert tree_digest(out) == before
    assert run_cli(["verify", out, "--source", a], capsys)[0] == 0


def test_resume_for_another_arch_is_refused(synth, tmp_path, capsys):
    a, out = synth("gpt_oss"), tmp_path / "OUT"
    assert run_cli(["convert", a, out, "--arch", "sm90", "-q"], capsys)[0] == 0
    before = tree_digest(out)
    rc, _, err = run_cli(["convert", a, out, "--arch", "gfx950", "--resume"], capsys)
    one_paragraph_error(rc, err, "target.arch: sm90 in OUT, gfx950 now")
    assert "source." not in " ".join(err.split()).split("differs from it:")[1].split(".")[0]
    assert tree_digest(out) == before


def _interrupted(monkeypatch, capsys, src, out, *args):
    """A conversion stopped by Ctrl-C as soon as its first finished shard is recorded."""
    import mxfp4conv.convert.run as run

    real_save = run._save_progress

    def save(out_dir, record):
        real_save(out_dir, record)
        if record["shards"]:  # a shard is finished and recorded
            raise KeyboardInterrupt
    monkeypatch.setattr(run, "_save_progress", save)
    rc, _, err = run_cli(["convert", src, out, *args], capsys)
    monkeypatch.setattr(run, "_save_progress", real_save)
    assert rc == 130, err
    finished = json.loads((out / PROGRESS_NAME).read_text())["shards"]
    assert finished and all((out / n).is_file() for n in finished)
    return finished


def test_interrupted_tp8_then_resume_tp4_keeps_the_tp8_shards(synth, tmp_path, capsys, monkeypatch):
    src, out = synth("deepseek_v4"), tmp_path / "OUT"
    tp8 = ["--arch", "gfx950", "--tp", "8", "--shard-size", "100KB"]
    finished = _interrupted(monkeypatch, capsys, src, out, *tp8)
    before = tree_digest(out)
    rc, _, err = run_cli(["convert", src, out, "--arch", "gfx950", "--tp", "4", "--shard-size", "100KB",
                          "--resume"], capsys)
    one_paragraph_error(rc, err, "target.tp: 8 in OUT, 4 now")
    assert tree_digest(out) == before
    rc, _, err = run_cli(["convert", src, out, *tp8, "--resume"], capsys)
    assert rc == 0, err
    flat = " ".join(err.split())
    assert f"keeping {len(finished)} of" in flat and "writing" in flat, flat
    assert all(tree_digest(out)[n] == before[n] for n in finished)  # kept, not rewritten
    assert run_cli(["verify", out, "--source", src], capsys)[0] == 0


def test_resume_with_another_shard_size_is_refused(synth, tmp_path, capsys, monkeypatch):
    src, out = synth("kimi_k3"), tmp_path / "OUT"
    _interrupted(monkeypatch, capsys, src, out, "--arch", "gfx950", "--tp", "2", "--shard-size", "100KB")
    before = tree_digest(out)
    rc, _, err = run_cli(["convert", src, out, "--arch", "gfx950", "--tp", "2", "--shard-size", "200KB",
                          "--resume"], capsys)
    one_paragraph_error(rc, err, "shard_size: 100000 in OUT, 200000 now")
    assert tree_digest(out) == before


def test_resume_of_another_mxfp4conv_version_is_refused(synth, tmp_path, capsys, monkeypatch):
    import mxfp4conv.convert.manifest as manifest

    src, out = synth("kimi_k3"), tmp_path / "OUT"
    _interrupted(monkeypatch, capsys, src, out, "--arch", "gfx950", "--shard-size", "100KB")
    before = tree_digest(out)
    monkeypatch.setattr(manifest, "VERSION", manifest.VERSION + 1)
    rc, _, err = run_cli(["convert", src, out, "--arch", "gfx950", "--shard-size", "100KB", "--resume"], capsys)
    one_paragraph_error(rc, err, f"version: {manifest.VERSION - 1} in OUT, {manifest.VERSION} now")
    assert tree_digest(out) == before


def test_resume_without_a_record_is_refused_when_shards_are_there(synth, tmp_path, capsys):
    src, out = synth("kimi_k3"), tmp_path / "OUT"
    assert run_cli(["convert", src, out, "--arch", "gfx950", "-q"], capsys)[0] == 0
    drop_record(out)
    (out / "mxfp4conv.json").unlink()
    before = tree_digest(out)
    rc, _, err = run_cli(["convert", src, out, "--arch", "gfx950", "--resume"], capsys)
    one_paragraph_error(rc, err, "cannot tell which conversion wrote the shards", "--force")
    assert tree_digest(out) == before


def test_finished_output_without_its_record_is_compared_by_manifest(synth, tmp_path, capsys):
    src, out = synth("kimi_k3"), tmp_path / "OUT"
    assert run_cli(["convert", src, out, "--arch", "gfx950", "-q"], capsys)[0] == 0
    drop_record(out)
    before = tree_digest(out)
    rc, _, err = run_cli(["convert", src, out, "--arch", "sm90", "--resume"], capsys)
    one_paragraph_error(rc, err, "target.arch: gfx950 in OUT, sm90 now")
    assert tree_digest(out) == before
    rc, _, err = run_cli(["convert", src, out, "--arch", "gfx950", "--resume"], capsys)  # same: rewritten
    assert rc == 0, err
    after = tree_digest(out)
    index = "model.safetensors.index.json"  # written again, with the record
    assert {k: v for k, v in after.items() if k != index} == {k: v for k, v in before.items() if k != index}


def test_a_finished_output_holds_no_hidden_file_and_resumes_from_its_index(synth, tmp_path, capsys):
    src, out = synth("kimi_k3"), tmp_path / "OUT"
    assert run_cli(["convert", src, out, "--arch", "gfx950", "--tp", "2", "-q"], capsys)[0] == 0
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
    before = tree_digest(out)
    rc, _, err = run_cli(["convert", src, out, "--arch", "gfx950", "--tp", "2", "--resume"], capsys)
    # the shared tensors' shard and one shard per rank
    n = len(set(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"].values()))
    assert rc == 0 and n == 3 and f"keeping {n} of {n} shards" in " ".join(err.split()), err
    assert tree_digest(out) == before and not (out / PROGRESS_NAME).exists()
    assert run_cli(["verify", out], capsys)[0] == 0  # the shard checksums, from the index


def test_force_with_resume_keeps_the_same_conversion_and_replaces_another(synth, tmp_path, capsys, monkeypatch):
    src, out = synth("kimi_k3"), tmp_path / "OUT"
    args = ["--arch", "gfx950", "--tp", "2", "--shard-size", "100KB"]
    finished = _interrupted(monkeypatch, capsys, src, out, *args)
    rc, _, err = run_cli(["convert", src, out, *args, "--resume", "--force"], capsys)
    assert rc == 0 and f"keeping {len(finished)} of" in " ".join(err.split()), err
    rc, _, err = run_cli(["convert", src, out, "--arch", "sm90", "--resume", "--force", "-q"], capsys)
    assert rc == 0, err
    assert json.loads((out / "mxfp4conv.json").read_text())["target"]["arch"] == "sm90"
    assert run_cli(["verify", out, "--source", src], capsys)[0] == 0
