"""``MoEExperts``: one MoE layer's routed experts for one rank, as the runtime holds them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

WEIGHT_KINDS = ("w13", "w13_scale", "w2", "w2_scale")
TENSOR_NAMES = {  # tensor kind -> stored tensor suffix after ``{P}.experts.rank{r}.``
    "w13": "w13_weight",
    "w13_scale": "w13_weight_scale",
    "w2": "w2_weight",
    "w2_scale": "w2_weight_scale",
    "w13_bias": "w13_bias",
    "w2_bias": "w2_bias",
    "w13_input_scale": "w13_input_scale",
    "w2_input_scale": "w2_input_scale",
}


def is_aiter_layout(name: str) -> bool:
    return name.startswith("aiter_")


@dataclass
class MoEExperts:
    """Routed experts of one MoE layer on one rank.

    Tensors are as stored (uint8 MXFP4 bytes / raw e8m0 scale bytes) in the layouts named by
    ``layout`` (per tensor kind: w13, w13_scale, w2, w2_scale); ``identity`` means the
    canonical 3-D layout ``[E_r, 2*I_pad, H_pad/2]`` with rows ``[gate_real|pad|up_real|pad]``.
    Geometry is given real and padded; ``expert_offset`` is the global id of local expert 0.
    ``expert_ids``: the global ids of the local experts in local order (vLLM's expert map for
    this MoE rank; empty: ``expert_offset`` onwards, contiguous); ``parallel``: the manifest's
    layout record (server tp / dp, placement, every rank's experts and intermediate slice).
    """

    prefix: str
    w13_weight: torch.Tensor
    w13_weight_scale: torch.Tensor
    w2_weight: torch.Tensor
    w2_weight_scale: torch.Tensor
    # target
    arch: str
    backend: str  # the manifest's vLLM Mxfp4MoeBackend name
    tp: int
    ep: bool
    rank: int
    act_quant: str  # what the served kernels feed both GEMMs: bf16 | none | fp8 | mxfp4 (served_act_quant)
    # geometry
    hidden: int
    hidden_padded: int
    intermediate: int  # global per-expert
    intermediate_per_rank: int
    intermediate_per_rank_padded: int
    num_experts: int  # global
    experts_per_rank: int
    expert_offset: int
    top_k: int
    # activation
    activation: str
    activation_params: dict[str, float] = field(default_factory=dict)
    layout: dict[str, str] = field(default_factory=lambda: {k: "identity" for k in WEIGHT_KINDS})
    stored_layout: dict[str, str] = field(default_factory=dict)  # as in the manifest
    gate_mode: str = "separated"
    situv2: str | None = None  # Kimi-K3 SiTUv2 mode on AITER (a4w4 | a8w4 | a16w4), from the manifest
    is_shuffled: bool = False
    runtime_env: dict[str, str] = field(default_factory=dict)  # what the manifest asks for
    runtime_env_applied: dict[str, str] = field(default_factory=dict)  # what the loader set
    w13_bias: torch.Tensor | None = None  # f32 [E_r, 2*I_pad]
    w2_bias: torch.Tensor | None = None  # f32 [E_r, H_pad]
    w13_input_scale: torch.Tensor | None = None  # f32 [E_r]
    w2_input_scale: torch.Tensor | None = None  # f32 [E_r]
    manifest: dict[str, Any] = field(default_factory=dict, repr=False)
    expert_ids: tuple[int, ...] = ()
    parallel: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def device(self) -> torch.device:
        return self.w13_weight.device

    @property
    def is_canonical(self) -> bool:
        return all(self.layout.get(k, "identity") == "identity" for k in WEIGHT_KINDS)

    @property
    def is_aiter(self) -> bool:
        return any(is_aiter_layout(self.layout.get(k, "identity")) for k in WEIGHT_KINDS)

    def shape3d(self, kind: str) -> tuple[int, int, int]:
        """Canonical 3-D shape of a tensor kind (what a layout's ``inverse`` returns)."""
        e, h, i = self.experts_per_rank, self.hidden_padded, self.intermediate_per_rank_padded
        return {
            "w13": (e, 2 * i, h // 2),
            "w13_scale": (e, 2 * i, h // 32),
            "w2": (e, h, i // 2),
            "w2_scale": (e, h, i // 32),
        }[kind]

    def tensor(self, kind: str) -> torch.Tensor | None:
        return getattr(self, TENSOR_NAMES[kind])

    @property
    def global_ids(self) -> tuple[int, ...]:
        """Global ids of this rank's experts, in local order."""
        return self.expert_ids or tuple(range(self.expert_offset, self.expert_offset + self.experts_per_rank))

    @property
    def expert_map(self) -> torch.Tensor | None:
        """vLLM's expert map of this rank: int32 [num_experts], global id -> local id, -1 for
        experts held elsewhere; None when every rank holds every expert (no expert parallel)."""
        if not self.ep or self.experts_per_rank == self.num_experts:
            return None
        out = torch.full((self.num_experts,), -1, dtype=torch.int32)
        out[list(self.global_ids)] = torch.arange(self.experts_per_rank, dtype=torch.int32)
        return out

    def local_ids(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """Global expert ids -> this rank's local ids, -1 for experts on other ranks."""
        m = self.expert_map
        if m is not None and self.global_ids != tuple(range(self.expert_offset, self.expert_offset + self.experts_per_rank)):
            ids = topk_ids.to(torch.int64)
            inside = (ids >= 0) & (ids < self.num_experts)
            local = m.to(topk_ids.device, torch.int64)[ids.clamp(0, self.num_experts - 1)]
            return torch.where(inside, local, torch.full_like(local, -1))
        local = topk_ids.to(torch.int64) - self.expert_offset
        on_rank = (local >= 0) & (local < self.experts_per_rank)
        return torch.where(on_rank, local, torch.full_like(local, -1))
