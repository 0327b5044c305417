"""``verify``: prove a converted checkpoint right, structurally and (with the source) byte by byte.

Without the source: manifest, index and every shard header (names, dtypes, shapes, sizes,
``__metadata__``) against what the manifest implies. With the source: the output plan is
rebuilt from the source and the manifest's target and compared tensor by tensor; every
expert tensor is inverted (layout inverse, pad bytes checked exactly, un-padded, ranks
re-stacked) and compared with the source bytes; every other tensor is compared by hash.
Stops at the first mismatch with its layer, rank, tensor and offset.
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mxfp4conv.lazy_torch import torch

from mxfp4conv.checkpoint import strict_json
from mxfp4conv.checkpoint.safetensors_io import pread_exact, read_header
from mxfp4conv.checkpoint.source import INDEX_NAME
from mxfp4conv.convert.manifest import build_manifest, target_from_manifest
from mxfp4conv.convert.plan import LAYOUT_FIELD, expert_kinds, expert_tensor_name, stored_shape
from mxfp4conv.convert.direct_read import DirectReader, merge_ranges
from mxfp4conv.convert.memory import keep_freed_memory
from mxfp4conv.convert.parallel import OrderedPool, chunk_budget, default_workers, one_torch_thread
from mxfp4conv.convert.progress import Progress
from mxfp4conv.convert.rank_tensors import WEIGHT_KINDS, RankGeometry, build_chunk, build_chunk_np
from mxfp4conv.convert.crc import crc32, crc32_combine
from mxfp4conv.convert.writer import as_bytes
from mxfp4conv.errors import CheckpointError, Mxfp4convError
from mxfp4conv.format.manifest import (EXPERT_KINDS, MANIFEST_NAME, SHARD_RE, SHUFFLE_PAD_BYTE, expert_checksums,
                                       load_manifest, stamped_part)

CHUNK_BYTES = 24 << 20  # per job, before the in-flight budget divides it among the workers


class VerifyError(Mxfp4convError):
    """The converted checkpoint does not match what it should hold."""

    def __init__(self, cls: str, message: str, **where):
        super().__init__(message)
        self.cls = cls
        self.where = where


@dataclass
class VerifyReport:
    out: str
    source: str | None
    ok: bool = False
    checks: list[str] = field(default_factory=list)
    layers: list[dict] = field(default_factory=list)
    error: dict | None = None
    bytes_compared: int = 0

    def to_json(self) -> dict:
        return {"ok": self.ok, "out": self.out, "source": self.source, "checks": self.checks,
                "layers": self.layers, "bytes_compared": self.bytes_compared, "error": self.error}


class _OutReader:
    """Reads tensors of the converted checkpoint by name, in ranges, using the shard headers
    already read and checked."""

    def __init__(self, root: Path, weight_map: dict[str, str], headers: dict, crc_names=()):
        self.root = root
        self.weight_map = weight_map
        self.headers = headers
        self.fds = {}
        self._lock = threading.Lock()  # read from several worker threads
        # (offset, size, crc32) of every piece read of these tensors: their crc32 without
        # reading them again
        self.crc_names = frozenset(crc_names)
        self.pieces: dict[str, list[tuple[int, int, int]]] = {}

    def entry(self, name: str):
        h = self.headers[self.weight_map[name]]
        return h, h.tensors[name]

    def _fd(self, shard: str) -> int:
        with self._lock:
            fd = self.fds.get(shard)
            if fd is None:
                fd = self.fds[shard] = os.open(self.root / shard, os.O_RDONLY)
            return fd

    def read(self, name: str, offset: int, n: int) -> bytearray:
        shard = self.weight_map[name]
        h, e = self.entry(name)
        data = pread_exact(self._fd(shard), h.data_start + e.begin + offset, n)
        if name in self.crc_names:
            piece = (offset, n, crc32(data))
            with self._lock:
                self.pieces.setdefault(name, []).append(piece)
        return data

    def crc(self, name: str) -> int:
        """crc32 of a whole tensor: combined from the pieces read when they tile it, else read."""
        _, e = self.entry(name)
        crc, at = 0, 0
        for off, n, c in sorted(set(self.pieces.get(name, ()))):
            if off != at:
                break
            crc, at = crc32_combine(crc, c, n), at + n
        if at == e.nbytes:
            return crc
        crc = 0
        for off in range(0, e.nbytes, 64 << 20):
            crc = crc32(self.read(name, off, min(64 << 20, e.nbytes - off)), crc)
        return crc

    def prefetch(self, pieces: list[tuple[str, int, int]]) -> None:
        """Start reading ``(tensor, offset, nbytes)`` pieces into the page cache (best effort)."""
        if not hasattr(os, "posix_fadvise"):
            return
        ranges = []
        for name, offset, n in pieces:
            h, e = self.entry(name)
            ranges.append((self.weight_map[name], h.data_start + e.begin + offset, n))
        for shard, off, n in merge_ranges(ranges):
            try:
                os.posix_fadvise(self._fd(shard), off, n, os.POSIX_FADV_WILLNEED)
            except OSError:
                return

    def close(self):
        with self._lock:
            for fd in self.fds.values():
                os.close(fd)
            self.fds = {}


def verify(out, source=None, workers=None, progress="none") -> VerifyReport:
    """Check ``out``; with ``source`` (spec or Source) compare every byte. Raises
    ``VerifyError`` on the first mismatch (the report is attached as ``exc.report``).
    ``workers``: threads that read and compare (None: ``default_workers()``); ``progress``:
    "auto" (a bar on a terminal, lines otherwise), "rich", "lines" or "none"."""
    out = Path(out)
    rep = VerifyReport(out=str(out), source=None if source is None else str(getattr(source, "spec", source)))
    try:
        _verify(out, source, rep, default_workers() if workers is None else max(1, workers), progress)
    except VerifyError as exc:
        rep.error = {"class": exc.cls, "message": str(exc), **exc.where}
        exc.report = rep
        raise
    rep.ok = True
    return rep


def _verify(out: Path, source, rep: VerifyReport, workers: int, progress: str) -> None:
    if not out.is_dir():
        raise CheckpointError(f"{out} is not a directory; give the converted checkpoint's directory.")
    manifest = load_manifest(out)
    if manifest is None:
        raise VerifyError("manifest", f"{out} has no {MANIFEST_NAME}: it is not a converted checkpoint, or "
                          f"its conversion did not finish (run convert again with --resume).")
    rep.checks.append("manifest")
    weight_map, headers = _check_index_and_headers(out, manifest)
    rep.checks.append("index and shard headers")
    expected = expected_expert_specs(manifest)
    for name, (dtype, shape) in expected.items():
        if name not in weight_map:
            raise VerifyError("missing tensor", f"{out}: expert tensor {name} is missing from the index.",
                              tensor=name)
        e = headers[weight_map[name]].tensors[name]
        if e.dtype != dtype or tuple(e.shape) != tuple(shape):
            raise VerifyError("header", f"{out / weight_map[name]}: tensor {name} is {e.dtype} "
                              f"{list(e.shape)}, expected {dtype} {list(shape)}.", tensor=name)
    rep.checks.append("expert tensor shapes")
    table = _checksum_table(out, manifest, expected)
    if source is None:  # with the source every byte is compared instead, naming the first difference
        rep.checks.append(_check_recorded_checksums(out, sorted(headers), table))
        rep.layers = [{"prefix": p, "status": "structure ok"} for p in manifest["moe"]["layers"]]
        return
    keep_freed_memory()  # chunk buffers are reused instead of faulted in afresh (see convert)
    reader = _OutReader(out, weight_map, headers, crc_names=table)
    try:
        _verify_against_source(out, source, manifest, weight_map, expected, reader, rep, workers, progress)
        # the bytes equal what the source gives, so a crc32 that differs is the table's fault
        for name in sorted(table):
            got = reader.crc(name)
            if got != table[name]:
                raise VerifyError("checksum", f"{out / MANIFEST_NAME}: records crc32 {table[name]:08x} for "
                                  f"{name}, whose bytes (equal to what the source gives) have {got:08x}; "
                                  f"the manifest was edited. Convert the source again.", tensor=name)
        rep.checks.append(f"the crc32 of {len(table)} expert tensors equal to {MANIFEST_NAME}'s")
    finally:
        reader.close()


def _checksum_table(out: Path, manifest: dict, expected: dict) -> dict[str, int]:
    """The manifest's crc32 of every expert tensor (what the loader checks), complete."""
    where = out / MANIFEST_NAME
    table = expert_checksums(manifest)
    if table is None:
        raise VerifyError("checksum", f"{where} records no crc32 of the expert tensors (an mxfp4conv "
                          f"that did not record them wrote it), so loaders cannot check the bytes "
                          f"they read. Convert the source again.")
    missing, extra = sorted(set(expected) - set(table)), sorted(set(table) - set(expected))
    if missing or extra:
        what = f"lacks {missing[0]}" if missing else f"names {extra[0]}, which is not an expert tensor"
        raise VerifyError("checksum", f"{where}: its crc32 table {what}; it was edited or belongs to "
                          f"another conversion. Convert the source again.", tensor=(missing or extra)[0])
    return table


