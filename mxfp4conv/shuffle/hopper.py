"""Triton-on-Hopper MMA layouts: fp4 weights and e8m0 scales in the order each thread of a
``wgmma`` with the weights as the register (A) operand holds them.

Why: a Triton kernel that loads canonical fp4 bytes and decodes them must re-distribute the
decoded tile into the MMA operand layout, which goes through shared memory with barriers and
bounds the whole GEMM. Stored in this order, one 16-byte load per thread is exactly that
thread's operand fragment for 16 rows x 64 codes, and the decode is a few bit operations.

Fragment facts (PTX ISA, ``wgmma`` / ``mma.m16n8k16`` A operand, bf16): in a 16-row x 16-K
tile, lane ``4g + t`` holds rows ``g`` and ``g + 8`` at K ``2t, 2t + 1`` and ``2t + 8, 2t + 9``;
each 32-bit register is one row's two consecutive K values.

Values (``hopper_mma_w``), per expert, canonical bytes ``[N, K/2]`` (two codes a byte, low
nibble first), N % 16 == 0 and K % 64 == 0. Rows come in slabs of 16 and each slab in blocks
of 64 codes (512 bytes, stored in K order). In a block, lane ``L = 4g + t`` owns bytes
``16L .. 16L + 15``: four 32-bit words, word ``kt`` for the K sub-tile ``16kt .. 16kt + 15``.
A word holds the 8 codes ``(h, c, kk)`` of rows ``8h + g`` at K ``16kt + 8c + 2t + kk``, bits
re-encoded so that four masks/shifts give four bf16 pairs, each ``e2m1 * 2**-126``:

    R0 = w & 0x81C081C0                                  (h=0, c=0), kk in the halves
    R1 = (w << 3) & 0x81C081C0                           (h=0, c=1)
    R2 = (w << 6) & 0x81C081C0                           (h=1, c=0)
    R3 = (w >> 4) & 0x00C000C0 | (w >> 5) & 0x01000100 | (w << 1) & 0x80008000   (h=1, c=1)

i.e. the code of register r, half q puts its magnitude bits (m, e0, e1) and sign at
``_BITS[r] + 16q``. Multiplying by ``2**(s - 1)`` (bf16 bits ``(s + 126) << 7``) then gives
the dequantised weight.

Scales (``hopper_mma_s``), per expert, canonical ``[N, K/32]``: the same 16-row slabs and
64-code blocks, 32 bytes per block stored in K order; byte ``4g + 2h + j`` is the scale of row
``8h + g``, K group ``2kb + j``. Lanes ``4g .. 4g + 3`` read the same 4 bytes.

Both keep the canonical tensor's shape and size and are independent per expert, so the
converter streams them like the other layouts.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from mxfp4conv.errors import LayoutError

# magnitude bit 0 (m), 1, 2 (e) and sign position of the low-half code of each register
_BITS = ((6, 7, 8, 15), (3, 4, 5, 12), (0, 1, 2, 9), (10, 11, 13, 14))
ROWS = 16  # rows per slab
CODES = 64  # codes per block


def _check(name: str, what: str, s, k_codes: int) -> None:
    _, n, _ = s
    if n % ROWS or k_codes % CODES:
        raise LayoutError(
            f"{name}: {what} of shape {tuple(s)} (N = {n} rows, K = {k_codes} codes) need "
            f"N a multiple of {ROWS} and K a multiple of {CODES}; pad the layer to those sizes.")


def check_weight(s) -> None:
    _check("hopper_mma_w", "fp4 weights", s, 2 * s[2])


def check_scale(s) -> None:
    _check("hopper_mma_s", "e8m0 scales", s, 32 * s[2])


def _luts() -> tuple[torch.Tensor, torch.Tensor]:
    """Byte lookup tables of the bit re-encoding, a fixed permutation of the 32 bits of a word.

    The "plain" word has byte ``2h + c`` = the canonical byte of row ``8h + g`` holding K
    ``16kt + 8c + 2t`` (low nibble) and ``+1`` (high nibble). ``fwd[p, v]``: encoded bits of
    plain byte ``p`` = v; ``inv[p, v]``: plain bits of encoded byte ``p`` = v.
    """
    src, dst = [], []  # plain bit -> encoded bit
    for r in range(4):
        for kk in range(2):
            for j, pos in enumerate(_BITS[r]):
                src.append(8 * r + 4 * kk + j)
                dst.append(pos + 16 * kk)
    v = torch.arange(256, dtype=torch.int64)
    fwd = torch.zeros(4, 256, dtype=torch.int64)
    inv = torch.zeros(4, 256, dtype=torch.int64)
    for a, b in zip(src, dst):
        fwd[a // 8] |= ((v >> (a % 8)) & 1) << b
        inv[b // 8] |= ((v >> (b % 8)) & 1) << a
    return fwd, inv


_FWD, _INV = _luts()


def _lut16(lut8: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The byte tables merged per 16-bit half-word (bytes 0-1 and 2-3): two gathers a word."""
    v = np.arange(1 << 16)
    t = lut8.numpy().astype(np.uint32)
    return t[0][v & 0xFF] | t[1][v >> 8], t[2][v & 0xFF] | t[3][v >> 8]


