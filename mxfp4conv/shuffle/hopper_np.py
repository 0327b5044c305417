"""The hopper_mma layouts' tables and their numpy forward transforms (no torch).

``hopper.py`` documents the layouts and holds the torch paths (any device) and the inverses;
this module is what ``convert`` runs on the CPU, so it is importable without torch.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

# magnitude bit 0 (m), 1, 2 (e) and sign position of the low-half code of each register
BITS = ((6, 7, 8, 15), (3, 4, 5, 12), (0, 1, 2, 9), (10, 11, 13, 14))


def _luts() -> tuple[np.ndarray, np.ndarray]:
    """Byte lookup tables of the bit re-encoding, a fixed permutation of the 32 bits of a word.

    The "plain" word has byte ``2h + c`` = the canonical byte of row ``8h + g`` holding K
    ``16kt + 8c + 2t`` (low nibble) and ``+1`` (high nibble). ``fwd[p, v]``: encoded bits of
    plain byte ``p`` = v; ``inv[p, v]``: plain bits of encoded byte ``p`` = v. ``[4, 256]`` int64.
    """
    src, dst = [], []  # plain bit -> encoded bit
    for r in range(4):
        for kk in range(2):
            for j, pos in enumerate(BITS[r]):
                src.append(8 * r + 4 * kk + j)
                dst.append(pos + 16 * kk)
    v = np.arange(256, dtype=np.int64)
    fwd = np.zeros((4, 256), dtype=np.int64)
    inv = np.zeros((4, 256), dtype=np.int64)
    for a, b in zip(src, dst):
        fwd[a // 8] |= ((v >> (a % 8)) & 1) << b
        inv[b // 8] |= ((v >> (b % 8)) & 1) << a
    return fwd, inv


FWD8, INV8 = _luts()


def _lut16(t8: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The byte tables merged per 16-bit half-word (bytes 0-1 and 2-3): two gathers a word."""
    v = np.arange(1 << 16)
    t = t8.astype(np.uint32)
    return t[0][v & 0xFF] | t[1][v >> 8], t[2][v & 0xFF] | t[3][v >> 8]


FWD16 = _lut16(FWD8)
INV16 = _lut16(INV8)


def _block_order() -> tuple[np.ndarray, np.ndarray]:
    """For one 16-row x 32-byte block (rows, then K bytes): the byte feeding plain byte (h, c) of
    word (g, t, kt), as two index lists (h = 0, h = 1), each ordered (g, t, kt, c)."""
    h, g, t, kt, c = np.meshgrid(np.arange(2), np.arange(8), np.arange(4), np.arange(4), np.arange(2), indexing="ij")
    src = ((8 * h + g) * 32 + 8 * kt + 4 * c + t).reshape(2, -1)
    return src[0], src[1]


SRC = _block_order()
DST = np.argsort(np.concatenate(SRC))  # plain bytes (h = 0 part, then h = 1 part) -> block byte


@lru_cache(maxsize=16)
def _slab_order(kb: int) -> np.ndarray:
    """For one 16-row slab of ``kb``-byte rows (row-major, ``16 * kb`` bytes): the slab byte
    feeding each plain byte, all h = 0 bytes first, then all h = 1 bytes, each part ordered
    (block, g, t, kt, c). ``_block_order`` per block, with the block gather folded in."""
    h, b, g, t, kt, c = np.meshgrid(np.arange(2), np.arange(kb // 32), np.arange(8), np.arange(4), np.arange(4),
                                    np.arange(2), indexing="ij")
    return ((8 * h + g) * kb + 32 * b + 8 * kt + 4 * c + t).reshape(-1).astype(np.intp)


STEP_BYTES = 1 << 20  # slab bytes gathered at a time: the step's buffers stay in cache


def weight_forward(x: np.ndarray) -> np.ndarray:
    """``[E, N, K/2]`` uint8 (contiguous) -> the stored bytes, same shape.

    One byte gather per slab into (h = 0 | h = 1) halves of plain words, then the two 16-bit
    table lookups, a cache-sized group of slabs at a time, into one output buffer."""
    e, n, kb = x.shape
    slabs = x.reshape(-1, 16 * kb)
    order = _slab_order(kb)
    half = 4 * kb  # uint16 pairs (= output words) per slab and h
    out = np.empty((slabs.shape[0], half), dtype=np.uint32)
    step = max(1, STEP_BYTES // (16 * kb))
    for a in range(0, slabs.shape[0], step):
        pairs = np.take(slabs[a:a + step], order, axis=1).view(np.uint16)
        words = out[a:a + step]
        np.take(FWD16[0], pairs[:, :half], out=words, mode="wrap")  # 65536 entries: wrap never wraps
        words |= np.take(FWD16[1], pairs[:, half:], mode="wrap")
    return out.view(np.uint8).reshape(x.shape)


@lru_cache(maxsize=16)
def _scale_order(g: int) -> np.ndarray:
    """For one 16-row slab of ``g`` scale bytes per row, as ``g / 2`` uint16 pairs (j = 0, 1):
    the slab pair feeding each stored pair, ordered (b, g, h)."""
    h, b, gg = np.meshgrid(np.arange(2), np.arange(g // 2), np.arange(8), indexing="ij")
    return ((8 * h + gg) * (g // 2) + b).transpose(1, 2, 0).reshape(-1).astype(np.intp)


def scale_forward(x: np.ndarray) -> np.ndarray:
    """``[E, N, K/32]`` uint8 (contiguous) -> the stored bytes, same shape."""
    e, n, g = x.shape
    pairs = x.view(np.uint16).reshape(-1, 8 * g)
    return np.take(pairs, _scale_order(g), axis=1).view(np.uint8).reshape(e, n, g)
