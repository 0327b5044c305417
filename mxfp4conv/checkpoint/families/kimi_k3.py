"""Kimi-K3: compressed-tensors ``mxfp4-pack-quantized`` experts in a latent MoE width."""

from __future__ import annotations

import re

from mxfp4conv.checkpoint.canonical import Activation, MoEGeometry, MoEModel
from mxfp4conv.checkpoint.families import common
from mxfp4conv.checkpoint.problems import Problems
from mxfp4conv.errors import CheckpointError

NAME = "kimi_k3"
FORMAT = "mxfp4-pack-quantized"
# vLLM pads a TP-split K3 intermediate to at least this many columns per rank.
MIN_MOE_INTERMEDIATE_PER_PARTITION = 256

# vLLM renames `.weight_packed` to `.weight`; both spellings are accepted.
PATTERN = re.compile(r"^(?P<prefix>(?:.+\.)?layers\.\d+\.block_sparse_moe)\.experts\.(?P<e>\d+)\."
                     r"(?P<proj>w[123])\.(?P<kind>weight_packed|weight_scale|weight)$")
_ROLE = {"w1": "gate", "w3": "up", "w2": "down"}


def text_config(config: dict) -> dict:
    tc = config.get("text_config")
    return tc if isinstance(tc, dict) else config


def matches(config: dict) -> bool:
    return config.get("model_type") == "kimi_k3" or text_config(config).get("model_type") == "kimi_linear"


def _field(m: re.Match) -> str:
    role = _ROLE[m["proj"]]
    return f"{role}_scale" if m["kind"] == "weight_scale" else role


def _name_for(prefix: str, e: int, field: str) -> str:
    proj = {v: k for k, v in _ROLE.items()}[field.split("_")[0]]
    return f"{prefix}.experts.{e}.{proj}.{'weight_scale' if field.endswith('scale') else 'weight_packed'}"


def _scheme(qc: dict | None, where: str) -> str:
    if not qc or qc.get("quant_method") != "compressed-tensors":
        raise CheckpointError(f"{where}: a Kimi-K3 config without a compressed-tensors "
                              f"quantization_config; only the MXFP4 release "
                              f"({FORMAT}) is supported.")
    groups = qc.get("config_groups") or {}
    fmts = {qc.get("format")} | {g.get("format") for g in groups.values() if isinstance(g, dict)}
    if FORMAT not in fmts:
        raise CheckpointError(f"{where}: Kimi-K3 quantization format is {qc.get('format')!r}, "
                              f"not {FORMAT!r}; only MXFP4 Kimi-K3 checkpoints are supported.")
    acts = [g.get("input_activations") for g in groups.values() if isinstance(g, dict)]
    act = next((a for a in acts if a), None)
    if not act:
        return "w_mxfp4"
    if act.get("type") == "float" and act.get("num_bits") == 4:
        return "w_mxfp4_a_mxfp4"
    if act.get("type") == "float" and act.get("num_bits") == 8:
        return "w_mxfp4_a_mxfp8" if act.get("group_size") == 32 else "w_mxfp4_a_fp8"
    return "w_mxfp4"


def build(source, problems: Problems) -> tuple[MoEModel | None, list[str]]:
    config = source.config
    tc = text_config(config)
    where = f"{source.spec} (config.json)"
    scheme = _scheme(common.quant_config(config), where)
    geometry = MoEGeometry(
        hidden=int(common.cfg_get(tc, where, "routed_expert_hidden_size", "hidden_size")),
        intermediate=int(common.cfg_get(tc, where, "moe_intermediate_size")),
        num_experts=int(common.cfg_get(tc, where, "num_experts", "n_routed_experts")),
        top_k=int(common.cfg_get(tc, where, "num_experts_per_token", "num_experts_per_tok")),
    )
    common.check_geometry(geometry, problems, where)
    act_name = str(tc.get("hidden_act", "situ"))
    params = {}
    if act_name == "situ":
        params["beta"] = float(common.cfg_get(tc, where, "activation_situ_beta"))
        if tc.get("activation_situ_linear_beta") is not None:
            params["linear_beta"] = float(tc["activation_situ_linear_beta"])
    found = common.scan(source.tensor_names(), PATTERN, _field)
    if not found.layers:
        problems.error(f"{source.spec}: a Kimi-K3 config but no routed-expert tensors named "
                       f"'...layers.L.block_sparse_moe.experts.E.w1.weight_packed' in the index. "
                       f"The checkpoint is not a Kimi-K3 MXFP4 release.")
    layers, prefixes, variants = common.expert_layers(source, found, geometry, problems, _name_for)
    model = MoEModel(
        family=NAME, quant_scheme=scheme, moe_method="mxfp4",
        activation=Activation(act_name, params), routing="DeepSeekV3", geometry=geometry,
        layers=tuple(layers), dtype_variants=variants,
        extra={"min_moe_intermediate_per_partition": MIN_MOE_INTERMEDIATE_PER_PARTITION,
               "first_k_dense_replace": int(tc.get("first_k_dense_replace", 0) or 0),
               "model_hidden": int(tc.get("hidden_size", geometry.hidden))},
    )
    return model, prefixes
