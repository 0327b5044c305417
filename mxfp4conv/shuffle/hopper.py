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
``hopper_np.BITS[r] + 16q``. Multiplying by ``2**(s - 1)`` (bf16 bits ``(s + 126) << 7``) then
gives the dequantised weight.

``hopper_mma_w_rot`` holds the same words with the bits at ``hopper_np.BITS_ROT[r] + 16q``
(modulo 32), which the kernels decode in 9 integer instructions a word instead of 11:

    R0 = w & M,  R1 = rotl(w, 4) & M,  R2 = rotl(w, 10) & M,       M = 0x81C081C0
    R3 = ((rotl(w, 6) & 0x00400040) | (rotl(w, 14) & 0x81808180)) & M

``hopper_mma_w_xor`` holds the same codes with its bits a linear map over GF(2) of the plain word
(``hopper_np.order_matrix("xor")``, not a permutation), which the kernels decode in 8: R0 as in
``hopper_mma_w_rot`` (every code where that order's decode puts it) and

    R1 = (w << 6) & M,  R2 = rotl(w, 12) & M,  R3 = ((w << 2) ^ (w >> 6)) & M

Scales (``hopper_mma_s``), per expert, canonical ``[N, K/32]``: the same 16-row slabs and
64-code blocks, 32 bytes per block stored in K order; byte ``4g + 2h + j`` is the scale of row
``8h + g``, K group ``2kb + j``. Lanes ``4g .. 4g + 3`` read the same 4 bytes.

Both keep the canonical tensor's shape and size and are independent per expert, so the
converter streams them like the other layouts.
"""

from __future__ import annotations

import numpy as np
from mxfp4conv.lazy_torch import torch

from mxfp4conv.errors import LayoutError
from mxfp4conv.shuffle import hopper_native as HX
from mxfp4conv.shuffle import hopper_np as HN

ROWS = 16  # rows per slab
CODES = 64  # codes per block


def _check(name: str, what: str, s, k_codes: int) -> None:
    _, n, _ = s
    if n % ROWS or k_codes % CODES:
        raise LayoutError(
            f"{name}: {what} of shape {tuple(s)} (N = {n} rows, K = {k_codes} codes) need "
            f"N a multiple of {ROWS} and K a multiple of {CODES}; pad the layer to those sizes.")


def check_weight(s, name: str = "hopper_mma_w") -> None:
    _check(name, "fp4 weights", s, 2 * s[2])


def check_scale(s) -> None:
    _check("hopper_mma_s", "e8m0 scales", s, 32 * s[2])


def _forward_cpu(x: torch.Tensor, order: str = "plain") -> torch.Tensor:
    return torch.from_numpy(HX.weight_forward(x.contiguous().numpy(), order))


def _inverse_cpu(y: torch.Tensor, shape, order: str = "plain") -> torch.Tensor:
    e, n, kb = shape
    inv16 = HN.lut16(order)[1]
    halves = y.contiguous().numpy().view(np.uint16).reshape(-1, 128, 2).transpose(2, 0, 1).copy()
    plain = inv16[0][halves[0]] ^ inv16[1][halves[1]]  # bytes (h0 c0, h0 c1, h1 c0, h1 c1) of each word
    parts = plain.view(np.uint16).reshape(-1, 128, 2).transpose(0, 2, 1).reshape(-1, 512 // 2)  # h0 pairs, h1 pairs
    blocks = torch.from_numpy(np.take(parts.view(np.uint8), HN.DST, axis=1))
    return blocks.reshape(e, n // 16, kb // 32, 16, 32).transpose(2, 3).reshape(shape)


def _permute_bits_torch(words: torch.Tensor, lut: np.ndarray) -> torch.Tensor:
    """[M, 4] bytes of little-endian words -> [M, 4] bytes with the bits moved by ``lut`` (any device): each
    byte's table entry xor-ed, so a table of any linear map over GF(2) works too, not only a bit permutation."""
    b = words.to(torch.int64)
    lut = torch.from_numpy(lut).to(b.device)
    out = lut[0][b[..., 0]] ^ lut[1][b[..., 1]] ^ lut[2][b[..., 2]] ^ lut[3][b[..., 3]]
    return torch.stack([(out >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8)


def _forward_torch(x: torch.Tensor, order: str = "plain", fwd8: np.ndarray | None = None) -> torch.Tensor:
    """``weight_forward`` with torch operations only, on any device (one expert at a time); fwd8: another bit
    order's byte tables (``_permute_bits_torch``) in place of the order's."""
    e, n, kb = x.shape
    if fwd8 is None:
        fwd8 = HN.lut8(order)[0]
    out = torch.empty_like(x)
    for i in range(e):
        # row = 16 nb + 8 h + g ; byte = 32 b + 8 kt + 4 c + t
        plain = x[i].reshape(n // 16, 2, 8, kb // 32, 4, 2, 4).permute(0, 3, 2, 6, 4, 1, 5)  # nb b g t kt h c
        out[i] = _permute_bits_torch(plain.reshape(-1, 4), fwd8).reshape(n, kb)
    return out


def _inverse_torch(y: torch.Tensor, shape, order: str = "plain") -> torch.Tensor:
    e, n, kb = shape
    inv8 = HN.lut8(order)[1]
    y = y.reshape(e, n * kb // 4, 4)
    out = torch.empty(shape, dtype=torch.uint8, device=y.device)
    for i in range(e):
        plain = _permute_bits_torch(y[i], inv8).reshape(n // 16, kb // 32, 8, 4, 4, 2, 2)  # nb b g t kt h c
        out[i] = plain.permute(0, 5, 2, 1, 4, 6, 3).reshape(n, kb)
    return out


def weight_forward(x: torch.Tensor, order: str = "plain") -> torch.Tensor:
    """Canonical ``[E, N, K/2]`` bytes -> hopper_mma_w bytes (order "rot": hopper_mma_w_rot, "xor":
    hopper_mma_w_xor)."""
    return _forward_cpu(x, order) if x.device.type == "cpu" else _forward_torch(x, order)


def weight_inverse(y: torch.Tensor, shape, order: str = "plain") -> torch.Tensor:
    return _inverse_cpu(y, shape, order) if y.device.type == "cpu" else _inverse_torch(y, shape, order)


def scale_forward(x: torch.Tensor) -> torch.Tensor:
    e, n, g = x.shape
    if x.device.type == "cpu":
        return torch.from_numpy(HN.scale_forward(x.contiguous().numpy()))
    return _scale_forward_torch(x)


def _scale_forward_torch(x: torch.Tensor) -> torch.Tensor:
    e, n, g = x.shape
    s = x.reshape(e, n // 16, 2, 8, g // 2, 2)  # e nb h g b j
    return s.permute(0, 1, 4, 3, 2, 5).contiguous().reshape(e, n, g)  # e nb b g h j


def scale_inverse(y: torch.Tensor, shape) -> torch.Tensor:
    e, n, g = shape
    s = y.reshape(e, n // 16, g // 2, 8, 2, 2)  # e nb b g h j
    return s.permute(0, 1, 4, 3, 2, 5).contiguous().reshape(e, n, g)
