"""Seeded mutational fuzzing of every parser and command input, with an oracle per target.

Each target mutates one kind of input (a shard header, an index, a config, one config field,
a manifest, the bytes of a converted or a source shard, a resume into an output directory, an
expert byte a loader reads, a command line), runs the code that reads it and classifies the
outcome:

- ``ok``: accepted, and the result passed the target's correctness checks;
- ``refused``: the project's own error (CLI: exit 1 with one ``error:`` paragraph, or a usage
  error, exit 2);
- ``crash``: any other exception, or a traceback on the CLI;
- ``hang``: the input took longer than the time limit;
- ``silent``: accepted although the oracle says it must be refused, a correctness check
  failed, the source changed, or a file under a final output name is incomplete.

Used by tests/test_fuzz.py (a few hundred inputs) and benchmarks/fuzz_long.py (10,000+).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import math
import os
import random
import shutil
import signal
import struct
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from mxfp4conv.errors import Mxfp4convError

GEOMETRY = dict(hidden=64, intermediate=64, num_experts=4, top_k=2, num_layers=1, vocab=32)
FAMILIES = (("kimi_k3", None), ("deepseek_v4", None), ("quark", "w_mxfp4"), ("gpt_oss", None))

HOSTILE = [None, True, False, -1, 0, 1, 1.5, -0.0, 2 ** 31, 2 ** 64, 10 ** 30, 1e308, -1e308, "", "abc",
           "-1", "1", "silu", "fp4", [], [1], ["a"], [[[]]], {}, {"a": 1}, {"dtype": "U8"}, "x" * 300]
NAN_TOKENS = ("NaN", "Infinity", "-Infinity")


class Hang(BaseException):
    """Raised by the alarm: the input ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float):
    def fire(signum, frame):
        raise Hang()
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclass
class Outcome:
    kind: str  # ok | refused | crash | hang | silent
    detail: str = ""


class Silent(Exception):
    """An oracle's verdict: accepted but must not be (or the accepted result is wrong)."""


def digest(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir" if p.is_dir() else "special"
    return out


# ---- mutators ---------------------------------------------------------------------------------

def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):
            yield from _paths(v, prefix + (i,))


def mutate_json(obj, rng: random.Random, *, prefer: list[tuple] | None = None) -> tuple[str, str]:
    """A mutated JSON text of ``obj``; returns (text, what was done)."""
    obj = copy.deepcopy(obj)
    paths = [p for p in _paths(obj) if p]
    if prefer and rng.random() < 0.6:
        paths = [p for p in paths if any(p[-len(q):] == q for q in prefer)] or paths
    op = rng.choice(["replace", "replace", "replace", "delete", "add", "nan", "dup", "deep", "text"])
    if not paths or op == "text":
        text = json.dumps(obj)
        i = rng.randrange(len(text) + 1)
        cut = rng.choice(["truncate", "flip", "insert"])
        if cut == "truncate":
            return text[:i], "truncated text"
        if cut == "flip" and text:
            i = min(i, len(text) - 1)
            return text[:i] + chr((ord(text[i]) + rng.randrange(1, 95)) % 95 + 32) + text[i + 1:], "flipped char"
        return text[:i] + rng.choice(['"', "{", "]", ",", "\\", "\x00", "\u00e9"]) + text[i:], "inserted char"
    path = rng.choice(paths)
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    where = "/".join(map(str, path))
    if op == "replace":
        parent[key] = copy.deepcopy(rng.choice(HOSTILE))
        return json.dumps(obj), f"{where} = {json.dumps(parent[key])[:40]}"
    if op == "delete":
        del parent[key]
        return json.dumps(obj), f"deleted {where}"
    if op == "add" and isinstance(parent, dict):
        parent[f"extra{rng.randrange(9)}"] = copy.deepcopy(rng.choice(HOSTILE))
        return json.dumps(obj), f"added a key next to {where}"
    if op == "deep":  # written as text: json.dumps itself cannot nest this deep
        d = rng.choice([70, 500, 1200])
        parent[key] = "\x01DEEP\x01"
        return json.dumps(obj).replace(json.dumps(parent[key]), "[" * d + "1" + "]" * d), f"{where} nested {d} deep"
    if op == "dup" and isinstance(parent, dict):
        text = json.dumps(parent)
        dup = json.dumps({key: rng.choice(HOSTILE)})[1:-1]
        new_parent = "{" + dup + ", " + text[1:] if len(text) > 2 else "{" + dup + "}"
        marker = "\x01MARK\x01"
        holder = obj
        for k in path[:-2]:
            holder = holder[k]
        if len(path) == 1:
            return new_parent, f"duplicate key {key!r}"
        holder[path[-2]] = marker
        return json.dumps(obj).replace(json.dumps(marker), new_parent), f"duplicate key {where}"
    token = rng.choice(NAN_TOKENS)
    marker = "\x01NAN\x01"
    parent[key] = marker
    return json.dumps(obj).replace(json.dumps(marker), token), f"{where} = {token}"


