"""The manifest ``mxfp4conv.json`` of a converted checkpoint: what a reader may rely on, how it is checked and read.

The kernel-ready format's own room: ``convert`` writes it (``convert.manifest.build_manifest``), and ``inspect``,
``verify``, the runtime and the vLLM plugin read it through this module only. It imports nothing above the
checkpoint readers' JSON and file helpers.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from mxfp4conv.checkpoint import strict_json
from mxfp4conv.checkpoint.safetensors_io import open_regular
from mxfp4conv.checkpoint.source import MANIFEST_NAME
from mxfp4conv.errors import CheckpointError

__all__ = ["CHECKSUMS", "EXPERT_KINDS", "FORMAT", "MANIFEST_NAME", "SHARD_RE", "READ_VERSIONS", "SHUFFLE_PAD_BYTE", "VERSION",
           "expert_checksums", "load_manifest", "manifest_text", "read_manifest_file", "stamped_part",
           "validate_manifest", "write_manifest_json"]

FORMAT = "mxfp4conv-kernel-layout"
# 2: the ``target.parallel`` record (the server layout and every MoE rank's experts and intermediate
# slice); 1: tp ranks with data parallel 1 and linear placement (still read)
VERSION = 2
READ_VERSIONS = (1, 2)
SHUFFLE_PAD_BYTE = 0x7F
# crc32 of every routed-expert tensor, added to mxfp4conv.json once the shards are written (so
# not part of the manifest stamped into each shard's header)
CHECKSUMS = "checksums"
EXPERT_KINDS = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale",
                "w13_bias", "w2_bias", "w13_input_scale", "w2_input_scale")
SHARD_RE = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")  # the output shards' names (convert.plan.shard_name)


_REQUIRED = {
    "target": ("arch", "backend", "activation", "activation_params", "act_quant", "tp", "ep",
               "gate_mode", "is_shuffled"),
    "layout": ("w13", "w13_scale", "w2", "w2_scale", "gate_up"),
    "moe": ("hidden", "hidden_padded", "intermediate", "intermediate_per_rank",
            "intermediate_per_rank_padded", "num_experts", "experts_per_rank", "top_k", "layers"),
    "source": ("sha256", "family", "quant_scheme"),
}


def validate_manifest(m: Any, where: str = MANIFEST_NAME) -> dict[str, Any]:
    """Raise ``CheckpointError`` unless ``m`` is a manifest this version understands."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{where}: {what}. The converted checkpoint is damaged or was written "
                               f"by another tool; convert the source again.")

    if not isinstance(m, dict):
        raise bad("the manifest is not a JSON object")
    if m.get("format") != FORMAT:
        raise bad(f"it declares format {m.get('format')!r}, expected {FORMAT!r}")
    if m.get("version") not in READ_VERSIONS:
        raise CheckpointError(
            f"{where}: manifest version {m.get('version')!r} is not known to this mxfp4conv "
            f"(knows versions {', '.join(map(str, READ_VERSIONS))}). Use the mxfp4conv release that wrote it, "
            f"or convert again.")
    for section, keys in _REQUIRED.items():
        sec = m.get(section)
        if not isinstance(sec, dict):
            raise bad(f"section {section!r} is missing")
        missing = [k for k in keys if k not in sec]
        if missing:
            raise bad(f"section {section!r} lacks {', '.join(missing)}")
    if "runtime_env" not in m or not isinstance(m["runtime_env"], dict):
        raise bad("section 'runtime_env' is missing")
    if not isinstance(m.get("vllm"), str) or not m["vllm"]:
        raise CheckpointError(
            f"{where}: the manifest does not name the vLLM release its backend, padding, layouts and "
            f"server environment were decided for (field 'vllm' is {m.get('vllm')!r}); an mxfp4conv "
            f"that modelled an unreleased vLLM wrote it, or it was edited. Convert the source again "
            f"with this mxfp4conv (`mxfp4conv convert SOURCE OUT --arch ...`).")
    _check_types(m, bad)
    moe, tgt = m["moe"], m["target"]
    tp = tgt["tp"]
    if tgt["ep"] and moe["experts_per_rank"] * tp != moe["num_experts"]:
        raise bad(f"experts_per_rank {moe['experts_per_rank']} x tp {tp} != num_experts {moe['num_experts']}")
    if not tgt["ep"] and moe["experts_per_rank"] != moe["num_experts"]:
        raise bad("experts_per_rank differs from num_experts without expert parallelism")
    if moe["hidden_padded"] < moe["hidden"] or moe["intermediate_per_rank_padded"] < moe["intermediate_per_rank"]:
        raise bad("a padded size is smaller than the real size")
    if moe["top_k"] > moe["num_experts"]:
        raise bad(f"top_k {moe['top_k']} exceeds num_experts {moe['num_experts']}")
    if m["version"] >= 2 or "parallel" in tgt:
        _check_parallel(tgt, moe, bad)
    return m


def _check_parallel(tgt: dict, moe: dict, bad) -> None:
    """The ``parallel`` record is the layout vLLM derives from its sizes, rank by rank."""
    from mxfp4conv.format.parallel import from_record

    rec = tgt.get("parallel")
    if not isinstance(rec, dict):
        raise bad("target.parallel (the server layout and per-rank expert map) is missing")
    try:
        par = from_record(rec, tp=tgt["tp"], ep=tgt["ep"], num_experts=moe["num_experts"])
        want = par.record(moe["intermediate"])
    except (KeyError, TypeError, ValueError) as exc:
        raise bad(f"target.parallel is malformed ({type(exc).__name__}: {exc})") from None
    if par.ranks != tgt["tp"] or par.use_ep != tgt["ep"]:
        raise bad(f"target.parallel ({par.describe()}) gives {par.ranks} MoE ranks"
                  f"{' with' if par.use_ep else ' without'} expert parallel, but target.tp is {tgt['tp']} and "
                  f"target.ep {tgt['ep']}")
    if rec != want:
        diff = next((k for k in want if rec.get(k) != want[k]), "an unknown key")
        raise bad(f"target.parallel.{diff} is not what the layout {par.describe()} gives")




