"""Shared machinery of the family adapters: finding expert tensors by name, checking them."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import dataclasses

from mxfp4conv.checkpoint.canonical import (
    GENERIC_ACTIVATIONS, Activation, ExpertTensors, GateUpExpertTensors, MoEGeometry, MoELayer, TensorRef,
)
from mxfp4conv.checkpoint.problems import Problems
from mxfp4conv.errors import CheckpointError

GROUP = 32
WEIGHT_DTYPES = ("U8", "I8", "F4")  # packed e2m1 pairs (F4: logical shape in the header)
SCALE_DTYPES = ("U8", "I8", "F8_E8M0")  # raw e8m0 bytes
REQUIRED = ("gate", "gate_scale", "up", "up_scale", "down", "down_scale")
GATE_UP_REQUIRED = ("gate_up", "gate_up_scale", "down", "down_scale")
_MAX_LISTED = 5


@dataclass(frozen=True)
class Found:
    """Expert tensors found by name: prefix -> expert id -> field -> [tensor names]."""

    layers: dict[str, dict[int, dict[str, list[str]]]]


def quant_config(config: dict) -> dict | None:
    """``quantization_config`` at the top level or inside ``text_config``."""
    for cfg in (config, config.get("text_config") or {}):
        qc = cfg.get("quantization_config") if isinstance(cfg, dict) else None
        if isinstance(qc, dict):
            return qc
    return None


def text_config(config: dict) -> dict:
    """The config holding the model dimensions: ``text_config`` when it has them, else the top."""
    tc = config.get("text_config")
    return tc if isinstance(tc, dict) and "hidden_size" in tc else config


def activation_from_config(cfg: dict, where: str = "config.json") -> Activation:
    """The routed experts' gated activation with its parameters, from the model config."""
    limit = cfg_float(cfg, where, "swiglu_limit")
    if cfg.get("model_type") == "gpt_oss":
        return Activation("swigluoai", {"alpha": cfg_float(cfg, where, "swiglu_alpha", default=1.702),
                                        "limit": 7.0 if limit is None else limit})
    name = cfg_activation(cfg, where, "silu")
    if name == "situ":
        params = {"beta": cfg_float(cfg, where, "activation_situ_beta", default=4.0)}
        linear_beta = cfg_float(cfg, where, "activation_situ_linear_beta", positive=False)
        if linear_beta is not None:
            params["linear_beta"] = linear_beta
        return Activation(name, params)
    if limit is not None:
        return Activation(name, {"swiglu_limit": limit})
    return Activation(name, {})


def cfg_get(config: dict, where: str, *keys: str, default=None, required: bool = True):
    """First of ``keys`` present in ``config``; a clear error when required and absent."""
    for k in keys:
        if k in config and config[k] is not None:
            return config[k]
    if required and default is None:
        raise CheckpointError(f"{where}: config.json lacks {' / '.join(repr(k) for k in keys)}, "
                              f"needed to describe the MoE layers. Use the model's original "
                              f"config.json.")
    return default


# Far above any real model, far below sizes that would make a loop over them run for hours.
MAX_EXPERTS = 1 << 16
MAX_WIDTH = 1 << 20  # hidden / intermediate sizes
MAX_LAYERS = 1 << 16


def _present(config: dict, keys: tuple[str, ...]) -> str:
    return next((k for k in keys if config.get(k) is not None), keys[0])


def cfg_int(config: dict, where: str, *keys: str, lo: int = 1, hi: int, default: int | None = None,
            required: bool = True) -> int:
    """``cfg_get`` for a whole number in ``[lo, hi]``; anything else is a clear error."""
    v = cfg_get(config, where, *keys, default=default, required=required)
    if v is None:
        return v
    ok = not isinstance(v, bool) and (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))
    if not ok or not lo <= v <= hi:
        raise CheckpointError(f"{where}: {_present(config, keys)!r} is {_shown(v)}, but it must be a "
                              f"whole number from {lo} to {hi}. Use the model's original "
                              f"config.json.")
    return int(v)


# Activation parameters (clamp limits, tanh saturation betas, slopes, routing scale) act on
# activations the MoE kernels hold in 16-bit floats: a limit above float16's largest finite value
# can never clamp one, a beta that large never saturates, so such a value is the clamp or the
# saturation switched off in disguise. Real models use 1.702 to 10.
MAX_ACT_PARAM = 65504.0


def cfg_float(config: dict, where: str, key: str, *, default: float | None = None,
              positive: bool = True, hi: float = MAX_ACT_PARAM) -> float | None:
    """A finite number (positive unless told otherwise) of magnitude at most ``hi``, or
    ``default`` when absent."""
    v = config.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or (positive and v <= 0) or abs(v) > hi:
        raise CheckpointError(f"{where}: {key!r} is {_shown(v)}, but it must be a finite "
                              f"{'positive ' if positive else ''}number of magnitude at most {hi:g} "
                              f"(larger is no limit for the 16-bit activations it acts on). Use the "
                              f"model's original config.json.")
    return float(v)