def mutate_bytes(raw: bytes, rng: random.Random, hot: int | None = None) -> tuple[bytes, str]:
    """Flip, truncate, extend or overwrite bytes (``hot``: favour the first ``hot`` bytes)."""
    op = rng.choice(["flip", "flip", "truncate", "append", "zero", "prefix"])
    limit = hot if hot and rng.random() < 0.7 else len(raw)
    i = rng.randrange(max(limit, 1))
    if op == "flip" and raw:
        b = bytearray(raw)
        b[i] ^= 1 << rng.randrange(8)
        return bytes(b), f"flipped a bit of byte {i}"
    if op == "truncate":
        return raw[:i], f"truncated to {i} bytes"
    if op == "append":
        return raw + os.urandom(rng.choice([1, 7, 100])), "appended bytes"
    if op == "zero":
        n = rng.choice([1, 8, 64])
        return raw[:i] + b"\0" * n + raw[i + n:], f"zeroed {n} bytes at {i}"
    n = rng.choice([0, 1, 7, 2 ** 20, 2 ** 40, 2 ** 64 - 1])
    return struct.pack("<Q", n) + raw[8:], f"length prefix {n}"


# ---- the checkpoints the targets start from ---------------------------------------------------------

@dataclass
class Corpus:
    base: Path
    sources: dict[str, Path] = field(default_factory=dict)
    converted: Path | None = None
    scratch_n: int = 0

    def scratch(self) -> Path:
        """A fresh working directory for one input (the previous input's is removed)."""
        self.scratch_n += 1
        shutil.rmtree(self.base / "scratch", ignore_errors=True)
        p = self.base / "scratch" / str(self.scratch_n)
        p.mkdir(parents=True)
        return p


def build_corpus(base: Path) -> Corpus:
    from mxfp4conv.checkpoint.synthetic import make_checkpoint
    from mxfp4conv.convert import convert
    from mxfp4conv.oracle import Target

    c = Corpus(base=Path(base))
    for family, scheme in FAMILIES:
        c.sources[family] = make_checkpoint(family, c.base / "src" / family, scheme=scheme, **GEOMETRY)
    c.converted = c.base / "converted"
    convert(str(c.sources["kimi_k3"]), c.converted, Target(arch="gfx950", tp=2), progress="none")
    return c


def inspect_refuses(root: Path) -> bool:
    """``inspect`` reports an error for the source at ``root`` (or refuses to read it)."""
    from mxfp4conv.checkpoint.summary import inspect_source

    try:
        return bool(inspect_source(str(root)).problems.errors)
    except Mxfp4convError:
        return True


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _shards(root: Path) -> list[Path]:
    return sorted(root.glob("model-*.safetensors"))


def _header_obj(raw: bytes) -> dict:
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n])


def _with_header(raw: bytes, text: str) -> bytes:
    n = struct.unpack("<Q", raw[:8])[0]
    hb = text.encode("utf-8", "surrogatepass")
    hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + raw[8 + n:]


