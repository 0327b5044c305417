"""Which family a checkpoint belongs to, and its canonical MoE description."""

from __future__ import annotations

from dataclasses import dataclass, field

from mxfp4conv.checkpoint.canonical import MoEModel
from mxfp4conv.checkpoint.families import compressed_tensors, deepseek_v4, gpt_oss, kimi_k3, quark
from mxfp4conv.checkpoint.problems import Problems
from mxfp4conv.checkpoint.source import MANIFEST_NAME, Source
from mxfp4conv.errors import CheckpointError

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
    qc = (config.get("quantization_config") or (config.get("text_config") or {}).get(
        "quantization_config") or {})
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
    model, prefixes = adapter.build(source, problems)
    if model is not None and not model.layers:
        model = None
        problems.error(f"{source.spec}: no complete MoE layer with routed experts was found; "
                       f"nothing to convert.")
    return Analysis(model=model, family=adapter.NAME, moe_prefixes=prefixes, problems=problems)


def load_model(source: Source) -> MoEModel:
    """The canonical description; any problem with the experts raises ``CheckpointError``."""
    if is_converted(source):
        raise CheckpointError(f"{source.root}: this is a checkpoint converted by mxfp4conv "
                              f"({MANIFEST_NAME} present), not a source checkpoint. Convert the "
                              f"original checkpoint, or load this one with mxfp4conv.runtime.")
    return analyze(source, strict=True).model
