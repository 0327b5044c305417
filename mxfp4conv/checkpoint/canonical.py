"""The canonical description of an MXFP4 mixture-of-experts checkpoint.

Every family adapter (Kimi-K3, DeepSeek-V4, Quark OCP-MX, gpt-oss, compressed-tensors MXFP4
MoE of other architectures) turns a source
checkpoint into one ``MoEModel``; the oracle, the converter, the verifier and ``inspect``
only ever look at this description, never at family-specific names.

Conventions (all families):
- Weights are MXFP4 in ``[out_features, in_features / 2]`` bytes, low nibble = even element.
- Scales are raw e8m0 bytes ``[out_features, in_features / 32]``; never cast numerically.
- ``w13`` means ``[gate (w1) ; up (w3)]`` stacked along rows ("GGUU"); ``w2`` is down.
- ``hidden`` is the width the routed experts see (Kimi-K3: ``routed_expert_hidden_size``).
- ``intermediate`` is the global per-expert intermediate size (before any TP split).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

FAMILIES = ("kimi_k3", "deepseek_v4", "quark", "gpt_oss", "compressed_tensors")
# vLLM's apply_moe_activation set: what Marlin and the emulation (Triton) experts accept; the family adapters check
# a config's hidden_act against it, the oracle's backend table asks for it
GENERIC_ACTIVATIONS = frozenset({
    "silu", "gelu", "gelu_tanh", "situ", "swigluoai", "swigluoai_uninterleave", "swiglustep",
    "silu_no_mul", "gelu_no_mul", "gelu_tanh_no_mul", "relu2_no_mul",
})


@dataclass(frozen=True)
class TensorRef:
    """Where one source tensor lives, as its shard header declares it."""

    name: str
    shard: str  # file name relative to the checkpoint root, exactly as in weight_map
    dtype: str  # safetensors dtype string as stored: "U8", "I8", "F8_E8M0", "BF16", ...
    shape: tuple[int, ...]


def _present_refs(tensors) -> list[TensorRef]:
    """The tensors an expert record names, in field order (the optional ones when present)."""
    return [r for r in (getattr(tensors, f.name) for f in fields(tensors)) if r is not None]


@dataclass(frozen=True)
class ExpertTensors:
    """One routed expert of a per-expert format (Kimi-K3, DeepSeek-V4, Quark)."""

    gate: TensorRef
    gate_scale: TensorRef
    up: TensorRef
    up_scale: TensorRef
    down: TensorRef
    down_scale: TensorRef
    # Quark static-fp8-activation exports (w_mxfp4_a_fp8): per-projection F32 scalars.
    gate_input_scale: TensorRef | None = None
    up_input_scale: TensorRef | None = None
    down_input_scale: TensorRef | None = None
    # Per-expert biases (Quark exports of gpt-oss-like models keep them).
    gate_bias: TensorRef | None = None
    up_bias: TensorRef | None = None
    down_bias: TensorRef | None = None

    def refs(self) -> list[TensorRef]:
        return _present_refs(self)


@dataclass(frozen=True)
class GateUpExpertTensors:
    """One routed expert with gate and up fused in one tensor, rows interleaved g0,u0,g1,u1,...

    Quark exports of gpt-oss: ``experts.E.gate_up_proj.{weight,weight_scale,bias,input_scale}``
    (``[2I, H/2]``, ``[2I, H/32]``, ``[2I]``, one scalar) and ``experts.E.down_proj.*``.
    """

    gate_up: TensorRef
    gate_up_scale: TensorRef
    down: TensorRef
    down_scale: TensorRef
    gate_up_input_scale: TensorRef | None = None
    down_input_scale: TensorRef | None = None
    gate_up_bias: TensorRef | None = None
    down_bias: TensorRef | None = None

    def refs(self) -> list[TensorRef]:
        return _present_refs(self)


@dataclass(frozen=True)
class FusedExperts:
    """gpt-oss: every expert of a layer in one tensor; w13 rows interleaved g0,u0,g1,u1,..."""

    gate_up_blocks: TensorRef  # U8 [E, 2I, H/32, 16]
    gate_up_scales: TensorRef  # U8 [E, 2I, H/32]
    down_blocks: TensorRef  # U8 [E, H, I/32, 16]
    down_scales: TensorRef  # U8 [E, H, I/32]
    gate_up_bias: TensorRef | None = None  # BF16 [E, 2I] (interleaved like the rows)
    down_bias: TensorRef | None = None  # BF16 [E, H]

    def refs(self) -> list[TensorRef]:
        return [r for r in (
            self.gate_up_blocks, self.gate_up_scales, self.down_blocks, self.down_scales,
            self.gate_up_bias, self.down_bias,
        ) if r is not None]


@dataclass(frozen=True)
class MoELayer:
    """One MoE layer with routed experts. ``prefix`` is everything before ``.experts.``."""

    prefix: str
    experts: tuple[ExpertTensors, ...] | None = None  # per-expert formats, index = expert id
    fused: FusedExperts | None = None  # gpt-oss
    gate_up_experts: tuple[GateUpExpertTensors, ...] | None = None  # Quark gpt-oss

    def source_refs(self) -> list[TensorRef]:
        """Every source tensor this layer's routed experts are made of."""
        if self.fused is not None:
            return self.fused.refs()
        return [r for ex in (self.experts or self.gate_up_experts or ()) for r in ex.refs()]

    def expert_scale_refs(self) -> list[tuple[TensorRef, ...]]:
        """The e8m0 scale tensors of each expert of a per-expert format, in expert order."""
        if self.gate_up_experts is not None:
            return [(ex.gate_up_scale, ex.down_scale) for ex in self.gate_up_experts]
        return [(ex.gate_scale, ex.up_scale, ex.down_scale) for ex in self.experts or ()]

    def source_tensor_names(self) -> list[str]:
        return [r.name for r in self.source_refs()]


