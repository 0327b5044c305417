"""Which family a checkpoint belongs to, and its canonical MoE description."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mxfp4conv.checkpoint.canonical import MoEModel
from mxfp4conv.checkpoint.families import compressed_tensors, deepseek_v4, gpt_oss, kimi_k3, quark
from mxfp4conv.checkpoint.families.common import quant_config
from mxfp4conv.checkpoint.problems import Problems
from mxfp4conv.checkpoint.source import MANIFEST_NAME, Source
from mxfp4conv.errors import CheckpointError, Mxfp4convError

# Quark first: its exports keep the base model's model_type (deepseek_v3, gpt_oss, ...).
# compressed-tensors last: the generic MXFP4 MoE reader for architectures without their own.
ADAPTERS = (quark, gpt_oss, kimi_k3, deepseek_v4, compressed_tensors)


@dataclass
class Analysis:
    model: MoEModel | None  # None when no MoE layer could be described
    family: str
    moe_prefixes: list[str]  # every MoE layer found by name, complete or not
    problems: Problems = field(default_factory=Problems)


def detect(config: dict, where: str = "config.json"):
    """The adapter module whose markers the config carries."""
    for adapter in ADAPTERS:
        if adapter.matches(config):
            return adapter
    qc = quant_config(config) or {}
    raise CheckpointError(
        f"{where}: model_type {config.get('model_type')!r} with quant_method "
        f"{qc.get('quant_method') if isinstance(qc, dict) else None!r} matches no supported "
        f"MXFP4 MoE family (Kimi-K3: model_type kimi_k3 with compressed-tensors "
        f"mxfp4-pack-quantized; DeepSeek-V4: expert_dtype \"fp4\"; AMD Quark OCP-MX: "
        f"quant_method \"quark\"; gpt-oss: model_type gpt_oss with quant_method \"mxfp4\"; "
        f"any other MoE: quant_method \"compressed-tensors\" with mxfp4-pack-quantized experts). "
        f"Point at an MXFP4 mixture-of-experts checkpoint with its original config.json.")


def is_converted(source: Source) -> bool:
    """Whether ``source`` was written by mxfp4conv (it carries the manifest)."""
    try:
        return source.path(MANIFEST_NAME).is_file()
    except CheckpointError:  # a hub repo without it (or not cached while offline)
        return False


def analyze(source: Source, *, strict: bool = False) -> Analysis:
    """Describe the checkpoint; problems are collected (or raised when ``strict``)."""
    adapter = detect(source.config, f"{source.root / 'config.json'}")
    problems = Problems(strict=strict)
    try:
        model, prefixes = adapter.build(source, problems)
    except Mxfp4convError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, re.error) as exc:
        # a config value of a type no adapter check anticipated: still the config's fault
        raise CheckpointError(
            f"{source.root / 'config.json'}: a value in this {adapter.NAME} config has an "
            f"unexpected type or form ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}). "
            f"Use the model's original config.json.") from exc
    if model is not None:
        model.extra.setdefault("num_expert_group", expert_groups(source.config))
    if model is not None and not model.layers:
        model = None
        problems.error(f"{source.spec}: no complete MoE layer with routed experts was found; "
                       f"nothing to convert.")
    return Analysis(model=model, family=adapter.NAME, moe_prefixes=prefixes, problems=problems)


def expert_groups(config: dict) -> int | None:
    """The model's expert groups as vLLM's MoE models pass them (``num_expert_group``: Kimi-K3's
    ``num_expert_group``, DeepSeek's ``n_group``); None when the config has neither. vLLM honours
    ``--expert-placement-strategy round_robin`` only for more than one group."""
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    for key in ("num_expert_group", "n_group"):
        v = cfg.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
            return v
    return None


def load_model(source: Source) -> MoEModel:
    """The canonical description; any problem with the experts raises ``CheckpointError``."""
    if is_converted(source):
        raise CheckpointError(f"{source.root}: this is a checkpoint converted by mxfp4conv "
                              f"({MANIFEST_NAME} present), not a source checkpoint. Convert the "
                              f"original checkpoint, or load this one with mxfp4conv.runtime.")
    from mxfp4conv.checkpoint.checks import check_index

    check_index(source, Problems(strict=True))  # what inspect calls an error, convert refuses
    return analyze(source, strict=True).model
