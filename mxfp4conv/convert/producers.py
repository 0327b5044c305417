"""Work units as tasks: each task produces ``(tensor name, bytes)`` pieces at known places.

Every task says up front which pieces it makes (``Task.pieces``: tensor, offset inside the
tensor, size), so tasks are independent: worker threads run them in any order and write
each piece straight to its final position; the caller records them in task order, so every
tensor's checksum sees its bytes in order. A plain tensor is copied in chunks; an MoE layer
is produced a chunk of experts at a time (each expert read once for every rank and kind),
then each layout's trailing 0x7F padding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from mxfp4conv.convert.plan import OutputPlan, Unit
from mxfp4conv.convert.direct_read import DirectReader, build_chunk_direct, build_chunk_direct_np
from mxfp4conv.checkpoint.checks import E8M0_DTYPE
from mxfp4conv.convert.rank_tensors import WEIGHT_KINDS, build_chunk, build_chunk_np, find_nan_scale
from mxfp4conv.errors import Mxfp4convError
from mxfp4conv.format.manifest import SHUFFLE_PAD_BYTE

COPY_CHUNK = 32 << 20


@dataclass(frozen=True)
class Task:
    run: Callable[[], list]  # -> [(tensor name, bytes)], in the order of ``pieces``
    pieces: tuple[tuple[str, int, int], ...]  # (tensor name, offset in the tensor, size)
    reads: tuple[tuple[str, int, int], ...] = ()  # source (shard, offset, size) it will read, for readahead

    def nbytes(self) -> int:
        return sum(n for _, _, n in self.pieces)


def unit_tasks(src, model, plan: OutputPlan, unit: Unit, chunk_bytes: int, allow_nan: bool,
               reader: DirectReader | None = None) -> Iterator[Task]:
    """``reader``: a shared ``DirectReader`` (its descriptors are the caller's to close)."""
    if unit.layer < 0:
        yield from _copy_tasks(src, unit.tensors[0], chunk_bytes, allow_nan)
    else:
        yield from _layer_tasks(src, model, plan, unit, chunk_bytes, allow_nan, reader or DirectReader(src))


def _copy_tasks(src, t, chunk_bytes: int, allow_nan: bool = False) -> Iterator[Task]:
    size = t.spec.size()
    step = max(1, min(COPY_CHUNK, chunk_bytes))
    check = t.spec.dtype == E8M0_DTYPE and not allow_nan  # 0xFF is NaN in any e8m0 tensor

    def read(off: int, n: int) -> list:
        data = src.read_range(t.src_shard, t.src_offset + off, n)
        if check:
            _check_nan_copy(t.name, off, data)
        return [(t.name, data)]

    for off in range(0, size, step):
        n = min(step, size - off)
        yield Task(lambda off=off, n=n: read(off, n), ((t.name, off, n),), ((t.src_shard, t.src_offset + off, n),))


def _check_nan_copy(name: str, off: int, data) -> None:
    i = find_nan_scale(np.frombuffer(data, dtype=np.uint8))
    if i is not None:
        raise Mxfp4convError(
            f"tensor {name} holds a NaN scale byte (0xFF) at byte offset {off + i} (an e8m0 tensor "
            f"outside the routed experts, copied as it is); served, it would produce NaNs. Fix the "
            f"checkpoint, or pass --allow-nan-scales to copy it as is.")


def per_expert_bytes(plan: OutputPlan) -> dict[str, int]:
    """Bytes one expert takes in each kind's stored per-rank tensor (trailing padding aside)."""
    g = plan.geometry
    out = {}
    for kind in plan.kinds:
        shape = plan.canonical[kind]
        lay = plan.layouts.get(kind)
        if lay is None:
            out[kind] = 4 * math.prod(shape[1:])
            continue
        body = math.prod(lay.out_shape(shape)) - int(lay.tail_bytes(shape))
        if body % g.experts_per_rank:
            raise Mxfp4convError(f"layout {lay.name} of {kind} is not per-expert ({body} bytes for "
                                 f"{g.experts_per_rank} experts); it cannot be written in chunks.")
        out[kind] = body // g.experts_per_rank
    return out


def expert_chunks(plan: OutputPlan, chunk_bytes: int) -> list[range]:
    """Global expert id sequences, each inside one rank's share (consecutive in its local order),
    sized to the chunk budget."""
    g = plan.geometry
    per_expert = sum(math.prod(plan.canonical[k][1:]) * (4 if k not in plan.layouts else 1)
                     for k in plan.kinds) * (1 if g.ep else g.tp)
    return g.chunks(max(1, chunk_bytes // max(per_expert, 1)))


def is_direct(layer, plan: OutputPlan) -> bool:
    """Whether ``layer``'s experts are read straight into the per-rank buffers (``direct_read``)."""
    return layer.experts is not None and set(plan.kinds) <= set(WEIGHT_KINDS)


def numpy_only(model, plan: OutputPlan) -> bool:
    """Whether converting runs without torch: every layout of the plan has a numpy path."""
    return all(plan.layouts[kind].forward_np is not None for kind in plan.layouts)


def _layer_tasks(src, model, plan: OutputPlan, unit: Unit, chunk_bytes: int, allow_nan: bool,
                 reader: DirectReader) -> Iterator[Task]:
    layer = model.layers[unit.layer]
    names = {(t.rank, t.kind): t.name for t in unit.tensors}
    g = plan.geometry
    direct = is_direct(layer, plan)
    with_numpy = numpy_only(model, plan)

    def direct_task(experts: range):
        def run() -> list:
            ranks = g.owner(experts[0])
            build = build_chunk_direct_np if with_numpy else build_chunk_direct
            bufs = build(reader, layer, experts, g, ranks, plan.kinds)
            if not allow_nan:
                for r in ranks:
                    _check_nan_direct(layer, experts, r, bufs, g)
            pieces = []
            for r in ranks:
                for kind in plan.kinds:
                    lay = plan.layouts[kind]
                    forward = lay.forward_np if with_numpy else lay.forward_chunk
                    pieces.append((names[(r, kind)], forward(bufs[(r, kind)])))
            return pieces
        return run

    def task(experts: range):
        from mxfp4conv.checkpoint.experts import read_expert, read_expert_np

        def run() -> list:
            data = []
            for e in experts:
                ex = (read_expert_np if with_numpy else read_expert)(src, layer, e)
                if not allow_nan:
                    _check_nan(layer, e, ex)
                data.append(ex)
            pieces = []
            ranks = g.owner(experts[0])
            for r in ranks:
                chunk = (build_chunk_np if with_numpy else build_chunk)(data, g, r, plan.kinds)
                for kind in plan.kinds:
                    t = chunk[kind]
                    lay = plan.layouts.get(kind)
                    if lay is not None:
                        t = lay.forward_np(t) if with_numpy else lay.forward_chunk(t)
                    pieces.append((names[(r, kind)], t))
            return pieces
        return run

    pe = per_expert_bytes(plan)
    for span in expert_chunks(plan, chunk_bytes):
        pieces = tuple((names[(r, kind)], g.local_index(r, span[0]) * pe[kind], len(span) * pe[kind])
                       for r in g.owner(span[0]) for kind in plan.kinds)
        reads = ()
        if layer.experts is not None:
            reads = tuple((i.shard, i.begin, i.nbytes) for e in span for ref in layer.experts[e].refs()
                          for i in (src.tensor_info(ref.name),))
        yield Task(direct_task(span) if direct else task(span), pieces, reads)

    tails = []
    for r in g.ranks():
        for kind, lay in plan.layouts.items():
            n = int(lay.tail_bytes(plan.canonical[kind]))
            if n:
                tails.append((names[(r, kind)], g.experts_per_rank * pe[kind], n))
    if tails:
        yield Task(lambda: [(name, np.full((n,), SHUFFLE_PAD_BYTE, dtype=np.uint8)) for name, _, n in tails],
                   tuple(tails))


def _check_nan(layer, e: int, ex) -> None:
    for kind, t in (("w13_weight_scale", ex.w13_scale), ("w2_weight_scale", ex.w2_scale)):
        i = find_nan_scale(t)
        if i is not None:
            name, off = nan_location(layer, e, kind, i, tuple(t.shape))
            raise Mxfp4convError(
                f"tensor {name} holds a NaN scale byte (0xFF) at byte offset {off} (MoE layer "
                f"{layer.prefix}, expert {e}). vLLM would load it as NaN and the expert would "
                f"produce NaNs. Fix the checkpoint, or pass --allow-nan-scales to copy it as is.")


def nan_location(layer, e: int, kind: str, flat: int, shape: tuple[int, int]) -> tuple[str, int]:
    """Source tensor name and byte offset of element ``flat`` of expert ``e``'s canonical scale."""
    rows, cols = shape
    row, col = divmod(flat, cols)
    if layer.fused is not None:
        f = layer.fused
        if kind == "w13_weight_scale":
            half = rows // 2
            src_row = 2 * row if row < half else 2 * (row - half) + 1
            return f.gate_up_scales.name, (e * rows + src_row) * cols + col
        return f.down_scales.name, e * rows * cols + flat
    if layer.gate_up_experts is not None:
        gu = layer.gate_up_experts[e]
        if kind == "w13_weight_scale":
            half = rows // 2
            src_row = 2 * row if row < half else 2 * (row - half) + 1
            return gu.gate_up_scale.name, src_row * cols + col
        return gu.down_scale.name, flat
    ex = layer.experts[e]
    if kind == "w13_weight_scale":
        half = rows // 2
        ref = ex.gate_scale if row < half else ex.up_scale
        return ref.name, (row % half) * cols + col
    return ex.down_scale.name, flat


def _check_nan_direct(layer, experts: range, r: int, bufs: dict, g) -> None:
    """NaN check on the stacked canonical scales of one rank (padding is never 0xFF)."""
    H, I, Ip = g.hidden, g.intermediate, g.inter_rank_padded
    sl = g.inter_slice(r)
    for kind in ("w13_weight_scale", "w2_weight_scale"):
        t = bufs[(r, kind)]
        i = find_nan_scale(t)
        if i is None:
            continue
        e_local, rest = divmod(i, t.shape[1] * t.shape[2])
        row, col = divmod(rest, t.shape[2])
        ex = layer.experts[experts[e_local]]
        if kind == "w13_weight_scale":
            ref = ex.gate_scale if row < Ip else ex.up_scale
            off = (sl.start + row % Ip) * (H // 32) + col
        else:
            ref = ex.down_scale
            off = row * (I // 32) + sl.start // 32 + col
        raise Mxfp4convError(
            f"tensor {ref.name} holds a NaN scale byte (0xFF) at byte offset {off} (MoE layer "
            f"{layer.prefix}, expert {experts[e_local]}). vLLM would load it as NaN and the expert "
            f"would produce NaNs. Fix the checkpoint, or pass --allow-nan-scales to copy it as is.")
