"""DeepSeek-V4: native names, I8 packed experts with F8_E8M0 scales, FP8 everything else."""

from __future__ import annotations

import re

from mxfp4conv.checkpoint.canonical import Activation, MoEGeometry, MoEModel
from mxfp4conv.checkpoint.families import common
from mxfp4conv.checkpoint.problems import Problems
from mxfp4conv.errors import CheckpointError

NAME = "deepseek_v4"

# `mtp.N.ffn` (multi-token prediction) layers carry routed experts like `layers.L.ffn`.
PATTERN = re.compile(r"^(?P<prefix>(?:model\.)?(?:layers|mtp)\.\d+\.ffn)\.experts\.(?P<e>\d+)\."
                     r"(?P<proj>w[123])\.(?P<kind>weight|scale|weight_scale)$")
_ROLE = {"w1": "gate", "w3": "up", "w2": "down"}


def matches(config: dict) -> bool:
    cfg = common.text_config(config)
    return "deepseek_v4" in (config.get("model_type"), cfg.get("model_type")) or \
        "expert_dtype" in config or "expert_dtype" in cfg


def _field(m: re.Match) -> str:
    role = _ROLE[m["proj"]]
    return role if m["kind"] == "weight" else f"{role}_scale"


def _name_for(prefix: str, e: int, field: str) -> str:
    proj = {v: k for k, v in _ROLE.items()}[field.split("_")[0]]
    return f"{prefix}.experts.{e}.{proj}.{'scale' if field.endswith('scale') else 'weight'}"


def build(source, problems: Problems) -> tuple[MoEModel | None, list[str]]:
    config = common.text_config(source.config)  # the dimensions may sit under text_config
    where = f"{source.spec} (config.json)"
    expert_dtype = config.get("expert_dtype", source.config.get("expert_dtype", "fp4"))
    if expert_dtype != "fp4":
        raise CheckpointError(f"{where}: DeepSeek-V4 with expert_dtype {expert_dtype!r}; only "
                              f"the MXFP4 release (expert_dtype \"fp4\") has MXFP4 experts to "
                              f"convert.")
    geometry = MoEGeometry(
        hidden=common.cfg_int(config, where, "hidden_size", hi=common.MAX_WIDTH),
        intermediate=common.cfg_int(config, where, "moe_intermediate_size", hi=common.MAX_WIDTH),
        num_experts=common.cfg_int(config, where, "n_routed_experts", hi=common.MAX_EXPERTS),
        top_k=common.cfg_int(config, where, "num_experts_per_tok", hi=common.MAX_EXPERTS),
    )
    common.check_geometry(geometry, problems, where)
    common.check_routing_config(config, where)
    # vLLM's DeepSeek-V4 routes with config.scoring_func (default sqrtsoftplus); the manifest
    # records its DeepseekV4 routing, which is sqrtsoftplus
    common.cfg_choice(config, where, "scoring_func", ("sqrtsoftplus",), "DeepSeek-V4's routing")
    params = {}
    limit = common.cfg_float(config, where, "swiglu_limit")
    if limit is not None:
        params["swiglu_limit"] = limit
    _refuse_dequantised_experts(source, where)
    found = common.scan(source.tensor_names(), PATTERN, _field)
    if not found.layers:
        problems.error(f"{source.spec}: a DeepSeek-V4 config but no routed-expert tensors named "
                       f"'layers.L.ffn.experts.E.w1.weight' in the index. The checkpoint is not "
                       f"a DeepSeek-V4 MXFP4 release.")
    layers, prefixes, variants = common.expert_layers(source, found, geometry, problems, _name_for)
    model = MoEModel(
        family=NAME, quant_scheme="w_mxfp4", moe_method="mxfp4", moe_class="Mxfp4MoEMethod",
        activation=Activation(common.cfg_activation(config, where, "silu"), params),
        routing="DeepseekV4", geometry=geometry, layers=tuple(layers), dtype_variants=variants,
        extra={"num_hash_layers": common.cfg_int(config, where, "num_hash_layers", lo=0,
                                                  hi=common.MAX_LAYERS, default=0),
               "mtp_layers": [p for p in prefixes if common.natural_key(p)[0]]},
    )
    return model, prefixes


FLOAT_DTYPES = ("BF16", "F16", "F32")


def _refuse_dequantised_experts(source, where: str) -> None:
    """Experts stored as floats with no scales (a re-save that dequantised them, as transformers
    writes DeepSeek-V4) are not MXFP4, whatever config.json still declares."""
    weights, scales = [], 0
    for name in source.tensor_names():
        m = PATTERN.match(name)
        if m:
            if m["kind"] == "weight":
                weights.append(name)
            else:
                scales += 1
    if not weights or scales:
        return
    info = source.tensor_info(weights[0])
    if info.dtype in FLOAT_DTYPES:
        raise CheckpointError(
            f"{source.spec}: the routed experts are {info.dtype}, not MXFP4 ({weights[0]} is {info.dtype} "
            f"{list(info.shape)}, and no expert has a scale tensor), although {where} declares expert_dtype "
            f"\"fp4\". A re-save that dequantised the experts (transformers writes DeepSeek-V4 so) has "
            f"nothing to convert: convert the original MXFP4 release instead.")
