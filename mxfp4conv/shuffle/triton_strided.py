"""triton_kernels' ``StridedLayout`` as vLLM 0.33.0 builds it on ROCm: the loaded bytes.

``_swizzle_mxfp4`` (``quantization/utils/mxfp4_utils.py``) transposes the weight and scale to
``[E, K', N]`` and wraps them in ``StridedLayout``; both are views, so the stored bytes are the
bytes vLLM loaded. The only byte movement on this path is the gate/up row interleave that
converter S's ``AITER_TRITON_MXFP4_BF16`` branch applies to w13 and its scale before the
swizzle (aiter's ``moe_gemm_a16w4`` reads ``[g0, u0, g1, u1, ...]`` rows), which is also what
gpt-oss checkpoints already hold for the ``TRITON`` backends.
"""

from __future__ import annotations

from mxfp4conv.errors import LayoutError
from mxfp4conv.shuffle import aiter as A
from mxfp4conv.shuffle import aiter_np as AN
from mxfp4conv.shuffle.layout_base import Shape3, make_layout


def check_gate_up_rows(s: Shape3, label: str) -> None:
    if s[1] % 2:
        raise LayoutError(
            f"{label}: a w13 tensor of shape {s} has N = {s[1]} rows per expert; the gate/up row "
            f"interleave needs N = 2*I ([gate; up]), an even number."
        )


TRITON_GU1 = make_layout(
    "triton_gu1",
    "w13 rows interleaved one by one ([g0, u0, g1, u1, ...]), bytes otherwise as loaded (Strided)",
    None,
    "any",
    lambda s: check_gate_up_rows(s, "triton_gu1"),
    lambda s: s,
    lambda x, s: A.interleave_gate_up_rows(x),
    lambda y, s: A.deinterleave_gate_up_rows(y),
    vllm_call="convert_weight_to_mxfp4_moe_kernel_format, AITER_TRITON_MXFP4_BF16: "
              "interleave_gate_up(w13 or its scale), then _swizzle_mxfp4's StridedLayout (a view)",
    np_chunk=lambda x, s: AN.interleave_gate_up_rows(x),
)
