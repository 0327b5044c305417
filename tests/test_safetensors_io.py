"""safetensors header parsing, validation and lazy single-tensor reads."""

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from checkpoint_fixtures import raw_shard
from mxfp4conv.checkpoint import safetensors_io as st
from mxfp4conv.errors import CheckpointError


def _tensors():
    g = torch.Generator().manual_seed(1)
    u8 = torch.randint(0, 256, (6, 8), generator=g, dtype=torch.uint8)
    return {
        "u8": u8,
        "i8": u8.clone().view(torch.int8),
        "e8m0": torch.randint(118, 136, (6, 2), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu),
        "f4": u8.clone().view(torch.float4_e2m1fn_x2),
        "bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "f16": torch.randn(4, generator=g).to(torch.float16),
        "f32": torch.randn(2, 3, generator=g),
        "i32": torch.arange(7, dtype=torch.int32),
        "i64": torch.arange(5, dtype=torch.int64) - 2,
        "fp8": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
        "bool": torch.tensor([True, False, True]),
        "f64": torch.randn(3, generator=g, dtype=torch.float64),
        "u16": torch.arange(9, dtype=torch.int32).to(torch.uint16),
        "scalar": torch.tensor(0.25),
        "empty": torch.zeros(0, 4),
    }


EXPECTED_DTYPES = {"u8": "U8", "i8": "I8", "e8m0": "F8_E8M0", "f4": "F4", "bf16": "BF16",
                   "f16": "F16", "f32": "F32", "i32": "I32", "i64": "I64", "fp8": "F8_E4M3",
                   "bool": "BOOL", "f64": "F64", "u16": "U16", "scalar": "F32", "empty": "F32"}


def test_header_dtypes_shapes_and_lazy_reads(tmp_path):
    ts = _tensors()
    path = tmp_path / "x.safetensors"
    save_file(ts, str(path), metadata={"format": "pt", "note": "hi"})
    h = st.read_header(path)
    assert h.metadata == {"format": "pt", "note": "hi"}
    assert {n: e.dtype for n, e in h.tensors.items()} == EXPECTED_DTYPES
    assert h.tensors["f4"].shape == (6, 16)  # F4: logical element shape, two per byte
    assert h.tensors["u8"].shape == (6, 8) and h.tensors["scalar"].shape == ()
    assert h.data_start + h.data_bytes == path.stat().st_size
    for name, t in ts.items():
        begin, end = h.absolute(name)
        got = st.to_tensor(st.read_range(path, begin, end - begin), h.tensors[name].dtype,
                           h.tensors[name].shape)
        want = t.view(torch.uint8) if t.dtype in (torch.float8_e8m0fnu, torch.float4_e2m1fn_x2) else t
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), name


def test_leading_whitespace_and_padding_accepted(tmp_path):
    body = b"\x01\x02\x03\x04"
    header = b'  {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}   '
    h = st.read_header(raw_shard(tmp_path / "w.safetensors", header, body))
    assert h.tensors["a"].shape == (4,) and h.absolute("a") == (8 + len(header), 8 + len(header) + 4)


def _good_header():
    return {"a": {"dtype": "U8", "shape": [2, 2], "data_offsets": [0, 4]},
            "b": {"dtype": "BF16", "shape": [2], "data_offsets": [4, 8]}}


@pytest.mark.parametrize("mutate, data, message", [
    (lambda h: h, b"\0" * 7, "truncated"),
    (lambda h: h, b"\0" * 9, "trailing bytes"),
    (lambda h: h["a"].update(data_offsets=[0, 5]) or h, b"\0" * 8, "span 5 bytes"),
    (lambda h: h["b"].update(data_offsets=[3, 7]) or h, b"\0" * 8, "overlaps"),
    (lambda h: h["b"].update(data_offsets=[5, 9]) or h, b"\0" * 9, "gap"),
    (lambda h: h["a"].update(dtype="Q7") or h, b"\0" * 8, "unknown dtype"),
    (lambda h: h["a"].update(shape=[2, -2]) or h, b"\0" * 8, "non-negative"),
    (lambda h: h["a"].pop("data_offsets") and h, b"\0" * 8, "data_offsets"),
    (lambda h: h.update(__metadata__={"format": 1}) or h, b"\0" * 8, "__metadata__"),
    (lambda h: [1, 2], b"", "not an object"),
])
def test_invalid_headers_are_refused(tmp_path, mutate, data, message):
    path = raw_shard(tmp_path / "bad.safetensors", mutate(_good_header()), data)
    with pytest.raises(CheckpointError) as err:
        st.read_header(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_garbage_oversized_and_short_files(tmp_path):
    garbage = tmp_path / "g.safetensors"
    garbage.write_bytes(struct.pack("<Q", 20) + b"\x89PNG\r\n\x1a\n not json at all" + b"\0" * 16)
    with pytest.raises(CheckpointError, match="not valid UTF-8 JSON"):
        st.read_header(garbage)
    huge = tmp_path / "h.safetensors"
    huge.write_bytes(struct.pack("<Q", st.MAX_HEADER_SIZE + 1) + b"{}")
    with pytest.raises(CheckpointError, match="limit"):
        st.read_header(huge)
    claims_more = tmp_path / "c.safetensors"
    claims_more.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(CheckpointError, match="truncated"):
        st.read_header(claims_more)
    short = tmp_path / "s.safetensors"
    short.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="too short"):
        st.read_header(short)


def test_sub_byte_sizes():
    assert st.expected_nbytes("F4", (3, 64)) == 96
    assert st.expected_nbytes("F4", (3,)) is None  # 12 bits: not whole bytes
    assert st.expected_nbytes("F6_E3M2", (4,)) == 3
    assert st.storage_shape("F4", (5, 64)) == (5, 32)


def test_header_read_touches_only_the_header(tmp_path, monkeypatch):
    path = tmp_path / "big.safetensors"
    n = 1 << 30  # a 1 GiB tensor in a sparse file
    header = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with open(path, "r+b") as f:
        f.truncate(8 + len(header) + n)
    read = []
    real = st.pread_exact
    monkeypatch.setattr(st, "pread_exact", lambda fd, off, k: read.append(k) or real(fd, off, k))
    h = st.read_header(path)
    assert h.tensors["w"].nbytes == n and sum(read) == len(header)
