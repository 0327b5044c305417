"""Checkpoint-wide checks that ``inspect`` reports as problems."""

from __future__ import annotations

import json

import numpy as np

from mxfp4conv.checkpoint.canonical import MoELayer, TensorRef
from mxfp4conv.checkpoint.problems import Problems
from mxfp4conv.checkpoint.safetensors_io import DTYPE_BITS, expected_nbytes
from mxfp4conv.checkpoint.source import INDEX_NAME, Source, duplicate_index_keys
from mxfp4conv.errors import CheckpointError

NAN_E8M0 = 0xFF
E8M0_DTYPE = "F8_E8M0"  # safetensors' dtype for e8m0 bytes
SAMPLE_TENSORS = 24  # scale tensors looked at by the default (cheap) NaN check
SAMPLE_BYTES = 1 << 20  # at most this many scale bytes read by the default check
# A median scale code at or above this implies weights no real model has (see magnitude_warning).
IMPLAUSIBLE_MEDIAN = 0x83


def check_index(source: Source, problems: Problems) -> None:
    """The index against the shard headers: every tensor exactly once, where it says."""
    if source.index_bytes is None:
        return
    for name in duplicate_index_keys(source.index_bytes)[:5]:
        problems.error(f"{INDEX_NAME}: tensor {name!r} is listed more than once in weight_map. "
                       f"Each tensor must appear exactly once; fix the index.")
    by_shard: dict[str, set[str]] = {}
    for n, s in source.weight_map.items():
        by_shard.setdefault(s, set()).add(n)
    for shard, mapped in by_shard.items():
        header = source.header(shard)
        missing = sorted(mapped - header.tensors.keys())
        if missing:
            problems.error(f"{shard}: the index maps {len(missing)} tensors to this shard that its "
                           f"header does not contain (e.g. {missing[0]!r}). The index and the "
                           f"shards disagree; download the checkpoint again.")
        extra = sorted(header.tensors.keys() - mapped)
        elsewhere = [n for n in extra if n in source.weight_map]
        unlisted = [n for n in extra if n not in source.weight_map]
        if elsewhere:
            problems.error(f"{shard}: {len(elsewhere)} tensors in this shard are mapped by the "
                           f"index to another shard (duplicates, e.g. {elsewhere[0]!r} -> "
                           f"{source.weight_map[elsewhere[0]]}). Remove the stale copy.")
        if unlisted:
            problems.error(f"{shard}: {len(unlisted)} tensors in this shard are not in the index "
                           f"(e.g. {unlisted[0]!r}), so loaders never see them. Regenerate "
                           f"{INDEX_NAME}.")
    meta = _index_metadata(source)
    total = meta.get("total_size") if isinstance(meta, dict) else None
    if isinstance(total, int):
        actual = sum(source.header(s).data_bytes for s in source.shards())
        if total != actual:
            problems.warning(f"{INDEX_NAME}: metadata.total_size is {total} but the shards hold "
                             f"{actual} bytes of tensor data.")


def _index_metadata(source: Source) -> dict:
    try:
        return json.loads(source.index_bytes).get("metadata") or {}
    except (ValueError, AttributeError):
        return {}


def scale_refs(layer: MoELayer) -> list[tuple[TensorRef, int | None]]:
    """(scale tensor, expert row or None for the whole tensor) of a layer."""
    if layer.fused is not None:
        return [(layer.fused.gate_up_scales, None), (layer.fused.down_scales, None)]
    return [(r, None) for refs in layer.expert_scale_refs() for r in refs]


def check_nan_scales(source: Source, layers: list[MoELayer], problems: Problems, *,
                     full: bool = False) -> dict:
    """Look at the e8m0 scale bytes: 0xFF (NaN) is an error, implausible magnitudes a warning.
    By default a sample of at most ``SAMPLE_BYTES`` from a few scale tensors (first/last
    layers and experts); ``full`` reads every scale byte. Returns what was scanned (the
    ``scale_scan`` of inspect's report)."""
    others = other_e8m0(source, layers)
    if full:
        todo = [(r, None) for layer in layers for r, _ in scale_refs(layer)]
        budget = None
    else:  # never download a hub shard just to sample it
        todo = [(r, row) for r, row in _sample(layers) if source.has_local(r.shard)]
        budget = SAMPLE_BYTES // max(len(todo), 1)
    bad, total, histogram = _read_scales(source, todo, budget)
    all_bytes = sum(_scale_nbytes(r) for layer in layers for r, _ in scale_refs(layer))
    all_bytes += sum(_scale_nbytes(r) for r in others)
    if bad:
        problems.error(f"{len(bad)} expert scale tensors contain 0xFF e8m0 bytes, which decode to "
                       f"NaN ({'; '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}). The weights "
                       f"are corrupt or were quantized from NaN/inf values; re-export them.")
    if full:  # the e8m0 tensors outside the routed experts (e.g. DeepSeek-V4's FP8 block scales)
        bad_other, n_other, _ = _read_scales(source, [(r, None) for r in others], None)
        total += n_other
        todo += [(r, None) for r in others]
        if bad_other:
            problems.error(f"{len(bad_other)} e8m0 tensors outside the routed experts contain 0xFF "
                           f"bytes, which decode to NaN ({'; '.join(bad_other[:5])}"
                           f"{' ...' if len(bad_other) > 5 else ''}). The weights are corrupt or "
                           f"were quantized from NaN/inf values; re-export them (convert refuses "
                           f"them unless --allow-nan-scales).")
    elif not full and len(todo) < len(_sample(layers)):
        problems.warning("the NaN-scale sample skipped shards that are not downloaded; run "
                         "inspect --full to download and scan every scale.")
    implausible = magnitude_warning(histogram)
    if implausible:
        problems.warning(implausible)
    return {"mode": "full" if full else "sample", "tensors_read": len(todo),
            "bytes_read": total, "bytes_total": all_bytes}