def _dupes(text: str) -> bool:
    found = []

    def hook(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            found.append(1)
        return dict(pairs)
    try:
        json.loads(text, object_pairs_hook=hook)
    except (ValueError, RecursionError):
        return False
    return bool(found)


# ---- targets -------------------------------------------------------------------------------------

def t_header(c: Corpus, rng: random.Random) -> None:
    """One source shard's header: read_header, checked against the safetensors library."""
    from safetensors import safe_open

    from mxfp4conv.checkpoint.safetensors_io import read_header

    family = rng.choice(sorted(c.sources))
    shard = rng.choice(_shards(c.sources[family]))
    raw = shard.read_bytes()
    if rng.random() < 0.6:
        text, _ = mutate_json(_header_obj(raw), rng, prefer=[("dtype",), ("shape",), ("data_offsets",),
                                                          ("__metadata__",)])
        data = _with_header(raw, text)
    else:
        n = struct.unpack("<Q", raw[:8])[0]
        data, _ = mutate_bytes(raw, rng, hot=8 + n)
        text = None
    p = c.scratch() / shard.name
    p.write_bytes(data)
    h = read_header(p)
    # accepted: the library that wrote the file must read it the same way, and we never accept
    # what is ambiguous to it (duplicate keys, a non-string metadata map)
    hn = struct.unpack("<Q", data[:8])[0]
    if _dupes(data[8:8 + hn].decode("utf-8", "replace")):
        raise Silent("a header with duplicate keys was accepted")
    try:
        with safe_open(str(p), framework="np") as f:
            keys = set(f.keys())
    except Exception as exc:  # the reference refuses what we accepted
        if "F4" in {e.dtype for e in h.tensors.values()} or "F8_E8M0" in {e.dtype for e in h.tensors.values()}:
            return  # dtypes this safetensors build may not know
        raise Silent(f"accepted a header the safetensors library refuses ({exc})") from None
    if keys != set(h.tensors):
        raise Silent("tensor names differ from the safetensors library's reading")
    if h.data_start + h.data_bytes != len(data):
        raise Silent("accepted a shard whose size does not match its header")


def t_index(c: Corpus, rng: random.Random) -> None:
    """The index: inspect, and convert's own check (load_model) must agree with it."""
    from mxfp4conv.checkpoint.detect import load_model
    from mxfp4conv.checkpoint.source import INDEX_NAME, open_source

    family = rng.choice(sorted(c.sources))
    root = _copy(c.sources[family], c.scratch() / "src")
    index = json.loads((root / INDEX_NAME).read_text())
    names = list(index["weight_map"])
    prefer = [(n,) for n in rng.sample(names, 3)] + [("weight_map",), ("metadata",)]
    if rng.random() < 0.3:  # semantic edits: drop / move / alias tensors
        wm = index["weight_map"]
        n = rng.choice(names)
        op = rng.choice(["drop", "move", "alias"])
        if op == "drop":
            del wm[n]
        elif op == "move":
            wm[n] = rng.choice([s for s in set(wm.values()) if s != wm[n]] or ["model-09999-of-09999.safetensors"])
        else:
            wm[n + ".alias"] = wm[n]
        text = json.dumps(index)
    else:
        text, _ = mutate_json(index, rng, prefer=prefer)
    (root / INDEX_NAME).write_text(text, encoding="utf-8", errors="surrogatepass")
    before = digest(root)
    refused_by_inspect = inspect_refuses(root)
    try:
        src = open_source(str(root))
        load_model(src)
        src.close()
        accepted = True
    except Mxfp4convError:
        accepted = False
    if digest(root) != before:
        raise Silent("the source changed")
    if accepted and refused_by_inspect:
        raise Silent("convert's check accepts an index that inspect calls bad")
    if accepted:
        _check_index_consistent(root)
    return "ok" if accepted else "refused"


def _check_index_consistent(root: Path) -> None:
    from safetensors import safe_open

    text = (root / "model.safetensors.index.json").read_text()
    if _dupes(text):
        raise Silent("an index with duplicate keys was accepted")
    wm = json.loads(text)["weight_map"]
    held = {}
    for s in set(wm.values()):
        with safe_open(str(root / s), framework="np") as f:
            for k in f.keys():
                held[k] = s
    if held != wm:
        raise Silent("accepted an index that does not map every tensor to the shard holding it")


CONFIG_KEYS = [("hidden_size",), ("moe_intermediate_size",), ("intermediate_size",), ("num_experts",),
               ("n_routed_experts",), ("num_local_experts",), ("num_experts_per_tok",),
               ("num_experts_per_token",), ("routed_expert_hidden_size",), ("hidden_act",), ("swiglu_limit",),
               ("activation_situ_beta",), ("activation_situ_linear_beta",), ("quantization_config",),
               ("config_groups",), ("exclude",), ("weight",), ("dtype",), ("format",), ("text_config",),
               ("model_type",), ("first_k_dense_replace",), ("num_hash_layers",), ("expert_dtype",)]


def t_config(c: Corpus, rng: random.Random) -> None:
    """config.json: inspect and load_model agree, and what is accepted is exactly the config."""
    from mxfp4conv.checkpoint.detect import load_model
    from mxfp4conv.checkpoint.source import open_source
    from mxfp4conv.convert.manifest import build_manifest
    from mxfp4conv.format.manifest import manifest_text
    from mxfp4conv.oracle import Target, decide

    family = rng.choice(sorted(c.sources))
    root = _copy(c.sources[family], c.scratch() / "src")
    cfg = json.loads((root / "config.json").read_text())
    text, _ = mutate_json(cfg, rng, prefer=CONFIG_KEYS)
    (root / "config.json").write_text(text, encoding="utf-8", errors="surrogatepass")
    before = digest(root)
    inspect_bad = inspect_refuses(root)
    try:
        src = open_source(str(root))
        model = load_model(src)
    except Mxfp4convError:
        model = None
    if digest(root) != before:
        raise Silent("the source changed")
    if model is None:
        return "refused"
    if inspect_bad:
        raise Silent("convert's check accepts a config that inspect calls bad")
    g = model.geometry
    for v in (g.hidden, g.intermediate, g.num_experts, g.top_k):
        if type(v) is not int or not 0 < v <= 1 << 20:
            raise Silent(f"accepted geometry value {v!r}")
    for v in model.activation.params.values():
        if not isinstance(v, float) or v != v or v in (float("inf"), float("-inf")):
            raise Silent(f"accepted activation parameter {v!r}")
    try:
        d = decide(model, Target(arch="cpu"))
    except Mxfp4convError:
        return "ok"
    manifest_text(build_manifest(src, model, d, Target(arch="cpu")))  # finite JSON or a project error
    src.close()


def t_manifest(c: Corpus, rng: random.Random) -> None:
    """mxfp4conv.json of a converted checkpoint: any change is refused by verify and the loader."""
    from mxfp4conv.convert.verify import verify
    from mxfp4conv.runtime import load_moe_layers

    out = _copy(c.converted, c.scratch() / "out")
    orig = json.loads((out / "mxfp4conv.json").read_text())
    text, _ = mutate_json(orig, rng, prefer=[("tp",), ("layers",), ("hidden",), ("experts_per_rank",),
                                             ("w13",), ("activation",), ("top_k",), ("activation_params",)])
    (out / "mxfp4conv.json").write_text(text, encoding="utf-8", errors="surrogatepass")
    rank = rng.randrange(2)
    try:
        edited = json.loads(text)
        same = edited == orig
    except (ValueError, RecursionError):
        edited, same = None, False
    accepted = []
    for name, run in (("verify", lambda: verify(out)),
                      ("load_moe_layers", lambda: load_moe_layers(out, rank=rank))):
        try:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run()
            accepted.append(name)
        except Mxfp4convError:
            pass
    if accepted == ["load_moe_layers"] and _same_for_rank(edited, orig, rank):
        return "ok"  # only crc32s of the other rank's tensors changed: that load reads none of them
    if accepted and not same:
        raise Silent(f"{' and '.join(accepted)} accepted an edited manifest")
    return "ok" if accepted else "refused"


def _same_for_rank(edited, orig: dict, rank: int) -> bool:
    """``edited`` differs from ``orig`` at most in crc32 values of tensors of ranks but ``rank``."""
    if not isinstance(edited, dict) or {k: v for k, v in edited.items() if k != "checksums"} != \
            {k: v for k, v in orig.items() if k != "checksums"}:
        return False
    table = edited.get("checksums", {}).get("crc32") if isinstance(edited.get("checksums"), dict) else None
    want = orig["checksums"]["crc32"]
    if not isinstance(table, dict) or table.keys() != want.keys() or set(edited["checksums"]) != {"crc32"}:
        return False
    mine = f".experts.rank{rank}."
    return all(table[n] == c for n, c in want.items() if mine in n)


def t_converted_shard(c: Corpus, rng: random.Random) -> None:
    """The bytes of a converted shard: verify refuses every change; the loader never crashes."""
    from mxfp4conv.convert.verify import verify
    from mxfp4conv.runtime import load_moe_layers

    out = _copy(c.converted, c.scratch() / "out")
    shard = rng.choice(_shards(out))
    raw = shard.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    data, _ = mutate_bytes(raw, rng, hot=8 + n if rng.random() < 0.5 else None)
    shard.write_bytes(data)
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_moe_layers(out, rank=rng.randrange(2))
    except Mxfp4convError:
        pass
    try:
        verify(out)
    except Mxfp4convError:
        return "refused"
    if data != raw:
        raise Silent("verify accepted a changed shard")


def t_source_shard(c: Corpus, rng: random.Random, *, convert_share: float = 0.25) -> None:
    """The bytes of a source shard: inspect, and sometimes a whole convert checked by verify."""
    from mxfp4conv.checkpoint.summary import inspect_source
    from mxfp4conv.convert import convert
    from mxfp4conv.convert.verify import verify
    from mxfp4conv.oracle import Target

    family = rng.choice(sorted(c.sources))
    work = c.scratch()
    root = _copy(c.sources[family], work / "src")
    shard = rng.choice(_shards(root))
    raw = shard.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    data, _ = mutate_bytes(raw, rng, hot=8 + n if rng.random() < 0.5 else None)
    shard.write_bytes(data)
    before = digest(root)
    kind = "ok"
    try:
        if inspect_source(str(root)).problems.errors:
            kind = "refused"
    except Mxfp4convError:
        kind = "refused"
    if rng.random() < convert_share:
        out = work / "out"
        try:
            convert(str(root), out, Target(arch=rng.choice(["gfx950", "cpu"]), tp=rng.choice([1, 2])),
                    progress="none")
            ok = True
        except Mxfp4convError:
            ok = False
        if digest(root) != before:
            raise Silent("convert changed the source")
        if ok:
            verify(out, str(root))  # a VerifyError here is a wrong result, reported below
        else:
            check_no_half_written(out)
        kind = "ok" if ok else "refused"
    if digest(root) != before:
        raise Silent("the source changed")
    return kind


def check_no_half_written(out: Path) -> None:
    from mxfp4conv.checkpoint.safetensors_io import read_header

    if not out.exists():
        return
    if (out / "mxfp4conv.json").exists():
        raise Silent("a failed convert left a manifest (the mark of a finished output)")
    for p in _shards(out):
        try:
            read_header(p)
        except Mxfp4convError:
            raise Silent(f"a failed convert left {p.name} incomplete under its final name") from None


def t_cli(c: Corpus, rng: random.Random) -> None:
    """A command line from a grammar of commands, paths and option values."""
    from mxfp4conv.cli import main

    work = c.scratch()
    family = rng.choice(sorted(c.sources))
    src = _copy(c.sources[family], work / "src")
    if rng.random() < 0.5:  # a damaged source
        target = rng.choice(["config.json", "model.safetensors.index.json"] + [p.name for p in _shards(src)])
        raw = (src / target).read_bytes()
        (src / target).write_bytes(mutate_bytes(raw, rng, hot=min(len(raw), 400))[0])
    (work / "afile").write_text("x")
    paths = [str(src), str(c.converted), str(work / "missing"), str(work / "afile"), str(work / "afile" / "x"),
             "/proc/mxfp4conv-fuzz", "", "-", str(work / "out")]  # no hub ids: they would go to the network
    values = ["1", "2", "0", "-1", "3", "abc", "1e9", "", "99999999999999999999", "5GB", "0B", "-5MB", "1.5KB"]
    archs = ["gfx950", "gfx942", "sm90", "cpu", "mi355x", "h200", "nope", "", "GFX950"]
    cmd = rng.choice(["inspect", "plan", "convert", "verify", "example"])
    args = [cmd]
    if cmd == "example":
        # (a valid example takes seconds to generate; tests/test_bad_input.py covers it)
        args += [rng.choice(["kimi_k3", "quark", "gpt_oss", "nope", ""]), rng.choice(paths)]
        if rng.random() < 0.3:
            args += ["--scheme", rng.choice(["w_mxfp4", "w_mxfp4_a_fp8", "bad"])]
    else:
        args.append(rng.choice(paths))
        if cmd == "convert":
            args.append(rng.choice(paths[2:] + [str(work / "out")] * 4))
        if cmd in ("plan", "convert") or rng.random() < 0.2:
            args += ["--arch", rng.choice(archs)]
        for opt, pool in (("--tp", values), ("--shard-size", values), ("--workers", values),
                          ("--act-quant", ["auto", "fp8", "bf16", "mxfp4", "x"]), ("--layout", ["auto", "identity", "x"]),
                          ("--source", paths), ("--backend", ["EMULATION", "AITER_MXFP4_BF16", "x"])):
            if rng.random() < 0.15:
                args += [opt, rng.choice(pool)]
        for flag in ("--json", "--ep", "--force", "--resume", "--full", "--quiet"):
            if rng.random() < 0.1:
                args.append(flag)
    before = digest(src)
    err, out = io.StringIO(), io.StringIO()
    code = 0
    # relative paths ("-", "") must land in the scratch directory, not in the caller's
    cwd = os.getcwd()
    os.chdir(work)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(cwd)
    text = err.getvalue()
    if "Traceback" in text:
        raise RuntimeError(f"traceback on stderr for {args}: {text[-300:]}")
    if code == 1:
        body = text.strip().split("\n\n")
        if not text.startswith("error:") and not (cmd == "inspect" and "error:" in text):
            raise RuntimeError(f"exit 1 without an error paragraph for {args}: {text[:200]!r}")
        if len(body) > 1 and cmd != "verify":
            raise RuntimeError(f"more than one paragraph for {args}")
    elif code not in (0, 2):
        raise RuntimeError(f"exit status {code} for {args}")
    if digest(src) != before:
        raise Silent(f"{args[0]} changed its source")
    if cmd == "convert" and code != 0:
        check_no_half_written(work / args[2])
    return "ok" if code == 0 else "refused"


# ---- one config field at a time: what may be accepted, written from vLLM's code ---------------

def _finite_in(lo: float, hi: float, *, open_lo: bool = True):
    def ok(v) -> bool:
        return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and (lo < v if open_lo else lo <= v) and v <= hi)
    return ok


