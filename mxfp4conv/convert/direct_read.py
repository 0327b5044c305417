"""Fast path for per-expert checkpoints: read source rows straight into the stacked,
padded per-rank buffers with ``preadv``, instead of reading each expert into fresh tensors
and copying it twice. Produces exactly what ``rank_tensors.build_chunk`` produces from
``read_expert`` (the tests compare both); used for weights and scales of layers whose
experts are separate tensors (Kimi-K3, DeepSeek-V4, Quark).
"""

from __future__ import annotations

import os
import threading

import numpy as np
from mxfp4conv.lazy_torch import torch

from mxfp4conv.convert.rank_tensors import RankGeometry
from mxfp4conv.errors import CheckpointError

IOV_MAX = 1024


class DirectReader:
    def __init__(self, source):
        self.source = source
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    def fd(self, shard: str) -> int:
        with self._lock:
            fd = self._fds.get(shard)
            if fd is None:
                fd = self._fds[shard] = os.open(self.source.path(shard), os.O_RDONLY)
            return fd

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds = {}

    def locate(self, name: str, rows: int, row_bytes: int) -> tuple[int, int]:
        info = self.source.tensor_info(name)
        if info.nbytes != rows * row_bytes:
            raise CheckpointError(f"{name}: {info.nbytes} bytes, expected {rows} x {row_bytes} for this layer's "
                                  f"geometry. The checkpoint is inconsistent with its config.")
        return self.fd(info.shard), info.begin

    def read_into(self, fd: int, offset: int, views: list[memoryview]) -> None:
        for i in range(0, len(views), IOV_MAX):
            group = views[i:i + IOV_MAX]
            want = sum(len(v) for v in group)
            got = os.preadv(fd, group, offset)
            if got != want:
                self._finish_short(fd, offset, group, got)
            offset += want

    @staticmethod
    def _finish_short(fd: int, offset: int, views: list[memoryview], got: int) -> None:
        pos = offset
        for v in views:
            if got >= len(v):
                got -= len(v)
                pos += len(v)
                continue
            done = got
            got = 0
            while done < len(v):
                k = os.preadv(fd, [v[done:]], pos + done)
                if k <= 0:
                    raise CheckpointError(f"unexpected end of file at offset {pos + done}; the source shard "
                                          f"is truncated. Download or copy it again.")
                done += k
            pos += len(v)

    def prefetch(self, ranges: list[tuple[str, int, int]]) -> None:
        """Ask the kernel to start reading ``(shard, offset, nbytes)`` ranges now (asynchronous
        readahead, merged where they are close), so a task finds its bytes in the page cache
        instead of waiting for many small reads. Best effort."""
        if not hasattr(os, "posix_fadvise"):
            return
        for shard, off, n in merge_ranges(ranges):
            try:
                os.posix_fadvise(self.fd(shard), off, n, os.POSIX_FADV_WILLNEED)
            except OSError:
                return

    def scratch(self, n: int) -> np.ndarray:
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.size < n:
            buf = self._local.buf = np.empty(n, dtype=np.uint8)
        return buf[:n]


def merge_ranges(ranges: list[tuple[str, int, int]], gap: int = 1 << 20) -> list[tuple[str, int, int]]:
    """Sorted ``(shard, offset, nbytes)`` ranges with overlapping ones, and ones less than
    ``gap`` bytes apart, joined."""
    out: list[list] = []
    for shard, off, n in sorted(r for r in ranges if r[2] > 0):
        if out and out[-1][0] == shard and off <= out[-1][1] + out[-1][2] + gap:
            out[-1][2] = max(out[-1][2], off + n - out[-1][1])
        else:
            out.append([shard, off, n])
    return [tuple(r) for r in out]


def _rows(t2d: np.ndarray) -> list[memoryview]:
    """One writable view per row of a 2-D uint8 array (rows may be strided)."""
    if t2d.flags.c_contiguous:
        return [memoryview(t2d).cast("B")]
    return [memoryview(r) for r in t2d]


def build_chunk_direct(reader: DirectReader, layer, experts: range, g: RankGeometry, ranks: list[int],
                       kinds: tuple[str, ...]) -> dict[tuple[int, str], torch.Tensor]:
    """(rank, kind) -> stacked canonical padded tensor for ``experts`` of a per-expert layer."""
    return {k: torch.from_numpy(v) for k, v in build_chunk_direct_np(reader, layer, experts, g, ranks, kinds).items()}


def build_chunk_direct_np(reader: DirectReader, layer, experts: range, g: RankGeometry, ranks: list[int],
                          kinds: tuple[str, ...]) -> dict[tuple[int, str], np.ndarray]:
    """``build_chunk_direct`` as uint8 numpy arrays (no torch)."""
    n = len(experts)
    H, Hp, I, Ip = g.hidden, g.hidden_padded, g.intermediate, g.inter_rank_padded
    out: dict[tuple[int, str], np.ndarray] = {}
    for kind in kinds:
        div = 2 if kind.endswith("weight") else 32
        pad = g.weight_pad if div == 2 else g.scale_pad
        if kind.startswith("w13"):
            shape = (n, 2 * Ip, Hp // div)
        else:
            shape = (n, Hp, Ip // div)
        # one allocation for all ranks: rank r is block r (contiguous), so the TP split of w2
        # below is a single strided copy per expert
        block = np.empty((len(ranks), *shape), dtype=np.uint8)
        for j, r in enumerate(ranks):
            sl = g.inter_slice(r)
            ir = sl.stop - sl.start
            t = block[j]
            if kind.startswith("w13"):
                t[:, ir:Ip] = pad
                t[:, Ip + ir:] = pad
                if Hp > H:
                    t[:, :, H // div:] = pad
            else:
                t[:, H:] = pad
                if Ip > ir:
                    t[:, :, ir // div:] = pad
            out[(r, kind)] = t
        for i, e in enumerate(experts):
            ex = layer.experts[e]
            if kind.startswith("w13"):
                refs = (ex.gate, ex.up) if div == 2 else (ex.gate_scale, ex.up_scale)
                for half, ref in enumerate(refs):
                    fd, base = reader.locate(ref.name, I, H // div)
                    for r in ranks:
                        sl = g.inter_slice(r)
                        ir = sl.stop - sl.start
                        row0 = half * Ip
                        dst = out[(r, kind)][i, row0:row0 + ir, : H // div]
                        reader.read_into(fd, base + sl.start * (H // div), _rows(dst))
            else:
                ref = ex.down if div == 2 else ex.down_scale
                fd, base = reader.locate(ref.name, H, I // div)
                whole = [r for r in ranks if g.inter_slice(r) == slice(0, I)]
                for r in whole:
                    reader.read_into(fd, base, _rows(out[(r, kind)][i, :H, : I // div]))
                split = [r for r in ranks if r not in whole]
                if split:
                    buf = reader.scratch(H * (I // div))
                    reader.read_into(fd, base, [memoryview(buf)])
                    src = buf.reshape(H, I // div)
                    if split == list(range(g.tp)) and split == ranks:
                        # all TP ranks at once: [H, T, I/T] -> [T, H, I/T]
                        w = g.inter_rank // div
                        block[:, i, :H, :w] = src.reshape(H, g.tp, w).transpose(1, 0, 2)
                    else:
                        for r in split:
                            sl = g.inter_slice(r)
                            out[(r, kind)][i, :H, : (sl.stop - sl.start) // div] = src[:, sl.start // div: sl.stop // div]
    return out
