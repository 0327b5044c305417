"""safetensors shards, read from their headers.

A shard is an 8-byte little-endian header length N, N bytes of JSON (one object, optional
``__metadata__`` of string -> string), then the tensor data. Headers are parsed and
validated here without touching the data; single tensors are read on demand with
``os.pread`` from a read-only descriptor.

Why not ``safetensors.safe_open``: it needs the whole file on local disk and maps it, so it
cannot read a header that arrived by an HTTP range request (``inspect`` of a hub repo), and
it rejects a bad shard with a generic message (a shard cut short by one byte: "incomplete
metadata, file not fully covered") where this reader names the tensor that is truncated,
overlaps another or leaves a gap, and says what to do. It also hands e8m0 scales and F4 weights
out as numeric dtypes, where the converter must move the raw bytes. The bytes read here are
checked against what ``safetensors`` itself reads (tests/test_source.py,
tests/test_safetensors_io.py). Writing stays with our streaming writer too: ``safetensors``
can only write a file from tensors that are all in memory at once.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from mxfp4conv.lazy_torch import torch

from mxfp4conv.checkpoint import strict_json
from mxfp4conv.errors import CheckpointError

MAX_HEADER_SIZE = 100_000_000  # the cap the safetensors reader itself applies

# Bits per element for every dtype string safetensors knows.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8,
    "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}

# How a tensor is handed out by ``to_tensor``: e8m0 scales as raw uint8 bytes (never a
# numeric cast), F4 as packed uint8 (two elements per byte, low nibble first).
@functools.cache
def _torch_dtypes() -> dict:
    return {
        "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "F8_E8M0": torch.uint8,
        "F4": torch.uint8, "F8_E5M2": torch.float8_e5m2, "F8_E4M3": torch.float8_e4m3fn,
        "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
        "I16": torch.int16, "U16": torch.uint16, "F16": torch.float16, "BF16": torch.bfloat16,
        "I32": torch.int32, "U32": torch.uint32, "F32": torch.float32, "C64": torch.complex64,
        "F64": torch.float64, "I64": torch.int64, "U64": torch.uint64,
    }


@dataclass(frozen=True)
class TensorEntry:
    """One header entry. ``begin``/``end`` are relative to the start of the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ShardHeader:
    path: Path
    header_len: int  # N, the JSON length
    file_size: int
    metadata: dict[str, str]
    tensors: dict[str, TensorEntry]
    raw: bytes  # the 8 length bytes + the JSON bytes, exactly as stored

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    def absolute(self, name: str) -> tuple[int, int]:
        e = self.tensors[name]
        return self.data_start + e.begin, self.data_start + e.end

    @property
    def data_bytes(self) -> int:
        return sum(e.nbytes for e in self.tensors.values())


def expected_nbytes(dtype: str, shape: tuple[int, ...]) -> int | None:
    """Bytes a tensor of this dtype and (logical) shape occupies; None if not whole bytes."""
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    return bits // 8 if bits % 8 == 0 else None