def _whole_in(lo: int, hi: int):
    def ok(v) -> bool:
        return (isinstance(v, (int, float)) and not isinstance(v, bool)
                and (isinstance(v, int) or (math.isfinite(v) and v.is_integer())) and lo <= v <= hi)
    return ok


VLLM_SCORING = ("softmax", "sigmoid", "sqrtsoftplus")  # vLLM 0.33 / 0.34 fused_topk_bias_router
ROUTING_FIELDS = {
    "scoring_func": lambda v: v in VLLM_SCORING,
    "moe_router_activation_func": lambda v: v in VLLM_SCORING,
    "norm_topk_prob": lambda v: isinstance(v, bool),
    "moe_renormalize": lambda v: isinstance(v, bool),
    "n_group": _whole_in(0, 1 << 16),
    "num_expert_group": _whole_in(0, 1 << 16),
    "topk_method": lambda v: isinstance(v, str) and bool(v),
    "routed_scaling_factor": _finite_in(0, 65504.0),
}
ACTIVATION_FIELDS = {
    "kimi_k3": {"activation_situ_beta": _finite_in(0, 65504.0),
                "activation_situ_linear_beta": _finite_in(-65504.0, 65504.0, open_lo=False)},
    "deepseek_v4": {"swiglu_limit": _finite_in(0, 65504.0)},
    "gpt_oss": {"swiglu_limit": _finite_in(0, 65504.0)},
    "quark": {"swiglu_limit": _finite_in(0, 65504.0)},
}
# the routing each family's vLLM model takes from the config, where mxfp4conv records one
FAMILY_ONLY = {("deepseek_v4", "scoring_func"): "sqrtsoftplus", ("kimi_k3", "moe_router_activation_func"): "sigmoid"}
FIELD_VALUES = HOSTILE + ["softmax", "sigmoid", "sqrtsoftplus", "bogus", "noaux_tc", 2 ** 63, 65504.0, 65505.0,
                          7.0, 1e-30, 2.0, 4, -7.5]


