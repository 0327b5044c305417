import errno
import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mxfp4conv.convert.writer import (
    ShardWriter, TensorSpec, WriteError, build_header, shard_checksum, write_safetensors,
)


def chunks_of(t: torch.Tensor, n: int):
    flat = t.contiguous().reshape(-1).view(torch.uint8)
    for i in range(0, flat.numel(), n):
        yield flat[i:i + n]


def test_streamed_file_reads_back_with_safetensors(tmp_path):
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 256, (7, 33, 5), dtype=torch.uint8, generator=g)
    b = torch.randn(13, 3, generator=g).to(torch.bfloat16)
    c = torch.randn(11, generator=g)
    specs = [TensorSpec("w.a", "U8", tuple(a.shape)), TensorSpec("b", "BF16", tuple(b.shape)),
             TensorSpec("c", "F32", tuple(c.shape)), TensorSpec("empty", "U8", (0, 4))]
    path = tmp_path / "x.safetensors"
    write_safetensors(path, [(specs[0], chunks_of(a, 100)), (specs[1], chunks_of(b, 7)),
                             (specs[2], [c]), (specs[3], [])], {"format": "pt", "k": "v"})
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"format": "pt", "k": "v"}
        assert list(f.keys()) == sorted(["w.a", "b", "c", "empty"])
        assert torch.equal(f.get_tensor("w.a"), a)
        assert torch.equal(f.get_tensor("b"), b)
        assert torch.equal(f.get_tensor("c"), c)
        assert f.get_tensor("empty").shape == (0, 4)
    assert not list(tmp_path.glob(".*partial"))


def test_interleaved_positional_writes_and_same_bytes_as_safetensors_order(tmp_path):
    a = torch.arange(4096, dtype=torch.int32).to(torch.uint8).reshape(64, 64)
    b = (torch.arange(64 * 32, dtype=torch.int32) * 7).to(torch.uint8).reshape(32, 64)
    specs = [TensorSpec("a", "U8", (64, 64)), TensorSpec("b", "U8", (32, 64))]
    w = ShardWriter(tmp_path / "y.safetensors", specs, {"format": "pt"})
    with w:
        for ca, cb in zip(chunks_of(a, 512), chunks_of(b, 256)):  # alternate tensors
            w.write("b", cb)
            w.write("a", ca)
        digest = w.finish()
    with safe_open(tmp_path / "y.safetensors", "pt") as f:
        assert torch.equal(f.get_tensor("a"), a) and torch.equal(f.get_tensor("b"), b)
    assert shard_checksum(tmp_path / "y.safetensors") == (digest, os.path.getsize(tmp_path / "y.safetensors"))
    # the checksum sees every byte
    raw = bytearray((tmp_path / "y.safetensors").read_bytes())
    raw[-1] ^= 1
    (tmp_path / "z.safetensors").write_bytes(raw)
    assert shard_checksum(tmp_path / "z.safetensors")[0] != digest


def test_header_is_aligned_and_parsable():
    header, ranges = build_header([TensorSpec("t", "F32", (3,)), TensorSpec("u", "F4", (2, 4))], {"a": "b"})
    n = int.from_bytes(header[:8], "little")
    assert n % 8 == 0 and len(header) == 8 + n
    obj = json.loads(header[8:])
    assert obj["t"]["data_offsets"] == [0, 12] and obj["u"]["data_offsets"] == [12, 16]
    assert ranges == {"t": (0, 12), "u": (12, 16)}


def test_short_tensor_leaves_no_file(tmp_path):
    path = tmp_path / "s.safetensors"
    w = ShardWriter(path, [TensorSpec("a", "U8", (10,))])
    w.open()
    w.write("a", b"12345")
    with pytest.raises(WriteError, match="got 5 of its 10 bytes"):
        w.finish()
    assert list(tmp_path.iterdir()) == []


def test_overflow_refused(tmp_path):
    w = ShardWriter(tmp_path / "o.safetensors", [TensorSpec("a", "U8", (4,))])
    w.open()
    with pytest.raises(WriteError, match="more than its planned 4"):
        w.write("a", b"12345")
    assert list(tmp_path.iterdir()) == []


def test_exception_inside_context_removes_temp(tmp_path):
    with pytest.raises(RuntimeError):
        with ShardWriter(tmp_path / "e.safetensors", [TensorSpec("a", "U8", (8,))]) as w:
            w.write("a", b"1234")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_disk_full_is_a_clean_error(tmp_path, monkeypatch):
    real = os.pwrite
    calls = {"n": 0}

    def pwrite(fd, data, off):
        calls["n"] += 1
        if calls["n"] > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, off)

    monkeypatch.setattr(os, "pwrite", pwrite)
    w = ShardWriter(tmp_path / "f.safetensors", [TensorSpec("a", "U8", (64,))])
    w.open()
    w.write("a", bytes(16))
    with pytest.raises(WriteError, match="disk is full"):
        w.write("a", bytes(16))
    assert list(tmp_path.iterdir()) == []


def test_permission_denied_is_a_clean_error(tmp_path, monkeypatch):
    def deny(*a, **k):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(WriteError, match="permission denied"):
        ShardWriter(tmp_path / "p.safetensors", [TensorSpec("a", "U8", (1,))]).open()
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_checksum_matches_for_file_written_by_safetensors_layout(tmp_path):
    # shard_checksum works on any safetensors file; two identical writes give one checksum
    t = {"x": torch.arange(10, dtype=torch.float32)}
    save_file(t, tmp_path / "a.safetensors")
    save_file(t, tmp_path / "b.safetensors")
    assert shard_checksum(tmp_path / "a.safetensors")[0] == shard_checksum(tmp_path / "b.safetensors")[0]