def other_e8m0(source: Source, layers: list[MoELayer]) -> list[TensorRef]:
    """Every tensor stored as F8_E8M0 that is not a routed expert's scale: 0xFF is NaN there too."""
    routed = {r.name for layer in layers for r, _ in scale_refs(layer)}
    out = []
    for shard in source.shards():
        try:
            header = source.header(shard)
        except CheckpointError:  # reported by the index checks
            continue
        for name, e in header.tensors.items():
            if e.dtype == E8M0_DTYPE and name not in routed and source.weight_map.get(name) == shard:
                out.append(TensorRef(name=name, shard=shard, dtype=e.dtype, shape=tuple(e.shape)))
    return out


def _read_scales(source: Source, todo, budget: int | None) -> tuple[list[str], int, list[int]]:
    """(tensors holding 0xFF, bytes read, histogram of the byte values) of the scales in ``todo``."""
    bad: list[str] = []
    total = 0
    histogram = [0] * 256
    for r, row in todo:
        info = source.tensor_info(r.name)
        begin, n = info.begin, info.nbytes
        if row is not None:
            n //= max(info.shape[0], 1)
            begin += row * n
        if budget is not None:
            n = min(n, budget)
        if not n:
            continue
        data = source.read_range(info.shard, begin, n)
        total += n
        counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256).tolist()
        histogram = [a + b for a, b in zip(histogram, counts)]
        if counts[NAN_E8M0]:
            where = f" (expert {row})" if row is not None else ""
            bad.append(f"{r.name}{where}: {counts[NAN_E8M0]} bytes")
    return bad, total, histogram


def scale_warnings(source: Source, layers: list[MoELayer]) -> list[str]:
    """What convert warns about the scales, from the same cheap sample inspect reads."""
    todo = [(r, row) for r, row in _sample(layers) if source.has_local(r.shard)]
    _, _, histogram = _read_scales(source, todo, SAMPLE_BYTES // max(len(todo), 1))
    msg = magnitude_warning(histogram)
    return [msg] if msg else []


def _scale_nbytes(r: TensorRef) -> int:
    return expected_nbytes(r.dtype, r.shape) or 0 if r.dtype in DTYPE_BITS else 0


def magnitude_warning(histogram: list[int]) -> str | None:
    """A real checkpoint's typical block of 32 weights has its largest value well below 1, so
    the median e8m0 code sits a few steps under 127; codes cast numerically instead of stored
    as exponents (compressed-tensors 0.20 with scale_dtype float8_e8m0fnu writes code 120 as
    0x86) put it far above."""
    counts = histogram[:NAN_E8M0]
    n = sum(counts)
    if not n:
        return None
    acc, median = 0, 0
    for code, c in enumerate(counts):
        acc += c
        if 2 * acc >= n:
            median = code
            break
    largest = 6.0 * 2.0 ** (median - 127)  # e2m1's largest magnitude is 6
    if median < IMPLAUSIBLE_MEDIAN:
        return None
    return (f"the expert scales are implausible: the median e8m0 scale byte is 0x{median:02X} "
            f"(2^{median - 127}), so a typical block of 32 weights would reach {largest:g}, "
            f"while real weights keep the largest value of almost every block below about 1 "
            f"(a median under 0x7F). The scales were "
            f"probably written as numbers instead of e8m0 exponent codes (compressed-tensors "
            f"with scale_dtype float8_e8m0fnu casts them numerically); re-export them, or check "
            f"the weights before serving them.")


def _sample(layers: list[MoELayer]) -> list[tuple[TensorRef, int | None]]:
    """A few scale tensors spread over first/last layers and first/last experts."""
    picks: list[tuple[TensorRef, int | None]] = []
    chosen = list(dict.fromkeys([*layers[:2], *layers[-1:]]))
    for layer in chosen:
        if layer.fused is not None:
            n = layer.fused.gate_up_scales.shape[0]
            for e in sorted({0, n - 1}):
                picks += [(layer.fused.gate_up_scales, e), (layer.fused.down_scales, e)]
        else:
            per_expert = layer.expert_scale_refs()
            for refs in dict.fromkeys([per_expert[0], per_expert[-1]]):
                picks += [(r, None) for r in refs]
    return picks[:SAMPLE_TENSORS]
