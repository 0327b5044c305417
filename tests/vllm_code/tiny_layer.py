"""The tiny MoE layer both sides of the converter conformance build from one seed.

Imported by the vLLM worker's ``probe_convert`` (which loads it into vLLM's layer) and by the
test (which hands the same canonical bytes to mxfp4conv's layouts). Only torch: the bytes come
from a seeded CPU generator, identical in both processes.

Canonical means mxfp4conv's convention: uint8 ``[E, N, K']``, w13 rows ``[gate; up]``.
"""

from __future__ import annotations

import base64

import torch

EXPERTS = 2
HIDDEN = 256  # K/32 = 8: the CDNA4 scale tile's column count
INTERMEDIATE = 256  # per rank; w13 has 2 * INTERMEDIATE rows
TENSORS = ("w13", "w13_scale", "w2", "w2_scale")


def _u8(shape, seed: int, lo: int = 0, hi: int = 256) -> torch.Tensor:
    return torch.randint(lo, hi, shape, dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed))


def canonical(seed: int) -> dict[str, torch.Tensor]:
    """fp4x2 weight bytes (any value) and e8m0 scale bytes (finite, near 1.0)."""
    e, h, i = EXPERTS, HIDDEN, INTERMEDIATE
    return {
        "w13": _u8((e, 2 * i, h // 2), seed),
        "w13_scale": _u8((e, 2 * i, h // 32), seed + 1, 100, 140),
        "w2": _u8((e, h, i // 2), seed + 2),
        "w2_scale": _u8((e, h, i // 32), seed + 3, 100, 140),
    }


def interleave_rows(t: torch.Tensor) -> torch.Tensor:
    """``[gate; up]`` rows -> ``[g0, u0, g1, u1, ...]`` (how a gpt-oss checkpoint stores w13)."""
    e, n, k = t.shape
    return t.reshape(e, 2, n // 2, k).transpose(1, 2).reshape(e, n, k)


def encode(t: torch.Tensor) -> str:
    return base64.b64encode(t.contiguous().view(torch.uint8).numpy().tobytes()).decode()


def decode(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)