MAX_TP = 1 << 12
MAX_SIZE = 1 << 22  # hidden / intermediate (padded) sizes
MAX_EXPERTS = 1 << 16


def _is_int(v, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _check_types(m: dict, bad) -> None:
    """Every field the readers use has the type and range they assume (a hand-edited manifest
    with null, a string or a huge number fails here, not deep inside verify or the loader)."""
    tgt, moe, lay, src = m["target"], m["moe"], m["layout"], m["source"]
    wrong = []
    for k in ("arch", "backend", "activation", "act_quant", "gate_mode"):
        if not isinstance(tgt[k], str) or not tgt[k]:
            wrong.append(f"target.{k} is {tgt[k]!r}, expected a name")
    for k in ("ep", "is_shuffled"):
        if not isinstance(tgt[k], bool):
            wrong.append(f"target.{k} is {tgt[k]!r}, expected true or false")
    if not _is_int(tgt["tp"], 1, MAX_TP):
        wrong.append(f"target.tp is {tgt['tp']!r}, expected a whole number from 1 to {MAX_TP}")
    params = tgt["activation_params"]
    if not isinstance(params, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in params.values()):
        wrong.append(f"target.activation_params is {params!r}, expected an object of finite numbers")
    for k in _REQUIRED["layout"]:
        if not isinstance(lay[k], str):
            wrong.append(f"layout.{k} is {lay[k]!r}, expected a layout name")
    for k, lo, hi in (("hidden", 1, MAX_SIZE), ("hidden_padded", 1, MAX_SIZE), ("intermediate", 1, MAX_SIZE),
                      ("intermediate_per_rank", 1, MAX_SIZE), ("intermediate_per_rank_padded", 1, MAX_SIZE),
                      ("num_experts", 1, MAX_EXPERTS), ("experts_per_rank", 1, MAX_EXPERTS),
                      ("top_k", 1, MAX_EXPERTS)):
        if not _is_int(moe[k], lo, hi):
            wrong.append(f"moe.{k} is {moe[k]!r}, expected a whole number from {lo} to {hi}")
    layers = moe["layers"]
    if not isinstance(layers, list) or not layers or not all(isinstance(x, str) and x for x in layers) \
            or len(set(layers)) != len(layers):
        wrong.append("moe.layers is not a non-empty list of distinct layer names")
    for k in ("has_bias", "static_input_scales"):
        if k in moe and not isinstance(moe[k], bool):
            wrong.append(f"moe.{k} is {moe[k]!r}, expected true or false")
    for k in _REQUIRED["source"]:
        if not isinstance(src[k], str):
            wrong.append(f"source.{k} is {src[k]!r}, expected a string")
    env = m["runtime_env"]
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        wrong.append("runtime_env does not map names to strings")
    pads = m.get("pad_bytes", {})
    if not isinstance(pads, dict) or not all(_is_int(v, 0, 255) for v in pads.values()):
        wrong.append(f"pad_bytes is {pads!r}, expected bytes 0..255")
    if tgt.get("request") is not None and not isinstance(tgt["request"], dict):
        wrong.append("target.request is not an object")
    if CHECKSUMS in m:
        table = m[CHECKSUMS].get("crc32") if isinstance(m[CHECKSUMS], dict) else None
        if not isinstance(table, dict) or set(m[CHECKSUMS]) != {"crc32"} \
                or not all(_is_int(v, 0, 0xFFFFFFFF) for v in table.values()):
            wrong.append(f"{CHECKSUMS} is not {{\"crc32\": {{tensor name: crc32 as a number}}}}")
    if wrong:
        shown = "; ".join(w if len(w) < 160 else w[:157] + "..." for w in wrong[:3])
        raise bad(shown + (f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""))


def stamped_part(m: dict[str, Any]) -> dict[str, Any]:
    """The manifest as stamped into every shard: all of it but the checksums of the shards' bytes
    (known only once they are written)."""
    return {k: v for k, v in m.items() if k != CHECKSUMS}


def expert_checksums(m: dict[str, Any]) -> dict[str, int] | None:
    """{tensor name: crc32} of the routed-expert tensors (None: an mxfp4conv that did not record
    them wrote this manifest)."""
    table = m.get(CHECKSUMS)
    return table.get("crc32") if isinstance(table, dict) else None


def manifest_text(m: dict[str, Any]) -> str:
    """Canonical JSON (the string stamped into every shard's ``__metadata__``)."""
    return strict_json.dumps_finite(m, sort_keys=True, separators=(",", ":"))


def write_manifest_json(m: dict[str, Any]) -> bytes:
    return (strict_json.dumps_finite(m, indent=2, sort_keys=True) + "\n").encode()


def read_manifest_file(p: Path) -> dict[str, Any]:
    """Parse and validate one ``mxfp4conv.json``."""
    fd = open_regular(Path(p), "manifest")
    try:
        with os.fdopen(fd, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise CheckpointError(f"{p}: cannot read the manifest ({exc.strerror}).") from None
    m = strict_json.loads(raw, str(p), "manifest of this converted checkpoint",
                          "Convert the source again.")
    return validate_manifest(m, str(p))


def load_manifest(root: Path) -> dict[str, Any] | None:
    """The validated manifest of a converted checkpoint directory, or None if it has none."""
    p = Path(root) / MANIFEST_NAME
    if not os.path.lexists(p):
        return None
    return read_manifest_file(p)
