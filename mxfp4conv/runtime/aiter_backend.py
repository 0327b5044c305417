"""AITER backend: call ``aiter.fused_moe`` on the pre-shuffled tensors of an AITER target.

NOT YET RUN ON AMD HARDWARE. The argument set is built by the pure function
``aiter_call_args`` (tested without aiter) from what vLLM's ``rocm_aiter_fused_experts`` passes:

- ``quant_type = QuantType.per_1x32`` (MXFP4 weights, e8m0 scales per 32);
- ``gate_mode`` from the stored w13 layout: ``aiter_p16_gu16`` (16-row gate/up interleave)
  -> ``INTERLEAVE``, ``aiter_p16`` -> ``SEPARATED``; it must agree with the manifest. This is
  what vLLM passes for the layouts mxfp4conv writes: SiTU by its SiTUv2 interleave switch,
  W4A16 INTERLEAVE (0.34: ``mxfp4_w4a16_extra_kwargs``; its SEPARATED + fp4-activation
  override is DeepSeek-V4's opt-in a4w4 shuffle, VLLM_ROCM_USE_AITER_MOE_A4W4_DSV4, which
  mxfp4conv does not write);
- activation: ``situ`` -> ``ActivationType.Situv2`` with ``beta`` / ``linear_beta``
  (forwarded only for Situv2, like vLLM), ``silu`` -> ``Silu``, ``swigluoai`` -> ``Swiglu``.
  DeepSeek-V4's ``swiglu_limit`` has no ``fused_moe`` argument and is not forwarded;
- ``hidden_pad = H_pad - H`` and ``intermediate_pad = I_pad - I`` per rank; except for SiTU
  both are rounded down to multiples of 128 and 64, as vLLM does for AITER's CK / FlyDSL
  dispatch, per the release the manifest names (``aiter_pads``): vLLM 0.33 doubles the
  intermediate pad when the MoE is not tensor-split (not for W4A4 SiLU, which AITER doubles
  itself); 0.34 no longer doubles it for W4A16 either (AITER does), and declares no
  intermediate pad at all for bias-less W4A16 layers;
- ``bias1`` / ``bias2`` (fp32) when the checkpoint has biases;
- ``expert_mask`` (int32 ``[num_experts]``, 1 for this rank's experts) under expert
  parallelism, with global ``topk_ids``;
- the weights carry ``is_shuffled = True`` (set by the loader).

The environment the manifest asks for (e.g. ``AITER_BF16_FP8_MOE_BOUND=0``) is applied by the
loader. ``aiter`` is imported only when a call is made.
"""

from __future__ import annotations

from typing import Any

import torch

from mxfp4conv.errors import CheckpointError, RuntimeInputError
from mxfp4conv.format.activations import activation_params
from mxfp4conv.oracle.releases import RELEASES, Release, release_of_version
from mxfp4conv.runtime.experts import MoEExperts

GATE_MODES = {"aiter_p16_gu16": "INTERLEAVE", "aiter_p16": "SEPARATED"}
ACTIVATION_TYPES = {"situ": "Situv2", "silu": "Silu", "swigluoai": "Swiglu"}


def aiter_gate_mode(experts: MoEExperts) -> str:
    name = experts.stored_layout.get("w13", experts.layout.get("w13"))
    if name not in GATE_MODES:
        raise RuntimeInputError(
            f"{experts.prefix}: w13 layout {name!r} is not an AITER weight layout ({', '.join(GATE_MODES)}); "
            "the AITER backend needs a checkpoint converted for an AITER target."
        )
    mode = GATE_MODES[name]
    declared = (experts.gate_mode or "").upper()
    if declared and declared != mode:
        raise CheckpointError(
            f"{experts.prefix}: the manifest declares gate_mode {experts.gate_mode!r} but w13 is stored as "
            f"{name!r}, which AITER reads as {mode}; a mismatch would give silently wrong results. "
            "Re-run `mxfp4conv convert`."
        )
    return mode


def experts_release(experts: MoEExperts) -> Release:
    """The vLLM release the manifest was converted for (its AITER call follows that release's
    ``experts/rocm_aiter_moe.py``); a manifest that names none (built by hand) reads as 0.33."""
    return release_of_version(str(experts.manifest.get("vllm") or "0.33.0")) or RELEASES["0.33"]


