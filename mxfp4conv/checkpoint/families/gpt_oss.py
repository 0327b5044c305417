"""gpt-oss: every expert of a layer in fused 4-D tensors, gate/up rows interleaved."""

from __future__ import annotations

import re

from mxfp4conv.checkpoint.canonical import Activation, FusedExperts, MoEGeometry, MoEModel
from mxfp4conv.checkpoint.families import common
from mxfp4conv.checkpoint.problems import Problems
from mxfp4conv.errors import CheckpointError

NAME = "gpt_oss"
SWIGLU_ALPHA = 1.702

PATTERN = re.compile(r"^(?P<prefix>.+)\.experts\.(?P<proj>gate_up_proj|down_proj)_"
                     r"(?P<kind>blocks|scales|bias)$")
_FIELDS = {("gate_up_proj", "blocks"): "gate_up_blocks", ("gate_up_proj", "scales"): "gate_up_scales",
           ("gate_up_proj", "bias"): "gate_up_bias", ("down_proj", "blocks"): "down_blocks",
           ("down_proj", "scales"): "down_scales", ("down_proj", "bias"): "down_bias"}
_NAMES = {f: f"{proj}_{kind}" for (proj, kind), f in _FIELDS.items()}
_REQUIRED = ("gate_up_blocks", "gate_up_scales", "down_blocks", "down_scales")


def matches(config: dict) -> bool:
    qc = common.quant_config(config) or {}
    return config.get("model_type") == "gpt_oss" and qc.get("quant_method") == "mxfp4"


def expected_shapes(g: MoEGeometry) -> dict[str, tuple[int, ...]]:
    E, H, I = g.num_experts, g.hidden, g.intermediate
    return {"gate_up_blocks": (E, 2 * I, H // 32, 16), "gate_up_scales": (E, 2 * I, H // 32),
            "gate_up_bias": (E, 2 * I), "down_blocks": (E, H, I // 32, 16),
            "down_scales": (E, H, I // 32), "down_bias": (E, H)}


def _byte_shape(r) -> tuple[int, ...]:
    """[E, N, K/32, 16] bytes, whatever the header's byte grouping (F4: logical elements)."""
    shape = common.packed_shape(r)
    if len(shape) == 3 and r.name.endswith("_blocks") and shape[-1] % 16 == 0:
        shape = (*shape[:2], shape[2] // 16, 16)
    return shape


def build(source, problems: Problems) -> tuple[MoEModel | None, list[str]]:
    config = source.config
    where = f"{source.spec} (config.json)"
    geometry = MoEGeometry(
        hidden=common.cfg_int(config, where, "hidden_size", hi=common.MAX_WIDTH),
        intermediate=common.cfg_int(config, where, "intermediate_size", hi=common.MAX_WIDTH),
        num_experts=common.cfg_int(config, where, "num_local_experts", "num_experts", hi=common.MAX_EXPERTS),
        top_k=common.cfg_int(config, where, "num_experts_per_tok", "experts_per_token", hi=common.MAX_EXPERTS),
    )
    common.check_geometry(geometry, problems, where)
    common.check_routing_config(config, where)
    found: dict[str, dict[str, str]] = {}
    for name in source.tensor_names():
        m = PATTERN.match(name)
        if m:
            found.setdefault(m["prefix"], {})[_FIELDS[(m["proj"], m["kind"])]] = name
    if not found:
        problems.error(f"{source.spec}: a gpt-oss config but no fused expert tensors named "
                       f"'model.layers.L.mlp.experts.gate_up_proj_blocks' in the index.")
    prefixes = sorted(found, key=common.natural_key)
    want = expected_shapes(geometry)
    layers = []
    for prefix in prefixes:
        fields = found[prefix]
        missing = [f for f in _REQUIRED if f not in fields]
        if missing:
            names = ", ".join(f"{prefix}.experts.{_NAMES[f]}" for f in missing)
            problems.error(f"MoE layer {prefix}: missing {names}. The checkpoint is incomplete; "
                           f"download the missing shards again.")
            continue
        try:
            refs = {f: common.ref(source, n) for f, n in fields.items()}
        except CheckpointError as exc:
            problems.error(str(exc))
            continue
        bad = [r for f, r in refs.items() if (_byte_shape(r) if f.endswith(("blocks", "scales"))
                                              else r.shape) != want[f]]
        for r in bad:
            f = next(k for k, v in refs.items() if v is r)
            problems.error(f"MoE layer {prefix}: {r.name!r} is {r.dtype} {list(r.shape)} but "
                           f"config.json (hidden {geometry.hidden}, intermediate "
                           f"{geometry.intermediate}, {geometry.num_experts} experts, group 32) "
                           f"implies {list(want[f])}. The tensor does not match the config.")
        layers.append(_layer(prefix, refs))
    variants = common.dtype_variants(layers, problems)
    model = MoEModel(
        family=NAME, quant_scheme="w_mxfp4", moe_method="gpt_oss_mxfp4",
        activation=Activation("swigluoai", {"alpha": SWIGLU_ALPHA,
                                            "limit": common.cfg_float(config, where, "swiglu_limit",
                                                                     default=7.0)}),
        routing="Renormalize", geometry=geometry, layers=tuple(layers),
        has_bias=any(layer.fused.gate_up_bias is not None for layer in layers),
        dtype_variants=variants, moe_class="GptOssMxfp4MoEMethod", gate_up_interleaved=True,
    )
    return model, prefixes


def _layer(prefix: str, refs: dict):
    from mxfp4conv.checkpoint.canonical import MoELayer

    return MoELayer(prefix=prefix, fused=FusedExperts(**refs))