_FWD16 = _lut16(_FWD)
_INV16 = _lut16(_INV)


def _block_order() -> tuple[np.ndarray, np.ndarray]:
    """For one 16-row x 32-byte block (rows, then K bytes): the byte feeding plain byte (h, c) of
    word (g, t, kt), as two index lists (h = 0, h = 1), each ordered (g, t, kt, c)."""
    h, g, t, kt, c = np.meshgrid(np.arange(2), np.arange(8), np.arange(4), np.arange(4), np.arange(2), indexing="ij")
    src = ((8 * h + g) * 32 + 8 * kt + 4 * c + t).reshape(2, -1)
    return src[0], src[1]


_SRC = _block_order()
_DST = np.argsort(np.concatenate(_SRC))  # plain bytes (h = 0 part, then h = 1 part) -> block byte


@lru_cache(maxsize=16)
def _slab_order(kb: int) -> np.ndarray:
    """For one 16-row slab of ``kb``-byte rows (row-major, ``16 * kb`` bytes): the slab byte
    feeding each plain byte, all h = 0 bytes first, then all h = 1 bytes, each part ordered
    (block, g, t, kt, c). ``_block_order`` per block, with the block gather folded in."""
    h, b, g, t, kt, c = np.meshgrid(np.arange(2), np.arange(kb // 32), np.arange(8), np.arange(4), np.arange(4),
                                    np.arange(2), indexing="ij")
    return ((8 * h + g) * kb + 32 * b + 8 * kt + 4 * c + t).reshape(-1).astype(np.intp)


_SLABS_PER_STEP_BYTES = 1 << 20  # slab bytes gathered at a time: the step's buffers stay in cache


def _forward_cpu(x: torch.Tensor) -> torch.Tensor:
    """One byte gather per slab into (h = 0 | h = 1) halves of plain words, then the two 16-bit
    table lookups, a cache-sized group of slabs at a time, into one output buffer."""
    e, n, kb = x.shape
    slabs = x.numpy().reshape(-1, 16 * kb)
    order = _slab_order(kb)
    half = 4 * kb  # uint16 pairs (= output words) per slab and h
    out = np.empty((slabs.shape[0], half), dtype=np.uint32)
    step = max(1, _SLABS_PER_STEP_BYTES // (16 * kb))
    for a in range(0, slabs.shape[0], step):
        pairs = np.take(slabs[a:a + step], order, axis=1).view(np.uint16)
        words = out[a:a + step]
        np.take(_FWD16[0], pairs[:, :half], out=words, mode="wrap")  # 65536 entries: wrap never wraps
        words |= np.take(_FWD16[1], pairs[:, half:], mode="wrap")
    return torch.from_numpy(out.view(np.uint8)).reshape(x.shape)


def _inverse_cpu(y: torch.Tensor, shape) -> torch.Tensor:
    e, n, kb = shape
    halves = y.contiguous().numpy().view(np.uint16).reshape(-1, 128, 2).transpose(2, 0, 1).copy()
    plain = _INV16[0][halves[0]] | _INV16[1][halves[1]]  # bytes (h0 c0, h0 c1, h1 c0, h1 c1) of each word
    parts = plain.view(np.uint16).reshape(-1, 128, 2).transpose(0, 2, 1).reshape(-1, 512 // 2)  # h0 pairs, h1 pairs
    blocks = torch.from_numpy(np.take(parts.view(np.uint8), _DST, axis=1))
    return blocks.reshape(e, n // 16, kb // 32, 16, 32).transpose(2, 3).reshape(shape)


def _permute_bits_torch(words: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """[M, 4] bytes of little-endian words -> [M, 4] bytes with the bits moved by ``lut`` (any device)."""
    b = words.to(torch.int64)
    lut = lut.to(b.device)
    out = lut[0][b[..., 0]] | lut[1][b[..., 1]] | lut[2][b[..., 2]] | lut[3][b[..., 3]]
    return torch.stack([(out >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8)


def _forward_torch(x: torch.Tensor) -> torch.Tensor:
    """``weight_forward`` with torch operations only, on any device (one expert at a time)."""
    e, n, kb = x.shape
    out = torch.empty_like(x)
    for i in range(e):
        # row = 16 nb + 8 h + g ; byte = 32 b + 8 kt + 4 c + t
        plain = x[i].reshape(n // 16, 2, 8, kb // 32, 4, 2, 4).permute(0, 3, 2, 6, 4, 1, 5)  # nb b g t kt h c
        out[i] = _permute_bits_torch(plain.reshape(-1, 4), _FWD).reshape(n, kb)
    return out


def _inverse_torch(y: torch.Tensor, shape) -> torch.Tensor:
    e, n, kb = shape
    y = y.reshape(e, n * kb // 4, 4)
    out = torch.empty(shape, dtype=torch.uint8, device=y.device)
    for i in range(e):
        plain = _permute_bits_torch(y[i], _INV).reshape(n // 16, kb // 32, 8, 4, 4, 2, 2)  # nb b g t kt h c
        out[i] = plain.permute(0, 5, 2, 1, 4, 6, 3).reshape(n, kb)
    return out


def weight_forward(x: torch.Tensor) -> torch.Tensor:
    return _forward_cpu(x) if x.device.type == "cpu" else _forward_torch(x)


def weight_inverse(y: torch.Tensor, shape) -> torch.Tensor:
    return _inverse_cpu(y, shape) if y.device.type == "cpu" else _inverse_torch(y, shape)


@lru_cache(maxsize=16)
def _scale_order(g: int) -> np.ndarray:
    """For one 16-row slab of ``g`` scale bytes per row, as ``g / 2`` uint16 pairs (j = 0, 1):
    the slab pair feeding each stored pair, ordered (b, g, h)."""
    h, b, gg = np.meshgrid(np.arange(2), np.arange(g // 2), np.arange(8), indexing="ij")
    return ((8 * h + gg) * (g // 2) + b).transpose(1, 2, 0).reshape(-1).astype(np.intp)


def scale_forward(x: torch.Tensor) -> torch.Tensor:
    e, n, g = x.shape
    if x.device.type == "cpu":
        pairs = x.numpy().view(np.uint16).reshape(-1, 8 * g)
        return torch.from_numpy(np.take(pairs, _scale_order(g), axis=1).view(np.uint8)).reshape(e, n, g)
    return _scale_forward_torch(x)


def _scale_forward_torch(x: torch.Tensor) -> torch.Tensor:
    e, n, g = x.shape
    s = x.reshape(e, n // 16, 2, 8, g // 2, 2)  # e nb h g b j
    return s.permute(0, 1, 4, 3, 2, 5).contiguous().reshape(e, n, g)  # e nb b g h j


def scale_inverse(y: torch.Tensor, shape) -> torch.Tensor:
    e, n, g = shape
    s = y.reshape(e, n // 16, g // 2, 8, 2, 2)  # e nb b g h j
    return s.permute(0, 1, 4, 3, 2, 5).contiguous().reshape(e, n, g)
