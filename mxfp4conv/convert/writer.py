"""Streaming safetensors writer.

The whole header is computed up front from (name, dtype, shape) entries, so tensor data can
be written straight to its final position in chunks, in any order across tensors and in
order within a tensor, without ever holding a whole tensor. The file lives under a
temporary name in the destination directory until every byte is accounted for; then it is
fsynced and renamed, so a file under its final name is always complete.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mxfp4conv import lazy_torch

from mxfp4conv.checkpoint.safetensors_io import DTYPE_BITS, expected_nbytes, read_header
from mxfp4conv.convert.crc import crc32, crc32_combine
from mxfp4conv.convert.writeback import start_writeback
from mxfp4conv.errors import Mxfp4convError

TEMP_PREFIX = "."
TEMP_SUFFIX = ".partial"


class WriteError(Mxfp4convError):
    """Writing an output file failed (disk full, permission denied, short write...)."""


def tensor_nbytes(dtype: str, shape: Iterable[int]) -> int:
    if dtype not in DTYPE_BITS:
        raise Mxfp4convError(f"unknown safetensors dtype {dtype!r}")
    nbytes = expected_nbytes(dtype, tuple(int(d) for d in shape))
    if nbytes is None:
        raise Mxfp4convError(f"a {dtype} tensor of shape {tuple(shape)} is not a whole number of bytes")
    return nbytes


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int = -1  # -1: computed from dtype and shape

    def size(self) -> int:
        return tensor_nbytes(self.dtype, self.shape) if self.nbytes < 0 else self.nbytes


def header_entry(spec: TensorSpec, begin: int) -> dict:
    return {"dtype": spec.dtype, "shape": list(spec.shape), "data_offsets": [begin, begin + spec.size()]}


def build_header(specs: list[TensorSpec], metadata: Mapping[str, str] | None = None
                 ) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The header bytes (length prefix included) and each tensor's data range, in the given order."""
    obj: dict = {}
    if metadata:
        obj["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    ranges: dict[str, tuple[int, int]] = {}
    pos = 0
    for spec in specs:
        if spec.name in ranges or spec.name == "__metadata__":
            raise Mxfp4convError(f"duplicate or reserved tensor name {spec.name!r} in one output shard")
        obj[spec.name] = header_entry(spec, pos)
        ranges[spec.name] = (pos, pos + spec.size())
        pos += spec.size()
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode()
    text += b" " * (-len(text) % 8)  # data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text, ranges


def header_entry_size(spec: TensorSpec, begin: int) -> int:
    """Bytes one tensor adds to the JSON header (for size planning; exact for our encoding)."""
    return len(json.dumps({spec.name: header_entry(spec, begin)}, separators=(",", ":"))) - 1


def as_bytes(chunk) -> memoryview:
    """A flat byte view of bytes/bytearray/memoryview/numpy array/torch tensor, without copying
    when the input is already contiguous."""
    torch = lazy_torch.loaded()  # a torch tensor exists only once torch is imported
    if torch is not None and isinstance(chunk, torch.Tensor):
        t = chunk.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous().reshape(-1)
        if t.dtype != torch.uint8:
            t = t.view(torch.uint8)
        return memoryview(t.numpy()).cast("B")
    if isinstance(chunk, np.ndarray):
        return memoryview(np.ascontiguousarray(chunk).reshape(-1).view(np.uint8))
    return memoryview(chunk).cast("B")


def combine_digest(header: bytes, tensor_crcs: Iterable[tuple[str, int, int]]) -> str:
    """Shard checksum: sha256 over the header and each tensor's (name, size, crc32)."""
    h = hashlib.sha256(header)
    for name, size, crc in tensor_crcs:
        h.update(f"{name}\0{size}\0{crc:08x}\n".encode())
    return "crc32x-sha256:" + h.hexdigest()


def _os_error(exc: OSError, path: Path, what: str) -> WriteError:
    if exc.errno == errno.ENOSPC:
        why = "the disk is full; free space (or choose another OUT) and run again with --resume"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = "permission denied; make the output directory writable and run again with --resume"
    else:
        why = f"{exc.strerror or exc}; fix the cause and run again with --resume"
    return WriteError(f"could not {what} {path}: {why}. No partial file was left under its final name.")


class ShardWriter:
    """Writes one safetensors file whose header is fixed in advance.

    ``write(name, chunk)`` appends the next bytes of tensor ``name`` at its precomputed
    position; tensors may be interleaved. ``finish()`` checks every tensor got exactly its
    size, fsyncs, renames the temporary file to ``path`` and returns the shard checksum.
    Any failure removes the temporary file.
    """

    def __init__(self, path: Path, specs: list[TensorSpec], metadata: Mapping[str, str] | None = None,
                 hasher=None):
        """``hasher``: an optional single-thread executor that computes the checksums off the
        writing thread (in submission order)."""
        self.hasher = hasher
        self._hashing: deque = deque()
        self.path = Path(path)
        self.temp = self.path.with_name(TEMP_PREFIX + self.path.name + TEMP_SUFFIX)
        self.specs = list(specs)
        self.header, self.ranges = build_header(self.specs, metadata)
        self.data_start = len(self.header)
        self.total_size = self.data_start + (max((e for _, e in self.ranges.values()), default=0))
        self.written = {s.name: 0 for s in self.specs}
        self.crcs = {s.name: 0 for s in self.specs}
        self.fd: int | None = None

    # context manager: abort on any exception
    def __enter__(self) -> ShardWriter:
        self.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    def open(self) -> None:
        try:
            self.fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            self._pwrite(self.header, 0)
        except OSError as exc:
            self.abort()
            raise _os_error(exc, self.temp, "create") from exc

    def _pwrite(self, view, offset: int) -> None:
        mv = memoryview(view).cast("B")
        while len(mv):
            n = os.pwrite(self.fd, mv, offset)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            mv = mv[n:]
            offset += n

    def write(self, name: str, chunk) -> None:
        view = as_bytes(chunk)
        begin, end = self.ranges[name]
        done = self.written[name]
        if done + len(view) > end - begin:
            self.abort()
            raise WriteError(
                f"internal error: tensor {name} in {self.path.name} received {done + len(view)} bytes, "
                f"more than its planned {end - begin}")
        try:
            self._pwrite(view, self.data_start + begin + done)
        except OSError as exc:
            self.abort()
            raise _os_error(exc, self.temp, "write") from exc
        if self.hasher is None:
            self._crc(name, view)
        else:
            self._hashing.append(self.hasher.submit(self._crc, name, view))
            while len(self._hashing) > 8:  # bounds the bytes held for hashing
                self._hashing.popleft().result()
        self.written[name] = done + len(view)

    def _crc(self, name: str, view) -> None:
        self.crcs[name] = crc32(view, self.crcs[name])

    # ---- parallel writing: pieces written anywhere, then recorded in order ----------------

    def write_at(self, name: str, offset: int, chunk) -> int:
        """Write bytes of tensor ``name`` at ``offset`` inside it and return their crc32. Safe to
        call from several threads at once (distinct ranges); nothing counts as written until
        ``record`` is called for the piece, in tensor order."""
        view = as_bytes(chunk)
        begin, end = self.ranges[name]
        if offset < 0 or offset + len(view) > end - begin:
            raise WriteError(f"internal error: a piece of tensor {name} in {self.path.name} at offset "
                             f"{offset} ({len(view)} bytes) lies outside its planned {end - begin} bytes")
        pos = self.data_start + begin + offset
        try:
            self._pwrite(view, pos)
        except OSError as exc:
            raise _os_error(exc, self.temp, "write") from exc
        start_writeback(self.fd, pos, len(view))
        return crc32(view)

    def record(self, name: str, offset: int, nbytes: int, crc: int) -> None:
        """Account for a piece written by ``write_at``; pieces of a tensor must come in order."""
        done = self.written[name]
        if offset != done:
            self.abort()
            raise WriteError(f"internal error: tensor {name} in {self.path.name} got a piece at offset "
                             f"{offset} after {done} bytes")
        self.crcs[name] = crc32_combine(self.crcs[name], crc, nbytes)
        self.written[name] = done + nbytes

    def write_tensor(self, name: str, chunks: Iterable) -> None:
        for chunk in chunks:
            self.write(name, chunk)

    def missing(self) -> list[str]:
        return [s.name for s in self.specs if self.written[s.name] != s.size()]

    def checksum(self) -> str:
        return combine_digest(self.header, ((s.name, s.size(), self.crcs[s.name]) for s in self.specs))

    def finish(self) -> str:
        while self._hashing:
            self._hashing.popleft().result()
        missing = self.missing()
        if missing:
            self.abort()
            n = missing[0]
            raise WriteError(
                f"internal error: tensor {n} in {self.path.name} got {self.written[n]} of its "
                f"{dict((s.name, s.size()) for s in self.specs)[n]} bytes")
        try:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = None
            os.replace(self.temp, self.path)
            fsync_dir(self.path.parent)
        except OSError as exc:
            self.abort()
            raise _os_error(exc, self.path, "finish") from exc
        return self.checksum()

    def abort(self) -> None:
        for f in self._hashing:
            f.cancel()
        self._hashing.clear()
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
        try:
            self.temp.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            pass


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_safetensors(path: Path, tensors: list[tuple[TensorSpec, Iterable]],
                      metadata: Mapping[str, str] | None = None) -> str:
    """Write a whole file from (spec, chunk iterable) pairs, in order. Returns the checksum."""
    w = ShardWriter(path, [s for s, _ in tensors], metadata)
    with w:
        for spec, chunks in tensors:
            w.write_tensor(spec.name, chunks)
        return w.finish()


def shard_checksum(path: Path, chunk_bytes: int = 64 << 20) -> tuple[str, int]:
    """Recompute a finished shard's checksum from its bytes (same definition as the writer's).
    Returns (checksum, file size)."""
    digest, size, _ = shard_crcs(path, chunk_bytes)
    return digest, size


def shard_crcs(path: Path, chunk_bytes: int = 64 << 20) -> tuple[str, int, dict[str, int]]:
    """(shard checksum, file size, crc32 of every tensor) recomputed from a shard's bytes."""
    h = read_header(path)
    crcs = []
    buf = bytearray(chunk_bytes)
    with open(path, "rb") as f:
        # the writer hashes in header order, which is the data order
        for e in sorted(h.tensors.values(), key=lambda e: e.begin):
            f.seek(h.data_start + e.begin)
            crc, left = 0, e.nbytes
            while left:
                k = f.readinto(memoryview(buf)[: min(left, chunk_bytes)])
                if not k:
                    raise Mxfp4convError(f"{path} is truncated inside tensor {e.name}")
                crc = crc32(memoryview(buf)[:k], crc)
                left -= k
            crcs.append((e.name, e.nbytes, crc))
    return combine_digest(h.raw, crcs), h.file_size, {name: crc for name, _, crc in crcs}