def _check_recorded_checksums(out: Path, shards: list[str], table: dict[str, int]) -> str:
    """Recompute every tensor's crc32 and every shard's checksum and compare them with the
    manifest's crc32 table and the checksums convert recorded when it wrote each shard: proves
    the bytes unchanged since, without the source."""
    from mxfp4conv.convert.run import PROGRESS_NAME, finished_record
    from mxfp4conv.convert.writer import shard_crcs

    p = out / PROGRESS_NAME
    record = None
    finished = finished_record(out).get("shards")
    if not p.is_file() and finished:  # a finished conversion's record, in the index
        p = out / INDEX_NAME
        record = finished
    elif p.is_file():
        try:
            record = json.loads(p.read_text()).get("shards")
        except (OSError, ValueError, AttributeError, RecursionError):
            record = None
        if not isinstance(record, dict):
            raise VerifyError("checksum", f"{p}: the record of shard checksums is not readable; it was "
                              f"damaged after the conversion. Convert again, or verify with --source.")
    for s in shards:
        got, _, crcs = shard_crcs(out / s)
        for name, crc in crcs.items():
            if name in table and table[name] != crc:
                raise VerifyError("checksum", f"{out / s}: tensor {name} has crc32 {crc:08x}, but "
                                  f"{MANIFEST_NAME} records {table[name]:08x}: its bytes changed since "
                                  f"convert wrote them. Copy or convert it again; verify --source names "
                                  f"the first differing byte.", shard=s, tensor=name)
        if record is None:
            continue
        rec = record.get(s)
        want = rec.get("checksum") if isinstance(rec, dict) else None
        if not isinstance(want, str):
            raise VerifyError("checksum", f"{out / s}: no checksum recorded for this shard in {p.name}; "
                              f"it was not written by this conversion. Convert again.", shard=s)
        if got != want:
            raise VerifyError("checksum", f"{out / s}: the shard's bytes changed since convert wrote it "
                              f"(checksum {got} differs from the recorded {want}). Copy or convert it "
                              f"again; verify --source names the first differing byte.", shard=s)
    if record is None:
        return (f"expert tensors' crc32 equal to {MANIFEST_NAME}'s; other tensors not checked "
                f"(no shard checksums recorded in {INDEX_NAME} or {PROGRESS_NAME})")
    return f"{len(shards)} shard checksums equal to the ones recorded at conversion, expert crc32 to {MANIFEST_NAME}'s"


