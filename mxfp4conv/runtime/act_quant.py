"""Activation quantisation semantics, emulated in fp32 (quantise then dequantise).

- ``none``: W4A16, activations stay in their precision.
- ``fp8``: W4A8 with static per-tensor input scales (Quark ``w_mxfp4_a_fp8``): each GEMM input
  is ``e4m3(x / s) * s`` with ``s`` the layer's ``w13_input_scale`` / ``w2_input_scale``. Like
  vLLM (``max()`` over the layer's per-expert scales, fp32 ``Parameter``), one scalar per GEMM
  is used: the max over this rank's experts. Without stored input scales the scale is dynamic
  per token (``amax / 448``). OCP ``float8_e4m3fn`` (gfx950, NVIDIA), saturating at +-448.
- ``mxfp4``: W4A4 with dynamic MXFP4 activations, per 32 elements along K, scale rounding
  "even" (vLLM's emulation ``qdq_mxfp4(x, "even")``, AITER's ``dynamic_mxfp4_quant``). Kimi-K3's
  SiTUv2 a4w4 on AITER is this too: both GEMM inputs quantised at run time.

Which one a layer runs comes from its manifest (``served_act_quant``): the target's act_quant,
except for SiTU layers on AITER, where the SiTUv2 mode decides (``situv2``).
"""

from __future__ import annotations

import torch

from mxfp4conv.errors import CheckpointError, RuntimeInputError
from mxfp4conv.runtime import situv2

ACT_QUANTS = ("none", "fp8", "mxfp4")
_ALIASES = {
    "none": "none", "bf16": "none", "fp16": "none", "w4a16": "none", "a16": "none",
    "fp8": "fp8", "w4a8": "fp8", "a8": "fp8",
    "mxfp4": "mxfp4", "w4a4": "mxfp4", "a4": "mxfp4",
}
FP8_MAX = 448.0


def resolve_act_quant(requested: str, target_act_quant: str | None) -> str:
    """``auto`` -> the target's act_quant (manifest ``target.act_quant``); aliases -> canonical."""
    req = (requested or "auto").lower()
    if req == "auto":
        req = (target_act_quant or "bf16").lower()
        if req == "auto":
            req = "bf16"
    if req not in _ALIASES:
        raise RuntimeInputError(
            f"act_quant={requested!r} is not known; use one of auto, none (W4A16), fp8 (W4A8), "
            "mxfp4 (W4A4)."
        )
    return _ALIASES[req]


def served_act_quant(target: dict, runtime_env: dict, layout: dict, where: str) -> tuple[str, str | None]:
    """(activation quantisation the served kernels apply: none | fp8 | mxfp4, SiTUv2 mode or None)."""
    raw = str(target.get("act_quant", "bf16"))
    if (raw or "auto").lower() not in (*_ALIASES, "auto"):
        raise CheckpointError(
            f"{where}: the manifest's target.act_quant is {raw!r}, not one of bf16, fp8, mxfp4; the "
            "manifest is damaged. Convert the source again."
        )
    declared = resolve_act_quant("auto", raw)
    kernel = _ALIASES.get(str((target.get("options") or {}).get("kernel_act", "")).lower())
    mode = situv2.resolve(target, runtime_env, layout, declared, kernel, where)
    return (situv2.ACT_QUANT[mode], mode) if mode else (declared, None)


def fp8_qdq(x: torch.Tensor, scale: float | None) -> torch.Tensor:
    """fp32 ``x`` through static (``scale``) or dynamic per-token e4m3 quantisation and back."""
    x = x.float()
    if scale is None:
        s = (x.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    else:
        s = torch.tensor(float(scale), dtype=torch.float32, device=x.device)
    q = (x / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.to(torch.float32) * s


def mxfp4_qdq(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``x[..., K]`` (K % 32 == 0) through dynamic MXFP4 (per 32 along K) and back."""
    from mxfp4conv.codec import dequantize_mxfp4, quantize_mxfp4

    packed, scales = quantize_mxfp4(x.float(), rounding="even")
    return dequantize_mxfp4(packed, scales, dtype=torch.float32)


def qdq(x: torch.Tensor, mode: str, static_scale: float | None = None) -> torch.Tensor:
    if mode == "none":
        return x
    if mode == "fp8":
        return fp8_qdq(x, static_scale)
    if mode == "mxfp4":
        return mxfp4_qdq(x)
    raise RuntimeInputError(f"act_quant mode {mode!r} is not one of {', '.join(ACT_QUANTS)}.")
