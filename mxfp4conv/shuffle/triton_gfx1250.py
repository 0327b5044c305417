"""gfx1250's MoE MX scale shuffle as vLLM 0.33.0 applies it before the Triton kernels.

On gfx1250 ``_swizzle_mxfp4`` (and converter S's ``AITER_TRITON_MXFP4_MXFP4`` branch) passes the
transposed scale ``[E, K/32, N]`` through aiter's ``shuffle_scale_moe(arch="gfx1250",
preshuffle_factor=32, scale_kwidth=4)``. Per expert, byte ``(32a + r, 4c + q)`` of the
``[N, K/32]`` scale goes to ``[a, 128c + 4r + q]`` of a ``[N/32, (K/32)*32]`` tensor: each 32-row x
4-column block stored contiguously, the same bytes as AITER's CK-side ``shuffle_scale_n32k4``.
No padding: vLLM asserts N % 32 == 0 and (K/32) % 4 == 0. The kernel gets the transposed view;
what is stored here is its contiguous storage.
"""

from __future__ import annotations

from mxfp4conv.shuffle import aiter as A
from mxfp4conv.shuffle import aiter_np as AN
from mxfp4conv.shuffle.layout_base import Shape3, make_layout

CALL = ('aiter shuffle_scale_moe(scale.transpose(-2, -1), arch="gfx1250", preshuffle_factor=32, '
        "scale_kwidth=4) in _swizzle_mxfp4 on gfx1250")


def _check(gu1: bool, label: str):
    def check(s: Shape3) -> None:
        A._n32k4_plan(s[0], s[1], s[2], gu1, label)

    return check


def _out(s: Shape3) -> tuple[int, int, int]:
    return (s[0], s[1] // 32, s[2] * 32)


TRITON_GFX1250_SCALE = make_layout(
    "triton_gfx1250_scale",
    "e8m0 scales as [E, N/32, (K/32)*32]: 32-row x 4-column blocks stored contiguously (gfx1250 WMMA scale order)",
    CALL,
    "scale",
    _check(False, "triton_gfx1250_scale"),
    _out,
    lambda x, s: A.shuffle_scale_n32k4(x, s[0], False, False),
    lambda y, s: A.unshuffle_scale_n32k4(y, s[0], False, False),
    vllm_call=CALL,
    np_chunk=lambda x, s: AN.scale_n32k4(x, False),
)

TRITON_GFX1250_SCALE_GU1 = make_layout(
    "triton_gfx1250_scale_gu1",
    "w13 scale rows interleaved one by one ([g0, u0, ...]), then the gfx1250 scale shuffle",
    CALL,
    "scale",
    _check(True, "triton_gfx1250_scale_gu1"),
    _out,
    lambda x, s: A.shuffle_scale_n32k4(x, s[0], True, True),
    lambda y, s: A.unshuffle_scale_n32k4(y, s[0], True, True),
    vllm_call="interleave_gate_up(w13 scale) (AITER_TRITON_MXFP4_BF16, or SwiGLU-OAI on "
              "AITER_TRITON_MXFP4_MXFP4), then " + CALL,
    np_chunk=lambda x, s: AN.scale_n32k4(x, True),
)
