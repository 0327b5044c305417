"""The parallel layout a converted checkpoint records (``target.parallel`` of the manifest): the
server's sizes (tp, dp, pcp, expert parallel, placement) and, for each MoE rank, the experts it
holds and its intermediate slice, in vLLM's terms.

vLLM (0.33.0 and 0.34.0, ``FusedMoEParallelConfig.make`` in fused_moe/config.py) flattens data
(and prefill-context) parallelism into the MoE layer's ranks: the worker with data-parallel rank d,
prefill-context rank c and tensor-parallel rank t is MoE rank ``d * pcp * tp + c * tp + t`` of
``tp * pcp * dp``. Without expert parallelism each MoE rank holds every expert and a 1/size slice
of the intermediate size; with it, whole experts: ``linear`` gives rank r the r-th contiguous
block, ``round_robin`` experts r, r + size, r + 2 size, ... (``determine_expert_map``), each rank's
experts in ascending global id (the expert map's local ids). How the sizes and the placement are
derived from a server's options is ``mxfp4conv.oracle.parallel``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mxfp4conv.errors import OracleError

PLACEMENTS = ("linear", "round_robin")
# vLLM's All2AllBackend values selectable from the command line (config/parallel.py)
ALL2ALL_BACKENDS = ("allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency",
                    "mori_high_throughput", "mori_low_latency", "moonep", "nixl_ep",
                    "flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided")
DEFAULT_ALL2ALL = "allgather_reducescatter"
# needs_round_robin_routing_tables: the all2all backends that keep round_robin placement
ROUND_ROBIN_ALL2ALL = ("deepep_low_latency", "nixl_ep")


@dataclass(frozen=True)
class MoeParallel:
    """The server's layout (tp, dp, pcp, ep, placement asked) and the MoE layout vLLM derives."""

    tp: int  # --tensor-parallel-size
    dp: int  # --data-parallel-size
    pcp: int  # --prefill-context-parallel-size
    ep: bool  # --enable-expert-parallel
    requested_placement: str  # --expert-placement-strategy
    all2all: str  # --all2all-backend
    num_experts: int
    placement: str  # what vLLM places the experts with
    moe_tp: int  # FusedMoEParallelConfig.tp_size
    ep_size: int  # FusedMoEParallelConfig.ep_size
    use_ep: bool  # FusedMoEParallelConfig.use_ep
    note: str | None = None  # why vLLM places differently from the request, or None

    @property
    def all2all_kernels(self) -> bool:
        """vLLM's use_all2all_kernels: expert parallel with dp (or pcp) > 1."""
        return self.use_ep and (self.dp > 1 or self.pcp > 1)

    @property
    def batched(self) -> bool:
        """The all2all runs vLLM's BatchedExperts activation format (DeepEP low-latency, NIXL EP)."""
        return self.all2all_kernels and self.all2all in ROUND_ROBIN_ALL2ALL

    @property
    def ranks(self) -> int:
        """The number of MoE ranks (= GPUs serving the model)."""
        return self.tp * self.pcp * self.dp

    def moe_rank(self, dp_rank: int, tp_rank: int, pcp_rank: int = 0) -> int:
        """vLLM's flatten_tp_across_dp_and_pcp: the MoE rank of one worker."""
        for name, v, n in (("dp", dp_rank, self.dp), ("tp", tp_rank, self.tp), ("pcp", pcp_rank, self.pcp)):
            if not 0 <= v < n:
                raise OracleError(f"{name} rank {v} is outside 0..{n - 1} of the layout {self.describe()}.")
        return dp_rank * self.pcp * self.tp + pcp_rank * self.tp + tp_rank

    def worker(self, rank: int) -> tuple[int, int, int]:
        """(dp rank, pcp rank, tp rank) of MoE rank ``rank``."""
        d, rest = divmod(rank, self.pcp * self.tp)
        c, t = divmod(rest, self.tp)
        return d, c, t

    def experts(self, rank: int) -> range:
        """Global ids of the experts MoE rank ``rank`` holds, in local order (determine_expert_map)."""
        if not self.use_ep:
            return range(self.num_experts)
        base, extra = divmod(self.num_experts, self.ep_size)
        if self.placement == "round_robin":
            return range(rank, self.num_experts, self.ep_size)
        start = rank * base + min(rank, extra)
        return range(start, start + base + (1 if rank < extra else 0))

    def expert_map(self, rank: int) -> list[int] | None:
        """vLLM's expert map of ``rank``: global id -> local id, -1 elsewhere (None without EP)."""
        if not self.use_ep:
            return None
        out = [-1] * self.num_experts
        for local, e in enumerate(self.experts(rank)):
            out[e] = local
        return out

    def intermediate_slice(self, rank: int, intermediate: int) -> tuple[int, int]:
        """[start, stop) of the (real) intermediate columns MoE rank ``rank`` holds."""
        if self.use_ep or self.moe_tp == 1:
            return 0, intermediate
        per = intermediate // self.moe_tp
        return rank * per, (rank + 1) * per

    def describe(self) -> str:
        parts = [f"tp {self.tp}", f"dp {self.dp}"] + ([f"pcp {self.pcp}"] if self.pcp > 1 else [])
        server = " x ".join(parts) + (" with expert parallel" if self.ep else "")
        if self.use_ep:
            moe = f"EP over {self.ep_size} ranks, {self.placement} placement"
        else:
            moe = f"MoE tensor parallel over {self.moe_tp} rank{'s' if self.moe_tp != 1 else ''}"
        return f"{server} (MoE: {moe})"

    def record(self, intermediate: int) -> dict:
        """The layout as the manifest records it (``parallel``)."""
        return {
            "tp": self.tp, "dp": self.dp, "pcp": self.pcp, "ep": self.ep,
            "placement": self.placement, "requested_placement": self.requested_placement,
            "all2all_backend": self.all2all, "moe_tp": self.moe_tp, "ep_size": self.ep_size,
            "use_ep": self.use_ep, "ranks": self.ranks,
            "rank_map": [{"rank": r, "dp_rank": self.worker(r)[0], "pcp_rank": self.worker(r)[1],
                          "tp_rank": self.worker(r)[2], "experts": list(self.experts(r)),
                          "intermediate": list(self.intermediate_slice(r, intermediate))}
                         for r in range(self.ranks)],
        }


