"""The hopper_mma layouts' tables and their numpy forward transforms (no torch).

``hopper.py`` documents the layouts and holds the torch paths (any device) and the inverses;
this module is what ``convert`` runs on the CPU, so it is importable without torch.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

# magnitude bit 0 (m), 1, 2 (e) and sign position of the low-half code of each register (the
# high-half code's are 16 higher, modulo 32)
BITS = ((6, 7, 8, 15), (3, 4, 5, 12), (0, 1, 2, 9), (10, 11, 13, 14))
# hopper_mma_w_rot: an order the kernels decode in 9 integer instructions a word instead of 11
# (R1, R2: rotate left by 4, 10, then the R0 mask; R3: rotate by 6 for the m bits, by 14 for the
# others)
BITS_ROT = ((6, 7, 8, 15), (2, 3, 4, 11), (28, 29, 30, 5), (0, 25, 26, 1))
# hopper_mma_w_xor: each register one mask of a shift, a rotation or the xor of two shifts of the word (8 integer
# instructions a word), every code landing where BITS_ROT's R0 decode puts it. Its stored bits are not a permutation
# of the plain word's but a linear map over GF(2), solved from this decode (_order_matrix).
MASK = 0x81C081C0
XOR_DECODE = ((("shl", 0),), (("shl", 6),), (("rotl", 12),), (("shl", 2), ("shr", 6)))
ORDERS = ("plain", "rot", "xor")  # hopper_mma_w, hopper_mma_w_rot, hopper_mma_w_xor


def _source(op: str, s: int, p: int) -> int | None:
    """The word bit that bit p of (op w, s) comes from (None: a zero shifted in)."""
    q = {"shl": p - s, "shr": p + s, "rotl": (p - s) % 32}[op]
    return q if 0 <= q < 32 else None


def _gf2_inverse(a: np.ndarray) -> np.ndarray:
    """The inverse of a square 0/1 matrix over GF(2) (Gauss-Jordan; ValueError where it is singular)."""
    n = a.shape[0]
    m = np.concatenate([a % 2, np.eye(n, dtype=np.uint8)], axis=1).astype(np.uint8)
    for c in range(n):
        piv = next((r for r in range(c, n) if m[r, c]), None)
        if piv is None:
            raise ValueError("the decode does not determine every bit")
        m[[c, piv]] = m[[piv, c]]
        for r in range(n):
            if r != c and m[r, c]:
                m[r] ^= m[c]
    return m[:, n:]


def _bf16_lands(r: int, kk: int, j: int) -> tuple[int, int]:
    """Where the bf16 decodes put bit j of code (r, kk): bit BITS_ROT[0][j] + 16 kk of register r."""
    return r, BITS_ROT[0][j] + 16 * kk


def _order_matrix(decode, mask: int = MASK, lands=_bf16_lands) -> np.ndarray:
    """[32 stored bits, 32 plain bits] over GF(2): the stored word whose decode (registers r = mask & the xor of
    decode[r]'s shifts) holds plain bit 8 r + 4 kk + j (code r = 2 h + c, half kk, bit j) where lands(r, kk, j) says
    (register, bit)."""
    targets = [(r, p) for r in range(len(decode)) for p in range(32) if mask >> p & 1]
    dec = np.zeros((32, 32), dtype=np.uint8)  # target bit <- stored bits
    place = np.zeros((32, 32), dtype=np.uint8)  # target bit <- plain bit
    for row, (r, p) in enumerate(targets):
        for op, s in decode[r]:
            q = _source(op, s, p)
            if q is not None:
                dec[row, q] ^= 1
    for r in range(4):
        for kk in range(2):
            for j in range(4):
                place[targets.index(lands(r, kk, j)), 8 * r + 4 * kk + j] = 1
    return (_gf2_inverse(dec).astype(np.int64) @ place) % 2


def _perm_matrix(bits) -> np.ndarray:
    """The matrix of a bit permutation (a BITS-like table): plain bit 8 r + 4 kk + j -> bits[r][j] + 16 kk."""
    m = np.zeros((32, 32), dtype=np.int64)
    for r in range(4):
        for kk in range(2):
            for j, pos in enumerate(bits[r]):
                m[(pos + 16 * kk) % 32, 8 * r + 4 * kk + j] = 1
    return m


def _byte_tables(m: np.ndarray) -> np.ndarray:
    """[4, 256] int64 of a [32 out, 32 in] GF(2) matrix: entry [p, v] the output bits of input byte p = v; a word's
    image is the xor of its four bytes' entries."""
    v = np.arange(256, dtype=np.int64)
    tab = np.zeros((4, 256), dtype=np.int64)
    for p in range(4):
        for b in range(8):
            col = sum(int(m[r, 8 * p + b]) << r for r in range(32))
            tab[p] ^= ((v >> b) & 1) * col
    return tab


def order_matrix(order: str) -> np.ndarray:
    """[32 stored bits, 32 plain bits] over GF(2) of a bit order (ORDERS). The "plain" word has byte ``2h + c`` =
    the canonical byte of row ``8h + g`` holding K ``16kt + 8c + 2t`` (low nibble) and ``+1`` (high nibble)."""
    if order == "xor":
        return _order_matrix(XOR_DECODE)
    return _perm_matrix({"plain": BITS, "rot": BITS_ROT}[order])


@lru_cache(maxsize=None)
def lut8(order: str) -> tuple[np.ndarray, np.ndarray]:
    """Byte lookup tables of an order (made on first use): ``fwd[p, v]`` the stored bits of plain byte ``p`` = v,
    ``inv[p, v]`` the plain bits of stored byte ``p`` = v; a word's image is the xor of its bytes' entries.
    ``[4, 256]`` int64."""
    m = order_matrix(check_order(order))
    return _byte_tables(m), _byte_tables(_gf2_inverse(m.astype(np.uint8)).astype(np.int64))


def _lut16(t8: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The byte tables merged per 16-bit half-word (bytes 0-1 and 2-3): two gathers a word."""
    v = np.arange(1 << 16)
    t = t8.astype(np.uint32)
    return t[0][v & 0xFF] ^ t[1][v >> 8], t[2][v & 0xFF] ^ t[3][v >> 8]


@lru_cache(maxsize=None)
def lut16(order: str) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(fwd16, inv16) of an order: lut8's tables merged per 16-bit half-word (made on first use)."""
    fwd8, inv8 = lut8(order)
    return _lut16(fwd8), _lut16(inv8)


def check_order(order: str) -> str:
    if order not in ORDERS:
        raise ValueError(f"hopper_mma bit order {order!r}: expected one of {', '.join(ORDERS)}")
    return order


def _block_order() -> tuple[np.ndarray, np.ndarray]:
    """For one 16-row x 32-byte block (rows, then K bytes): the byte feeding plain byte (h, c) of
    word (g, t, kt), as two index lists (h = 0, h = 1), each ordered (g, t, kt, c)."""
    h, g, t, kt, c = np.meshgrid(np.arange(2), np.arange(8), np.arange(4), np.arange(4), np.arange(2), indexing="ij")
    src = ((8 * h + g) * 32 + 8 * kt + 4 * c + t).reshape(2, -1)
    return src[0], src[1]


SRC = _block_order()
DST = np.argsort(np.concatenate(SRC))  # plain bytes (h = 0 part, then h = 1 part) -> block byte


# The 8 bytes at K offsets 8kt .. 8kt + 7 of one row are (c = 0, t = 0..3), (c = 1, t = 0..3). One
# delta swap of bytes 1 <-> 4 and 3 <-> 6 of each uint64 turns them into four uint16 pairs (c = 0
# byte, c = 1 byte) for t = 0, 2, 1, 3: the table indices, with no byte gather.
SWAP_SHIFT = np.uint64(24)
SWAP_MASK = np.uint64(0x00000000FF00FF00)
PAIR_T = (0, 2, 1, 3)  # t of the four pairs of a uint64 after the swap


@lru_cache(maxsize=16)
def _word_order(kb: int) -> np.ndarray:
    """For one 16-row slab of ``kb``-byte rows: the looked-up word feeding each stored word. The
    looked-up words are ordered (g, block, kt, pair), the stored ones (block, g, t, kt)."""
    nb = kb // 32
    b, g, t, kt = np.meshgrid(np.arange(nb), np.arange(8), np.arange(4), np.arange(4), indexing="ij")
    pair = np.argsort(PAIR_T)[t]
    return (((g * nb + b) * 4 + kt) * 4 + pair).reshape(-1).astype(np.intp)


STEP_BYTES = 1 << 18  # slab bytes transformed at a time: the step's buffers stay in cache


def weight_forward(x: np.ndarray, order: str = "plain") -> np.ndarray:
    """``[E, N, K/2]`` uint8 (contiguous) -> the stored bytes, same shape (hopper_mma_w; order "rot":
    hopper_mma_w_rot, "xor": hopper_mma_w_xor).

    A cache-sized group of slabs at a time: one delta swap on uint64 lanes makes the (c = 0,
    c = 1) byte pairs adjacent, the two 16-bit table lookups (rows g, h = 0 and h = 1) give the
    words, and one 4-byte gather puts the words in the stored order."""
    e, n, kb = x.shape
    fwd16 = lut16(order)[0]
    slabs = np.ascontiguousarray(x).reshape(-1, 16 * kb)
    lanes = slabs.view(np.uint64)  # [slab, h, g, block, kt]
    places = _word_order(kb)
    half = 4 * kb  # words per slab = uint16 pairs per slab and h
    ns = slabs.shape[0]
    out = np.empty((ns, half), dtype=np.uint32)
    step = min(ns, max(1, STEP_BYTES // (16 * kb)))
    u = np.empty((step, 2 * kb), dtype=np.uint64)
    t = np.empty_like(u)
    words = np.empty((step, half), dtype=np.uint32)
    other = np.empty_like(words)
    for a in range(0, ns, step):
        m = min(step, ns - a)
        src, uu, tt, w, w1 = lanes[a:a + m], u[:m], t[:m], words[:m], other[:m]
        np.right_shift(src, SWAP_SHIFT, out=tt)
        tt ^= src
        tt &= SWAP_MASK
        np.bitwise_xor(src, tt, out=uu)
        tt <<= SWAP_SHIFT
        uu ^= tt
        pairs = uu.view(np.uint16)  # [slab, h, g, block, kt, pair]
        np.take(fwd16[0], pairs[:, :half], out=w, mode="wrap")  # 65536 entries: wrap never wraps
        np.take(fwd16[1], pairs[:, half:], out=w1, mode="wrap")
        w ^= w1
        np.take(w, places, axis=1, out=out[a:a + m], mode="wrap")  # indices < half: never wraps
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