def t_config_field(c: Corpus, rng: random.Random) -> None:
    """One field the decision or the runtime reads, set to a hostile or a legal value: accepted
    only if the value is one vLLM (and the recorded routing) accepts."""
    from mxfp4conv.checkpoint.detect import load_model
    from mxfp4conv.checkpoint.source import open_source

    family = rng.choice(sorted(c.sources))
    fields = {**ROUTING_FIELDS, **ACTIVATION_FIELDS[family]}
    key = rng.choice(sorted(fields))
    value = copy.deepcopy(rng.choice(FIELD_VALUES))
    root = _copy(c.sources[family], c.scratch() / "src")
    cfg = json.loads((root / "config.json").read_text())
    tc = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) and "hidden_size" in cfg["text_config"] else cfg
    tc[key] = value
    (root / "config.json").write_text(json.dumps(cfg))
    inspect_bad = inspect_refuses(root)
    try:
        src = open_source(str(root))
        load_model(src)
        src.close()
    except Mxfp4convError:
        return "refused"
    if inspect_bad:
        raise Silent(f"convert's check accepts {key} = {value!r}, which inspect calls bad")
    legal = value is None or (fields[key](value) and FAMILY_ONLY.get((family, key), value) == value)
    if not legal:
        raise Silent(f"{family}: accepted {key} = {json.dumps(value)[:40]}")
    return "ok"