def storage_shape(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the tensor ``to_tensor`` returns (F4: last dim halved, two per byte)."""
    if dtype == "F4":
        if not shape or shape[-1] % 2:
            raise ValueError(f"F4 shape {list(shape)} has an odd last dimension")
        return (*shape[:-1], shape[-1] // 2)
    return shape


def to_tensor(buf: bytes | bytearray | memoryview, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Raw bytes -> torch tensor of the stored dtype (F8_E8M0 and F4 as uint8)."""
    if dtype not in _torch_dtypes():  # F6_*: no torch dtype; hand out the bytes
        return torch.frombuffer(bytearray(buf), dtype=torch.uint8) if len(buf) else torch.empty(0, dtype=torch.uint8)
    tdtype = _torch_dtypes()[dtype]
    sshape = storage_shape(dtype, shape)
    if len(buf) == 0:
        return torch.empty(sshape, dtype=tdtype)
    if isinstance(buf, bytes):
        buf = bytearray(buf)
    return torch.frombuffer(buf, dtype=torch.uint8).view(tdtype).reshape(sshape)


def _fail(path: Path, what: str, fix: str) -> CheckpointError:
    return CheckpointError(f"{path}: {what} {fix}")


_REDOWNLOAD = "The file is damaged or not a safetensors file; download or copy it again."


def parse_header(raw_len: bytes, raw_json: bytes, file_size: int, path: Path) -> ShardHeader:
    """Validate a header already read from ``path`` (of ``file_size`` bytes)."""
    (n,) = struct.unpack("<Q", raw_len)
    obj = strict_json.loads(raw_json, str(path), f"safetensors header ({n} bytes)", _REDOWNLOAD)
    if not isinstance(obj, dict):
        raise _fail(path, f"the safetensors header is JSON but not an object (it is a "
                          f"{type(obj).__name__}).", _REDOWNLOAD)
    metadata = obj.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise _fail(path, "the header's __metadata__ must be an object mapping strings to "
                          "strings.", _REDOWNLOAD)

    tensors: dict[str, TensorEntry] = {}
    for name, entry in obj.items():
        tensors[name] = _parse_entry(path, name, entry)

    data_len = file_size - 8 - n
    pos = 0
    prev = None
    for e in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if e.end > data_len:
            raise _fail(path, f"tensor {e.name!r} ends at data byte {e.end} but the file holds only "
                              f"{max(data_len, 0)} data bytes: the shard is truncated.",
                        "Download or copy the file again (it was cut short).")
        if e.begin < pos:
            raise _fail(path, f"tensor {e.name!r} (bytes {e.begin}..{e.end} of the data section) "
                              f"overlaps tensor {prev.name!r} (bytes {prev.begin}..{prev.end}).",
                        _REDOWNLOAD)
        if e.begin > pos:
            raise _fail(path, f"the data section has a gap of {e.begin - pos} bytes before "
                              f"tensor {e.name!r} (offsets must be contiguous from 0).", _REDOWNLOAD)
        pos, prev = e.end, e
    if pos != data_len:
        raise _fail(path, f"the header's tensors cover {pos} data bytes but the file holds "
                          f"{data_len} bytes after the header (trailing bytes not described by "
                          f"the header).", _REDOWNLOAD)
    return ShardHeader(path=path, header_len=n, file_size=file_size, metadata=dict(metadata),
                       tensors=tensors, raw=raw_len + raw_json)


def _parse_entry(path: Path, name: str, entry: object) -> TensorEntry:
    bad = f"tensor {name!r} has a malformed header entry"
    if not isinstance(entry, dict):
        raise _fail(path, f"{bad} (not an object).", _REDOWNLOAD)
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise _fail(path, f"tensor {name!r} has unknown dtype {dtype!r} (known: "
                          f"{', '.join(DTYPE_BITS)}).", _REDOWNLOAD)
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool)
                                              and d >= 0 for d in shape):
        raise _fail(path, f"{bad}: shape {shape!r} is not a list of non-negative integers.",
                    _REDOWNLOAD)
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
            or offsets[0] > offsets[1]):
        raise _fail(path, f"{bad}: data_offsets {offsets!r} is not [begin, end] with "
                          f"0 <= begin <= end.", _REDOWNLOAD)
    shape_t = tuple(shape)
    want = expected_nbytes(dtype, shape_t)
    if want is None:
        raise _fail(path, f"tensor {name!r} ({dtype} {list(shape_t)}) does not fill a whole "
                          f"number of bytes.", _REDOWNLOAD)
    if offsets[1] - offsets[0] != want:
        raise _fail(path, f"tensor {name!r} is {dtype} {list(shape_t)} = {want} bytes but its "
                          f"data_offsets {offsets} span {offsets[1] - offsets[0]} bytes.", _REDOWNLOAD)
    return TensorEntry(name=name, dtype=dtype, shape=shape_t, begin=offsets[0], end=offsets[1])


def read_header(path: str | os.PathLike) -> ShardHeader:
    """Read and validate the header of one shard, reading no tensor data."""
    path = Path(path)
    fd = open_regular(path, "shard")
    try:
        size = os.fstat(fd).st_size
        raw_len = os.pread(fd, 8, 0)
        if len(raw_len) < 8:
            raise _fail(path, f"the file is {size} bytes, too short to hold a safetensors header "
                              f"(8-byte length prefix): the shard is truncated or empty.",
                        "Download or copy the file again.")
        (n,) = struct.unpack("<Q", raw_len)
        if n > MAX_HEADER_SIZE:
            raise _fail(path, f"the safetensors header claims {n} bytes, more than the "
                              f"{MAX_HEADER_SIZE}-byte limit: this is not a valid safetensors "
                              f"header (garbage or a different file format).", _REDOWNLOAD)
        if 8 + n > size:
            raise _fail(path, f"the safetensors header claims {n} bytes but the file has only "
                              f"{size - 8} bytes after the length prefix: the shard is truncated "
                              f"or not a safetensors file.", _REDOWNLOAD)
        raw_json = pread_exact(fd, 8, n)
    finally:
        os.close(fd)
    return parse_header(raw_len, bytes(raw_json), size, path)


def open_regular(path: Path, what: str) -> int:
    """A read-only descriptor of ``path``, refused unless it is a regular file (a FIFO would
    block forever, a directory cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            raise CheckpointError(f"{path}: the {what} is a directory, not a file. Put the real "
                                  f"file in its place.") from None
        raise CheckpointError(f"{path}: cannot open the {what} ({exc.strerror}). Check that the "
                              f"file exists and is readable.") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CheckpointError(f"{path}: the {what} is {file_kind(mode)}, not a regular file. Put "
                              f"the real file in its place.")
    os.set_blocking(fd, True)
    return fd


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def pread_exact(fd: int, offset: int, n: int) -> bytearray:
    """Read exactly ``n`` bytes at ``offset`` into a fresh writable buffer."""
    buf = bytearray(n)
    view = memoryview(buf)
    done = 0
    while done < n:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise EOFError(f"end of file after {done} of {n} bytes at offset {offset}")
        done += got
    return buf


def read_range(path: str | os.PathLike, offset: int, n: int) -> bytearray:
    """Read ``n`` bytes at ``offset`` of ``path`` (opened read-only, closed after)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return pread_exact(fd, offset, n)
    finally:
        os.close(fd)
