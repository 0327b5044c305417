"""The oracle's answer: which backend serves a checkpoint on a target, and what that means
for the bytes (padding, layouts) and for the server (runtime environment).

Pure data; produced by ``mxfp4conv.oracle.select.decide`` and consumed by ``plan``,
``convert`` (which stamps it into the manifest), ``verify`` and the runtime loader.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Target:
    """What the user asked for."""

    arch: str  # canonical arch: gfx942, gfx950, gfx1250, sm90, sm100, sm120, cpu
    tp: int = 1  # the server's --tensor-parallel-size
    ep: bool = False  # --enable-expert-parallel
    act_quant: str = "auto"  # auto | bf16 | fp8 | mxfp4
    aiter: bool = True  # False models a ROCm server without VLLM_ROCM_USE_AITER
    backend: str | None = None  # forced backend (vLLM --moe-backend string or enum name)
    # layout of the EMULATION fallback (mxfp4conv's own runtime): auto (hopper_mma on sm90 for
    # bf16 activations, else identity), identity (the canonical bytes) or hopper_mma
    layout: str = "auto"
    # the vLLM release whose decision is modelled (oracle.releases): a modelled release ("0.34"),
    # another version (its stand-in is used, with a note) or "auto" (the installed vLLM, else
    # the newest modelled); the commands resolve it before deciding, so manifests record one
    vllm: str = "auto"
    # the server's --quantization-config.moe.weight (vLLM's quantization_config.moe.weight);
    # None: not given. Modelled: int4_per_group_32 (gfx942's Kimi-K3 int4 requantisation)
    moe_weight: str | None = None
    dp: int = 1  # --data-parallel-size (vLLM flattens it into the MoE layer's ranks)
    placement: str = "linear"  # --expert-placement-strategy
    all2all: str = "allgather_reducescatter"  # --all2all-backend (decides whether round_robin holds)


@dataclass(frozen=True)
class Candidate:
    backend: str  # vLLM Mxfp4MoeBackend member name
    selected: bool
    reason: str  # why accepted or rejected; non-empty for every rejected candidate


@dataclass(frozen=True)
class LayoutRecipe:
    """Names of the layout transforms (``mxfp4conv.shuffle.layouts``) per tensor kind."""

    w13: str
    w13_scale: str
    w2: str
    w2_scale: str
    w13_bias: str = "identity"
    w2_bias: str = "identity"
    gate_up: str = "[gate; up]"  # convention of w13 rows before any transform

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    arch: str
    backend: str
    activation: str
    activation_params: dict[str, float]
    act_quant: str  # resolved: bf16 | fp8 | mxfp4
    tp: int  # the MoE layer's ranks: tp x dp of the server (oracle.parallel)
    ep: bool  # the MoE layer runs expert parallel (vLLM's use_ep)
    hidden: int
    hidden_padded: int
    intermediate: int  # global
    intermediate_per_rank: int  # real (unpadded) per-rank intermediate
    intermediate_per_rank_padded: int
    num_experts: int
    experts_per_rank: int
    top_k: int
    layout: LayoutRecipe
    scale_pad_byte: int  # fill of padded scale rows/cols vLLM allocates: 0x00 Mxfp4, 0x01 Quark
    runtime_env: dict[str, str]
    gate_mode: str  # "separated" ([gate; up]) or "interleave" (16-row GU16) for AITER
    is_shuffled: bool  # AITER layouts: the loader must tag weights is_shuffled = True
    candidates: tuple[Candidate, ...]
    notes: tuple[str, ...] = ()  # vLLM-bug notes, NVIDIA caveats, ...
    options: dict[str, Any] = field(default_factory=dict)  # e.g. {"aiter": True}
    parallel: Any = None  # oracle.parallel.MoeParallel: the server layout and the MoE rank map

    def plan_json(self) -> dict[str, Any]:
        """The object ``plan --json`` prints (see the interface spec)."""
        return {
            "vllm": self.options.get("vllm_release"),
            "arch": self.arch,
            "backend": self.backend,
            "activation": self.activation,
            "activation_params": dict(self.activation_params),
            "act_quant": self.act_quant,
            "tp": self.tp,
            "ep": self.ep,
            "hidden": self.hidden,
            "hidden_padded": self.hidden_padded,
            "intermediate": self.intermediate,
            "intermediate_per_rank": self.intermediate_per_rank,
            "intermediate_per_rank_padded": self.intermediate_per_rank_padded,
            "num_experts": self.num_experts,
            "experts_per_rank": self.experts_per_rank,
            "top_k": self.top_k,
            "layout": self.layout.as_dict(),
            "runtime_env": dict(self.runtime_env),
            "gate_mode": self.gate_mode,
            "is_shuffled": self.is_shuffled,
            "scale_pad_byte": self.scale_pad_byte,
            "candidates": [
                {"backend": c.backend, "selected": c.selected, "reason": c.reason}
                for c in self.candidates
            ],
            "notes": list(self.notes),
            "options": dict(self.options),
            "parallel": self.parallel.record(self.intermediate) if self.parallel is not None else None,
        }
