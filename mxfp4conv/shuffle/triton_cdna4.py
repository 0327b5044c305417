"""triton_kernels' ``CDNA4MXScaleLayout``: the gfx950 MX scale swizzle vLLM 0.33.0 applies.

``_swizzle_mxfp4`` swizzles the e8m0 scales with it on gfx950 at TP <= 2
(``should_use_cdna4_mx_scale_swizzle``; the bundled triton_kernels has no
``GFX950MXScaleLayout``, so that import falls back to this class) for every backend whose
weights go through ``_swizzle_mxfp4`` (``TRITON``, ``TRITON_UNFUSED``,
``AITER_TRITON_MXFP4_BF16``, ``AITER_MXFP4_FP8``). Per expert, byte
``(32a + 16p + l, 8b + 4q + j)`` of the ``[N, K/32]`` scale goes to ``[a, 256b + 64j + 4l + 2q + p]``
of a ``[N/32, (K/32)*32]`` tensor: the same bytes in the same order as AITER's 32x8
``e8m0_shuffle`` tile of one expert, without any padding (triton_kernels views the tensor, so
N must be a multiple of 32 and K/32 of 8). vLLM hands the kernel the transposed view
``[E, (K/32)*32, N/32]`` of that tensor; what is stored here is its contiguous storage.
"""

from __future__ import annotations

from mxfp4conv.lazy_torch import torch

from mxfp4conv.errors import LayoutError
from mxfp4conv.shuffle import aiter as A
from mxfp4conv.shuffle import aiter_np as AN
from mxfp4conv.shuffle.layout_base import Shape3, make_layout
from mxfp4conv.shuffle.triton_strided import check_gate_up_rows

CALL = "triton_kernels CDNA4MXScaleLayout.swizzle_data(scale.transpose(-2, -1)) in _swizzle_mxfp4 (gfx950, tp <= 2)"


def check(s: Shape3, label: str) -> None:
    if s[1] % 32 or s[2] % 8:
        raise LayoutError(
            f"{label}: triton_kernels' CDNA4MXScaleLayout views scales of shape {s} as 32-row x "
            f"8-column tiles without padding, so N = {s[1]} must be a multiple of 32 and K/32 = {s[2]} "
            f"of 8 (K a multiple of 256). vLLM pads H and I to 256 on this path; pad the same way."
        )


def swizzle(x: torch.Tensor) -> torch.Tensor:
    """uint8 ``[E, N, Ks]`` -> ``[E, N/32, Ks*32]`` (see the module docstring)."""
    e, n, ks = x.shape
    t = x.reshape(e, n // 32, 2, 16, ks // 8, 2, 4)  # e, a, p, l, b, q, j
    return t.permute(0, 1, 4, 6, 3, 5, 2).reshape(e, n // 32, ks * 32)


def unswizzle(y: torch.Tensor, s: Shape3) -> torch.Tensor:
    """Exact inverse of ``swizzle``: ``[E, N/32, Ks*32]`` -> uint8 ``[E, N, Ks]``."""
    e, n, ks = s
    t = y.reshape(e, n // 32, ks // 8, 4, 16, 2, 2)  # e, a, b, j, l, q, p
    return t.permute(0, 1, 6, 4, 2, 5, 3).reshape(s)


def _out(s: Shape3) -> tuple[int, int, int]:
    return (s[0], s[1] // 32, s[2] * 32)


def _check_gu1(s: Shape3) -> None:
    check_gate_up_rows(s, "triton_cdna4_scale_gu1")
    check(s, "triton_cdna4_scale_gu1")


TRITON_CDNA4_SCALE = make_layout(
    "triton_cdna4_scale",
    "e8m0 scales as [E, N/32, (K/32)*32] in 32-row x 8-column tiles, one dword per lane (CDNA4 MFMA scale order)",
    None,
    "scale",
    lambda s: check(s, "triton_cdna4_scale"),
    _out,
    lambda x, s: swizzle(x),
    unswizzle,
    vllm_call=CALL,
    np_chunk=lambda x, s: AN.cdna4_scale(x),
)

TRITON_CDNA4_SCALE_GU1 = make_layout(
    "triton_cdna4_scale_gu1",
    "w13 scale rows interleaved one by one ([g0, u0, ...]), then the CDNA4 scale swizzle",
    None,
    "scale",
    _check_gu1,
    _out,
    lambda x, s: swizzle(A.interleave_gate_up_rows(x)),
    lambda y, s: A.deinterleave_gate_up_rows(unswizzle(y, s)),
    vllm_call="AITER_TRITON_MXFP4_BF16: interleave_gate_up(w13 scale), then " + CALL,
    np_chunk=lambda x, s: AN.cdna4_scale(AN.interleave_gate_up_rows(x)),
)
