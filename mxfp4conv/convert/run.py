"""``convert``: plan, then stream every output shard, resumably.

Order of events: everything is checked and planned before a byte is written; sidecar files
are copied; shards are written under temporary names, each renamed only when complete and
recorded (size + checksum) in a progress file; the index and the manifest come last, so a
directory without ``mxfp4conv.json`` is visibly unfinished.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import sys
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from mxfp4conv.checkpoint.checks import scale_warnings
from mxfp4conv.checkpoint.source import INDEX_NAME
from mxfp4conv.convert.memory import keep_freed_memory
from mxfp4conv.convert.manifest import build_manifest
from mxfp4conv.convert.plan import (
    DEFAULT_SHARD_SIZE, OutputPlan, build_plan, parse_size, plan_metadata, resolve_layouts,
)
from mxfp4conv.convert.direct_read import DirectReader
from mxfp4conv.convert.parallel import OrderedPool, chunk_budget, default_workers, one_torch_thread
from mxfp4conv.convert.producers import numpy_only, unit_tasks
from mxfp4conv.convert.progress import Progress
from mxfp4conv.convert.resume import check_resume, identity
from mxfp4conv.convert.writer import (
    TEMP_SUFFIX, ShardWriter, WriteError, _os_error, as_bytes, fsync_dir, shard_crcs,
)
from mxfp4conv.errors import CheckpointError, Mxfp4convError
from mxfp4conv.format.manifest import CHECKSUMS, MANIFEST_NAME, SHARD_RE, write_manifest_json

PROGRESS_NAME = ".mxfp4conv-progress.json"
LOCK_NAME = ".mxfp4conv.lock"
INDEX_RECORD = "mxfp4conv"  # the key of a finished conversion's record in the index's metadata
DEFAULT_CHUNK_BYTES = 24 << 20  # per task; keeps every buffer under glibc's mmap threshold


@dataclass
class ConvertResult:
    out: Path
    shards: list[str]
    kept: list[str] = field(default_factory=list)  # finished shards reused by --resume
    bytes_written: int = 0
    manifest: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # also printed on stderr
    redone: list[str] = field(default_factory=list)  # shards --resume writes (again)


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


def convert(source, out, target, shard_size=DEFAULT_SHARD_SIZE, resume=False, workers=None, force=False,
            progress="auto", allow_nan_scales=False, chunk_bytes=DEFAULT_CHUNK_BYTES) -> ConvertResult:
    """Convert ``source`` (a spec string or an open ``Source``) into ``out`` for ``target``.
    ``workers``: threads that read, transform and write (None: ``default_workers()``)."""
    src, model, decision, manifest, plan = prepare(source, target, shard_size)
    keep_freed_memory()
    notes = scale_warnings(src, list(model.layers))
    for msg in notes:
        sys.stderr.write(f"warning: {msg}\n")
    sidecars = [rel for rel in src.sidecar_files() if rel not in (MANIFEST_NAME, INDEX_NAME, PROGRESS_NAME)]
    out = Path(out)
    _check_out(src, out, resume, force)
    _make_dir(out)
    with output_lock(out):
        result = _convert_into(src, model, plan, manifest, out, sidecars, resume, force, workers,
                               progress, allow_nan_scales, chunk_bytes, identity(manifest, parse_size(shard_size)))
    result.warnings = notes
    return result


def _convert_into(src, model, plan, manifest, out, sidecars, resume, force, workers, progress,
                  allow_nan_scales, chunk_bytes, conversion) -> ConvertResult:
    fingerprint = plan.fingerprint()
    earlier = _load_progress(out)
    if resume:  # before anything in OUT changes
        try:
            check_resume(out, earlier, conversion, fingerprint)
        except Mxfp4convError:
            if not force:
                raise
            resume = False  # --force --resume: finish the same conversion, else replace OUT
    _remove(out / MANIFEST_NAME)  # unfinished until the very end
    _remove(out / INDEX_NAME)
    for p in out.glob("." + "*" + TEMP_SUFFIX):
        _remove(p)

    record = earlier if resume else {}
    if record.get("plan") != fingerprint:
        record = {"plan": fingerprint, "shards": {}}
    record["conversion"] = conversion
    kept = _keep_finished(out, plan, record)
    redone = [s.name for s in plan.shards if s.name not in kept]
    if resume and progress != "none":
        sys.stderr.write(_resume_note(out, plan, kept, redone, record) + "\n")
    for p in out.glob("model-*-of-*.safetensors"):
        if SHARD_RE.match(p.name) and p.name not in kept:
            _remove(p)
    # files an earlier conversion copied into OUT that this one does not write
    files = earlier.get("files")
    for rel in set(files if isinstance(files, list) else ()) - set(sidecars):
        if isinstance(rel, str) and _is_own_path(out, rel):
            _remove(out / rel)
    record["shards"] = {k: v for k, v in record["shards"].items() if k in kept}
    record["files"] = sorted(sidecars)
    _save_progress(out, record)

    src.prefetch(src.shards() + sidecars)  # a hub source: fetch in parallel (no-op locally)
    _copy_sidecars(src, out, sidecars)

    todo = sum(t.spec.size() for s in plan.shards if s.name not in kept for t in s.tensors)
    bar = Progress(todo, progress)
    try:
        # torch only where a step has no numpy path: importing it costs seconds
        with one_torch_thread(load=not numpy_only(model, plan)):
            written = _write_shards(src, model, plan, out, kept, record, bar,
                                    default_workers() if workers is None else workers,
                                    allow_nan_scales, chunk_bytes)
    finally:
        bar.close()

    # the progress record (shard checksums for verify and --resume, the files copied) moves into
    # the index's metadata: a finished OUT holds no hidden file
    index = {"metadata": {"total_size": plan.total_size(), INDEX_RECORD: record},
             "weight_map": plan.weight_map()}
    _atomic_write(out / INDEX_NAME, (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())
    # the crc32 of every routed-expert tensor, checked by the loader as it reads them
    crcs = {n: c for s in plan.shards for n, c in record["shards"][s.name]["crc32"].items()}
    manifest = {**manifest, CHECKSUMS: {"crc32": dict(sorted(crcs.items()))}}
    _atomic_write(out / MANIFEST_NAME, write_manifest_json(manifest))
    _remove(out / PROGRESS_NAME)
    if progress != "none":
        n = len(plan.shards)
        bar.line(f"converted {n} shard{'' if n == 1 else 's'} into {out}"
                 + (f" ({len(kept)} kept from an earlier run)" if kept else ""))
    return ConvertResult(out, [s.name for s in plan.shards], sorted(kept), written, manifest,
                         redone=redone if resume else [])


def _resume_note(out: Path, plan: OutputPlan, kept: set[str], redone: list[str], record: dict) -> str:
    """What a resume keeps and what it writes (again), and why."""
    damaged = [n for n in redone if n in record["shards"]]
    text = (f"resuming the conversion in {out}: keeping {len(kept)} of {len(plan.shards)} shards "
            f"(their bytes match the checksums recorded when they were written), writing {len(redone)}")
    if redone:
        text += f" ({_names(redone)})"
    if damaged:
        text += f"; {_names(damaged)} changed since it was written and is written again"
    return text + "."


def _names(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


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


def _make_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parent = next((p for p in out.parents if os.path.lexists(p)), out.parent)
        if exc.errno in (errno.ENOTDIR, errno.EEXIST):
            why = f"{parent} is not a directory"
        else:
            why = exc.strerror or str(exc)
        raise Mxfp4convError(f"cannot create the output directory {out} ({why}); choose an output "
                             f"path inside a writable directory.") from None


@contextmanager
def output_lock(out: Path):
    """Hold an exclusive lock on OUT for the whole conversion; a second convert into the same
    OUT is refused instead of racing the first."""
    path = out / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise _os_error(exc, path, "create the lock file") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Mxfp4convError(f"{out}: another mxfp4conv convert is writing into this output "
                                 f"directory right now (it holds {LOCK_NAME}). Wait for it to "
                                 f"finish, or choose another output directory.") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # a convert that just finished removed the file we locked
            raise Mxfp4convError(f"{out}: another mxfp4conv convert finished writing into this output "
                                 f"directory just now; run the command again.")
        try:
            yield
        finally:
            _remove(path)  # OUT keeps no lock file (removed while still held)
    finally:
        os.close(fd)


def _is_own_path(out: Path, rel: str) -> bool:
    """A path recorded in OUT's progress file that stays inside OUT (the record is not trusted)."""
    p = Path(rel)
    if not rel or p.is_absolute() or ".." in p.parts or rel in (PROGRESS_NAME, LOCK_NAME, INDEX_NAME,
                                                               MANIFEST_NAME):
        return False
    full = out / p
    return full.resolve().is_relative_to(out.resolve()) and not full.is_dir() and not SHARD_RE.match(rel)


