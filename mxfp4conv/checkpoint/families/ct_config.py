"""A compressed-tensors ``quantization_config``, read as vLLM 0.33.0 reads it for MoE experts.

vLLM's ``CompressedTensorsMoEMethod.get_moe_method`` takes the scheme of expert 0's gate, up
and down projections (``config_groups`` targets, ``ignore`` list) and picks the MoE method from
the weight and input-activation arguments:

- ``_is_mxfp4_w4a8_fp8``: MXFP4 weights (static) with dynamic, symmetric fp8 input activations
  per token or per group -> ``CompressedTensorsW4A8Mxfp4MoEMethod`` (an ``Mxfp4MoEMethod``
  that carries the declared fp8 activation key);
- ``_is_mxfp4``: MXFP4 weights (float, 4 bits, group 32, symmetric), whatever else the
  activations declare -> ``CompressedTensorsW4A4Mxfp4MoEMethod``.

Kimi-K3 (``KimiK3ForConditionalGeneration`` / ``KimiK3MTPModel``) is the exception: vLLM's
``KimiK3ForConditionalGenerationConfig`` rewrites a top-level ``format: mxfp4-pack-quantized``
config to ``quant_method: mxfp4`` before the quant method is resolved, so its experts get
``Mxfp4MoEMethod`` and any declared activation quantisation is not read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mxfp4conv.errors import CheckpointError

QUANT_METHOD = "compressed-tensors"
MXFP4_FORMAT = "mxfp4-pack-quantized"
K3_ARCHITECTURES = ("KimiK3ForConditionalGeneration", "KimiK3MTPModel")


@dataclass(frozen=True)
class CTScheme:
    """What the config says about one expert projection, and what vLLM does with it."""

    quant_scheme: str  # "w_mxfp4", "w_mxfp4_a_mxfp4", "w_mxfp4_a_fp8", "w_mxfp4_a_mxfp8", ...
    declared_act: str | None  # e.g. "fp8_dynamic_group128", "mxfp4_dynamic_group32"; None: W4A16
    moe_method: str  # "mxfp4" (an Mxfp4MoEMethod) or "compressed_tensors_mxfp4"
    moe_class: str  # vLLM 0.33.0's MoE method class
    group: str  # the config_groups entry that matched


def is_ct(qc: dict | None) -> bool:
    return isinstance(qc, dict) and qc.get("quant_method") == QUANT_METHOD


def _matches(module: str, target: str, cls: str = "Linear") -> bool:
    if not isinstance(target, str):
        return False
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return target in (module, cls)


def _is_mxfp4(w: dict) -> bool:
    return (w.get("strategy") == "group" and w.get("type") == "float" and w.get("num_bits") == 4
            and w.get("group_size") == 32 and bool(w.get("symmetric")))


def _is_w4a8_fp8(w: dict, a: dict | None) -> bool:
    return bool(a) and (a.get("type") == "float" and a.get("num_bits") == 8
                        and not w.get("dynamic") and bool(a.get("dynamic"))
                        and a.get("strategy") in ("token", "group") and bool(a.get("symmetric")))


def _act_name(a: dict) -> tuple[str, str]:
    """(scheme suffix, declared activation) of an ``input_activations`` entry."""
    t, bits, strategy = a.get("type"), a.get("num_bits"), a.get("strategy")
    group = a.get("group_size")
    if t == "float" and bits == 4:
        kind = "mxfp4" if group == 32 else f"fp4_g{group}"
    elif t == "float" and bits == 8:
        kind = "mxfp8" if group == 32 else "fp8"
    else:
        kind = f"{t}{bits}"
    dyn = "dynamic" if a.get("dynamic") else "static"
    where = f"group{group}" if strategy == "group" else str(strategy)
    return kind, f"{kind}_{dyn}_{where}"


def scheme_for(qc: dict, modules: list[str], where: str, *, architectures=()) -> CTScheme | None:
    """The scheme vLLM applies to these expert projection modules (None: they are ignored)."""
    ignore = qc.get("ignore") or []
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict) or not isinstance(ignore, list):
        raise CheckpointError(f"{where}: compressed-tensors config_groups must be an object and "
                              f"ignore a list; the quantization_config is malformed.")
    found = []
    for module in modules:
        if any(_matches(module, p) for p in ignore):
            found.append(None)
            continue
        hit = next(((name, g) for name, g in groups.items() if isinstance(g, dict)
                    and any(_matches(module, t) for t in g.get("targets") or [])), None)
        found.append(hit)
    if any(f is None for f in found):
        if all(f is None for f in found):
            return None
        raise CheckpointError(f"{where}: the compressed-tensors ignore list or targets leave some "
                              f"of {', '.join(modules)} unquantised; vLLM needs all MoE projections "
                              f"in the same scheme.")
    if len({name for name, _ in found}) != 1:
        raise CheckpointError(f"{where}: the MoE projections {', '.join(modules)} fall into "
                              f"different config_groups; vLLM needs all MoE projections in the "
                              f"same scheme.")
    name, g = found[0]
    w = g.get("weights") or {}
    a = g.get("input_activations")
    for part, d in (("weights", w), ("input_activations", a)):
        for key in ("symmetric", "dynamic"):  # read as flags: bool("false") would be True
            v = d.get(key) if isinstance(d, dict) else None
            if v is not None and not isinstance(v, bool):
                raise CheckpointError(f"{where}: compressed-tensors group {name!r} {part}.{key} is "
                                      f"{v!r}, but it must be true or false. Use the model's "
                                      f"original config.json.")
    fmt = g.get("format") or qc.get("format")
    if not isinstance(w, dict) or not _is_mxfp4(w):
        raise CheckpointError(f"{where}: compressed-tensors group {name!r} quantises the experts "
                              f"as {w!r}, which is not MXFP4 (float, 4 bits, strategy group, "
                              f"group_size 32, symmetric); mxfp4conv converts MXFP4 experts only.")
    if fmt != MXFP4_FORMAT:
        raise CheckpointError(f"{where}: compressed-tensors group {name!r} has format {fmt!r}, "
                              f"not {MXFP4_FORMAT!r}; only packed MXFP4 experts can be converted.")
    a = a if isinstance(a, dict) else None
    suffix, declared = _act_name(a) if a else ("", None)
    scheme = f"w_mxfp4_a_{suffix}" if a else "w_mxfp4"
    if set(architectures) & set(K3_ARCHITECTURES) and qc.get("format") == MXFP4_FORMAT:
        return CTScheme(scheme, declared, "mxfp4", "Mxfp4MoEMethod", name)
    if _is_w4a8_fp8(w, a):
        return CTScheme(scheme, declared, "mxfp4", "CompressedTensorsW4A8Mxfp4MoEMethod", name)
    return CTScheme(scheme, declared, "compressed_tensors_mxfp4",
                    "CompressedTensorsW4A4Mxfp4MoEMethod", name)