def cfg_bool(config: dict, where: str, key: str) -> bool | None:
    """An optional true / false (a string or number is refused: ``bool("false")`` is True)."""
    v = config.get(key)
    if v is None or isinstance(v, bool):
        return v
    raise CheckpointError(f"{where}: {key!r} is {_shown(v)}, but it must be true or false. Use the "
                          f"model's original config.json.")


def cfg_choice(config: dict, where: str, key: str, allowed: tuple[str, ...], who: str) -> str | None:
    """An optional name out of ``allowed`` (``who`` says whose list it is)."""
    v = config.get(key)
    if v is None or (isinstance(v, str) and v in allowed):
        return v
    raise CheckpointError(f"{where}: {key!r} is {_shown(v)}, but it must be one of "
                          f"{', '.join(allowed)} ({who}). Use the model's original config.json.")


def cfg_name(config: dict, where: str, key: str) -> str | None:
    """An optional non-empty string."""
    v = config.get(key)
    if v is None or (isinstance(v, str) and v):
        return v
    raise CheckpointError(f"{where}: {key!r} is {_shown(v)}, but it must be a name (a non-empty "
                          f"string). Use the model's original config.json.")


# the scoring functions vLLM 0.33.0 / 0.34.0's MoE routers implement (fused_topk_bias_router:
# softmax, sigmoid, sqrtsoftplus; any other raises "Unsupported scoring function")
VLLM_SCORING_FUNCS = ("softmax", "sigmoid", "sqrtsoftplus")


def check_routing_config(cfg: dict, where: str) -> None:
    """Every routing key a family or vLLM's model reads: type and allowed values."""
    for key in ("scoring_func", "moe_router_activation_func"):
        cfg_choice(cfg, where, key, VLLM_SCORING_FUNCS, "the scoring functions vLLM's MoE routers implement")
    for key in ("norm_topk_prob", "moe_renormalize"):
        cfg_bool(cfg, where, key)
    for key in ("n_group", "num_expert_group", "topk_group"):
        if cfg.get(key) is not None:
            cfg_int(cfg, where, key, lo=0, hi=MAX_EXPERTS)
    cfg_name(cfg, where, "topk_method")
    cfg_name(cfg, where, "model_type")
    cfg_float(cfg, where, "routed_scaling_factor")


def cfg_activation(config: dict, where: str, default: str) -> str:
    """``hidden_act``: one of the names vLLM's MoE activations accept."""
    v = config.get("hidden_act")
    if v is None:
        return default
    known = GENERIC_ACTIVATIONS | {"gelu_pytorch_tanh"}
    if not isinstance(v, str) or v not in known:
        raise CheckpointError(f"{where}: 'hidden_act' is {_shown(v)}, not an activation vLLM's "
                              f"MoE layers know ({', '.join(sorted(known))}). Use the model's "
                              f"original config.json.")
    return v


def cfg_dict(config: dict, where: str, key: str) -> dict:
    """An optional object-valued key ({} when absent)."""
    v = config.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise CheckpointError(f"{where}: {key!r} is {_shown(v)}, but it must be a JSON object. Use "
                              f"the model's original config.json.")
    return v


def cfg_list_of_str(config: dict, where: str, key: str) -> list[str]:
    """An optional list of strings ([] when absent)."""
    v = config.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise CheckpointError(f"{where}: {key!r} is {_shown(v)}, but it must be a list of "
                              f"strings. Use the model's original config.json.")
    return v


