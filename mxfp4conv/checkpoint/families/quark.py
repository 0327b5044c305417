"""AMD Quark OCP-MX exports: per-expert MXFP4 weights with uint8 e8m0 scales."""

from __future__ import annotations

import fnmatch
import re

from mxfp4conv.checkpoint.canonical import MoEModel
from mxfp4conv.checkpoint.families import common
from mxfp4conv.checkpoint.problems import Problems
from mxfp4conv.errors import CheckpointError

NAME = "quark"
SUPPORTED = ("w_mxfp4", "w_mxfp4_a_mxfp4", "w_mxfp4_a_fp8")

# HF names (gate_proj/up_proj/down_proj), native ones (w1/w3/w2) of the base model, and the
# per-expert fused, row-interleaved gate_up_proj of Quark's gpt-oss exports.
PATTERN = re.compile(r"^(?P<prefix>.+)\.experts\.(?P<e>\d+)\.(?P<proj>gate_up_proj|gate_proj|up_proj"
                     r"|down_proj|w[123])\.(?P<kind>weight|weight_scale|scale|input_scale|bias)$")
_ROLE = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down",
         "w2": "down", "gate_up_proj": "gate_up"}
_KIND = {"weight": "", "weight_scale": "_scale", "scale": "_scale", "input_scale": "_input_scale",
         "bias": "_bias"}
_MX = {"fp4": "mxfp4", "fp6_e3m2": "mxfp6_e3m2", "fp6_e2m3": "mxfp6_e2m3"}


def matches(config: dict) -> bool:
    qc = common.quant_config(config)
    return bool(qc) and qc.get("quant_method") == "quark"


def _field(m: re.Match) -> str:
    return _ROLE[m["proj"]] + _KIND[m["kind"]]


def scheme_name(spec: dict, where: str) -> str:
    """vLLM's OCP_MX_Scheme name for a Quark layer quant config."""
    weight = common.cfg_dict(spec, where, "weight")
    wdt = weight.get("dtype")
    if not isinstance(wdt, str) or wdt not in _MX:
        raise CheckpointError(f"{where}: Quark weight dtype {wdt!r} is not an OCP-MX format "
                              f"(fp4, fp6_e3m2, fp6_e2m3); mxfp4conv converts MXFP4 experts only.")
    if weight.get("qscheme") != "per_group" or weight.get("group_size") != 32 \
            or weight.get("scale_format") != "e8m0":
        raise CheckpointError(f"{where}: Quark weight config {weight} is not OCP-MX (needs "
                              f"qscheme per_group, group_size 32, scale_format e8m0).")
    name = f"w_{_MX[wdt]}"
    act = common.cfg_dict(spec, where, "input_tensors")
    if act:
        adt = act.get("dtype")
        if not isinstance(adt, str):
            raise CheckpointError(f"{where}: Quark input_tensors dtype {adt!r} is not a dtype "
                                  f"name; use the export's original config.json.")
        if adt in _MX:
            name += f"_a_{_MX[adt]}"
        elif adt in ("fp8_e4m3", "fp8"):
            name += "_a_fp8"
        else:
            name += f"_a_{adt}"
    return name


def _matches_pattern(module: str, pattern: str, where: str) -> bool:
    if pattern.startswith("re:"):
        try:
            return re.search(pattern[3:], module) is not None
        except re.error as exc:
            raise CheckpointError(f"{where}: Quark module pattern {pattern!r} is not a valid "
                                  f"regular expression ({exc}); use the export's original "
                                  f"config.json.") from None
    return fnmatch.fnmatch(module, pattern) or module == pattern


def expert_spec(qc: dict, module: str, where: str = "config.json") -> dict | None:
    """The quant config Quark applied to one expert module (None: excluded)."""
    where = f"{where} quantization_config"
    if any(_matches_pattern(module, p, where) for p in common.cfg_list_of_str(qc, where, "exclude")):
        return None
    for pattern, spec in common.cfg_dict(qc, where, "layer_quant_config").items():
        if _matches_pattern(module, pattern, where):
            if not isinstance(spec, dict):
                raise CheckpointError(f"{where}: layer_quant_config[{pattern!r}] is not an object; "
                                      f"use the export's original config.json.")
            return spec
    return common.cfg_dict(qc, where, "global_quant_config")


