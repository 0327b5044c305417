"""What ``mxfp4conv inspect`` reports about a checkpoint, from its headers."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from mxfp4conv.checkpoint import checks, strict_json
from mxfp4conv.checkpoint.detect import analyze, is_converted
from mxfp4conv.checkpoint.problems import Problems
from mxfp4conv.checkpoint.source import MANIFEST_NAME, Source, open_source
from mxfp4conv.errors import CheckpointError

_CONVERTED_EXPERT = re.compile(r"\.experts\.rank\d+\.")
_ROUTED_EXPERT = re.compile(r"\.experts\.(\d+\.|gate_up_proj_|down_proj_)")
_GROUPS = (  # (group name, pattern), first match wins; routed experts are decided separately
    ("shared experts", re.compile(r"shared_expert")),
    ("router", re.compile(r"\.(gate|router)\.(weight|bias|e_score_correction_bias|tid2eid)$")),
    ("latent projections", re.compile(r"routed_expert_(down|up)_proj|routed_expert_norm")),
    ("attention", re.compile(r"(self_)?attn\.|\.attn_sink|\.sinks$")),
    ("norms", re.compile(r"norm\.weight$|norm$")),
    ("embeddings and head", re.compile(r"(^|\.)(embed_tokens|embed|lm_head|head)\.")),
    ("dense MLP", re.compile(r"\.(mlp|ffn|block_sparse_moe)\.(gate_proj|up_proj|down_proj|w[123])\.")),
    ("vision", re.compile(r"^(vision_tower|mm_projector)\.")),
)


@dataclass
class Report:
    data: dict[str, Any]  # the --json object
    groups: list[dict[str, Any]] = field(default_factory=list)
    problems: Problems = field(default_factory=Problems)


def _group_of(name: str, expert_names: set[str]) -> str:
    if name in expert_names or _CONVERTED_EXPERT.search(name) or _ROUTED_EXPERT.search(name):
        return "routed experts"
    for group, pattern in _GROUPS:
        if pattern.search(name):
            return group
    return "other"


def _groups(source: Source, expert_names: set[str]) -> tuple[list[dict], int, int, int]:
    groups: dict[str, dict[str, Any]] = {}
    total = count = experts = 0
    for shard in source.shards():
        header = source.header(shard)
        for name, e in header.tensors.items():
            if source.weight_map.get(name) != shard:
                continue  # reported by check_index; counted once, where the index says
            g = groups.setdefault(_group_of(name, expert_names),
                                  {"tensors": 0, "bytes": 0, "dtypes": set()})
            g["tensors"] += 1
            g["bytes"] += e.nbytes
            g["dtypes"].add(e.dtype)
            total += e.nbytes
            count += 1
            if g is groups.get("routed experts"):
                experts += e.nbytes
    rows = [{"group": k, "tensors": v["tensors"], "bytes": v["bytes"],
             "dtypes": sorted(v["dtypes"])} for k, v in groups.items()]
    rows.sort(key=lambda r: -r["bytes"])
    return rows, count, total, experts


def inspect_source(spec: str, *, full: bool = False) -> Report:
    """Read ``spec`` from its headers and describe it (``full``: scan every expert scale)."""
    source = open_source(spec)
    try:
        return _inspect(source, full)
    finally:
        source.close()


def _inspect(source: Source, full: bool) -> Report:
    problems = Problems()
    checks.check_index(source, problems)
    if is_converted(source):
        return _converted(source, problems)
    analysis = analyze(source)
    problems.items.extend(analysis.problems.items)
    model = analysis.model
    expert_names = model.expert_tensor_names() if model else set()
    scale_scan = None
    if model is not None:
        scale_scan = checks.check_nan_scales(source, list(model.layers), problems, full=full)
    groups, count, total, experts = _groups(source, expert_names)
    data = {
        "family": analysis.family,
        "quant_scheme": model.quant_scheme if model else None,
        "activation": model.activation.name if model else None,
        "activation_params": dict(model.activation.params) if model else {},
        "moe": {
            "layers": list(analysis.moe_prefixes),
            "num_experts": model.geometry.num_experts if model else None,
            "top_k": model.geometry.top_k if model else None,
            "hidden": model.geometry.hidden if model else None,
            "intermediate": model.geometry.intermediate if model else None,
        },
        "tensors": count,
        "bytes": total,
        "expert_bytes": experts,
        "kernel_layout": None,
        "problems": [p.to_json() for p in problems],
        "scale_scan": scale_scan,
        # Beyond the contract: what the oracle and a reader find useful.
        "moe_method": model.moe_method if model else None,
        "moe_class": model.moe_class if model else None,
        "declared_act": model.declared_act if model else None,
        "gate_up_interleaved": model.gate_up_interleaved if model else None,
        "routing": model.routing if model else None,
        "has_bias": model.has_bias if model else None,
        "static_input_scales": model.static_input_scales if model else None,
        "dtype_variants": dict(model.dtype_variants) if model else {},
        "extra": dict(model.extra) if model else {},
        "source": _source_info(source),
        "groups": groups,
    }
    return Report(data=data, groups=groups, problems=problems)


def _source_info(source: Source) -> dict[str, Any]:
    return {"spec": str(source.spec), "root": str(source.root), "revision": source.revision,
            "shards": len(source.shards()), "sha256": source.fingerprint()}


def _converted(source: Source, problems: Problems) -> Report:
    from mxfp4conv.format.manifest import validate_manifest

    path = source.path(MANIFEST_NAME)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the manifest ({exc.strerror}).") from None
    manifest = strict_json.loads(raw, str(path), "manifest of this converted checkpoint",
                                 "Convert the source again.")
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: the manifest must be a JSON object. Convert the source "
                              f"again.")
    try:
        validate_manifest(manifest, str(path))
    except CheckpointError as exc:  # shown as a problem; only what was checked is shown
        problems.error(str(exc))
        manifest = {}
    src = manifest.get("source") or {}
    target = manifest.get("target") or {}
    moe = manifest.get("moe") or {}
    groups, count, total, experts = _groups(source, set())
    data = {
        "family": src.get("family"),
        "quant_scheme": src.get("quant_scheme"),
        "activation": target.get("activation"),
        "activation_params": dict(target.get("activation_params") or {}),
        "moe": {k: moe.get(k) for k in ("layers", "num_experts", "top_k", "hidden", "intermediate")},
        "tensors": count,
        "bytes": total,
        "expert_bytes": experts,
        "kernel_layout": manifest or None,
        "problems": [p.to_json() for p in problems],
        "source": _source_info(source),
        "groups": groups,
    }
    return Report(data=data, groups=groups, problems=problems)
