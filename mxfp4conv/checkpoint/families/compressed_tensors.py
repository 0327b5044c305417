"""compressed-tensors ``mxfp4-pack-quantized`` MoE checkpoints of any architecture.

What llmcompressor writes for Qwen3-MoE, DeepSeek-V3, transformers' Kimi-Linear and the like:
``{P}.experts.E.{gate,up,down}_proj.weight_packed`` (U8 ``[out, in/2]``) and ``.weight_scale``
(U8 ``[out, in/32]``), ``P`` being the model's MoE block (``model.layers.L.mlp``,
``model.layers.L.block_sparse_moe``, ...). Native ``w1/w3/w2`` names are read too. The MoE
method vLLM 0.33.0 uses is taken from the quant config (``ct_config``); Kimi-K3 releases are
the ``kimi_k3`` family.
"""

from __future__ import annotations

import re

from mxfp4conv.checkpoint.canonical import MoEModel
from mxfp4conv.checkpoint.families import common, ct_config
from mxfp4conv.checkpoint.problems import Problems
from mxfp4conv.errors import CheckpointError

NAME = "compressed_tensors"

PATTERN = re.compile(r"^(?P<prefix>.+)\.experts\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj|w[123])"
                     r"\.(?P<kind>weight_packed|weight_scale|weight)$")
_ROLE = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down",
         "w2": "down"}


def matches(config: dict) -> bool:
    return ct_config.is_ct(common.quant_config(config))


def _field(m: re.Match) -> str:
    role = _ROLE[m["proj"]]
    return f"{role}_scale" if m["kind"] == "weight_scale" else role


def build(source, problems: Problems) -> tuple[MoEModel | None, list[str]]:
    config = source.config
    cfg = common.text_config(config)
    qc = common.quant_config(config)
    where = f"{source.spec} (config.json)"
    found = common.scan(source.tensor_names(), PATTERN, _field)
    if not found.layers:
        raise CheckpointError(
            f"{source.spec}: a compressed-tensors config ({cfg.get('model_type')!r}) but no "
            f"routed-expert tensors named '...experts.E.gate_proj.weight_packed' in the index; "
            f"this is not a mixture-of-experts checkpoint mxfp4conv can convert.")
    first = min(found.layers, key=common.natural_key)
    names = [n for v in found.layers[first][min(found.layers[first])].values() for n in v]
    hf_names = any("_proj." in n for n in names)
    projs = ("gate_proj", "up_proj", "down_proj") if hf_names else ("w1", "w3", "w2")
    modules = [f"{first}.experts.0.{p}" for p in projs]
    architectures = config.get("architectures") or cfg.get("architectures") or ()
    scheme = ct_config.scheme_for(qc, modules, where, architectures=architectures)
    if scheme is None:
        raise CheckpointError(f"{where}: the compressed-tensors ignore list leaves the routed "
                              f"experts (e.g. {modules[0]!r}) unquantised; there are no MXFP4 "
                              f"experts to convert.")
    geometry = common.generic_geometry(cfg, where, problems)

    def name_for(prefix: str, e: int, field: str) -> str:
        role = field.split("_")[0]
        proj = dict(zip(("gate", "up", "down"), projs))[role]
        return f"{prefix}.experts.{e}.{proj}.{'weight_scale' if field.endswith('scale') else 'weight_packed'}"

    layers, prefixes, variants = common.expert_layers(source, found, geometry, problems, name_for)
    if cfg.get("model_type") == "kimi_linear" and hf_names:
        problems.warning(
            f"{source.spec}: this Kimi-Linear export names its routed experts "
            f"'experts.E.gate_proj/up_proj/down_proj' (transformers' names); vLLM 0.33.0's "
            f"Kimi-Linear loader maps only 'experts.E.w1/w3/w2', so stock vLLM does not load these "
            f"expert tensors. mxfp4conv reads and converts them; a converted checkpoint is loaded "
            f"by its '.experts.rank<r>.' names.")
    model = MoEModel(
        family=NAME, quant_scheme=scheme.quant_scheme, moe_method=scheme.moe_method,
        activation=common.activation_from_config(cfg, where), routing=common.routing_from_config(cfg, where),
        geometry=geometry, layers=tuple(layers), dtype_variants=variants,
        moe_class=scheme.moe_class, declared_act=scheme.declared_act,
        extra={"base_model_type": cfg.get("model_type"), "architectures": list(architectures)},
    )
    return model, prefixes