def aiter_pads(experts: MoEExperts) -> tuple[int, int]:
    """(hidden_pad, intermediate_pad) as vLLM's ``aiter_moe_pads`` (and, from 0.34, the bias-less
    W4A16 rule after it) computes them for the release the manifest names."""
    hidden_pad = experts.hidden_padded - experts.hidden
    inter_pad = experts.intermediate_per_rank_padded - experts.intermediate_per_rank
    if experts.activation == "situ":  # SiTU's A16W4 FlyDSL kernel pads per gate/up half
        return hidden_pad, inter_pad
    release = experts_release(experts)
    moe_tp = 1 if experts.ep else experts.tp
    w4a16 = experts.backend == "AITER_MXFP4_BF16"  # vLLM's quant_config.use_mxfp4_w4a16
    w4a4_silu = experts.backend == "AITER_MXFP4_MXFP4" and experts.activation == "silu"
    # AITER doubles the W4A4 SiLU pad itself (both releases) and, as 0.34 reads it, the W4A16 one
    double = moe_tp == 1 and not w4a4_silu and not (w4a16 and not release.aiter_w4a16_pad_doubled_at_tp1)
    hidden_pad = hidden_pad // 128 * 128
    inter_pad = inter_pad // 64 * 64 * (2 if double else 1)
    if w4a16 and experts.w13_bias is None and release.aiter_w4a16_no_pad_without_bias:
        # 0.34: AITER's bias-less W4A16 FlyDSL stage 1 leaves the padded intermediate columns
        # unwritten; the padded weights are zero, so vLLM declares no pad there
        inter_pad = 0
    return hidden_pad, inter_pad


def aiter_call_args(
    experts: MoEExperts,
    hidden_states: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> dict[str, Any]:
    """Keyword arguments for ``aiter.fused_moe``; enum members are given by name (str).

    ``hidden_states`` is ``[T, H]`` (unpadded); it is zero-padded to ``H_pad`` here.
    """
    if experts.activation not in ACTIVATION_TYPES:
        raise RuntimeInputError(f"{experts.prefix}: activation {experts.activation!r} has no AITER equivalent.")
    if hidden_states.dtype not in (torch.bfloat16, torch.float16):
        raise RuntimeInputError(
            f"the AITER backend takes bf16 or fp16 hidden_states, got {hidden_states.dtype}; cast the input or "
            "use backend='torch'."
        )
    T, H = hidden_states.shape
    x = hidden_states
    if experts.hidden_padded != H:
        x = torch.nn.functional.pad(hidden_states, (0, experts.hidden_padded - H))
    hidden_pad, inter_pad = aiter_pads(experts)
    args: dict[str, Any] = dict(
        hidden_states=x,
        w1=experts.w13_weight,
        w2=experts.w2_weight,
        topk_weight=topk_weights.to(torch.float32),
        topk_ids=topk_ids.to(torch.int32),
        expert_mask=None,
        activation=ACTIVATION_TYPES[experts.activation],
        quant_type="per_1x32",
        doweight_stage1=False,
        w1_scale=experts.w13_weight_scale,
        w2_scale=experts.w2_weight_scale,
        dtype=hidden_states.dtype,
        hidden_pad=hidden_pad,
        intermediate_pad=inter_pad,
        bias1=experts.w13_bias,
        bias2=experts.w2_bias,
        gate_mode=aiter_gate_mode(experts),
    )
    if experts.ep:
        mask = torch.zeros(experts.num_experts, dtype=torch.int32, device=topk_ids.device)
        mask[list(experts.global_ids)] = 1  # AITER numbers the masked experts in ascending order
        args["expert_mask"] = mask
    if experts.activation == "situ":
        p = activation_params("situ", experts.activation_params)
        args["beta"] = p["beta"]
        args["linear_beta"] = p["linear_beta"] if p["linear_beta"] is not None else -1.0
    return args


def aiter_fused_moe(
    experts: MoEExperts,
    hidden_states: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Run ``aiter.fused_moe`` (ROCm with aiter only); returns ``[T, H]`` in the input dtype."""
    try:
        import aiter
        from aiter.fused_moe import fused_moe
    except ImportError as exc:
        raise RuntimeInputError(
            "backend 'aiter' needs the aiter package on a ROCm machine; it is not importable here "
            f"({exc}). Use backend='torch' or 'triton'."
        ) from exc
    args = aiter_call_args(experts, hidden_states, topk_weights, topk_ids)
    args["activation"] = getattr(aiter.ActivationType, args["activation"])
    args["quant_type"] = getattr(aiter.QuantType, args["quant_type"])
    gate_mode_enum = getattr(aiter, "GateMode", None)
    if gate_mode_enum is not None:
        args["gate_mode"] = getattr(gate_mode_enum, args["gate_mode"])
    out = fused_moe(**args)
    return out[:, : hidden_states.shape[1]]
