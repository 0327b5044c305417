"""mxfp4conv's Hopper weight layouts written out from docs/kernel-ready-format.md, bit by bit, without the
library's tables: what test_convert expects convert to write and what test_hopper_layout checks the layouts against."""

from __future__ import annotations

import torch

# docs/kernel-ready-format.md: magnitude bits (m, e0, e1) and sign of the low-half code of the
# registers (h, c) = (0, 0), (0, 1), (1, 0), (1, 1); the high-half code (kk = 1) sits 16 bits up
HOPPER_BITS = ((6, 7, 8, 15), (3, 4, 5, 12), (0, 1, 2, 9), (10, 11, 13, 14))
HOPPER_BITS_ROT = ((6, 7, 8, 15), (2, 3, 4, 11), (28, 29, 30, 5), (0, 25, 26, 1))  # hopper_mma_w_rot (modulo 32)


def hopper_words(x: torch.Tensor, bits) -> torch.Tensor:
    """hopper_mma_w / hopper_mma_w_rot written out from their definition, bit by bit."""
    E, N, K2 = x.shape
    codes = torch.stack((x & 0xF, x >> 4), -1).reshape(E, N, 2 * K2).long()
    # row = 16 nb + 8 h + g, k = 64 b + 16 kt + 8 c + 2 t + kk  ->  [E, nb, b, g, t, kt, h, c, kk]
    codes = codes.reshape(E, N // 16, 2, 8, 2 * K2 // 64, 4, 2, 4, 2).permute(0, 1, 4, 3, 7, 5, 2, 6, 8)
    word = torch.zeros(codes.shape[:6], dtype=torch.long)
    for h in range(2):
        for c in range(2):
            for kk in range(2):
                for j, pos in enumerate(bits[2 * h + c]):
                    word |= ((codes[..., h, c, kk] >> j) & 1) << ((pos + 16 * kk) % 32)
    b = torch.stack([(word >> (8 * i)) & 0xFF for i in range(4)], -1).to(torch.uint8)
    return b.reshape(E, N, K2)


def xor_words_solved(rot: torch.Tensor) -> torch.Tensor:
    """hopper_mma_w_xor from its definition, independent of the library's GF(2) tables: the word whose decode
    (docs/kernel-ready-format.md) gives the registers hopper_mma_w_rot's decode gives, its bits solved one by one."""
    w = rot.reshape(-1, 4).to(torch.int64)
    w = w[:, 0] | w[:, 1] << 8 | w[:, 2] << 16 | w[:, 3] << 24
    M = 0x81C081C0
    rotl = lambda v, s: ((v << s) | (v >> (32 - s))) & 0xFFFFFFFF  # noqa: E731
    regs = [w & M, rotl(w, 4) & M, rotl(w, 10) & M, (rotl(w, 6) & 0x00400040) | (rotl(w, 14) & 0x81808180)]
    bit = lambda v, p: (v >> p) & 1  # noqa: E731
    out = {}
    for p in (6, 7, 8, 15, 22, 23, 24, 31):  # R0 = w & M, R1 = (w << 6) & M, R2 = rotl(w, 12) & M
        out[p] = bit(regs[0], p)
        out[p - 6] = bit(regs[1], p)
        out[(p - 12) % 32] = bit(regs[2], p)
    # R3 = ((w << 2) ^ (w >> 6)) & M: bit p is w[p - 2] ^ w[p + 6] (w[37] = 0)
    out[29] = bit(regs[3], 31)
    for p, known, unknown in ((23, 29, 21), (15, 21, 13), (7, 13, 5), (6, 12, 4), (8, 6, 14), (22, 28, 20),
                              (24, 22, 30)):
        a, b = (p - 2, p + 6)
        out[unknown] = bit(regs[3], p) ^ out[known]
        assert {a, b} == {known, unknown}
    word = sum(out[p] << p for p in range(32))
    return torch.stack([(word >> (8 * i)) & 0xFF for i in range(4)], -1).to(torch.uint8).reshape(rot.shape)