def from_record(rec: dict | None, *, tp: int, ep: bool, num_experts: int) -> MoeParallel:
    """The layout of a manifest: its ``parallel`` record, or (manifests without one) tp ranks with
    data parallel 1 and linear placement."""
    if not rec:
        use_ep = ep and tp > 1
        return MoeParallel(tp=tp, dp=1, pcp=1, ep=ep, requested_placement="linear", all2all=DEFAULT_ALL2ALL,
                           num_experts=num_experts, placement="linear", moe_tp=1 if use_ep else tp,
                           ep_size=tp if use_ep else 1, use_ep=use_ep)
    return MoeParallel(tp=int(rec["tp"]), dp=int(rec["dp"]), pcp=int(rec.get("pcp", 1)), ep=bool(rec["ep"]),
                       requested_placement=str(rec.get("requested_placement", rec["placement"])),
                       all2all=str(rec.get("all2all_backend", DEFAULT_ALL2ALL)), num_experts=num_experts,
                       placement=str(rec["placement"]), moe_tp=int(rec["moe_tp"]), ep_size=int(rec["ep_size"]),
                       use_ep=bool(rec["use_ep"]))


def eplb_initial_logical(par: MoeParallel, physical: int, rank: int) -> tuple[int, ...]:
    """vLLM's initial EPLB placement with redundant experts, for EP rank ``rank``: the layer holds
    ``physical`` = E + R experts placed linearly (EPLB needs them to split evenly), physical
    expert p holding logical expert p for p < E and (p - E) mod E after
    (``EplbState.build_initial_global_physical_to_logical_map``); the logical ids of the rank's
    physical experts, in local order."""
    per = physical // par.ep_size
    E = par.num_experts
    return tuple(p if p < E else (p - E) % E for p in range(rank * per, (rank + 1) * per))
