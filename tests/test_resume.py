"""Interrupted conversions: no final-named partial file, and --resume ends byte-identical."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mxfp4conv.checkpoint.synthetic import make_checkpoint
from mxfp4conv.convert import run as run_mod
from mxfp4conv.convert.run import PROGRESS_NAME, convert
from mxfp4conv.convert.verify import verify
from mxfp4conv.convert.writer import ShardWriter
from mxfp4conv.errors import Mxfp4convError
from mxfp4conv.oracle.decision import Target

TARGET = Target(arch="gfx950", tp=2)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_checkpoint("deepseek_v4", tmp_path_factory.mktemp("s") / "dsv4", hidden=128,
                           intermediate=128, num_experts=6, seed=5)


def shard_size(src: Path) -> int:
    return sum(p.stat().st_size for p in src.glob("*.safetensors")) // 6


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "out"
    convert(str(src), out, TARGET, shard_size=shard_size(src), progress="none", chunk_bytes=20_000)
    return out


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def assert_same(a: Path, b: Path) -> None:
    fa, fb = files(a), files(b)
    assert sorted(fa) == sorted(fb)
    for k in fa:
        assert fa[k] == fb[k], k


def count_writes(src: Path, tmp: Path) -> int:
    n = {"n": 0}
    real = ShardWriter.write_at

    def counting(self, name, offset, chunk):
        n["n"] += 1
        return real(self, name, offset, chunk)

    ShardWriter.write_at = counting
    try:
        convert(str(src), tmp, TARGET, shard_size=shard_size(src), progress="none", chunk_bytes=20_000)
    finally:
        ShardWriter.write_at = real
    return n["n"]


def no_unfinished_final_files(out: Path, plan_shards: dict) -> None:
    """Every final-named shard present is complete (size matches its recorded plan size)."""
    for p in out.glob("model-*.safetensors"):
        assert p.name in plan_shards, p.name
        assert p.stat().st_size == plan_shards[p.name]["size"], p.name


@pytest.mark.parametrize("fraction", [0.0, 0.35, 0.7, 0.999])
def test_exception_mid_write_then_resume(src, reference, tmp_path, monkeypatch, fraction):
    total = count_writes(src, tmp_path / "count")
    fail_at = max(1, int(total * fraction))
    calls = {"n": 0}
    real = ShardWriter.write_at

    def failing(self, name, offset, chunk):
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise OSError(28, "No space left on device (injected)")
        return real(self, name, offset, chunk)

    out = tmp_path / "out"
    monkeypatch.setattr(ShardWriter, "write_at", failing)
    with pytest.raises(OSError):
        convert(str(src), out, TARGET, shard_size=shard_size(src), progress="none", chunk_bytes=20_000)
    monkeypatch.setattr(ShardWriter, "write_at", real)
    assert not (out / "mxfp4conv.json").exists()  # visibly unfinished
    assert not list(out.glob(".*partial"))  # temp files were removed
    record = json.loads((out / PROGRESS_NAME).read_text())
    no_unfinished_final_files(out, record["shards"])
    finished = len(record["shards"])

    with pytest.raises(Mxfp4convError, match="not empty"):
        convert(str(src), out, TARGET, shard_size=shard_size(src), progress="none")
    res = convert(str(src), out, TARGET, shard_size=shard_size(src), progress="none", resume=True,
                  chunk_bytes=20_000)
    assert len(res.kept) == finished
    if fraction > 0.5:
        assert finished > 0
    assert_same(out, reference)
    assert verify(out, str(src)).ok


def test_disk_full_is_a_clean_error_and_resume_finishes(src, reference, tmp_path, monkeypatch):
    real = os.pwrite
    calls = {"n": 0}

    def pwrite(fd, data, off):
        calls["n"] += 1
        if calls["n"] == 40:
            raise OSError(28, "No space left on device")
        return real(fd, data, off)

    out = tmp_path / "out"
    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(Mxfp4convError, match="disk is full"):
        convert(str(src), out, TARGET, shard_size=shard_size(src), progress="none", chunk_bytes=20_000)
    monkeypatch.setattr(os, "pwrite", real)
    assert not list(out.glob(".*partial")) and not (out / "mxfp4conv.json").exists()
    convert(str(src), out, TARGET, shard_size=shard_size(src), progress="none", resume=True, chunk_bytes=20_000)
    assert_same(out, reference)


def test_interrupted_before_manifest(src, reference, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real = run_mod._atomic_write

    def fail_on_manifest(path, data):
        if path.name == "mxfp4conv.json":
            raise KeyboardInterrupt
        return real(path, data)

    monkeypatch.setattr(run_mod, "_atomic_write", fail_on_manifest)
    with pytest.raises(KeyboardInterrupt):
        convert(str(src), out, TARGET, shard_size=shard_size(src), progress="none", chunk_bytes=20_000)
    monkeypatch.setattr(run_mod, "_atomic_write", real)
    assert not (out / "mxfp4conv.json").exists()
    res = convert(str(src), out, TARGET, shard_size=shard_size(src), progress="none", resume=True)
    assert len(res.kept) == len(res.shards)  # nothing rewritten
    assert_same(out, reference)


def test_resume_redoes_a_corrupted_finished_shard(src, reference, tmp_path):
    out = tmp_path / "out"
    convert(str(src), out, TARGET, shard_size=shard_size(src), progress="none")
    victim = sorted(out.glob("model-*.safetensors"))[1]
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))
    (out / "mxfp4conv.json").unlink()
    res = convert(str(src), out, TARGET, shard_size=shard_size(src), progress="none", resume=True)
    assert victim.name not in res.kept and len(res.kept) == len(res.shards) - 1
    assert_same(out, reference)


def test_resume_with_other_options_is_refused_and_touches_nothing(src, tmp_path):
    out = tmp_path / "out"
    convert(str(src), out, TARGET, shard_size=shard_size(src), progress="none")
    before = files(out)
    other = Target(arch="gfx942", tp=1)
    with pytest.raises(Mxfp4convError, match=r"target\.arch: gfx950 in OUT, gfx942 now") as exc:
        convert(str(src), out, other, shard_size=shard_size(src), progress="none", resume=True)
    assert "target.tp: 2 in OUT, 1 now" in str(exc.value) and "--force" in str(exc.value)
    assert files(out) == before
    res = convert(str(src), out, other, shard_size=shard_size(src), progress="none", force=True)
    fresh = tmp_path / "fresh"
    convert(str(src), fresh, other, shard_size=shard_size(src), progress="none")
    assert res.kept == [] and files(out) == files(fresh)


KILLER = textwrap.dedent("""
    import os, signal, sys
    from mxfp4conv.convert.writer import ShardWriter
    from mxfp4conv.convert.run import convert
    from mxfp4conv.oracle.decision import Target

    mode, n = sys.argv[3], int(sys.argv[4])
    count = {"n": 0}
    real_write, real_finish = ShardWriter.write_at, ShardWriter.finish

    def write(self, name, offset, chunk):
        count["n"] += 1
        if mode == "write" and count["n"] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_write(self, name, offset, chunk)

    def finish(self):
        digest = real_finish(self)  # renamed to its final name ...
        count["n"] += 1
        if mode == "finish" and count["n"] == n:
            os.kill(os.getpid(), signal.SIGKILL)  # ... but not yet recorded as finished
        return digest

    if mode == "write":
        ShardWriter.write_at = write
    else:
        ShardWriter.finish = finish
    convert(sys.argv[1], sys.argv[2], Target(arch="gfx950", tp=2), shard_size=int(sys.argv[5]),
            progress="none", chunk_bytes=20_000)
""")


@pytest.mark.parametrize("mode,n", [("write", 3), ("write", 25), ("finish", 2)])
def test_sigkill_then_resume(src, reference, tmp_path, mode, n):
    out = tmp_path / "out"
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    p = subprocess.run([sys.executable, str(script), str(src), str(out), mode, str(n), str(shard_size(src))],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert not (out / "mxfp4conv.json").exists()
    res = convert(str(src), out, TARGET, shard_size=shard_size(src), progress="none", resume=True,
                  chunk_bytes=20_000)
    if mode == "finish":
        # the shard renamed just before the kill was never recorded, so it is redone
        assert len(res.kept) == 1
    assert not list(out.glob(".*partial"))
    assert_same(out, reference)