def _shown(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def natural_key(prefix: str) -> tuple:
    """Sort MoE prefixes by layer number, multi-token-prediction layers last."""
    is_mtp = bool(re.search(r"(^|\.)mtp\.", prefix))
    return (is_mtp, [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", prefix)])


def scan(names, pattern: re.Pattern, field_of: Callable[[re.Match], str | None]) -> Found:
    """Group tensor names matching ``pattern`` (groups ``prefix`` and ``e``) by layer/expert."""
    layers: dict[str, dict[int, dict[str, list[str]]]] = defaultdict(lambda: defaultdict(dict))
    for name in names:
        m = pattern.match(name)
        if not m:
            continue
        field = field_of(m)
        if field is None:
            continue
        layers[m["prefix"]][int(m["e"])].setdefault(field, []).append(name)
    return Found({p: dict(v) for p, v in layers.items()})


def ref(source, name: str) -> TensorRef:
    info = source.tensor_info(name)
    return TensorRef(name=name, shard=info.shard, dtype=info.dtype, shape=tuple(info.shape))


def packed_shape(r: TensorRef) -> tuple[int, ...]:
    """Byte shape of a packed weight (an F4 header gives the logical element shape)."""
    if r.dtype == "F4" and r.shape:
        return (*r.shape[:-1], r.shape[-1] // 2)
    return r.shape


def _listed(items: list) -> str:
    shown = ", ".join(str(i) for i in items[:_MAX_LISTED])
    return shown + (f" and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else "")


def build_layers(source, found: Found, num_experts: int, problems: Problems,
                 name_for: Callable[[str, int, str], str],
                 required: tuple[str, ...] = REQUIRED) -> tuple[list[MoELayer], list[str]]:
    """Complete per-expert layers (sorted) and the prefixes of every layer found.

    Experts whose ``required`` fields name a fused ``gate_up`` become ``GateUpExpertTensors``,
    the others ``ExpertTensors``."""
    cls = GateUpExpertTensors if "gate_up" in required else ExpertTensors
    known = {f.name for f in dataclasses.fields(cls)}
    prefixes = sorted(found.layers, key=natural_key)
    layers = []
    for prefix in prefixes:
        experts = found.layers[prefix]
        missing: dict[str, list[int]] = defaultdict(list)
        dupes = []
        for e in range(num_experts):
            fields = experts.get(e, {})
            for f in required:
                if f not in fields:
                    missing[f].append(e)
            dupes += [names for names in fields.values() if len(names) > 1]
        extra = sorted(e for e in experts if e >= num_experts)
        ok = True
        for f, es in missing.items():
            ok = False
            problems.error(f"MoE layer {prefix}: {len(es)} of {num_experts} experts lack their "
                           f"{f.replace('_', ' ')} tensor (experts {_listed(es)}; e.g. "
                           f"{name_for(prefix, es[0], f)!r} is not in the checkpoint). The "
                           f"checkpoint is incomplete; download the missing shards again.")
        for names in dupes[:_MAX_LISTED]:
            ok = False
            problems.error(f"MoE layer {prefix}: duplicate expert tensors {_listed(names)} hold "
                           f"the same weight. Keep exactly one of them in the index.")
        if extra:
            problems.error(f"MoE layer {prefix}: tensors for experts {_listed(extra)} exist but "
                           f"the config declares only {num_experts} experts. Check "
                           f"config.json's expert count.")
        if not ok:
            continue
        try:
            built = []
            for e in range(num_experts):
                fields = {f: ref(source, names[0]) for f, names in experts[e].items()}
                built.append(cls(**{k: v for k, v in fields.items() if k in known}))
        except CheckpointError as exc:
            problems.error(str(exc))
            continue
        if cls is GateUpExpertTensors:
            layers.append(MoELayer(prefix=prefix, gate_up_experts=tuple(built)))
        else:
            layers.append(MoELayer(prefix=prefix, experts=tuple(built)))
    return layers, prefixes


def expert_layers(source, found: Found, geometry: MoEGeometry, problems: Problems,
                  name_for: Callable[[str, int, str], str], required: tuple[str, ...] = REQUIRED
                  ) -> tuple[list[MoELayer], list[str], dict[str, str]]:
    """The per-expert layers with their checks: completeness, dtype variants, shapes."""
    layers, prefixes = build_layers(source, found, geometry.num_experts, problems, name_for, required)
    variants = dtype_variants(layers, problems)
    check_expert_shapes(layers, geometry, problems)
    return layers, prefixes, variants


def dtype_variants(layers: list[MoELayer], problems: Problems) -> dict[str, str]:
    """Which dtype strings hold the packed weights and the scales; bad ones are problems."""
    seen: dict[str, set[str]] = {"weight": set(), "scale": set()}
    for layer in layers:
        for r in _weight_scale_refs(layer):
            kind = "scale" if _is_scale(r) else "weight"
            seen[kind].add(r.dtype)
    for kind, allowed in (("weight", WEIGHT_DTYPES), ("scale", SCALE_DTYPES)):
        bad = sorted(seen[kind] - set(allowed))
        if bad:
            problems.error(f"MoE expert {kind} tensors are stored as {', '.join(bad)}; MXFP4 "
                           f"{kind}s must be raw bytes ({' / '.join(allowed)}). This is not an "
                           f"MXFP4 checkpoint, or it was re-saved in another precision.")
    return {k: ",".join(sorted(v)) for k, v in seen.items() if v}


def _weight_scale_refs(layer: MoELayer):
    if layer.fused is not None:
        f = layer.fused
        return [f.gate_up_blocks, f.gate_up_scales, f.down_blocks, f.down_scales]
    if layer.gate_up_experts is not None:
        return [r for ex in layer.gate_up_experts
                for r in (ex.gate_up, ex.gate_up_scale, ex.down, ex.down_scale)]
    return [r for ex in layer.experts for r in (ex.gate, ex.gate_scale, ex.up, ex.up_scale,
                                                ex.down, ex.down_scale)]


def _is_scale(r: TensorRef) -> bool:
    return r.name.endswith(("scale", "scales", "_scale_inv"))


def generic_geometry(cfg: dict, where: str, problems: Problems) -> MoEGeometry:
    """The MoE sizes of a config whose exporter keeps the base model's key names (Quark,
    compressed-tensors: DeepSeek, Kimi, Qwen-style keys), checked."""
    g = MoEGeometry(
        hidden=cfg_int(cfg, where, "routed_expert_hidden_size", "hidden_size", hi=MAX_WIDTH),
        intermediate=cfg_int(cfg, where, "moe_intermediate_size", "intermediate_size", hi=MAX_WIDTH),
        num_experts=cfg_int(cfg, where, "n_routed_experts", "num_experts", "num_local_experts",
                            hi=MAX_EXPERTS),
        top_k=cfg_int(cfg, where, "num_experts_per_tok", "num_experts_per_token", "experts_per_token",
                      "moe_topk", hi=MAX_EXPERTS),
    )
    check_geometry(g, problems, where)
    return g


def check_geometry(g: MoEGeometry, problems: Problems, where: str) -> None:
    for what, v in (("hidden", g.hidden), ("intermediate", g.intermediate)):
        if v <= 0 or v % GROUP:
            problems.error(f"{where}: the MoE {what} size {v} is not a positive multiple of the "
                           f"MXFP4 group size {GROUP}; config.json is wrong or not an MXFP4 MoE.")
    if g.num_experts <= 0 or not 0 < g.top_k <= g.num_experts:
        problems.error(f"{where}: config declares {g.num_experts} experts with top-k {g.top_k}; "
                       f"both must be positive and top-k at most the expert count.")


def check_expert_shapes(layers: list[MoELayer], g: MoEGeometry, problems: Problems) -> None:
    """Every per-expert tensor's byte shape against the config's geometry."""
    H, I = g.hidden, g.intermediate
    want = {"gate": (I, H // 2), "up": (I, H // 2), "down": (H, I // 2),
            "gate_scale": (I, H // GROUP), "up_scale": (I, H // GROUP),
            "down_scale": (H, I // GROUP), "gate_up": (2 * I, H // 2),
            "gate_up_scale": (2 * I, H // GROUP)}
    for layer in layers:
        bad: dict[str, list[TensorRef]] = defaultdict(list)
        for ex in layer.experts or layer.gate_up_experts or ():
            for f, shape in want.items():
                r = getattr(ex, f, None)
                if r is not None and packed_shape(r) != shape:
                    bad[f].append(r)
        for f, refs in bad.items():
            r = refs[0]
            problems.error(
                f"MoE layer {layer.prefix}: {len(refs)} expert {f.replace('_', ' ')} tensors have "
                f"the wrong shape, e.g. {r.name!r} is {r.dtype} {list(r.shape)} but hidden={H}, "
                f"intermediate={I} and group size {GROUP} give {list(want[f])} bytes. The "
                f"tensors do not match config.json (wrong config, or not grouped by 32).")


def routing_from_config(cfg: dict, where: str = "config.json") -> str:
    """vLLM's RoutingMethodType name for a model config (get_routing_method_type's rules)."""
    check_routing_config(cfg, where)
    model_type = cfg.get("model_type")
    if model_type == "gpt_oss":
        return "Renormalize"
    # Kimi-Linear routes with sigmoid scores and a correction bias whatever its config says
    # (transformers' KimiLinearConfig has no key for it).
    default = "sigmoid" if model_type == "kimi_linear" else "softmax"
    scoring = cfg.get("scoring_func") or cfg.get("moe_router_activation_func") or default
    renorm = bool(cfg.get("norm_topk_prob", cfg.get("moe_renormalize", True)))
    groups = cfg.get("n_group") or cfg.get("num_expert_group") or 0
    if scoring == "sqrtsoftplus" or model_type == "deepseek_v4":
        return "DeepseekV4" if renorm else "Unspecified"
    if scoring == "sigmoid":
        has_bias = cfg.get("topk_method") == "noaux_tc" or model_type in (
            "deepseek_v3", "kimi_k2", "kimi_linear")
        if has_bias and renorm and groups:
            return "DeepSeekV3"
        if has_bias and renorm and cfg.get("routed_scaling_factor") in (None, 1.0):
            return "MiniMax2"
        return "SigmoidRenorm" if renorm else "Sigmoid"
    return "RenormalizeNaive" if renorm else "Default"
