"""``verify``: prove a converted checkpoint right, structurally and (with the source) byte by byte.

Without the source: manifest, index and every shard header (names, dtypes, shapes, sizes,
``__metadata__``) against what the manifest implies. With the source: the output plan is
rebuilt from the source and the manifest's target and compared tensor by tensor; every
expert tensor is inverted (layout inverse, pad bytes checked exactly, un-padded, ranks
re-stacked) and compared with the source bytes; every other tensor is compared by hash.
Stops at the first mismatch with its layer, rank, tensor and offset.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mxfp4conv.checkpoint.safetensors_io import pread_exact, read_header
from mxfp4conv.checkpoint.source import INDEX_NAME
from mxfp4conv.convert.manifest import (
    EXPERT_KINDS, MANIFEST_NAME, SHUFFLE_PAD_BYTE, build_manifest, load_manifest, target_from_manifest,
)
from mxfp4conv.convert.plan import LAYOUT_FIELD, SHARD_RE, expert_kinds, expert_tensor_name, stored_shape
from mxfp4conv.convert.rank_tensors import WEIGHT_KINDS, RankGeometry
from mxfp4conv.errors import CheckpointError, Mxfp4convError

HASH_CHUNK = 32 << 20


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

    def __init__(self, root: Path, weight_map: dict[str, str], headers: dict):
        self.root = root
        self.weight_map = weight_map
        self.headers = headers
        self.fds = {}

    def entry(self, name: str):
        h = self.headers[self.weight_map[name]]
        return h, h.tensors[name]

    def read(self, name: str, offset: int, n: int) -> bytearray:
        shard = self.weight_map[name]
        h, e = self.entry(name)
        if shard not in self.fds:
            self.fds[shard] = os.open(self.root / shard, os.O_RDONLY)
        return pread_exact(self.fds[shard], h.data_start + e.begin + offset, n)

    def close(self):
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


def verify(out, source=None) -> VerifyReport:
    """Check ``out``; with ``source`` (spec or Source) compare every byte. Raises
    ``VerifyError`` on the first mismatch (the report is attached as ``exc.report``)."""
    out = Path(out)
    rep = VerifyReport(out=str(out), source=None if source is None else str(getattr(source, "spec", source)))
    try:
        _verify(out, source, rep)
    except VerifyError as exc:
        rep.error = {"class": exc.cls, "message": str(exc), **exc.where}
        exc.report = rep
        raise
    rep.ok = True
    return rep


def _verify(out: Path, source, rep: VerifyReport) -> None:
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
    if source is None:
        rep.layers = [{"prefix": p, "status": "structure ok"} for p in manifest["moe"]["layers"]]
        return
    reader = _OutReader(out, weight_map, headers)
    try:
        _verify_against_source(out, source, manifest, weight_map, expected, reader, rep)
    finally:
        reader.close()


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
                        ep=bool(t["ep"]), scale_pad=int(manifest.get("pad_bytes", {}).get("scale", 0)))


def _check_index_and_headers(out: Path, manifest: dict):
    p = out / INDEX_NAME
    try:
        index = json.loads(p.read_text())
        weight_map = index["weight_map"]
        total = int(index["metadata"]["total_size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
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
        except ValueError:
            stamped = None
        if stamped != manifest:
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

def _verify_against_source(out, source, manifest, weight_map, expected, reader, rep) -> None:
    from mxfp4conv.checkpoint import load_model, open_source
    from mxfp4conv.oracle import decide
    src = open_source(source) if isinstance(source, (str, os.PathLike)) else source
    model = load_model(src)
    target = target_from_manifest(manifest)
    want = build_manifest(src, model, decide(model, target), target)
    for section in ("target", "layout", "moe", "pad_bytes", "runtime_env"):
        if want.get(section) != manifest.get(section):
            raise VerifyError("manifest", f"{out / MANIFEST_NAME}: section {section!r} is {manifest.get(section)} "
                              f"but converting this source for that target gives {want.get(section)}.")
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
        if _hash_out(reader, name, e.nbytes) != _hash_src(src, info):
            off = _first_diff_plain(reader, src, info)
            raise VerifyError("tensor bytes", f"{out}: tensor {name} differs from the source, first at byte "
                              f"offset {off}.", tensor=name, offset=off)
        rep.bytes_compared += e.nbytes
    rep.checks.append(f"{len(plain)} non-expert tensors byte-identical (sha256)")

    g = _geometry(manifest)
    for layer in model.layers:
        n = _verify_layer(src, manifest, g, layer, expected, reader)
        rep.bytes_compared += n
        rep.layers.append({"prefix": layer.prefix, "status": "ok", "bytes": n})
    rep.checks.append(f"{len(model.layers)} MoE layers inverted and equal to the source")


def _hash_out(reader, name, n) -> str:
    h = hashlib.sha256()
    for off in range(0, n, HASH_CHUNK):
        h.update(reader.read(name, off, min(HASH_CHUNK, n - off)))
    return h.hexdigest()


def _hash_src(src, info) -> str:
    h = hashlib.sha256()
    for off in range(0, info.nbytes, HASH_CHUNK):
        h.update(src.read_range(info.shard, info.begin + off, min(HASH_CHUNK, info.nbytes - off)))
    return h.hexdigest()


def _first_diff_plain(reader, src, info) -> int:
    for off in range(0, info.nbytes, HASH_CHUNK):
        k = min(HASH_CHUNK, info.nbytes - off)
        a = torch.frombuffer(reader.read(info.name, off, k), dtype=torch.uint8)
        b = torch.frombuffer(src.read_range(info.shard, info.begin + off, k), dtype=torch.uint8)
        d = (a != b).nonzero()
        if d.numel():
            return off + int(d[0, 0])
    return -1


def _verify_layer(src, manifest, g: RankGeometry, layer, expected, reader) -> int:
    from mxfp4conv.checkpoint.experts import read_expert
    from mxfp4conv.shuffle.layouts import get_layout

    canonical = g.canonical_shapes()
    kinds = [k for k in EXPERT_KINDS if expert_tensor_name(layer.prefix, 0, k) in expected]
    layouts = {k: get_layout(manifest["layout"][LAYOUT_FIELD[k]]) for k in WEIGHT_KINDS}
    per_expert = {}
    for k in WEIGHT_KINDS:
        total = math.prod(expected[expert_tensor_name(layer.prefix, 0, k)][1])
        tail = int(layouts[k].tail_bytes(canonical[k]))
        body = total - tail
        if body % g.experts_per_rank:
            raise VerifyError("layout", f"layout {layouts[k].name} of {k} is not per-expert ({body} bytes "
                              f"for {g.experts_per_rank} experts).")
        per_expert[k] = (body // g.experts_per_rank, tail, body)
    per = sum(v[0] for v in per_expert.values()) * (1 if g.ep else g.tp)
    chunk_experts = max(1, (48 << 20) // max(per, 1))
    compared = 0
    # trailing shuffle padding of each rank's tensors
    for r in g.ranks():
        for k in WEIGHT_KINDS:
            pe, tail, body = per_expert[k]
            if tail:
                name = expert_tensor_name(layer.prefix, r, k)
                t = torch.frombuffer(reader.read(name, body, tail), dtype=torch.uint8)
                bad = (t != SHUFFLE_PAD_BYTE).nonzero()
                if bad.numel():
                    raise VerifyError("pad bytes", f"{name}: trailing layout padding byte at offset "
                                      f"{body + int(bad[0, 0])} is 0x{int(t[bad[0, 0]]):02X}, expected 0x7F.",
                                      layer=layer.prefix, rank=r, tensor=name, offset=body + int(bad[0, 0]))
    spans = [g.expert_range(r) for r in g.ranks()] if g.ep else [range(g.num_experts)]
    for span in spans:
        for a in range(span.start, span.stop, chunk_experts):
            experts = range(a, min(a + chunk_experts, span.stop))
            data = [read_expert(src, layer, e) for e in experts]
            for r in g.owner(a):
                local0 = experts.start - g.expert_range(r).start
                for k in kinds:
                    name = expert_tensor_name(layer.prefix, r, k)
                    if k in WEIGHT_KINDS:
                        compared += _check_weight_chunk(name, k, layouts[k], per_expert[k][0], canonical[k],
                                                        g, r, local0, data, reader, layer.prefix, experts.start)
                    else:
                        compared += _check_float_chunk(name, k, canonical[k], g, r, local0, data, reader,
                                                       layer.prefix, experts.start)
    return compared


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
                raise _fail("expert bytes", prefix, r, name, e0 + i, (rr + rs.start, cc),
                            f"0x{int(got[rr, cc]):02X}", f"0x{int(want[rr, cc]):02X}", "source data")
            mask[rs, cs] = False
        bad = (xi != pad) & mask
        if bad.any():
            rr, cc = bad.nonzero()[0].tolist()
            raise _fail("pad bytes", prefix, r, name, e0 + i, (rr, cc), f"0x{int(xi[rr, cc]):02X}",
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
            raise _fail("expert bytes", prefix, r, name, e0 + i, (j,), float(got.reshape(-1)[j]),
                        float(want.reshape(-1)[j]), "bias / input scale")
    return n * per
