"""``mxfp4conv example`` through the console script: repeatable with --force, --json."""

import hashlib
import json

from console import mxfp4conv


def digest(root):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def test_example_again_needs_force_and_force_replaces_it(tmp_path):
    out = tmp_path / "demo"
    assert mxfp4conv("example", "kimi_k3", out, cwd=tmp_path).returncode == 0
    first = digest(out)
    r = mxfp4conv("example", "kimi_k3", out, "--seed", "1")
    assert r.returncode == 1 and "--force" in r.stderr and "Traceback" not in r.stderr
    assert digest(out) == first
    r = mxfp4conv("example", "kimi_k3", out, "--seed", "1", "--force")
    assert r.returncode == 0, r.stderr
    second = digest(out)
    assert second.keys() == first.keys() and second != first  # new weights, same files
    assert [p.name for p in tmp_path.iterdir()] == ["demo"]  # no temporary directory left


def test_force_never_replaces_a_directory_that_is_not_a_checkpoint(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    r = mxfp4conv("example", "kimi_k3", out, "--force")
    assert r.returncode == 1 and "config.json" in r.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_example_json(tmp_path):
    r = mxfp4conv("example", "quark", tmp_path / "q", "--scheme", "w_mxfp4_a_fp8", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["family"] == "quark" and d["scheme"] == "w_mxfp4_a_fp8"
    got = json.loads(mxfp4conv("inspect", d["path"], "--json").stdout)
    assert got["family"] == "quark" and got["quant_scheme"] == "w_mxfp4_a_fp8"