def _remove(p: Path) -> None:
    try:
        p.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise _os_error(exc, p, "remove") from exc


def finished_record(out: Path) -> dict:
    """The progress record a finished conversion keeps in OUT's index, or {}."""
    try:
        d = json.loads((out / INDEX_NAME).read_text())["metadata"][INDEX_RECORD]
        return d if isinstance(d, dict) and isinstance(d.get("shards"), dict) else {}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return {}


def _load_progress(out: Path) -> dict:
    """The record of the conversion in OUT: the progress file while one runs (or was
    interrupted), the index's copy once it finished."""
    try:
        d = json.loads((out / PROGRESS_NAME).read_text())
        return d if isinstance(d, dict) and isinstance(d.get("shards"), dict) else {}
    except FileNotFoundError:
        return finished_record(out)
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


def expert_names(shard) -> list[str]:
    """The routed-expert tensors of a planned shard (those whose crc32 the manifest records)."""
    return [t.name for t in shard.tensors if t.layer >= 0]


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
            digest, _, crcs = shard_crcs(p)
        except Mxfp4convError:
            continue
        if digest == rec.get("checksum"):
            kept.add(s.name)
            rec["crc32"] = {n: crcs[n] for n in expert_names(s)}
    return kept


def _copy_sidecars(src, out: Path, sidecars: list[str]) -> None:
    for rel in sidecars:
        dst = out / rel
        tmp = dst.with_name("." + dst.name + TEMP_SUFFIX)
        path = src.path(rel)
        try:
            fin = open(path, "rb")
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot read this file of the source ({exc.strerror}), "
                                  f"so it cannot be copied into the output. Make it readable and "
                                  f"run again with --resume.") from None
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            with fin, open(tmp, "wb") as fout:
                shutil.copyfileobj(fin, fout)
            os.replace(tmp, dst)
        except OSError as exc:
            _remove(tmp)
            raise _os_error(exc, dst, "copy a sidecar file to") from exc


