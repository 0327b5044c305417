"""Kimi-K3: compressed-tensors ``mxfp4-pack-quantized`` experts in a latent MoE width."""

from __future__ import annotations

import re

from mxfp4conv.checkpoint.canonical import Activation, MoEGeometry, MoEModel
from mxfp4conv.checkpoint.families import common, ct_config
from mxfp4conv.checkpoint.problems import Problems
from mxfp4conv.errors import CheckpointError

NAME = "kimi_k3"
# vLLM pads a TP-split K3 intermediate to at least this many columns per rank.
MIN_MOE_INTERMEDIATE_PER_PARTITION = 256

# vLLM renames `.weight_packed` to `.weight`; both spellings are accepted.
PATTERN = re.compile(r"^(?P<prefix>(?:.+\.)?layers\.\d+\.block_sparse_moe)\.experts\.(?P<e>\d+)\."
                     r"(?P<proj>w[123])\.(?P<kind>weight_packed|weight_scale|weight)$")
_ROLE = {"w1": "gate", "w3": "up", "w2": "down"}


def matches(config: dict) -> bool:
    archs = config.get("architectures")
    archs = archs if isinstance(archs, list) else []  # a malformed value is no Kimi-K3 claim
    return config.get("model_type") == "kimi_k3" or any(
        isinstance(a, str) and a in ct_config.K3_ARCHITECTURES for a in archs)


def _field(m: re.Match) -> str:
    role = _ROLE[m["proj"]]
    return f"{role}_scale" if m["kind"] == "weight_scale" else role


def _name_for(prefix: str, e: int, field: str) -> str:
    proj = {v: k for k, v in _ROLE.items()}[field.split("_")[0]]
    return f"{prefix}.experts.{e}.{proj}.{'weight_scale' if field.endswith('scale') else 'weight_packed'}"


def _scheme(config: dict, prefix: str, where: str) -> ct_config.CTScheme:
    qc = common.quant_config(config)
    if not ct_config.is_ct(qc):
        raise CheckpointError(f"{where}: a Kimi-K3 config without a compressed-tensors "
                              f"quantization_config; only the MXFP4 release "
                              f"({ct_config.MXFP4_FORMAT}) is supported.")
    modules = [f"{prefix}.experts.0.{w}" for w in ("w1", "w3", "w2")]
    scheme = ct_config.scheme_for(qc, modules, where, architectures=ct_config.K3_ARCHITECTURES)
    if scheme is None:
        raise CheckpointError(f"{where}: the compressed-tensors ignore list leaves the Kimi-K3 "
                              f"routed experts unquantised; there are no MXFP4 experts to convert.")
    return scheme


def build(source, problems: Problems) -> tuple[MoEModel | None, list[str]]:
    config = source.config
    tc = common.text_config(config)
    where = f"{source.spec} (config.json)"
    found = common.scan(source.tensor_names(), PATTERN, _field)
    first = min(found.layers, key=common.natural_key) if found.layers else "model.layers.1.block_sparse_moe"
    scheme = _scheme(config, first, where)
    if not found.layers:
        problems.error(f"{source.spec}: a Kimi-K3 config but no routed-expert tensors named "
                       f"'...layers.L.block_sparse_moe.experts.E.w1.weight_packed' in the index. "
                       f"The checkpoint is not a Kimi-K3 MXFP4 release.")
    geometry = MoEGeometry(
        hidden=common.cfg_int(tc, where, "routed_expert_hidden_size", "hidden_size", hi=common.MAX_WIDTH),
        intermediate=common.cfg_int(tc, where, "moe_intermediate_size", hi=common.MAX_WIDTH),
        num_experts=common.cfg_int(tc, where, "num_experts", "n_routed_experts", hi=common.MAX_EXPERTS),
        top_k=common.cfg_int(tc, where, "num_experts_per_token", "num_experts_per_tok", hi=common.MAX_EXPERTS),
    )
    common.check_geometry(geometry, problems, where)
    common.check_routing_config(tc, where)
    # vLLM's Kimi-K3 routes with config.moe_router_activation_func; the manifest records its
    # DeepSeekV3 routing (sigmoid scores with a correction bias)
    common.cfg_choice(tc, where, "moe_router_activation_func", ("sigmoid",), "Kimi-K3's DeepSeekV3 routing")
    act_name = common.cfg_activation(tc, where, "situ")
    params = {}
    if act_name == "situ":
        params["beta"] = common.cfg_float(tc, where, "activation_situ_beta")
        if params["beta"] is None:
            common.cfg_get(tc, where, "activation_situ_beta")  # the "lacks" error
        linear_beta = common.cfg_float(tc, where, "activation_situ_linear_beta", positive=False)
        if linear_beta is not None:
            params["linear_beta"] = linear_beta
    layers, prefixes, variants = common.expert_layers(source, found, geometry, problems, _name_for)
    model = MoEModel(
        family=NAME, quant_scheme=scheme.quant_scheme, moe_method=scheme.moe_method,
        moe_class=scheme.moe_class, declared_act=scheme.declared_act,
        activation=Activation(act_name, params), routing="DeepSeekV3", geometry=geometry,
        layers=tuple(layers), dtype_variants=variants,
        extra={"min_moe_intermediate_per_partition": MIN_MOE_INTERMEDIATE_PER_PARTITION,
               "first_k_dense_replace": common.cfg_int(tc, where, "first_k_dense_replace", lo=0,
                                                       hi=common.MAX_LAYERS, default=0),
               "model_hidden": common.cfg_int(tc, where, "hidden_size", hi=common.MAX_WIDTH,
                                              default=geometry.hidden)},
    )
    return model, prefixes
