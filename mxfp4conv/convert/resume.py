"""Which conversion an output directory holds, and whether ``--resume`` may finish it there.

``--resume`` keeps finished shards, so it must only ever finish the *same* conversion: the
same source, target, parallel layout, vLLM release, shard size and mxfp4conv format. The
progress file records what a conversion is (its manifest and shard size) next to the shards it
finished; a resume that differs in any of these is refused before anything in OUT is touched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mxfp4conv.errors import Mxfp4convError
from mxfp4conv.format.manifest import MANIFEST_NAME, SHARD_RE, stamped_part

# the fields named first when a resume differs: what users change on purpose
_FIRST = ("source.", "target.arch", "target.tp", "target.ep", "target.backend", "target.act_quant",
          "vllm", "layout.", "shard_size", "format", "version", "tool_version")
_LISTED = 6


def identity(manifest: dict, shard_size: int) -> dict[str, Any]:
    """What a conversion is, as the progress file records it."""
    return {"manifest": stamped_part(manifest), "shard_size": shard_size}


def check_resume(out: Path, record: dict, now: dict, fingerprint: str) -> None:
    """Raise unless ``out`` holds nothing, or an unfinished or finished run of the conversion
    ``now`` (``identity``). ``record`` is OUT's progress file ({} when absent or unreadable)."""
    before = record.get("conversion")
    if isinstance(before, dict):
        diffs = differences(before, now)
        if not diffs and record.get("plan") != fingerprint:
            diffs = ["the planned shard headers (the same options give other output tensors: the "
                     "source's tensors changed)"]
        if diffs:
            raise _refused(out, diffs)
        return
    if record.get("plan") is not None:  # a record without a description of its conversion
        if record["plan"] != fingerprint:
            raise _refused(out, [f"the planned shards (OUT's record was written by an mxfp4conv that "
                                 f"did not describe its conversion, and its shard plan "
                                 f"{str(record['plan'])[:12]}... is not this one's {fingerprint[:12]}...)"])
        return
    manifest = _finished_manifest(out)
    if manifest is not None:
        diffs = differences({"manifest": manifest}, {"manifest": now["manifest"]})
        if diffs:
            raise _refused(out, diffs)
        return
    shards = sorted(p.name for p in out.glob("model-*-of-*.safetensors") if SHARD_RE.match(p.name))
    if shards:
        raise Mxfp4convError(
            f"{out}: --resume cannot tell which conversion wrote the shards in this directory "
            f"({shards[0]}{' and more' if len(shards) > 1 else ''}): its record "
            f"(.mxfp4conv-progress.json) is missing or unreadable. Nothing in {out} was changed. "
            f"Pass --force to replace its contents with this conversion, or convert into another "
            f"output directory.")


def _finished_manifest(out: Path) -> dict | None:
    try:
        m = json.loads((out / MANIFEST_NAME).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return stamped_part(m) if isinstance(m, dict) else None


def _refused(out: Path, diffs: list[str]) -> Mxfp4convError:
    shown = "; ".join(diffs[:_LISTED]) + (f"; and {len(diffs) - _LISTED} more" if len(diffs) > _LISTED else "")
    return Mxfp4convError(
        f"{out}: --resume only finishes the conversion this directory already holds, and this one "
        f"differs from it: {shown}. Nothing in {out} was changed. Pass --force to replace its "
        f"contents with this conversion, or convert into another output directory.")


def differences(before: dict, now: dict) -> list[str]:
    """``field: X in OUT, Y now`` for every manifest field (and the shard size) that differs."""
    a, b = _fields(before), _fields(now)
    keys = [k for k in sorted(a.keys() | b.keys()) if a.get(k, _MISSING) != b.get(k, _MISSING)]
    keys.sort(key=lambda k: next((i for i, p in enumerate(_FIRST) if k == p or k.startswith(p)),
                                 len(_FIRST)))
    return [f"{k}: {_shown(a.get(k, _MISSING))} in OUT, {_shown(b.get(k, _MISSING))} now" for k in keys]


_MISSING = object()


def _fields(ident: dict) -> dict[str, Any]:
    out = _flat(ident.get("manifest"), "")
    if "shard_size" in ident:
        out["shard_size"] = ident["shard_size"]
    return out


def _flat(d: Any, prefix: str) -> dict[str, Any]:
    """Leaves of nested objects by dotted path (lists and empty objects are leaves)."""
    if isinstance(d, dict) and d:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1] or "manifest": d}


def _shown(v: Any) -> str:
    if v is _MISSING:
        return "absent"
    text = json.dumps(v, sort_keys=True) if not isinstance(v, str) else v
    return text if len(text) <= 48 else text[:45] + "..."
