"""The torch reference backend: dequantise the touched experts, two GEMMs and the activation in fp32.

This is the definition every other backend is compared with. Input is zero-padded to
``H_pad`` and the output cut back to ``H``; the result is this rank's share (a partial sum for
tensor-parallel ranks, only this rank's experts for expert-parallel ranks).
"""

from __future__ import annotations

import torch

from mxfp4conv.errors import CheckpointError
from mxfp4conv.runtime.act_quant import qdq
from mxfp4conv.runtime.activations import resolve_activation
from mxfp4conv.runtime.experts import MoEExperts
from mxfp4conv.runtime.relayout import canonical


def _static_scale(scales: torch.Tensor | None) -> float | None:
    # vLLM reduces the per-expert static input scales of a layer to one scalar (max).
    return None if scales is None else float(scales.max())


def dequant_expert(ex: MoEExperts, kind: str, e: int) -> torch.Tensor:
    """Local expert ``e`` of ``w13`` / ``w2`` as fp32 ``[N, K]``; a NaN scale (0xFF) is an error."""
    from mxfp4conv.codec import dequantize_mxfp4

    packed, scales = ex.tensor(kind)[e], ex.tensor(kind + "_scale")[e]
    w = dequantize_mxfp4(packed, scales, dtype=torch.float32)
    if not bool(torch.isfinite(w).all()):
        raise CheckpointError(
            f"{ex.prefix}.experts.rank{ex.rank}: {kind} scale of local expert {e} (global "
            f"{ex.global_ids[e]}) holds the e8m0 byte 0xFF (NaN), so its output would be NaN. "
            "The source checkpoint or the conversion is damaged; convert again from a healthy source."
        )
    return w


def torch_fused_moe(
    x: torch.Tensor,
    experts: MoEExperts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act_quant: str,
) -> torch.Tensor:
    """``[T, H]`` -> ``[T, H]`` fp32: ``sum_k w_k * expert_k(x)`` over this rank's experts."""
    ex = canonical(experts)
    T, H = x.shape
    h_pad, i_pad = ex.hidden_padded, ex.intermediate_per_rank_padded
    xp = torch.zeros(T, h_pad, dtype=torch.float32, device=x.device)
    xp[:, :H] = x.float()
    act = resolve_activation(ex.activation, ex.activation_params)
    s13 = _static_scale(ex.w13_input_scale) if act_quant == "fp8" else None
    s2 = _static_scale(ex.w2_input_scale) if act_quant == "fp8" else None
    a1 = qdq(xp, act_quant, s13)

    local = ex.local_ids(topk_ids)
    out = torch.zeros(T, h_pad, dtype=torch.float32, device=x.device)
    for e in torch.unique(local[local >= 0]).tolist():
        tok, slot = torch.nonzero(local == e, as_tuple=True)
        w13 = dequant_expert(ex, "w13", e)  # [2*I_pad, H_pad]
        h = a1[tok] @ w13.T
        if ex.w13_bias is not None:
            h = h + ex.w13_bias[e]
        inter = act(h[:, :i_pad], h[:, i_pad:])
        inter = qdq(inter, act_quant, s2)
        w2 = dequant_expert(ex, "w2", e)  # [H_pad, I_pad]
        y = inter @ w2.T
        if ex.w2_bias is not None:
            y = y + ex.w2_bias[e]
        out.index_add_(0, tok, y * topk_weights[tok, slot].float().unsqueeze(1))
    return out[:, :H]