# ---- --resume into an output directory that holds another conversion --------------------------

RESUME_PLANS = ("same", "arch", "tp", "shard_size", "source", "ep")


def t_resume(c: Corpus, rng: random.Random) -> None:
    """``convert --resume`` into a finished or interrupted OUT: only the same conversion may go
    on; anything else is refused with OUT unchanged."""
    from mxfp4conv.convert import convert
    from mxfp4conv.oracle import Target

    from mxfp4conv.convert.run import INDEX_RECORD, PROGRESS_NAME

    out = _copy(c.converted, c.scratch() / "out")
    if rng.random() < 0.5:  # interrupted: the record in the progress file, no manifest nor index yet
        index = json.loads((out / "model.safetensors.index.json").read_text())
        (out / PROGRESS_NAME).write_text(json.dumps(index["metadata"][INDEX_RECORD]))
        for name in ("mxfp4conv.json", "model.safetensors.index.json"):
            (out / name).unlink()
        if rng.random() < 0.5:
            rng.choice(_shards(out)).unlink()
    plan = rng.choice(RESUME_PLANS)
    family = rng.choice(["deepseek_v4", "quark", "gpt_oss"]) if plan == "source" else "kimi_k3"
    target = {"arch": Target(arch=rng.choice(["gfx942", "sm90", "sm100"]), tp=2),
              "tp": Target(arch="gfx950", tp=rng.choice([1, 4])),
              "ep": Target(arch="gfx950", tp=2, ep=True)}.get(plan, Target(arch="gfx950", tp=2))
    shard_size = rng.choice(["100KB", "1MB"]) if plan == "shard_size" else 5_000_000_000
    before = digest(out)
    try:
        convert(str(c.sources[family]), out, target, shard_size=shard_size, resume=True, progress="none")
    except Mxfp4convError:
        if digest(out) != before:
            raise Silent(f"a refused resume ({plan}) changed OUT")
        if plan == "same":
            raise AssertionError("a resume of the very same conversion was refused")
        return "refused"
    if plan != "same":
        raise Silent(f"--resume into OUT with another {plan} was accepted")
    return "ok"


