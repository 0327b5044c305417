"""The manifest ``mxfp4conv.json`` that ``convert`` writes: built from the oracle's decision. The format itself (its
fields, checks and reading) is ``mxfp4conv.format.manifest``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mxfp4conv import __version__
from mxfp4conv.format.manifest import FORMAT, SHUFFLE_PAD_BYTE, VERSION


def build_manifest(source, model, decision, target=None) -> dict[str, Any]:
    """The manifest for converting ``source`` (its ``MoEModel``) as ``decision`` says;
    ``target`` (the request) is recorded so that ``verify`` can ask the oracle again."""
    d = decision
    src: dict[str, Any] = {"family": model.family, "quant_scheme": model.quant_scheme,
                           "sha256": source.fingerprint()}
    if getattr(source, "is_hub", False):
        src["repo"] = str(source.spec).split("@")[0]
    else:
        src["path"] = str(Path(source.root).resolve())
    if source.revision:
        src["revision"] = source.revision
    return {
        "format": FORMAT,
        "version": VERSION,
        "tool_version": __version__,
        "vllm": d.options.get("vllm_release"),  # the vLLM release the decision models
        "target": {
            "arch": d.arch,
            "backend": d.backend,
            "activation": d.activation,
            "activation_params": dict(d.activation_params),
            "act_quant": d.act_quant,
            "tp": d.tp,
            "ep": d.ep,
            "parallel": d.parallel.record(d.intermediate),
            "gate_mode": d.gate_mode,
            "is_shuffled": d.is_shuffled,
            "options": dict(d.options),
            "request": _request(target),
        },
        "layout": d.layout.as_dict(),
        "moe": {
            "hidden": d.hidden,
            "hidden_padded": d.hidden_padded,
            "intermediate": d.intermediate,
            "intermediate_per_rank": d.intermediate_per_rank,
            "intermediate_per_rank_padded": d.intermediate_per_rank_padded,
            "num_experts": d.num_experts,
            "experts_per_rank": d.experts_per_rank,
            "top_k": d.top_k,
            "layers": [layer.prefix for layer in model.layers],
            "moe_method": model.moe_method,
            "routing": model.routing,
            "has_bias": bool(model.has_bias),
            "static_input_scales": bool(model.static_input_scales),
        },
        "pad_bytes": {"weight": 0, "scale": d.scale_pad_byte, "shuffle": SHUFFLE_PAD_BYTE},
        "runtime_env": dict(d.runtime_env),
        "source": src,
        "notes": list(d.notes),
    }


def _request(target) -> dict[str, Any] | None:
    if target is None:
        return None
    return {"arch": target.arch, "tp": target.tp, "ep": target.ep, "act_quant": target.act_quant,
            "aiter": target.aiter, "backend": target.backend, "layout": target.layout,
            "vllm": target.vllm, "moe_weight": target.moe_weight, "dp": target.dp,
            "placement": target.placement, "all2all": target.all2all}


def target_from_manifest(m: dict[str, Any]):
    """The request a manifest was converted for (falls back to the decided target)."""
    from mxfp4conv.oracle.decision import Target

    t = m["target"]
    r = t.get("request") or {"arch": t["arch"], "tp": t["tp"], "ep": t["ep"], "act_quant": t["act_quant"],
                             "aiter": t.get("options", {}).get("aiter", True), "backend": t["backend"]}
    return Target(arch=r["arch"], tp=r["tp"], ep=bool(r["ep"]), act_quant=r["act_quant"],
                  aiter=bool(r["aiter"]), backend=r["backend"], layout=r.get("layout", "auto"),
                  vllm=str(r.get("vllm") or m.get("vllm") or "0.33"), moe_weight=r.get("moe_weight"),
                  dp=int(r.get("dp", 1)), placement=str(r.get("placement", "linear")),
                  all2all=str(r.get("all2all", "allgather_reducescatter")))