# ---- the data pipeline --------------------------------------------------------------------

def _write_shards(src, model, plan: OutputPlan, out: Path, kept: set[str], record: dict,
                  bar: Progress, workers: int, allow_nan: bool, chunk_bytes: int) -> int:
    """Tasks run on ``workers`` threads, each reading, transforming, writing and checksumming
    its pieces at their final offsets; this thread only submits tasks, records finished ones
    in order (which fixes each tensor's crc32) and hands complete shards to the finisher."""
    workers = max(1, workers)
    shard_of = plan.shard_of()
    # which units touch each shard; a shard is finished when its last unit is done
    last_unit: dict[str, int] = {}
    for ui, unit in enumerate(plan.units):
        for t in unit.tensors:
            last_unit[shard_of[t.name].name] = ui
    by_name = {s.name: s for s in plan.shards}
    writers: dict[str, ShardWriter] = {}
    written = 0

    finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mxfp4conv-fsync")
    finishing: list = []

    def writer_for(shard_name: str) -> ShardWriter | None:
        if shard_name in kept:
            return None  # its bytes are already on disk
        w = writers.get(shard_name)
        if w is None:
            w = ShardWriter(out / shard_name, by_name[shard_name].specs(), plan.metadata)
            w.open()
            bar.started(shard_name)
            writers[shard_name] = w
        return w

    def finish_one(name: str, w: ShardWriter) -> None:
        # fsync + rename off the submitting thread; the progress record follows the rename
        digest = w.finish()
        record["shards"][name] = {"size": w.total_size, "checksum": digest,
                                  "crc32": {n: w.crcs[n] for n in expert_names(by_name[name])}}
        _save_progress(out, record)
        bar.finished(name)

    def finish_shards(ui: int) -> None:
        for f in [f for f in finishing if f.done()]:
            f.result()  # surface errors early
        for name, last in last_unit.items():
            if last == ui and name not in kept:
                w = writers.pop(name)
                finishing.append(finisher.submit(finish_one, name, w))

    reader = DirectReader(src)
    chunk = chunk_budget(workers, chunk_bytes)

    def jobs():
        for ui, unit in enumerate(plan.units):
            if all(shard_of[t.name].name in kept for t in unit.tensors):
                continue
            for task in unit_tasks(src, model, plan, unit, chunk, allow_nan, reader):
                # shards are opened here, in order, before any worker writes into them; the
                # source bytes are asked for now, a queue's length before a worker needs them
                reader.prefetch(list(task.reads))
                yield ui, task, [writer_for(shard_of[name].name) for name, _, _ in task.pieces]
            yield ui, None, None  # unit done marker

    def work(job):
        _, task, targets = job
        return None if task is None else _run_task(task, targets)

    try:
        # finished tasks hold no data, so the queue may run well ahead of the slowest task
        with OrderedPool(workers) as pool:
            for (ui, task, _), crcs in pool.map(work, jobs()):
                if task is None:
                    finish_shards(ui)
                    continue
                for (name, off, k), crc in zip(task.pieces, crcs):
                    if crc is not None:
                        writers[shard_of[name].name].record(name, off, k, crc)
                    written += k
                    bar.advance(k)
        for f in finishing:
            f.result()
    except BaseException:
        finisher.shutdown(wait=True)  # shards already complete are finished and recorded
        for w in writers.values():
            w.abort()
        reader.close()
        raise
    reader.close()
    finisher.shutdown(wait=True)
    if writers:
        raise WriteError(f"internal error: shards {sorted(writers)} were opened but never finished")
    return written


def _run_task(task, targets: list) -> list[int | None]:
    """Worker side: produce the pieces and write each where it belongs; returns their crc32s
    (None for pieces of shards kept from an earlier run)."""
    data = task.run()
    if len(data) != len(task.pieces):
        raise WriteError(f"internal error: a task made {len(data)} pieces, planned {len(task.pieces)}")
    crcs = []
    for (name, off, n), (got_name, chunk), w in zip(task.pieces, data, targets):
        view = as_bytes(chunk)
        if got_name != name or len(view) != n:
            raise WriteError(f"internal error: a task made {len(view)} bytes of {got_name}, planned {n} of {name}")
        crcs.append(None if w is None else w.write_at(name, off, view))
    return crcs
