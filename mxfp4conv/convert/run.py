"""``convert``: plan, then stream every output shard, resumably.

Order of events: everything is checked and planned before a byte is written; sidecar files
are copied; shards are written under temporary names, each renamed only when complete and
recorded (size + checksum) in a progress file; the index and the manifest come last, so a
directory without ``mxfp4conv.json`` is visibly unfinished.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from mxfp4conv.checkpoint.source import INDEX_NAME
from mxfp4conv.convert.memory import keep_freed_memory
from mxfp4conv.convert.manifest import MANIFEST_NAME, build_manifest, write_manifest_json
from mxfp4conv.convert.plan import (
    DEFAULT_SHARD_SIZE, SHARD_RE, OutputPlan, build_plan, parse_size, plan_metadata, resolve_layouts,
)
from mxfp4conv.convert.direct_read import DirectReader
from mxfp4conv.convert.producers import unit_tasks
from mxfp4conv.convert.progress import Progress
from mxfp4conv.convert.writer import (
    TEMP_SUFFIX, ShardWriter, WriteError, _os_error, as_bytes, fsync_dir, shard_checksum,
)
from mxfp4conv.errors import CheckpointError, Mxfp4convError

PROGRESS_NAME = ".mxfp4conv-progress.json"
DEFAULT_CHUNK_BYTES = 24 << 20  # per task; keeps every buffer under glibc's mmap threshold


@dataclass
class ConvertResult:
    out: Path
    shards: list[str]
    kept: list[str] = field(default_factory=list)  # finished shards reused by --resume
    bytes_written: int = 0
    manifest: dict = field(default_factory=dict)


def prepare(source, target, shard_size=DEFAULT_SHARD_SIZE):
    """Open the source, decide and plan. Returns (source, model, decision, manifest, plan)."""
    from mxfp4conv.checkpoint import load_model, open_source
    from mxfp4conv.oracle import decide
    from mxfp4conv.shuffle.layouts import get_layout

    src = open_source(source) if isinstance(source, (str, os.PathLike)) else source
    if (Path(src.root) / MANIFEST_NAME).exists():
        raise CheckpointError(f"{src.root} is already a converted checkpoint ({MANIFEST_NAME} is "
                              f"present); convert the original source instead.")
    model = load_model(src)
    decision = decide(model, target)
    manifest = build_manifest(src, model, decision, target)
    plan = build_plan(src, model, decision, resolve_layouts(decision, get_layout),
                      plan_metadata(manifest), parse_size(shard_size))
    return src, model, decision, manifest, plan


def convert(source, out, target, shard_size=DEFAULT_SHARD_SIZE, resume=False, workers=1, force=False,
            progress="auto", allow_nan_scales=False, chunk_bytes=DEFAULT_CHUNK_BYTES) -> ConvertResult:
    """Convert ``source`` (a spec string or an open ``Source``) into ``out`` for ``target``."""
    src, model, decision, manifest, plan = prepare(source, target, shard_size)
    keep_freed_memory()
    out = Path(out)
    _check_out(src, out, resume, force)
    out.mkdir(parents=True, exist_ok=True)
    _remove(out / MANIFEST_NAME)  # unfinished until the very end
    _remove(out / INDEX_NAME)
    for p in out.glob("." + "*" + TEMP_SUFFIX):
        _remove(p)

    fingerprint = plan.fingerprint()
    record = _load_progress(out) if resume else {}
    if record.get("plan") != fingerprint:
        record = {"plan": fingerprint, "shards": {}}
    kept = _keep_finished(out, plan, record)
    for p in out.glob("model-*-of-*.safetensors"):
        if SHARD_RE.match(p.name) and p.name not in kept:
            _remove(p)
    record["shards"] = {k: v for k, v in record["shards"].items() if k in kept}
    _save_progress(out, record)

    src.prefetch(src.shards() + src.sidecar_files())  # a hub source: fetch in parallel (no-op locally)
    _copy_sidecars(src, out)

    todo = sum(t.spec.size() for s in plan.shards if s.name not in kept for t in s.tensors)
    bar = Progress(todo, progress)
    try:
        written = _write_shards(src, model, plan, out, kept, record, bar, workers,
                                allow_nan_scales, chunk_bytes)
    finally:
        bar.close()

    index = {"metadata": {"total_size": plan.total_size()}, "weight_map": plan.weight_map()}
    _atomic_write(out / INDEX_NAME, (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())
    _atomic_write(out / MANIFEST_NAME, write_manifest_json(manifest))
    if progress != "none":
        n = len(plan.shards)
        bar.line(f"converted {n} shard{'' if n == 1 else 's'} into {out}"
                 + (f" ({len(kept)} kept from an earlier run)" if kept else ""))
    return ConvertResult(out, [s.name for s in plan.shards], sorted(kept), written, manifest)


# ---- output directory -------------------------------------------------------------------

def _check_out(src, out: Path, resume: bool, force: bool) -> None:
    root = Path(src.root).resolve()
    o = out.resolve()
    if o == root or root in o.parents or o in root.parents:
        raise Mxfp4convError(f"output directory {out} overlaps the source {src.root}; choose a "
                             f"separate directory (the source is never written to).")
    if o.exists() and not o.is_dir():
        raise Mxfp4convError(f"{out} exists and is not a directory; choose another output path.")
    if o.is_dir() and any(o.iterdir()) and not (resume or force):
        raise Mxfp4convError(f"output directory {out} is not empty; pass --resume to finish an "
                             f"interrupted conversion into it, --force to overwrite it, or choose "
                             f"an empty directory.")


def _remove(p: Path) -> None:
    try:
        p.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise _os_error(exc, p, "remove") from exc


def _load_progress(out: Path) -> dict:
    try:
        d = json.loads((out / PROGRESS_NAME).read_text())
        return d if isinstance(d, dict) and isinstance(d.get("shards"), dict) else {}
    except (OSError, ValueError):
        return {}


def _save_progress(out: Path, record: dict) -> None:
    _atomic_write(out / PROGRESS_NAME, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name("." + path.name + TEMP_SUFFIX)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        _remove(tmp)
        raise _os_error(exc, path, "write") from exc


def _keep_finished(out: Path, plan: OutputPlan, record: dict) -> set[str]:
    """Shards of an earlier run that match the plan by size and recomputed checksum."""
    kept = set()
    for s in plan.shards:
        rec = record["shards"].get(s.name)
        p = out / s.name
        if not rec or not p.is_file():
            continue
        size = plan.shard_file_size(s)
        if rec.get("size") != size or p.stat().st_size != size:
            continue
        try:
            digest, _ = shard_checksum(p)
        except Mxfp4convError:
            continue
        if digest == rec.get("checksum"):
            kept.add(s.name)
    return kept


def _copy_sidecars(src, out: Path) -> None:
    for rel in src.sidecar_files():
        if rel in (MANIFEST_NAME, INDEX_NAME, PROGRESS_NAME):
            continue
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name("." + dst.name + TEMP_SUFFIX)
        try:
            shutil.copyfile(src.path(rel), tmp)
            os.replace(tmp, dst)
        except OSError as exc:
            _remove(tmp)
            raise _os_error(exc, dst, "copy a sidecar file to") from exc


# ---- the data pipeline --------------------------------------------------------------------

class _Sink:
    """Stands in for a shard kept from an earlier run: its bytes are already on disk."""

    def write(self, name, chunk) -> None:
        pass


def _write_shards(src, model, plan: OutputPlan, out: Path, kept: set[str], record: dict,
                  bar: Progress, workers: int, allow_nan: bool, chunk_bytes: int) -> int:
    shard_of = plan.shard_of()
    # which units touch each shard; a shard is finished when its last unit is done
    last_unit: dict[str, int] = {}
    for ui, unit in enumerate(plan.units):
        for t in unit.tensors:
            last_unit[shard_of[t.name].name] = ui
    by_name = {s.name: s for s in plan.shards}
    writers: dict[str, ShardWriter | _Sink] = {}
    written = 0

    hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mxfp4conv-crc")
    finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mxfp4conv-fsync")
    finishing: list = []

    def writer_for(shard_name: str):
        w = writers.get(shard_name)
        if w is None:
            if shard_name in kept:
                w = _Sink()
            else:
                w = ShardWriter(out / shard_name, by_name[shard_name].specs(), plan.metadata, hasher=hasher)
                w.open()
                bar.describe(shard_name)
            writers[shard_name] = w
        return w

    def finish_one(name: str, w: ShardWriter) -> None:
        # fsync + rename off the writing thread; the progress record follows the rename
        digest = w.finish()
        record["shards"][name] = {"size": w.total_size, "checksum": digest}
        _save_progress(out, record)
        if bar.mode == "lines":
            bar.line(f"finished {name}")

    def finish_shards(ui: int) -> None:
        for f in [f for f in finishing if f.done()]:
            f.result()  # surface errors early
        for name, last in last_unit.items():
            if last == ui and name not in kept:
                w = writers.pop(name)
                finishing.append(finisher.submit(finish_one, name, w))

    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="mxfp4conv")
    reader = DirectReader(src)
    pending: deque = deque()
    depth = max(1, workers) + 1

    def jobs():
        for ui, unit in enumerate(plan.units):
            if all(shard_of[t.name].name in kept for t in unit.tensors):
                continue
            for task in unit_tasks(src, model, plan, unit, chunk_bytes, allow_nan, reader):
                yield ui, task, False
            yield ui, None, True  # unit done marker

    try:
        for ui, task, done in jobs():
            if task is not None:
                pending.append((ui, pool.submit(task), False))
            else:
                pending.append((ui, None, True))
            while len(pending) > depth or (pending and pending[0][2]):
                written += _drain_one(pending, writer_for, shard_of, bar, finish_shards)
        while pending:
            written += _drain_one(pending, writer_for, shard_of, bar, finish_shards)
        for f in finishing:
            f.result()
    except BaseException:
        for f in pending:
            if f[1] is not None:
                f[1].cancel()
        pool.shutdown(wait=True, cancel_futures=True)
        finisher.shutdown(wait=True)  # shards already complete are finished and recorded
        for w in writers.values():
            if isinstance(w, ShardWriter):
                w.abort()
        hasher.shutdown(wait=True, cancel_futures=True)
        reader.close()
        raise
    reader.close()
    pool.shutdown(wait=True)
    finisher.shutdown(wait=True)
    hasher.shutdown(wait=True)
    leftover = [n for n, w in writers.items() if isinstance(w, ShardWriter)]
    if leftover:
        raise WriteError(f"internal error: shards {leftover} were opened but never finished")
    return written


def _drain_one(pending, writer_for, shard_of, bar, finish_shards) -> int:
    ui, fut, done = pending.popleft()
    if done:
        finish_shards(ui)
        return 0
    n = 0
    for name, data in fut.result():
        view = as_bytes(data)
        writer_for(shard_of[name].name).write(name, view)
        k = len(view)
        n += k
        bar.advance(k)
    return n