def expected_expert_specs(manifest: dict) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every expert tensor a manifest implies: name -> (dtype, shape)."""
    from mxfp4conv.shuffle.layouts import get_layout

    g = _geometry(manifest)
    canonical = g.canonical_shapes()
    moe = manifest["moe"]
    layouts = {k: get_layout(manifest["layout"][f]) for k, f in LAYOUT_FIELD.items()}
    stored = {k: stored_shape(k, canonical, layouts)
              for k in expert_kinds(bool(moe.get("has_bias")), bool(moe.get("static_input_scales")))}
    return {expert_tensor_name(prefix, r, k): spec
            for prefix in moe["layers"] for r in g.ranks() for k, spec in stored.items()}


def _geometry(manifest: dict) -> RankGeometry:
    m, t = manifest["moe"], manifest["target"]
    return RankGeometry(hidden=m["hidden"], hidden_padded=m["hidden_padded"], intermediate=m["intermediate"],
                        inter_rank=m["intermediate_per_rank"], inter_rank_padded=m["intermediate_per_rank_padded"],
                        num_experts=m["num_experts"], experts_per_rank=m["experts_per_rank"], tp=t["tp"],
                        ep=bool(t["ep"]), scale_pad=int(manifest.get("pad_bytes", {}).get("scale", 0)),
                        placement=str((t.get("parallel") or {}).get("placement", "linear")))


def _check_index_and_headers(out: Path, manifest: dict):
    p = out / INDEX_NAME
    try:
        index = strict_json.loads(p.read_bytes(), str(p), "index", "Convert again.")
        weight_map = index["weight_map"]
        total = index["metadata"]["total_size"]
        if not isinstance(total, int) or not isinstance(weight_map, dict) \
                or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map must map names to shard files and total_size be an integer")
    except (OSError, KeyError, TypeError, CheckpointError) as exc:
        raise VerifyError("index", f"{p}: missing or malformed ({exc}). Convert again.") from None
    shards = sorted(set(weight_map.values()))
    for i, s in enumerate(shards):
        m = SHARD_RE.match(s)
        if not m or int(m.group(1)) != i + 1 or int(m.group(2)) != len(shards):
            raise VerifyError("index", f"{p}: shard names {shards} do not follow model-NNNNN-of-NNNNN.safetensors "
                              f"numbered 1..{len(shards)}.")
    headers = {}
    data = 0
    for s in shards:
        h = read_header(out / s)
        headers[s] = h
        md = h.metadata
        if md.get("format") != "pt":
            raise VerifyError("header", f"{out / s}: __metadata__ lacks \"format\": \"pt\".", shard=s)
        try:
            stamped = json.loads(md.get("mxfp4conv", ""))
        except (ValueError, RecursionError):
            stamped = None
        if stamped != stamped_part(manifest):
            raise VerifyError("header", f"{out / s}: the manifest stamped in __metadata__ differs from "
                              f"{MANIFEST_NAME}; shards from different conversions are mixed.", shard=s)
        for name in h.tensors:
            if weight_map.get(name) != s:
                raise VerifyError("index", f"{out / s}: tensor {name} is not mapped to this shard by the index.",
                                  tensor=name, shard=s)
        if h.file_size != h.data_start + h.data_bytes:
            raise VerifyError("header", f"{out / s}: file is {h.file_size} bytes but its header accounts "
                              f"for {h.data_start + h.data_bytes}.", shard=s)
        data += h.data_bytes
    for name, s in weight_map.items():
        if name not in headers[s].tensors:
            raise VerifyError("index", f"{p}: maps {name} to {s}, whose header lacks it.", tensor=name, shard=s)
    if data != total:
        raise VerifyError("index", f"{p}: total_size {total} differs from the shards' {data} data bytes.")
    return weight_map, headers


# ---- with the source -----------------------------------------------------------------------

def _verify_against_source(out, source, manifest, weight_map, expected, reader, rep, workers, progress) -> None:
    from mxfp4conv.checkpoint import load_model, open_source
    from mxfp4conv.oracle import decide
    src = open_source(source) if isinstance(source, (str, os.PathLike)) else source
    model = load_model(src)
    target = target_from_manifest(manifest)
    recorded = manifest.get("source") if isinstance(manifest.get("source"), dict) else {}
    t = manifest.get("target") if isinstance(manifest.get("target"), dict) else {}
    if recorded.get("family") not in (None, model.family) or \
            recorded.get("quant_scheme") not in (None, model.quant_scheme):
        origin = recorded.get("path") or recorded.get("repo") or "the checkpoint it was converted from"
        raise VerifyError("manifest", f"{out} is {recorded.get('family')} ({recorded.get('quant_scheme')}) "
                          f"for {t.get('arch')}, the source is {model.family} ({model.quant_scheme}): verify it "
                          f"against {origin}.")
    want = build_manifest(src, model, decide(model, target), target)
    for section in ("moe", "target", "layout", "pad_bytes", "runtime_env"):  # the geometry says most
        if want.get(section) != manifest.get(section):
            raise VerifyError("manifest", f"{out / MANIFEST_NAME}: converting this source for the recorded "
                              f"target gives another {section}: {_differences(manifest.get(section), want.get(section))}. "
                              f"Verify against the checkpoint it was converted from, or convert again.")
    if want["source"]["sha256"] != manifest["source"]["sha256"]:
        raise VerifyError("manifest", f"{out / MANIFEST_NAME}: it was converted from a source whose index "
                          f"hash is {manifest['source']['sha256']}, not this one ({want['source']['sha256']}).")
    rep.checks.append("manifest matches source and target")

    expert_src = model.expert_tensor_names()
    plain = [n for n in src.tensor_names() if n not in expert_src]
    want_names = set(plain) | set(expected)
    have = set(weight_map)
    if want_names != have:
        extra, missing = sorted(have - want_names), sorted(want_names - have)
        raise VerifyError("tensor set", f"{out}: tensor set differs from the plan: missing {missing[:5]}, "
                          f"unexpected {extra[:5]}.", tensor=(missing or extra)[0])
    for name in plain:
        info = src.tensor_info(name)
        _, e = reader.entry(name)
        if e.dtype != info.dtype or tuple(e.shape) != tuple(info.shape) or e.nbytes != info.nbytes:
            raise VerifyError("header", f"{out}: tensor {name} is {e.dtype} {list(e.shape)}, the source has "
                              f"{info.dtype} {list(info.shape)}.", tensor=name)

    g = _geometry(manifest)
    chunk = chunk_budget(workers, CHUNK_BYTES)
    layer_checks = [_LayerCheck(src, manifest, g, layer, expected, reader) for layer in model.layers]
    total = sum(src.tensor_info(n).nbytes for n in plain) + sum(c.total for c in layer_checks)

    ahead = DirectReader(src)  # its own descriptors, for readahead only

    def jobs():
        # the bytes a job compares are asked for when it is queued, a queue's length ahead
        for name in plain:
            info = src.tensor_info(name)
            for off in range(0, info.nbytes, chunk):
                n = min(chunk, info.nbytes - off)
                ahead.prefetch([(info.shard, info.begin + off, n)])
                reader.prefetch([(name, off, n)])
                yield "plain", name, (info, off, n)
        for i, check in enumerate(layer_checks):
            yield "tail", i, None
            for experts in check.spans(chunk):
                ahead.prefetch(check.source_ranges(experts))
                reader.prefetch(check.out_pieces(experts))
                yield "experts", i, experts

    def work(job):
        what, key, arg = job
        if what == "plain":
            return _compare_plain(out, reader, src, *arg)
        if what == "tail":
            return layer_checks[key].check_tails()
        return layer_checks[key].check(arg)

    per_layer = [0] * len(layer_checks)
    compared_plain = 0
    bar = Progress(total, progress, label="verifying")
    try:
        # jobs are consumed in order, so the error reported is the first in checkpoint order;
        # torch only where a layer has no numpy path (importing it costs seconds)
        with one_torch_thread(load=not all(c.numpy for c in layer_checks)), \
                OrderedPool(workers, name="mxfp4conv-verify") as pool:
            for (what, key, _), n in pool.map(work, jobs()):
                if what == "plain":
                    compared_plain += n
                elif what == "experts":
                    per_layer[key] += n
                bar.advance(n)
    finally:
        bar.close()
        ahead.close()
    rep.bytes_compared += compared_plain
    rep.checks.append(f"{len(plain)} non-expert tensors byte-identical")
    for layer, n in zip(model.layers, per_layer):
        rep.bytes_compared += n
        rep.layers.append({"prefix": layer.prefix, "status": "ok", "bytes": n})
    rep.checks.append(f"{len(model.layers)} MoE layers equal to the source through their layouts")


def _compare_plain(out, reader, src, info, off: int, n: int) -> int:
    a = reader.read(info.name, off, n)
    b = src.read_range(info.shard, info.begin + off, n)
    if a != b:
        first = off + _first_difference(a, b)
        raise VerifyError("tensor bytes", f"{out}: tensor {info.name} differs from the source, first at byte "
                          f"offset {first}.", tensor=info.name, offset=first)
    return n


class _LayerCheck:
    """One MoE layer: the stored bytes of every rank tensor against the source put through the
    canonical per-rank build (``rank_tensors.build_chunk`` from ``read_expert``, not the
    converter's direct reader) and the layout's forward transform. Both are exact permutations
    of the canonical bytes, so equal bytes prove that inverting the layout gives the source
    back; a difference is then located by inverting the layout (canonical position, data or
    padding)."""

    def __init__(self, src, manifest, g: RankGeometry, layer, expected, reader):
        from mxfp4conv.shuffle.layouts import get_layout

        self.src, self.g, self.layer, self.reader = src, g, layer, reader
        self.canonical = g.canonical_shapes()
        self.kinds = tuple(k for k in EXPERT_KINDS if expert_tensor_name(layer.prefix, 0, k) in expected)
        self.layouts = {k: get_layout(manifest["layout"][LAYOUT_FIELD[k]]) for k in WEIGHT_KINDS}
        self.per_expert = {}  # kind -> (bytes per expert, trailing pad bytes, body bytes)
        for k in self.kinds:
            total = math.prod(expected[expert_tensor_name(layer.prefix, 0, k)][1])
            tail = 0
            if k in WEIGHT_KINDS:
                tail = int(self.layouts[k].tail_bytes(self.canonical[k]))
            else:
                total *= 4  # float32
            body = total - tail
            if body % g.experts_per_rank:
                raise VerifyError("layout", f"layout {self.layouts[k].name} of {k} is not per-expert ({body} "
                                  f"bytes for {g.experts_per_rank} experts).")
            self.per_expert[k] = (body // g.experts_per_rank, tail, body)
        self.total = sum(body for _, _, body in self.per_expert.values()) * g.tp
        # numpy layout paths: checked without torch
        self.numpy = all(self.layouts[k].forward_np is not None for k in self.kinds if k in WEIGHT_KINDS)

    def spans(self, chunk_bytes: int):
        g = self.g
        per = sum(v[0] for v in self.per_expert.values()) * (1 if g.ep else g.tp)
        yield from g.chunks(max(1, chunk_bytes // max(per, 1)))

    def source_ranges(self, experts: range) -> list[tuple[str, int, int]]:
        """``(shard, offset, nbytes)`` of the source bytes ``check(experts)`` reads (per-expert layers)."""
        if self.layer.experts is None:
            return []
        return [(i.shard, i.begin, i.nbytes) for e in experts for ref in self.layer.experts[e].refs()
                for i in (self.src.tensor_info(ref.name),)]

    def out_pieces(self, experts: range) -> list[tuple[str, int, int]]:
        """``(tensor, offset, nbytes)`` of the stored bytes ``check(experts)`` reads."""
        g, out = self.g, []
        for r in g.owner(experts[0]):
            local0 = g.local_index(r, experts[0])
            for k in self.kinds:
                pe = self.per_expert[k][0]
                out.append((expert_tensor_name(self.layer.prefix, r, k), local0 * pe, len(experts) * pe))
        return out

    def check_tails(self) -> int:
        """The trailing shuffle padding of each rank's tensors (not counted as compared)."""
        prefix = self.layer.prefix
        for r in self.g.ranks():
            for k in WEIGHT_KINDS:
                _, tail, body = self.per_expert[k]
                if tail:
                    name = expert_tensor_name(prefix, r, k)
                    t = np.frombuffer(self.reader.read(name, body, tail), dtype=np.uint8)
                    bad = np.flatnonzero(t != SHUFFLE_PAD_BYTE)
                    if bad.size:
                        raise VerifyError("pad bytes", f"{name}: trailing layout padding byte at offset "
                                          f"{body + int(bad[0])} is 0x{int(t[bad[0]]):02X}, expected 0x7F.",
                                          layer=prefix, rank=r, tensor=name, offset=body + int(bad[0]))
        return 0

    def check(self, experts: range) -> int:
        if not self.numpy:
            return self._check_torch(experts)

        def differs(name, k, r, local0, got, want):
            try:
                self._check_torch(experts)  # names the first difference in canonical coordinates
            except ImportError:  # no torch: the byte offset below
                pass
            off = local0 * self.per_expert[k][0] + _first_difference(got, want)
            how = f"through the layout {self.layouts[k].name}" if k in WEIGHT_KINDS else "as float32"
            raise VerifyError("expert bytes", f"MoE layer {self.layer.prefix}, rank {r}, tensor {name}: byte "
                              f"{off} differs from the source {how}.", layer=self.layer.prefix, rank=r,
                              tensor=name, offset=off)

        from mxfp4conv.checkpoint.experts import read_expert_np

        data = [read_expert_np(self.src, self.layer, e) for e in experts]
        return self._compare(
            experts, data, build_chunk_np,
            lambda k, c: as_bytes(self.layouts[k].forward_np(c) if k in WEIGHT_KINDS else c), differs)

    def _check_torch(self, experts: range) -> int:
        from mxfp4conv.checkpoint.experts import read_expert

        data = [read_expert(self.src, self.layer, e) for e in experts]
        return self._compare(
            experts, data, build_chunk,
            lambda k, c: as_bytes(self.layouts[k].forward_chunk(c) if k in WEIGHT_KINDS else c),
            lambda name, k, r, local0, got, want: self._locate(name, k, r, local0, data, got, want, experts))

    def _compare(self, experts: range, data: list, build, stored_form, differs) -> int:
        """The stored bytes of ``experts`` on every rank that holds them against ``stored_form`` of the
        chunk ``build`` makes from the source ``data``; ``differs`` is called on a mismatch."""
        g, prefix = self.g, self.layer.prefix
        compared = 0
        for r in g.owner(experts[0]):
            local0 = g.local_index(r, experts[0])
            chunk = build(data, g, r, self.kinds)
            for k in self.kinds:
                name = expert_tensor_name(prefix, r, k)
                pe = self.per_expert[k][0]
                got = self.reader.read(name, local0 * pe, len(data) * pe)
                want = stored_form(k, chunk[k])
                if got != want:
                    differs(name, k, r, local0, got, want)
                compared += len(got)
        return compared

    def _locate(self, name, k, r, local0, data, got, want, e0) -> None:
        """Raise the error that names the first difference in canonical coordinates."""
        g, prefix = self.g, self.layer.prefix
        pe = self.per_expert[k][0]
        if k in WEIGHT_KINDS:
            _check_weight_chunk(name, k, self.layouts[k], pe, self.canonical[k], g, r, local0, data,
                                self.reader, prefix, e0)
        else:
            _check_float_chunk(name, k, self.canonical[k], g, r, local0, data, self.reader, prefix, e0)
        off = local0 * pe + _first_difference(got, want)
        how = f"through the layout {self.layouts[k].name}" if k in WEIGHT_KINDS else "as float32"
        raise VerifyError("expert bytes", f"MoE layer {prefix}, rank {r}, tensor {name}: byte {off} differs "
                          f"from the source {how}.", layer=prefix, rank=r, tensor=name, offset=off)


def _differences(have, want, prefix: str = "", limit: int = 3) -> str:
    """The first few keys where two manifest sections differ, as ``key is X here, Y for the source``."""
    out: list[str] = []

    def walk(a, b, path):
        if len(out) >= limit:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                walk(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        elif a != b:
            out.append(f"{path or 'it'} is {a!r} in the output, {b!r} for this source")

    walk(have, want, prefix)
    return "; ".join(out)


def _first_difference(a, b) -> int:
    """Offset of the first differing byte of two equally long byte strings."""
    x, y = np.frombuffer(a, dtype=np.uint8), np.frombuffer(b, dtype=np.uint8)
    return int(np.flatnonzero(x != y)[0])


def _fail(cls, layer, rank, name, e_global, coord, got, want, what):
    return VerifyError(cls, f"MoE layer {layer}, rank {rank}, tensor {name}: expert {e_global}, "
                       f"canonical (pre-layout) position {coord}: stored {got}, expected {want} ({what}).",
                       layer=layer, rank=rank, tensor=name, expert=e_global, offset=list(coord))


def _check_weight_chunk(name, kind, lay, pe, cshape, g, r, local0, data, reader, prefix, e0) -> int:
    n = len(data)
    raw = reader.read(name, local0 * pe, n * pe)
    y = torch.frombuffer(raw, dtype=torch.uint8)
    shape = (n, *cshape[1:])
    full = torch.cat([y, torch.full((int(lay.tail_bytes(shape)),), SHUFFLE_PAD_BYTE, dtype=torch.uint8)])
    x = lay.inverse(full.reshape(tuple(lay.out_shape(shape))), shape).reshape(shape)
    again = lay.forward_chunk(x).reshape(-1)
    if not torch.equal(again, y):
        i = int((again != y).nonzero()[0, 0]) if again.numel() == y.numel() else 0
        raise VerifyError("pad bytes", f"MoE layer {prefix}, rank {r}, tensor {name}: byte {local0 * pe + i} "
                          f"is not what the layout {lay.name} produces from its own inverse (padding the "
                          f"layout adds must be 0x7F).", layer=prefix, rank=r, tensor=name,
                          offset=local0 * pe + i)
    H, I, Ip = g.hidden, g.intermediate, g.inter_rank_padded
    sl = g.inter_slice(r)
    ir = sl.stop - sl.start
    w13 = kind.startswith("w13")
    div = 2 if kind.endswith("weight") else 32
    pad = g.weight_pad if kind.endswith("weight") else g.scale_pad
    expect_pad = torch.ones(x.shape[1:], dtype=torch.bool)
    for i, ex in enumerate(data):
        xi = x[i]
        if w13:
            src = ex.w13 if div == 2 else ex.w13_scale
            regions = [((slice(0, ir), slice(0, H // div)), src[sl.start:sl.stop]),
                       ((slice(Ip, Ip + ir), slice(0, H // div)), src[I + sl.start:I + sl.stop])]
        else:
            src = ex.w2 if div == 2 else ex.w2_scale
            regions = [((slice(0, H), slice(0, ir // div)), src[:, sl.start // div:sl.stop // div])]
        mask = expect_pad.clone()
        for (rs, cs), want in regions:
            got = xi[rs, cs]
            if not torch.equal(got, want):
                rr, cc = (got != want).nonzero()[0].tolist()
                raise _fail("expert bytes", prefix, r, name, e0[i], (rr + rs.start, cc),
                            f"0x{int(got[rr, cc]):02X}", f"0x{int(want[rr, cc]):02X}", "source data")
            mask[rs, cs] = False
        bad = (xi != pad) & mask
        if bad.any():
            rr, cc = bad.nonzero()[0].tolist()
            raise _fail("pad bytes", prefix, r, name, e0[i], (rr, cc), f"0x{int(xi[rr, cc]):02X}",
                        f"0x{pad:02X}", "padding vLLM allocates")
    return n * pe


def _check_float_chunk(name, kind, cshape, g, r, local0, data, reader, prefix, e0) -> int:
    n = len(data)
    per = 4 * math.prod(cshape[1:])
    x = torch.frombuffer(reader.read(name, local0 * per, n * per), dtype=torch.float32).reshape(n, *cshape[1:])
    H, I, Ip = g.hidden, g.intermediate, g.inter_rank_padded
    sl = g.inter_slice(r)
    ir = sl.stop - sl.start
    for i, ex in enumerate(data):
        if kind == "w13_bias":
            want = torch.zeros(2 * Ip)
            want[:ir] = ex.w13_bias[sl]
            want[Ip:Ip + ir] = ex.w13_bias[I + sl.start:I + sl.stop]
        elif kind == "w2_bias":
            want = torch.zeros(cshape[1])
            if g.ep or r == 0:
                want[:H] = ex.w2_bias
        else:
            want = torch.tensor(float(getattr(ex, kind)), dtype=torch.float32)
        got = x[i]
        if not torch.equal(got.view(torch.int32), want.to(torch.float32).view(torch.int32)):
            j = int((got.view(torch.int32) != want.view(torch.int32)).reshape(-1).nonzero()[0, 0])
            raise _fail("expert bytes", prefix, r, name, e0[i], (j,), float(got.reshape(-1)[j]),
                        float(want.reshape(-1)[j]), "bias / input scale")
    return n * per