def _declared_act(act: dict) -> str | None:
    if not act:
        return None
    kind = _MX.get(act.get("dtype"), "fp8" if act.get("dtype") in ("fp8_e4m3", "fp8") else act.get("dtype"))
    where = f"group{act.get('group_size')}" if act.get("qscheme") == "per_group" else \
        str(act.get("qscheme", "")).replace("per_", "")
    return f"{kind}_{'dynamic' if act.get('is_dynamic') else 'static'}_{where}"


def build(source, problems: Problems) -> tuple[MoEModel | None, list[str]]:
    config = source.config
    cfg = common.text_config(config)
    qc = common.quant_config(config)
    where = f"{source.spec} (config.json)"
    found = common.scan(source.tensor_names(), PATTERN, _field)
    if not found.layers:
        raise CheckpointError(f"{source.spec}: a Quark config but no routed-expert tensors named "
                              f"'...experts.E.gate_proj.weight' in the index; nothing to convert.")
    first_prefix = min(found.layers, key=common.natural_key)
    first_e = min(found.layers[first_prefix])
    sample = next(iter(found.layers[first_prefix][first_e].values()))[0].rsplit(".", 1)[0]
    spec = expert_spec(qc, sample, where)
    if spec is None:
        raise CheckpointError(f"{where}: Quark's exclude list leaves the routed experts (e.g. "
                              f"{sample!r}) unquantized; there are no MXFP4 experts to convert.")
    scheme = scheme_name(spec, where)
    if not scheme.startswith("w_mxfp4"):
        raise CheckpointError(f"{where}: Quark scheme {scheme} stores the experts in another "
                              f"OCP-MX format; mxfp4conv converts MXFP4-weight schemes "
                              f"({', '.join(SUPPORTED)}).")
    act = spec.get("input_tensors") or {}
    common.cfg_bool(act, where, "is_dynamic")
    static = scheme == "w_mxfp4_a_fp8" and not act.get("is_dynamic", False)
    geometry = common.generic_geometry(cfg, where, problems)
    gate_up = any("gate_up" in f for e in found.layers[first_prefix].values() for f in e)
    if gate_up:
        required = common.GATE_UP_REQUIRED + (("gate_up_input_scale", "down_input_scale")
                                              if static else ())
    else:
        required = common.REQUIRED + (("gate_input_scale", "up_input_scale", "down_input_scale")
                                      if static else ())
    hf_names = any(".gate_proj." in n or ".down_proj." in n or ".gate_up_proj." in n
                   for e in found.layers[first_prefix].values() for v in e.values() for n in v)

    def name_for(prefix: str, e: int, field: str) -> str:
        role = "gate_up" if field.startswith("gate_up") else field.split("_")[0]
        kind = field[len(role) + 1:]
        proj = f"{role}_proj" if hf_names else {"gate": "w1", "up": "w3", "down": "w2"}[role]
        return f"{prefix}.experts.{e}.{proj}.{('weight_' + kind) if kind == 'scale' else kind or 'weight'}"

    layers, prefixes, variants = common.expert_layers(source, found, geometry, problems,
                                                      name_for, required)
    has_bias = any(ex.down_bias is not None for layer in layers
                   for ex in layer.experts or layer.gate_up_experts)
    model = MoEModel(
        family=NAME, quant_scheme=scheme, moe_method="quark",
        activation=common.activation_from_config(cfg, where), routing=common.routing_from_config(cfg, where),
        geometry=geometry, layers=tuple(layers), has_bias=has_bias, static_input_scales=static,
        dtype_variants=variants, moe_class="QuarkOCP_MX_MoEMethod",
        declared_act=_declared_act(act), gate_up_interleaved=gate_up,
        extra={"base_model_type": cfg.get("model_type"),
               "input_dynamic": bool(act.get("is_dynamic")) if act else None},
    )
    return model, prefixes
