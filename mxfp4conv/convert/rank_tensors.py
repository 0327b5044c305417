"""Per-rank expert tensors in canonical padded form, before any layout transform.

For one chunk of experts and one rank this builds exactly what vLLM's loader leaves in the
(pre-filled) parameters before ``process_weights_after_loading``:

- TP rank r takes intermediate columns ``[r*I/T, (r+1)*I/T)`` (rows of w1/w3, the packed
  input columns of w2); EP rank r takes experts ``[r*E/T, (r+1)*E/T)`` (linear placement) or
  ``r, r+T, r+2T, ...`` (round_robin), I unsplit. T is the MoE layer's ranks (tp x dp).
- w13 rows ``[gate_real | pad | up_real | pad]`` (each half padded at its own tail), H
  padding at the tail of the packed columns; w2 padded at the tail of rows (H) and columns.
- Weight pad 0x00, scale pad as the decision says (0x00 Mxfp4 / 0x01 Quark), bias pad 0.
- The w2 bias lives on tensor-parallel rank 0 only (zeros elsewhere); under EP every rank
  holds its own experts' biases.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mxfp4conv.lazy_torch import torch

from mxfp4conv.errors import Mxfp4convError

WEIGHT_KINDS = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")


@dataclass(frozen=True)
class RankGeometry:
    hidden: int
    hidden_padded: int
    intermediate: int  # global
    inter_rank: int  # real per-rank intermediate
    inter_rank_padded: int
    num_experts: int
    experts_per_rank: int
    tp: int
    ep: bool
    scale_pad: int
    weight_pad: int = 0
    placement: str = "linear"  # EP expert placement: linear | round_robin

    @classmethod
    def from_decision(cls, d) -> RankGeometry:
        g = cls(hidden=d.hidden, hidden_padded=d.hidden_padded, intermediate=d.intermediate,
                inter_rank=d.intermediate_per_rank, inter_rank_padded=d.intermediate_per_rank_padded,
                num_experts=d.num_experts, experts_per_rank=d.experts_per_rank, tp=d.tp, ep=d.ep,
                scale_pad=d.scale_pad_byte,
                placement=d.parallel.placement if d.parallel is not None else "linear")
        g.check()
        return g

    def check(self) -> None:
        H, Hp, I, Ir, Ip = self.hidden, self.hidden_padded, self.intermediate, self.inter_rank, self.inter_rank_padded
        problems = []
        if self.ep:
            if self.num_experts % self.tp or self.experts_per_rank * self.tp != self.num_experts:
                problems.append(f"{self.num_experts} experts do not split evenly over {self.tp} ranks")
            if Ir != I:
                problems.append(f"expert parallelism keeps I whole but the per-rank size is {Ir}, not {I}")
        else:
            if Ir * self.tp != I:
                problems.append(f"intermediate {I} is not {self.tp} x {Ir}")
            if self.experts_per_rank != self.num_experts:
                problems.append("tensor parallelism keeps every expert on every rank")
        for name, v in (("hidden", H), ("padded hidden", Hp), ("per-rank intermediate", Ir),
                        ("padded per-rank intermediate", Ip)):
            if v % 32:
                problems.append(f"{name} {v} is not a multiple of 32")
        if Hp < H or Ip < Ir:
            problems.append("a padded size is smaller than the real one")
        if problems:
            raise Mxfp4convError("cannot lay out experts per rank: " + "; ".join(problems) + ".")

    def ranks(self) -> range:
        return range(self.tp)

    def expert_range(self, rank: int) -> range:
        """Global ids of ``rank``'s experts in local order (oracle.parallel.MoeParallel.experts)."""
        if self.ep:
            if self.placement == "round_robin":
                return range(rank, self.num_experts, self.tp)
            return range(rank * self.experts_per_rank, (rank + 1) * self.experts_per_rank)
        return range(self.num_experts)

    def owner(self, expert: int) -> list[int]:
        """Ranks that hold global expert ``expert``."""
        if not self.ep:
            return list(self.ranks())
        return [expert % self.tp] if self.placement == "round_robin" else [expert // self.experts_per_rank]

    def local_index(self, rank: int, expert: int) -> int:
        """Local position of global expert ``expert`` on ``rank`` (which holds it)."""
        return self.expert_range(rank).index(expert)

    def chunks(self, n: int) -> list[range]:
        """Expert id sequences of at most ``n`` experts, each inside one rank's share and
        consecutive in its local order (a slice of ``expert_range``)."""
        spans = [self.expert_range(r) for r in self.ranks()] if self.ep else [range(self.num_experts)]
        return [span[a:a + n] for span in spans for a in range(0, len(span), n)]

    def inter_slice(self, rank: int) -> slice:
        if self.ep:
            return slice(0, self.intermediate)
        return slice(rank * self.inter_rank, (rank + 1) * self.inter_rank)

    def canonical_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes per rank before any layout transform (weights/scales as U8, rest F32)."""
        E, Hp, Ip = self.experts_per_rank, self.hidden_padded, self.inter_rank_padded
        return {
            "w13_weight": (E, 2 * Ip, Hp // 2),
            "w13_weight_scale": (E, 2 * Ip, Hp // 32),
            "w2_weight": (E, Hp, Ip // 2),
            "w2_weight_scale": (E, Hp, Ip // 32),
            "w13_bias": (E, 2 * Ip),
            "w2_bias": (E, Hp),
            "w13_input_scale": (E,),
            "w2_input_scale": (E,),
        }


def build_chunk(experts: list, geom: RankGeometry, rank: int, kinds: tuple[str, ...]) -> dict:
    """``build_chunk_np`` as torch tensors, from ``ExpertData`` of torch tensors or numpy arrays."""
    from mxfp4conv.checkpoint.experts import as_numpy

    return {k: torch.from_numpy(v) for k, v in build_chunk_np([as_numpy(ex) for ex in experts], geom, rank,
                                                             kinds).items()}


def build_chunk_np(experts: list, geom: RankGeometry, rank: int, kinds: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Stacked canonical padded arrays of ``rank`` for a list of ``ExpertData`` holding numpy
    arrays (in order): kind -> array with a leading expert dimension of ``len(experts)``
    (weights and scales uint8, biases and input scales float32)."""
    n = len(experts)
    H, Hp, I, Ip = geom.hidden, geom.hidden_padded, geom.intermediate, geom.inter_rank_padded
    sl = geom.inter_slice(rank)
    ir = sl.stop - sl.start
    out: dict[str, np.ndarray] = {}
    for kind in kinds:
        if kind == "w13_weight" or kind == "w13_weight_scale":
            div = 2 if kind == "w13_weight" else 32
            pad = geom.weight_pad if kind == "w13_weight" else geom.scale_pad
            t = np.full((n, 2 * Ip, Hp // div), pad, dtype=np.uint8)
            for i, ex in enumerate(experts):
                src = ex.w13 if kind == "w13_weight" else ex.w13_scale
                t[i, :ir, : H // div] = src[sl.start:sl.stop]
                t[i, Ip:Ip + ir, : H // div] = src[I + sl.start:I + sl.stop]
        elif kind == "w2_weight" or kind == "w2_weight_scale":
            div = 2 if kind == "w2_weight" else 32
            pad = geom.weight_pad if kind == "w2_weight" else geom.scale_pad
            t = np.full((n, Hp, Ip // div), pad, dtype=np.uint8)
            for i, ex in enumerate(experts):
                src = ex.w2 if kind == "w2_weight" else ex.w2_scale
                t[i, :H, : ir // div] = src[:, sl.start // div: sl.stop // div]
        elif kind == "w13_bias":
            t = np.zeros((n, 2 * Ip), dtype=np.float32)
            for i, ex in enumerate(experts):
                b = _bias(ex, "w13_bias")
                t[i, :ir] = b[sl.start:sl.stop]
                t[i, Ip:Ip + ir] = b[I + sl.start:I + sl.stop]
        elif kind == "w2_bias":
            t = np.zeros((n, Hp), dtype=np.float32)
            if geom.ep or rank == 0:
                for i, ex in enumerate(experts):
                    t[i, :H] = _bias(ex, "w2_bias")
        elif kind in ("w13_input_scale", "w2_input_scale"):
            vals = []
            for ex in experts:
                v = getattr(ex, kind)
                if v is None:
                    raise Mxfp4convError(f"expert has no {kind} although the checkpoint declares static input scales")
                vals.append(float(v))
            t = np.array(vals, dtype=np.float32)
        else:
            raise ValueError(kind)
        out[kind] = t
    return out


def build_weight_chunk_np(experts: list[dict], geom: RankGeometry, rank: int,
                          kinds: tuple[str, ...]) -> dict[str, np.ndarray]:
    """``build_chunk_np`` for the weight and scale kinds only, each expert a dict with ``w13`` /
    ``w13_scale`` (rows [gate; up]) and ``w2`` / ``w2_scale`` uint8 arrays."""
    from mxfp4conv.checkpoint.experts import ExpertData

    if any(k not in WEIGHT_KINDS for k in kinds):
        raise ValueError(kinds)
    return build_chunk_np([ExpertData(**ex) for ex in experts], geom, rank, kinds)


def _bias(ex, kind: str) -> np.ndarray:
    b = getattr(ex, kind)
    if b is None:
        raise Mxfp4convError(f"expert has no {kind} although the layer declares biases")
    return np.asarray(b, dtype=np.float32)


def find_nan_scale(t) -> int | None:
    """Flat index of the first 0xFF (e8m0 NaN) byte of a torch tensor or numpy array, or None."""
    if isinstance(t, np.ndarray):
        if t.dtype == np.uint8 and (t.size == 0 or int(t.max()) != 0xFF):  # one pass, no mask
            return None
        hit = np.flatnonzero(t.reshape(-1) == 0xFF)
        return int(hit[0]) if hit.size else None
    if t.dtype == torch.uint8 and (t.numel() == 0 or int(t.max()) != 0xFF):  # one pass, no mask
        return None
    hit = (t.reshape(-1) == 0xFF).nonzero()
    return int(hit[0, 0]) if hit.numel() else None