@dataclass(frozen=True)
class Activation:
    """The gated activation of the routed experts, with vLLM's name for it.

    name: "situ" (Kimi-K3: params beta, linear_beta), "silu" (params may hold
    swiglu_limit for DeepSeek-V4), "swigluoai" (gpt-oss: alpha 1.702, limit 7.0, up + 1).
    """

    name: str
    params: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class MoEGeometry:
    hidden: int  # width the routed experts see (K of GEMM1, N of GEMM2)
    intermediate: int  # global per-expert intermediate size
    num_experts: int
    top_k: int


@dataclass
class MoEModel:
    """A checkpoint, as mxfp4conv understands it."""

    family: str  # one of FAMILIES
    quant_scheme: str  # "w_mxfp4" (weight-only), "w_mxfp4_a_mxfp4", "w_mxfp4_a_fp8", ...
    # vLLM's MoE quant method for this checkpoint: "mxfp4" (Mxfp4MoEMethod and its
    # compressed-tensors W4A8 subclass: K3, DSV4), "gpt_oss_mxfp4" (GptOssMxfp4MoEMethod),
    # "quark" (QuarkOCP_MX_MoEMethod), "compressed_tensors_mxfp4"
    # (CompressedTensorsW4A4Mxfp4MoEMethod: its own fixed CUTLASS / XPU / Marlin choice).
    moe_method: str
    activation: Activation
    # vLLM RoutingMethodType name: "DeepSeekV3" (K3, DeepSeek-V3 bases), "DeepseekV4",
    # "Renormalize" (gpt-oss), "RenormalizeNaive", "Default", ...
    routing: str
    geometry: MoEGeometry
    layers: tuple[MoELayer, ...]
    has_bias: bool = False
    # The source stores w13 rows interleaved g0,u0,g1,u1,... (gpt-oss, Quark's gpt-oss
    # exports); vLLM loads them so. read_expert always returns [gate; up].
    gate_up_interleaved: bool = False
    static_input_scales: bool = False  # Quark w_mxfp4_a_fp8 with input_scale tensors
    # What the headers actually said, e.g. {"weight": "I8", "scale": "F8_E8M0"}.
    dtype_variants: dict[str, str] = field(default_factory=dict)
    # vLLM 0.33.0's MoE method class for these experts, e.g. "Mxfp4MoEMethod",
    # "CompressedTensorsW4A8Mxfp4MoEMethod", "CompressedTensorsW4A4Mxfp4MoEMethod".
    moe_class: str = ""
    # The input-activation quantisation the quant config declares for the experts, e.g.
    # "fp8_dynamic_group128", "fp8_dynamic_token", "fp8_static_tensor", "mxfp4_dynamic_group32";
    # None: weight-only. Whether vLLM honours it is the oracle's decision.
    declared_act: str | None = None
    # Family-specific facts the oracle needs, e.g. kimi_k3:
    # {"min_moe_intermediate_per_partition": 256}.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family == "gpt_oss":  # the release's fused tensors always interleave gate/up
            self.gate_up_interleaved = True

    def expert_tensor_names(self) -> set[str]:
        return {n for layer in self.layers for n in layer.source_tensor_names()}
