"""A layer's stored expert tensors in the forms vLLM's MXFP4 MoE methods hold them (pure torch).

- ``loaded_form``: what vLLM's weight loader leaves in the layer's parameters before
  ``process_weights_after_loading`` (identity bytes; gpt-oss keeps its checkpoint's gate/up row
  interleave, which mxfp4conv's format stores as ``[gate; up]``).
- ``kernel_form``: what vLLM's weight converter returns for the backend (the converted bytes, in
  the dtype and with the ``is_shuffled`` flag vLLM's conversion gives them: AITER's shuffles mark
  their outputs, scales included, unless vLLM writes the result back into its own parameter;
  TRTLLM's uint8 weights and float8_e4m3fn-viewed scales carry no mark), for the (method, backend)
  pairs whose layout mxfp4conv writes.
"""

from __future__ import annotations

from typing import Any

import torch

from mxfp4conv.errors import RuntimeInputError

PARAM = {"w13": "w13_weight", "w13_scale": "w13_weight_scale", "w2": "w2_weight", "w2_scale": "w2_weight_scale",
         "w13_bias": "w13_bias", "w2_bias": "w2_bias",
         "w13_input_scale": "w13_input_scale", "w2_input_scale": "w2_input_scale"}
INTERLEAVED_W13 = ("GptOssMxfp4MoEMethod",)  # vLLM keeps the checkpoint's gate/up row interleave
W13_ROWS = ("w13", "w13_scale", "w13_bias")


def interleave_gate_up(t: torch.Tensor) -> torch.Tensor:
    """``[gate; up]`` rows (dim 1) -> ``[g0, u0, g1, u1, ...]``; each half's padding rows land
    at the tail, where vLLM's gpt-oss loader leaves its padding."""
    gate, up = t.chunk(2, dim=1)
    return torch.stack((gate, up), dim=2).reshape(t.shape)


def loaded_form(method: str, stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{parameter name: tensor} as vLLM's loader leaves them for ``method`` (copied into its params)."""
    out = {}
    for kind, t in stored.items():
        if method in INTERLEAVED_W13 and kind in W13_ROWS:
            t = interleave_gate_up(t)
        out[PARAM[kind]] = t
    return out


def _fp4(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.float4_e2m1fn_x2)


def _e8m0(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.float8_e8m0fnu)


def _e4m3(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.float8_e4m3fn)


# (method, backend, SiTU?) -> (weight view, scale view, scales kept 3-D by vLLM, is_shuffled marks);
# a view None keeps the stored uint8
KERNEL_READY = {
    ("Mxfp4MoEMethod", "AITER_MXFP4_BF16", True): (_fp4, _e8m0, False, True),  # Kimi-K3 SiTU a16w4 / a4w4 / a8w4
    ("Mxfp4MoEMethod", "AITER_MXFP4_BF16", False): (_fp4, None, False, True),  # DeepSeek-V4
    ("GptOssMxfp4MoEMethod", "AITER_MXFP4_BF16", False): (_fp4, None, False, True),
    ("QuarkOCP_MX_MoEMethod", "AITER_MXFP4_BF16", False): (_fp4, None, False, True),
    ("QuarkOCP_MX_MoEMethod", "AITER_MXFP4_MXFP4", False): (_fp4, None, True, True),
    # sm100 TRTLLM-Gen (converter S): uint8 weights, the e8m0 scale bytes viewed as float8_e4m3fn
    ("Mxfp4MoEMethod", "FLASHINFER_TRTLLM_MXFP4_MXFP8", True): (None, _e4m3, True, False),  # Kimi-K3
    ("Mxfp4MoEMethod", "FLASHINFER_TRTLLM_MXFP4_MXFP8", False): (None, _e4m3, True, False),  # DeepSeek-V4
    ("GptOssMxfp4MoEMethod", "FLASHINFER_TRTLLM_MXFP4_BF16", False): (None, _e4m3, True, False),
    ("GptOssMxfp4MoEMethod", "FLASHINFER_TRTLLM_MXFP4_MXFP8", False): (None, _e4m3, True, False),
}
# backends whose converter also puts the biases in the weights' row order (stored as loaded)
TRTLLM_BIASES = ("FLASHINFER_TRTLLM_MXFP4_BF16", "FLASHINFER_TRTLLM_MXFP4_MXFP8")


def kernel_form(method: str, backend: str, activation: str, stored: dict[str, torch.Tensor],
                manifest: dict[str, Any], where: str) -> dict[str, torch.Tensor]:
    """{parameter name: tensor} as vLLM's converter returns them for ``backend`` on ``method``."""
    key = (method, backend, activation == "situ")
    if key not in KERNEL_READY:
        known = ", ".join(f"{m}/{b}" for m, b, _ in KERNEL_READY)
        raise RuntimeInputError(
            f"{where} holds {backend} bytes for {method}, which the mxfp4conv vLLM plugin cannot hand to "
            f"vLLM's kernel (it serves {known}, and identity layouts for every backend). Convert the source "
            "again with `--layout identity` so vLLM converts at start-up, or for another target.")
    weight_view, scale_view, scale_3d, marks = KERNEL_READY[key]
    moe = manifest["moe"]
    e, h, i = int(moe["experts_per_rank"]), int(moe["hidden_padded"]), int(moe["intermediate_per_rank_padded"])
    out = {}
    for kind, t in stored.items():
        if kind in ("w13", "w2"):
            if weight_view is not None:
                t = weight_view(t)
            if marks:
                t.is_shuffled = True
        elif kind in ("w13_scale", "w2_scale"):
            if scale_3d:  # vLLM keeps the converted scales 3-D
                t = t.reshape(e, 2 * i if kind == "w13_scale" else h, -1)
            if scale_view is not None:
                t = scale_view(t)
            if marks and not scale_3d:
                t.is_shuffled = True
        elif kind in ("w13_bias", "w2_bias"):
            t = t.to(torch.float32)
            if backend in TRTLLM_BIASES:
                from mxfp4conv.shuffle.trtllm import bias_rows

                t = bias_rows(t, gate_up=kind == "w13_bias")
        out[PARAM[kind]] = t
    return out
