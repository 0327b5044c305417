"""The MoE layer's parallel layout vLLM derives from a server's options (tp, dp, pcp,
--enable-expert-parallel, --expert-placement-strategy, --all2all-backend), as a
``mxfp4conv.format.parallel.MoeParallel``.

vLLM 0.33.0 / 0.34.0: ``FusedMoEParallelConfig.make`` (fused_moe/config.py) flattens tp x pcp x dp
into the MoE layer's size; with expert parallelism (and a size above 1) the MoE tensor parallelism
is 1 and expert parallelism takes the size. ``determine_expert_placement_strategy`` and
``ExpertMapManager._determine_placement_strategy`` (fused_moe/expert_map_manager.py) keep
``round_robin`` only for a model with expert groups (``num_expert_group`` > 1), no redundant experts
and no EPLB, and, where the all2all kernels run (EP with dp or pcp > 1), only with the
``deepep_low_latency`` or ``nixl_ep`` all2all backend; otherwise they fall back to ``linear``.
"""

from __future__ import annotations

from mxfp4conv.errors import OracleError
from mxfp4conv.format.parallel import (  # noqa: F401 (the names oracle users import from here)
    ALL2ALL_BACKENDS, DEFAULT_ALL2ALL, PLACEMENTS, ROUND_ROBIN_ALL2ALL, MoeParallel, from_record,
)


def derive(*, tp: int, dp: int = 1, ep: bool = False, placement: str = "linear", num_experts: int,
           num_expert_group: int | None = None, all2all: str = DEFAULT_ALL2ALL, pcp: int = 1) -> MoeParallel:
    """The MoE layout vLLM builds for this server layout; refuses what vLLM refuses and what the
    format cannot hold (an uneven expert split)."""
    for name, v in (("--tp", tp), ("--dp", dp), ("--pcp", pcp)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise OracleError(f"{name} must be a whole number of at least 1, got {v!r} (vLLM's ParallelConfig "
                              "requires sizes >= 1).")
    if placement not in PLACEMENTS:
        raise OracleError(f"Unknown expert placement {placement!r}; vLLM's --expert-placement-strategy takes "
                          f"{' or '.join(PLACEMENTS)}.")
    if all2all not in ALL2ALL_BACKENDS:
        raise OracleError(f"Unknown all2all backend {all2all!r}; vLLM's --all2all-backend takes "
                          f"{', '.join(ALL2ALL_BACKENDS)}.")
    size = tp * pcp * dp
    use_ep = ep and size > 1
    note = None
    effective = placement
    if not use_ep:
        effective = "linear"
        if placement != "linear":
            note = (f"--expert-placement-strategy {placement} has no effect without expert parallelism "
                    f"({'no --enable-expert-parallel' if not ep else 'one rank'}).")
    elif placement == "round_robin":
        if not (num_expert_group is not None and num_expert_group > 1):
            effective = "linear"
            note = ("vLLM places the experts linearly: round_robin needs a model with expert groups "
                    f"(num_expert_group > 1; this model has {num_expert_group or 'none'}), "
                    "determine_expert_placement_strategy falls back to linear.")
        elif dp > 1 or pcp > 1:  # use_all2all_kernels
            if all2all not in ROUND_ROBIN_ALL2ALL:
                effective = "linear"
                note = (f"vLLM places the experts linearly: with data parallel {dp} the all2all kernels run, and "
                        f"round_robin needs the {' or '.join(ROUND_ROBIN_ALL2ALL)} all2all backend "
                        f"(--all2all-backend {all2all} falls back to linear).")
    moe_tp, ep_size = (1, size) if use_ep else (size, 1)
    if use_ep and num_experts % ep_size:
        base, extra = divmod(num_experts, ep_size)
        raise OracleError(
            f"Expert parallel over {ep_size} ranks (tp {tp} x dp {dp}{f' x pcp {pcp}' if pcp > 1 else ''}) "
            f"needs the expert count ({num_experts}) to be divisible by {ep_size}: vLLM would give ranks 0..{extra - 1} {base + 1} "
            f"experts and the others {base}, and mxfp4conv's format holds the same number of experts on every "
            f"rank. Choose sizes whose product divides {num_experts}.")
    return MoeParallel(tp=tp, dp=dp, pcp=pcp, ep=ep, requested_placement=placement, all2all=all2all,
                       num_experts=num_experts, placement=effective, moe_tp=moe_tp, ep_size=ep_size,
                       use_ep=use_ep, note=note)


def of_target(target, model) -> MoeParallel:
    """The MoE layout of an oracle ``Target`` for a source ``MoEModel``; refuses the batched
    activation format, which no layout mxfp4conv writes is served with."""
    par = derive(tp=target.tp, dp=getattr(target, "dp", 1), ep=target.ep,
                  placement=getattr(target, "placement", "linear"), num_experts=model.geometry.num_experts,
                  num_expert_group=model.extra.get("num_expert_group"),
                  all2all=getattr(target, "all2all", DEFAULT_ALL2ALL))
    if par.batched:
        raise OracleError(
            f"--all2all-backend {par.all2all} with expert parallel over data parallel {par.dp} runs vLLM's "
            "BatchedExperts activation format (use_batched_activation_format), and no MXFP4 experts class "
            "mxfp4conv writes for takes it: vLLM's AITER, Triton, CUTLASS, TRT-LLM and EMULATION experts (and "
            "mxfp4conv's own kernel) take the Standard format, only BatchedMarlinExperts and Humming's batched "
            "experts the batched one (on ROCm vLLM raises NotImplementedError). Serve with the default "
            f"--all2all-backend {DEFAULT_ALL2ALL} (round_robin placement then falls back to linear), or with "
            "data parallel 1 (--tp N --ep keeps round_robin).")
    return par
