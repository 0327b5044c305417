"""JSON as every file of a checkpoint is read: standard JSON only, errors as one paragraph.

Python's ``json`` accepts ``NaN`` / ``Infinity`` (not JSON), keeps the last of duplicate
keys, and raises ``RecursionError`` on deeply nested input. Configs, indexes, shard headers
and manifests all come through ``loads`` here, so none of that reaches the rest of the code.
"""

from __future__ import annotations

import json

from mxfp4conv.errors import CheckpointError

MAX_DEPTH = 64  # far deeper than any real config, index, header or manifest


class _Bad(ValueError):
    pass


def _no_constant(name: str):
    raise _Bad(f"the non-standard constant {name} (JSON has no NaN or Infinity)")


def _unique(pairs):
    seen = set()
    for k, _ in pairs:
        if k in seen:
            raise _Bad(f"the key {k!r} appears twice in one object")
        seen.add(k)
    return dict(pairs)


def _depth(obj) -> int:
    deepest, todo = 0, [(obj, 1)]
    while todo:
        o, d = todo.pop()
        if isinstance(o, (dict, list)):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                return d
            todo.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return deepest


def loads(raw: bytes | str, where: str, what: str, fix: str, *, unique_keys: bool = True) -> object:
    """Parse ``raw`` (the bytes of ``what`` in ``where``) or raise ``CheckpointError`` saying
    what is wrong, followed by ``fix``."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray, memoryview)) else raw
        obj = json.loads(text, parse_constant=_no_constant,
                         object_pairs_hook=_unique if unique_keys else None)
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{where}: the {what} is not valid UTF-8 JSON ({exc.reason} at "
                              f"byte {exc.start}). {fix}") from None
    except _Bad as exc:
        raise CheckpointError(f"{where}: the {what} is not valid JSON: it holds {exc}. {fix}") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{where}: the {what} is not valid JSON ({exc}). {fix}") from None
    except RecursionError:
        raise CheckpointError(f"{where}: the {what} nests objects or lists too deeply to be "
                              f"read. {fix}") from None
    if _depth(obj) > MAX_DEPTH:
        raise CheckpointError(f"{where}: the {what} nests objects or lists more than {MAX_DEPTH} "
                              f"levels deep; no real one does. {fix}")
    return obj


def dumps_finite(obj, **kw) -> str:
    """``json.dumps`` that refuses NaN / Infinity instead of writing non-standard JSON."""
    try:
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError as exc:
        raise CheckpointError(f"internal error: a value to be written as JSON is not finite "
                              f"({exc}); please report it.") from None
