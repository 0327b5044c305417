"""``fused_moe``: one entry point, three backends (torch reference, Triton, AITER)."""

from __future__ import annotations

import torch

from mxfp4conv.errors import RuntimeInputError
from mxfp4conv.runtime.act_quant import resolve_act_quant
from mxfp4conv.runtime.experts import MoEExperts
from mxfp4conv.runtime.loader import choose_backend, triton_layout
from mxfp4conv.runtime.relayout import canonical

BACKENDS = ("auto", "torch", "triton", "aiter")
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INT_DTYPES = (torch.int32, torch.int64, torch.int16, torch.uint8, torch.int8)


def _validate(x, experts, topk_weights, topk_ids, out) -> None:
    if not isinstance(experts, MoEExperts):
        raise RuntimeInputError(f"experts must be a MoEExperts from load_moe_layers, got {type(experts).__name__}.")
    for name, t in (("hidden_states", x), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if not isinstance(t, torch.Tensor):
            raise RuntimeInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}.")
    if x.dim() != 2 or x.dtype not in FLOAT_DTYPES:
        raise RuntimeInputError(
            f"hidden_states must be a 2-D [tokens, {experts.hidden}] bf16/fp16/fp32 tensor, got shape "
            f"{list(x.shape)} and dtype {x.dtype}."
        )
    if x.shape[1] != experts.hidden:
        hint = " (that is the padded width; pass the unpadded hidden states)" if x.shape[1] == experts.hidden_padded else ""
        raise RuntimeInputError(
            f"hidden_states has hidden size {x.shape[1]}, but layer {experts.prefix!r} expects {experts.hidden}{hint}."
        )
    T = x.shape[0]
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T or topk_ids.shape[1] < 1:
        raise RuntimeInputError(f"topk_ids must be [tokens={T}, k] with k >= 1, got shape {list(topk_ids.shape)}.")
    if topk_ids.dtype not in INT_DTYPES:
        raise RuntimeInputError(f"topk_ids must be an integer tensor (int32 or int64), got {topk_ids.dtype}.")
    if topk_weights.shape != topk_ids.shape:
        raise RuntimeInputError(
            f"topk_weights must have the shape of topk_ids {list(topk_ids.shape)}, got {list(topk_weights.shape)}."
        )
    if not topk_weights.dtype.is_floating_point:
        raise RuntimeInputError(f"topk_weights must be a float tensor, got {topk_weights.dtype}.")
    dev = experts.device
    for name, t in (("hidden_states", x), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if t.device != dev:
            raise RuntimeInputError(
                f"{name} is on {t.device}, but the experts of {experts.prefix!r} are on {dev}; move the input "
                "or load the checkpoint with device=... matching it."
            )
    if topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < 0 or hi >= experts.num_experts:
            bad = lo if lo < 0 else hi
            raise RuntimeInputError(
                f"topk_ids contains expert id {bad}, outside [0, {experts.num_experts}) for layer "
                f"{experts.prefix!r}; topk_ids are global expert ids."
            )
    if out is not None and (tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype or out.device != x.device):
        raise RuntimeInputError(
            f"out must be a {list(x.shape)} {x.dtype} tensor on {x.device}, got {list(out.shape)} {out.dtype} on {out.device}."
        )


def _run_triton(x, experts, topk_weights, topk_ids, act_quant):
    if act_quant != "none":
        raise RuntimeInputError(
            f"the triton backend computes W4A16 only, but act_quant resolved to {act_quant!r}; pass "
            "act_quant='none' for W4A16 math or backend='torch' to emulate the activation quantisation."
        )
    from mxfp4conv.kernels.triton_moe import fused_moe_triton

    ex = experts
    layout = triton_layout(ex.layout)
    if layout is None:
        ex, layout = canonical(ex), "identity"
    H = x.shape[1]
    xp = x if ex.hidden_padded == H else torch.nn.functional.pad(x, (0, ex.hidden_padded - H))
    local = ex.local_ids(topk_ids).to(torch.int32)
    y = fused_moe_triton(
        xp.contiguous(), ex.w13_weight, ex.w13_weight_scale, ex.w2_weight, ex.w2_weight_scale,
        topk_weights.to(torch.float32), local,
        activation=ex.activation, activation_params=dict(ex.activation_params),
        w13_bias=ex.w13_bias, w2_bias=ex.w2_bias, layout=layout,
    )
    return y[:, :H]


def fused_moe(
    hidden_states: torch.Tensor,
    experts: MoEExperts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    backend: str = "auto",
    act_quant: str = "auto",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Routed-expert forward of one MoE layer for this rank: ``[T, H]`` in the input dtype.

    ``sum_k topk_weights[:, k] * expert_{topk_ids[:, k]}(x)`` over this rank's share: tensor
    parallel ranks return partial sums (to be all-reduced), expert parallel ranks only their
    experts' contributions. ``topk_ids`` are global expert ids. ``act_quant``: ``auto`` (what the
    layer's manifest says the served kernels run: the target's act_quant, or for Kimi-K3 SiTU on
    AITER the SiTUv2 mode, a4w4 = MXFP4 activations), or an explicit what-if: ``none`` (W4A16 on
    any checkpoint), ``fp8`` (W4A8), ``mxfp4`` (W4A4). ``out``: optional preallocated result,
    fully overwritten.
    """
    if backend not in BACKENDS:
        raise RuntimeInputError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}.")
    _validate(hidden_states, experts, topk_weights, topk_ids, out)
    aq = resolve_act_quant(act_quant, experts.act_quant)
    chosen = choose_backend(backend, experts.layout, experts.device, aq)
    if chosen == "torch":
        from mxfp4conv.runtime.reference import torch_fused_moe

        y = torch_fused_moe(hidden_states, experts, topk_weights, topk_ids, aq)
    elif chosen == "triton":
        y = _run_triton(hidden_states, experts, topk_weights, topk_ids, aq)
    else:
        target_aq = resolve_act_quant("auto", experts.act_quant)
        if aq != target_aq:
            raise RuntimeInputError(
                f"the aiter backend runs the activation precision AITER chooses for this target "
                f"({target_aq}); act_quant={act_quant!r} cannot be honoured. Use backend='torch' for it."
            )
        from mxfp4conv.runtime.aiter_backend import aiter_fused_moe

        y = aiter_fused_moe(experts, hidden_states, topk_weights, topk_ids)
    if out is None:
        return y.to(hidden_states.dtype)
    out.copy_(y)
    return out
