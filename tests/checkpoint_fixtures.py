"""Helpers for the checkpoint tests: synthetic checkpoints, hand-made shards, the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from mxfp4conv.checkpoint.safetensors_io import read_header
from mxfp4conv.checkpoint.synthetic import make_checkpoint

CASES = [("kimi_k3", None), ("deepseek_v4", None), ("quark", "w_mxfp4"),
         ("quark", "w_mxfp4_a_mxfp4"), ("quark", "w_mxfp4_a_fp8"), ("gpt_oss", None)]


@pytest.fixture(scope="session")
def synth(tmp_path_factory):
    """synth(family, scheme=None, **kw) -> a cached read-only-by-convention checkpoint."""
    # Kept on disk under the session's base temp dir, so every test module shares them.
    cache = tmp_path_factory.getbasetemp() / "synthetic-checkpoints"

    def get(family: str, scheme: str | None = None, **kw) -> Path:
        key = "-".join([family, scheme or "default"] + [f"{k}={v}" for k, v in sorted(kw.items())])
        path = cache / key
        if not path.exists():
            make_checkpoint(family, path, scheme=scheme, **kw)
        return path

    return get


def patch_tensor_byte(out: Path, name: str, offset: int, xor: int = 0x01) -> None:
    """XOR one byte of tensor ``name`` of the checkpoint ``out`` in place."""
    wm = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    b, _ = read_header(out / wm[name]).absolute(name)
    with open(out / wm[name], "r+b") as f:
        f.seek(b + offset)
        x = f.read(1)[0]
        f.seek(b + offset)
        f.write(bytes([x ^ xor]))


def copy_of(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def raw_shard(path: Path, header: dict | bytes, data: bytes = b"", *, length: int | None = None) -> Path:
    """A shard with exactly this header (dict -> JSON) and data, no validation."""
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(hb) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + hb + data)
    return path


def tree_digest(root: Path) -> dict[str, str]:
    """Every file (and symlink target) under root with its sha256: to prove nothing changed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for f in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = Path(dirpath) / f
            rel = p.relative_to(root).as_posix()
            out[rel] = ("link:" + os.readlink(p)) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """Run the mxfp4conv CLI in-process; returns (exit status, stdout, stderr)."""
    from mxfp4conv.cli import main

    capsys.readouterr()
    try:
        main([str(a) for a in args])
        rc = 0
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


def load_index(root: Path) -> dict:
    return json.loads((root / "model.safetensors.index.json").read_text())


def save_index(root: Path, index: dict) -> None:
    (root / "model.safetensors.index.json").write_text(json.dumps(index))


def rewrite_header(path: Path, fn) -> None:
    """Apply ``fn`` to a shard's parsed header (a dict) and write it back over the same data."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    fn(header)
    raw_shard(path, header, raw[8 + n:])