# ---- one expert byte flipped where a loader reads it -------------------------------------------

def t_load_flip(c: Corpus, rng: random.Random) -> None:
    """A byte of one rank's expert tensor flipped: load_moe_layers and the vLLM plugin's reader
    must refuse that rank (the other rank, which reads none of it, loads)."""
    import warnings

    from mxfp4conv.checkpoint.safetensors_io import read_header
    from mxfp4conv.integrations.vllm.rank_tensors import read_layer
    from mxfp4conv.runtime import load_moe_layers
    from mxfp4conv.runtime.loader import _weight_map, read_manifest

    out = _copy(c.converted, c.scratch() / "out")
    wm = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    name = rng.choice(sorted(n for n in wm if ".experts.rank" in n))
    rank = int(name.split(".experts.rank")[1].split(".")[0])
    b, e = read_header(out / wm[name]).absolute(name)
    with open(out / wm[name], "r+b") as f:
        f.seek(rng.randrange(b, e))
        x = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([x ^ rng.randrange(1, 256)]))
    other = 1 - rank
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_moe_layers(out, rank=other)  # must load: none of its bytes changed
        try:
            load_moe_layers(out, rank=rank)
            raise Silent(f"load_moe_layers loaded rank {rank} with a flipped byte in {name}")
        except Mxfp4convError:
            pass
    manifest, weight_map = read_manifest(out), _weight_map(out)
    try:
        read_layer(out, weight_map, manifest, name.split(".experts.rank")[0], rank)
    except Mxfp4convError:
        return "refused"
    raise Silent(f"the vLLM plugin's reader loaded a flipped byte in {name}")


TARGETS = {"header": t_header, "index": t_index, "config": t_config, "config_field": t_config_field,
           "manifest": t_manifest, "converted_shard": t_converted_shard, "source_shard": t_source_shard,
           "resume": t_resume, "load_flip": t_load_flip, "cli": t_cli}


def run_one(c: Corpus, target: str, seed: int, limit_s: float = 20.0) -> Outcome:
    """Run one input; never raises (except KeyboardInterrupt)."""
    rng = random.Random(f"{target}-{seed}")
    try:
        with time_limit(limit_s):
            kind = TARGETS[target](c, rng)
        return Outcome(kind or "ok")
    except Hang:
        return Outcome("hang", f"{target} seed {seed}")
    except Silent as exc:
        return Outcome("silent", f"{target} seed {seed}: {exc}")
    except Mxfp4convError:
        return Outcome("refused")
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a crash is what we are counting
        tb = traceback.extract_tb(exc.__traceback__)
        site = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb) if "mxfp4conv" in f.filename
                     and "fuzz_cases" not in f.filename), "?")
        return Outcome("crash", f"{target} seed {seed}: {type(exc).__name__} at {site}: {str(exc)[:200]}")
