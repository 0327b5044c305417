"""Every bad input gives exit status 1, one clear paragraph, no traceback, and leaves the
source exactly as it was."""

import json
import os
import struct
import subprocess
import sys

import pytest

from checkpoint_fixtures import copy_of, load_index, raw_shard, rewrite_header, run_cli, save_index, synth, tree_digest  # noqa: F401

SHARD = "model-00002-of-00002.safetensors"


def _truncate(root):
    p = root / SHARD
    p.write_bytes(p.read_bytes()[:-100])


def _garbage(root):
    (root / SHARD).write_bytes(struct.pack("<Q", 64) + os.urandom(64) + b"\0" * 32)


def _oversized(root):
    p = root / SHARD
    p.write_bytes(struct.pack("<Q", 1 << 40) + p.read_bytes()[8:])


def _not_object(root):
    raw_shard(root / SHARD, b'["a", "list", "not", "an", "object"]')


def _overlap(root):
    def fn(h):
        names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
        a, b = h[names[3]], h[names[4]]
        size = b["data_offsets"][1] - b["data_offsets"][0]
        b["data_offsets"] = [a["data_offsets"][0], a["data_offsets"][0] + size]
    rewrite_header(root / SHARD, fn)


def _past_end(root):
    def fn(h):
        last = max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][1])
        b, e = h[last]["data_offsets"]
        h[last]["data_offsets"] = [b + 64, e + 64]
        h[last]["shape"] = h[last]["shape"]
    rewrite_header(root / SHARD, fn)


def _index_edit(value):
    def fn(root):
        index = load_index(root)
        first = next(iter(index["weight_map"]))
        index["weight_map"][first] = value
        save_index(root, index)
    return fn


def _missing_shard(root):
    (root / SHARD).unlink()


def _symlink_out(root):
    outside = root.parent / "outside.safetensors"
    (root / SHARD).rename(outside)
    (root / SHARD).symlink_to(outside)


def _no_family(root):
    cfg = json.loads((root / "config.json").read_text())
    cfg.update(model_type="mistral")
    cfg.pop("quantization_config")
    (root / "config.json").write_text(json.dumps(cfg))


def _index_not_json(root):
    (root / "model.safetensors.index.json").write_text('{"weight_map": {"a": ')


CASES = {
    "truncated shard": (_truncate, [SHARD, "truncated"]),
    "garbage header": (_garbage, [SHARD, "not valid UTF-8 JSON"]),
    "oversized header": (_oversized, [SHARD, "limit"]),
    "header not an object": (_not_object, [SHARD, "not an object"]),
    "overlapping offsets": (_overlap, [SHARD, "overlaps"]),
    "offsets past the file": (_past_end, [SHARD, "truncated"]),
    "missing shard": (_missing_shard, ["model.safetensors.index.json", SHARD, "does not exist"]),
    "index ../ path": (_index_edit("../x.safetensors"), ["'../x.safetensors'", "outside the checkpoint directory"]),
    "index absolute path": (_index_edit("/etc/hosts"), ["'/etc/hosts'", "outside the checkpoint directory"]),
    "symlink out": (_symlink_out, [SHARD, "symbolic link leading outside"]),
    "no family": (_no_family, ["config.json", "'mistral'", "matches no supported"]),
    "index not JSON": (_index_not_json, ["model.safetensors.index.json", "not valid JSON"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_clean_error(synth, tmp_path, capsys, case):
    breaker, needles = CASES[case]
    root = copy_of(synth("quark"), tmp_path / "src")
    breaker(root)
    before = tree_digest(root)
    outside_before = sorted(p.name for p in tmp_path.iterdir())
    for args in (["inspect", root], ["inspect", root, "--json"]):
        rc, out, err = run_cli(args, capsys)
        assert rc == 1, (case, out, err)
        assert err.startswith("error:") and "Traceback" not in err and "\n\n" not in err.strip()
        flat = " ".join(err.split())
        for needle in needles:
            assert needle in flat, (case, needle, flat)
    assert tree_digest(root) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == outside_before


def test_console_script_has_no_traceback(synth, tmp_path):
    root = copy_of(synth("gpt_oss"), tmp_path / "src")
    (root / "model-00001-of-00001.safetensors").write_bytes(b"\x00" * 5)
    proc = subprocess.run([sys.executable, "-m", "mxfp4conv", "inspect", str(root)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "Traceback" not in proc.stderr and "model-00001-of-00001.safetensors" in proc.stderr
    assert "too short" in " ".join(proc.stderr.split())


def test_example_refuses_existing_output(tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    rc, _, err = run_cli(["example", "kimi_k3", out], capsys)
    assert rc == 1 and "not an empty directory" in " ".join(err.split()) and "Traceback" not in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    rc, _, err = run_cli(["example", "nope", tmp_path / "x"], capsys)
    assert rc == 2 and "'nope' is not one of kimi_k3" in " ".join(err.split()) and not (tmp_path / "x").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]  # no partial directory left behind


@pytest.mark.parametrize("family, scheme", [("kimi_k3", None), ("quark", "w_mxfp4_a_fp8")])
def test_example_command_writes_a_checkpoint(tmp_path, capsys, family, scheme):
    args = ["example", family, tmp_path / "ex"] + (["--scheme", scheme] if scheme else [])
    rc, out, err = run_cli(args, capsys)
    assert rc == 0, err
    rc, out, err = run_cli(["inspect", tmp_path / "ex", "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["family"] == family and d["quant_scheme"] == (scheme or "w_mxfp4")
