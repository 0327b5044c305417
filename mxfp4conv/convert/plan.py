"""Planning the whole output from the source headers, before a byte is written.

The plan fixes every output tensor (name, dtype, shape, size), its shard and therefore every
shard header. Work is a sequence of units in source order: a plain tensor copy, or one MoE
layer (all ranks and kinds of its stacked expert tensors, produced expert by expert).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from mxfp4conv.convert.rank_tensors import WEIGHT_KINDS, RankGeometry
from mxfp4conv.convert.writer import TensorSpec, build_header, header_entry_size
from mxfp4conv.errors import Mxfp4convError
from mxfp4conv.format.manifest import manifest_text

DEFAULT_SHARD_SIZE = 5_000_000_000


def parse_size(text: str | int) -> int:
    """Bytes from ``5GB`` / ``500MB`` / ``100KB`` (decimal units, parsed by huggingface_hub as
    for its own ``max_shard_size``) or a plain number of bytes."""
    from huggingface_hub.serialization._base import parse_size_to_int

    if isinstance(text, int):
        n = text
    else:
        s = str(text).strip()
        try:
            n = int(s) if s.isdigit() else parse_size_to_int(s)
        except ValueError:
            raise Mxfp4convError(f"shard size {text!r} is not a size; write a number of bytes or "
                                 f"one with a unit, e.g. 5GB, 500MB or 100KB.") from None
    if n < 1024:
        raise Mxfp4convError(f"shard size {text!r} is too small; use at least 1KB.")
    return n


def shard_name(i: int, n: int) -> str:  # the names format.manifest.SHARD_RE matches
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def expert_tensor_name(prefix: str, rank: int, kind: str) -> str:
    return f"{prefix}.experts.rank{rank}.{kind}"


@dataclass(frozen=True)
class OutTensor:
    spec: TensorSpec
    # copy: (source shard, absolute offset) ; expert: (layer index, rank, kind)
    src_shard: str | None = None
    src_offset: int = 0
    layer: int = -1
    rank: int = -1
    kind: str = ""

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass
class Unit:
    """One piece of work: a tensor copy (``layer == -1``) or a whole MoE layer."""

    tensors: list[OutTensor]
    layer: int = -1


@dataclass
class ShardPlan:
    name: str
    tensors: list[OutTensor] = field(default_factory=list)

    def specs(self) -> list[TensorSpec]:
        return [t.spec for t in self.tensors]


@dataclass
class OutputPlan:
    shards: list[ShardPlan]
    units: list[Unit]
    metadata: dict[str, str]
    geometry: RankGeometry
    kinds: tuple[str, ...]  # expert tensor kinds present, in canonical order
    canonical: dict[str, tuple[int, ...]]  # kind -> per-rank shape before the layout
    layouts: dict[str, object]  # kind -> Layout (weights and scales only)

    def weight_map(self) -> dict[str, str]:
        return {t.name: s.name for s in self.shards for t in s.tensors}

    def shard_of(self) -> dict[str, ShardPlan]:
        return {t.name: s for s in self.shards for t in s.tensors}

    def total_size(self) -> int:
        return sum(t.spec.size() for s in self.shards for t in s.tensors)

    def shard_header(self, shard: ShardPlan) -> bytes:
        return build_header(shard.specs(), self.metadata)[0]

    def shard_file_size(self, shard: ShardPlan) -> int:
        return len(self.shard_header(shard)) + sum(t.spec.size() for t in shard.tensors)

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for s in self.shards:
            h.update(self.shard_header(s))
        return h.hexdigest()


def expert_kinds(has_bias: bool, static_input_scales: bool) -> tuple[str, ...]:
    kinds = list(WEIGHT_KINDS)
    if has_bias:
        kinds += ["w13_bias", "w2_bias"]
    if static_input_scales:
        kinds += ["w13_input_scale", "w2_input_scale"]
    return tuple(kinds)


LAYOUT_FIELD = {"w13_weight": "w13", "w13_weight_scale": "w13_scale",
                "w2_weight": "w2", "w2_weight_scale": "w2_scale"}


def resolve_layouts(decision, get_layout) -> dict[str, object]:
    rec = decision.layout
    for kind in ("w13_bias", "w2_bias"):
        if getattr(rec, kind, "identity") != "identity":
            raise Mxfp4convError(f"layout {getattr(rec, kind)!r} for {kind} is not supported; "
                                 f"biases are stored as they are.")
    return {k: get_layout(getattr(rec, f)) for k, f in LAYOUT_FIELD.items()}


def stored_shape(kind: str, canonical: dict, layouts: dict) -> tuple[str, tuple[int, ...]]:
    """(dtype, shape) of one per-rank expert tensor as written."""
    if kind in layouts:
        lay = layouts[kind]
        lay.check(canonical[kind])
        return "U8", tuple(int(x) for x in lay.out_shape(canonical[kind]))
    return "F32", canonical[kind]


def build_plan(source, model, decision, layouts: dict, metadata: dict[str, str],
               shard_size: int = DEFAULT_SHARD_SIZE) -> OutputPlan:
    geom = RankGeometry.from_decision(decision)
    kinds = expert_kinds(model.has_bias, model.static_input_scales)
    canonical = geom.canonical_shapes()
    stored = {k: stored_shape(k, canonical, layouts) for k in kinds}

    shard_order = {s: i for i, s in enumerate(source.shards())}
    expert_names = model.expert_tensor_names()
    keyed: list[tuple[tuple[int, int, str], Unit]] = []

    def where(name: str) -> tuple[int, int, str]:
        info = source.tensor_info(name)
        return (shard_order[info.shard], info.begin, name)

    for name in source.tensor_names():
        if name in expert_names:
            continue
        info = source.tensor_info(name)
        spec = TensorSpec(name, info.dtype, tuple(info.shape), info.nbytes)
        keyed.append(((shard_order[info.shard], info.begin, name),
                      Unit([OutTensor(spec, src_shard=info.shard, src_offset=info.begin)])))
    for li, layer in enumerate(model.layers):
        refs = layer.source_tensor_names()
        if not refs:
            raise Mxfp4convError(f"MoE layer {layer.prefix} has no expert tensors")
        tensors = []
        for r in geom.ranks():
            for k in kinds:
                dtype, shape = stored[k]
                tensors.append(OutTensor(TensorSpec(expert_tensor_name(layer.prefix, r, k), dtype, shape),
                                         layer=li, rank=r, kind=k))
        keyed.append((min(where(n) for n in refs), Unit(tensors, layer=li)))
    keyed.sort(key=lambda kv: kv[0])
    units = [u for _, u in keyed]

    names = [t.name for u in units for t in u.tensors]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise Mxfp4convError(f"output tensor name {dup} would be written twice; the source already "
                             f"holds a tensor with a converted-expert name.")

    groups = rank_groups([t for u in units for t in u.tensors], geom.tp, metadata, shard_size)
    shards = [ShardPlan(shard_name(i + 1, len(groups)), g) for i, g in enumerate(groups)]
    return OutputPlan(shards, units, metadata, geom, kinds, canonical, layouts)


def rank_groups(tensors: list[OutTensor], ranks: int, metadata: dict[str, str],
                shard_size: int) -> list[list[OutTensor]]:
    """Shards that a node can fetch alone: with more than one rank, the shared (non-expert)
    tensors first, then each rank's expert tensors in shards of their own, so the node serving
    ranks a..b needs the shared shards and those of its ranks only (``mxfp4conv ranks``)."""
    if ranks <= 1:
        return assign_shards(tensors, metadata, shard_size)
    parts = [[t for t in tensors if t.layer < 0]] + [[t for t in tensors if t.layer >= 0 and t.rank == r]
                                                      for r in range(ranks)]
    groups = [g for part in parts if part for g in assign_shards(part, metadata, shard_size)]
    return groups or [[]]


def assign_shards(tensors: list[OutTensor], metadata: dict[str, str], shard_size: int) -> list[list[OutTensor]]:
    """Greedy, in order: a new shard starts when the next tensor would push the file (header
    included) past ``shard_size``; a tensor larger than that gets a shard of its own."""
    base = len(json.dumps({"__metadata__": metadata}, separators=(",", ":"))) + 16
    groups: list[list[OutTensor]] = []
    cur: list[OutTensor] = []
    cur_size = base
    for t in tensors:
        # entry size with a generous offset width, so the estimate never undershoots
        add = t.spec.size() + header_entry_size(t.spec, 10**15) + 1
        if cur and cur_size + add > shard_size:
            groups.append(cur)
            cur, cur_size = [], base
        cur.append(t)
        cur_size += add
    if cur or not groups:
        groups.append(cur)
    return groups


def plan_metadata(manifest: dict) -> dict[str, str]:
    return {"format": "pt", "mxfp4conv": manifest_text(manifest)}
