"""Checkpoint sources: a local directory or a Hugging Face hub repo, read lazily.

A ``Source`` knows the config, the weight map (tensor name -> shard file, taken from the
index exactly as written, never rebuilt) and, on demand, each shard's validated header.
Tensor bytes are read one tensor at a time with ``pread`` from read-only descriptors.
Nothing here ever writes into the source.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from mxfp4conv.lazy_torch import torch

from mxfp4conv.checkpoint import safetensors_io as st
from mxfp4conv.checkpoint import strict_json
from mxfp4conv.errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
MANIFEST_NAME = "mxfp4conv.json"
HUB_MAX_WORKERS = 8  # parallel downloads of one snapshot_download call

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors dtype string as stored
    shape: tuple[int, ...]  # as in the header (F4: logical element shape)
    shard: str  # file name relative to the root, exactly as in weight_map
    begin: int  # absolute byte offsets in the shard file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


class Source:
    """A checkpoint to read. Build it with ``open_source``."""

    def __init__(self, *, root: Path, spec: str, revision: str | None, config: dict,
                 weight_map: dict[str, str], index_bytes: bytes | None, fetcher: "_Fetcher"):
        self.root = root
        self.spec = spec
        self.revision = revision
        self.config = config
        self.weight_map = weight_map
        self.index_bytes = index_bytes  # None for a single-file checkpoint
        self._fetcher = fetcher
        self._headers: dict[str, st.ShardHeader] = {}
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    # ---- description -------------------------------------------------------------
    @property
    def is_hub(self) -> bool:
        return self._fetcher.is_hub

    def tensor_names(self) -> list[str]:
        return sorted(self.weight_map)

    def shards(self) -> list[str]:
        """Shard file names as the index writes them, in first-seen order."""
        return list(dict.fromkeys(self.weight_map.values()))

    def header(self, shard: str) -> st.ShardHeader:
        """The validated header of one shard (cached; on the hub, read with a range request)."""
        with self._lock:
            h = self._headers.get(shard)
        if h is None:
            h = self._fetcher.header(shard)
            with self._lock:
                self._headers[shard] = h
        return h

    def tensor_info(self, name: str) -> TensorInfo:
        shard = self.weight_map.get(name)
        if shard is None:
            raise CheckpointError(f"{self.spec}: tensor {name!r} is not in the checkpoint's "
                                  f"weight map. Check the tensor name or the index file.")
        h = self.header(shard)
        e = h.tensors.get(name)
        if e is None:
            raise CheckpointError(
                f"{self.root / shard}: the index maps tensor {name!r} to this shard but its "
                f"header does not contain it. The index and the shards disagree; download the "
                f"checkpoint again or fix {INDEX_NAME}.")
        begin, end = h.absolute(name)
        return TensorInfo(name=name, dtype=e.dtype, shape=e.shape, shard=shard, begin=begin, end=end)

    def fingerprint(self) -> str:
        """sha256 of the index file, or of the single shard's header."""
        if self.index_bytes is not None:
            return hashlib.sha256(self.index_bytes).hexdigest()
        return hashlib.sha256(self.header(self.shards()[0]).raw).hexdigest()

    def sidecar_files(self) -> list[str]:
        """Relative paths of every non-weight file (config, tokenizer, code, docs...)."""
        return self._fetcher.sidecar_files(set(self.shards()))

    def has_local(self, rel: str) -> bool:
        """Whether the file can be read without downloading it."""
        return self._fetcher.has_local(rel)

    def path(self, rel: str) -> Path:
        """Local path of a file of the checkpoint (fetched from the hub if needed)."""
        return self._fetcher.local_path(rel)

    def prefetch(self, rels, max_workers: int = HUB_MAX_WORKERS) -> None:
        """Fetch these files of a hub checkpoint in parallel now (a no-op for a local one)."""
        self._fetcher.prefetch(list(rels), max_workers)

    # ---- data ----------------------------------------------------------------------
    def read_bytes(self, name: str) -> bytearray:
        info = self.tensor_info(name)
        return self.read_range(info.shard, info.begin, info.nbytes)

    def read_range(self, shard: str, offset: int, n: int) -> bytearray:
        """``n`` bytes at absolute ``offset`` of ``shard``."""
        fd = self._fd(shard)
        try:
            return st.pread_exact(fd, offset, n)
        except (EOFError, OSError) as exc:
            raise CheckpointError(f"{self.root / shard}: reading {n} bytes at offset {offset} "
                                  f"failed ({exc}); the shard changed or is truncated. Download "
                                  f"or copy it again.") from None

    def read_tensor(self, name: str) -> torch.Tensor:
        """One tensor, raw, in the stored dtype (F8_E8M0 as uint8, F4 as packed uint8)."""
        info = self.tensor_info(name)
        return st.to_tensor(self.read_range(info.shard, info.begin, info.nbytes), info.dtype, info.shape)

    def _fd(self, shard: str) -> int:
        with self._lock:
            fd = self._fds.get(shard)
        if fd is not None:
            return fd
        local = self._fetcher.local_path(shard)
        header = self.header(shard)
        if self._fetcher.is_hub and header.file_size != local.stat().st_size:
            raise CheckpointError(f"{local}: the downloaded shard is {local.stat().st_size} bytes "
                                  f"but the hub header said {header.file_size}. Delete it from the "
                                  f"cache and try again.")
        fd = os.open(local, os.O_RDONLY)
        with self._lock:
            if shard in self._fds:
                os.close(fd)
                return self._fds[shard]
            self._fds[shard] = fd
        return fd

    def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __enter__(self) -> "Source":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"Source({self.spec!r}, {len(self.weight_map)} tensors in {len(self.shards())} shards)"


# ---- fetchers: where the files come from ---------------------------------------------

class _Fetcher:
    is_hub = False

    def local_path(self, rel: str) -> Path:
        raise NotImplementedError

    def header(self, shard: str) -> st.ShardHeader:
        return st.read_header(self.local_path(shard))

    def has_local(self, rel: str) -> bool:
        return True

    def prefetch(self, rels: list[str], max_workers: int) -> None:
        pass

    def sidecar_files(self, shards: set[str]) -> list[str]:
        raise NotImplementedError


def _is_weight_file(rel: str, shards: set[str]) -> bool:
    return rel in shards or rel.endswith(".safetensors") or rel.endswith(".safetensors.index.json")


class _LocalFetcher(_Fetcher):
    def __init__(self, root: Path):
        self.root = root

    def local_path(self, rel: str) -> Path:
        return self.root / rel

    def sidecar_files(self, shards: set[str]) -> list[str]:
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in sorted(filenames):
                if f.startswith("."):
                    continue
                rel = (Path(dirpath) / f).relative_to(self.root).as_posix()
                if not _is_weight_file(rel, shards):
                    _check_sidecar(self.root, rel)
                    out.append(rel)
        return out


def _check_sidecar(root: Path, rel: str) -> None:
    """A file copied into the output must be a regular file inside the checkpoint."""
    full = root / rel
    real = full.resolve()
    if not real.is_relative_to(root.resolve()):
        raise CheckpointError(f"{full}: this file of the checkpoint is a symbolic link leading "
                              f"outside the checkpoint directory (to {real}); convert would copy "
                              f"that file into the output. Replace the link with the real file, "
                              f"or remove it.")
    mode = full.stat().st_mode if os.path.exists(full) else None
    if mode is None:
        raise CheckpointError(f"{full}: this file of the checkpoint is a broken symbolic link. "
                              f"Replace it with the real file, or remove it.")
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{full}: this file of the checkpoint is {st.file_kind(mode)}, not a "
                              f"regular file, and cannot be copied into the output. Remove it "
                              f"from the checkpoint directory.")
    if not os.access(full, os.R_OK):
        raise CheckpointError(f"{full}: this file of the checkpoint cannot be read (permission "
                              f"denied), so it cannot be copied into the output. Make it "
                              f"readable.")


class _HubFetcher(_Fetcher):
    is_hub = True

    def __init__(self, repo_id: str, revision: str | None):
        self.repo_id = repo_id
        self.revision = revision  # resolved commit once known

    def snapshot(self, patterns: list[str], max_workers: int = HUB_MAX_WORKERS) -> Path:
        """Fetch the repo's files matching ``patterns`` in parallel (cached ones are not fetched
        again; offline, the cached snapshot) and return the snapshot directory. The first call
        resolves the revision: every later fetch is pinned to that commit."""
        from huggingface_hub import snapshot_download

        log.info("hub %s@%s: fetching %s", self.repo_id, self.revision or "main", ", ".join(patterns))
        try:
            snap = Path(snapshot_download(self.repo_id, revision=self.revision, allow_patterns=patterns,
                                          max_workers=max_workers))
        except Exception as exc:  # huggingface_hub raises many kinds; all mean "not available"
            raise _hub_error(self.repo_id, self.revision, ", ".join(patterns), exc) from None
        if re.fullmatch(r"[0-9a-f]{40}", snap.name):
            self.revision = snap.name
        return snap

    def download(self, rel: str) -> Path:
        from huggingface_hub import hf_hub_download

        log.info("hub %s@%s: downloading %s", self.repo_id, self.revision or "main", rel)
        try:
            return Path(hf_hub_download(self.repo_id, rel, revision=self.revision))
        except Exception as exc:
            raise _hub_error(self.repo_id, self.revision, rel, exc) from None

    def prefetch(self, rels: list[str], max_workers: int) -> None:
        missing = [r for r in rels if not self.has_local(r)]
        if missing:
            self.snapshot(missing, max_workers)

    def cached(self, rel: str) -> Path | None:
        from huggingface_hub import try_to_load_from_cache

        p = try_to_load_from_cache(self.repo_id, rel, revision=self.revision)
        return Path(p) if isinstance(p, str) else None

    def local_path(self, rel: str) -> Path:
        return self.cached(rel) or self.download(rel)

    def has_local(self, rel: str) -> bool:
        return self.cached(rel) is not None

    def header(self, shard: str) -> st.ShardHeader:
        cached = self.cached(shard)
        if cached is not None or _offline():
            return st.read_header(cached or self.download(shard))
        return _remote_header(self.repo_id, self.revision, shard)

    def sidecar_files(self, shards: set[str]) -> list[str]:
        if _offline():
            snap = self.cached(CONFIG_NAME)
            files = [p.relative_to(snap.parent).as_posix() for p in snap.parent.rglob("*")
                     if p.is_file()] if snap else []
        else:
            from huggingface_hub import list_repo_files

            try:
                files = list_repo_files(self.repo_id, revision=self.revision)
            except Exception as exc:
                raise _hub_error(self.repo_id, self.revision, "(file list)", exc) from None
        return sorted(f for f in files if not _is_weight_file(f, shards)
                      and not any(part.startswith(".") for part in f.split("/")))


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_repo_id(text: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` when ``text`` is a hub repo id ``[namespace/]name[@revision]``
    by huggingface_hub's own rules, else None."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    repo, at, revision = text.partition("@")
    if at and not revision.strip():
        return None
    try:
        validate_repo_id(repo)
    except HFValidationError:
        return None
    return repo, revision or None


def _hub_error(repo: str, revision: str | None, rel: str, exc: Exception) -> CheckpointError:
    where = f"{repo}@{revision}" if revision else repo
    if _offline():
        hint = ("HF_HUB_OFFLINE is set and the file is not in the local cache; download it "
                "first (unset HF_HUB_OFFLINE, or run `hf download` on a connected machine).")
    else:
        hint = ("Check the repo id and revision, your network, and that you are logged in "
                "(`hf auth login`) for gated or private repos.")
    return CheckpointError(f"hub repo {where}: cannot get {rel!r} ({type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:300]}). {hint}")


def _remote_header(repo: str, revision: str | None, shard: str) -> st.ShardHeader:
    """A shard's header from HTTP range requests, without downloading the shard.

    ``huggingface_hub.get_safetensors_metadata`` reads the same bytes but hands back only the
    decoded JSON: without the header length (so no absolute offsets), the raw bytes (so no
    duplicate-key check and no fingerprint) or the file size (so no truncation check). Here
    huggingface_hub makes the requests (URL, auth headers, session, errors) and the bytes go
    through the same validating parser as a local shard's.
    """
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(repo, shard, revision=revision)
    headers = build_hf_headers()
    first = 8 + 100_000  # one request holds almost every header
    try:
        r = get_session().get(url, headers={**headers, "range": f"bytes=0-{first - 1}"}, timeout=30,
                              follow_redirects=True)
        hf_raise_for_status(r)
        content = r.content
        total = int(r.headers.get("content-range", "/0").rsplit("/", 1)[-1] or 0) or len(content)
        if len(content) < 8:
            raise CheckpointError(f"hub repo {repo}: {shard} is too short to be a safetensors "
                                  f"file. The repo is damaged; report it to its owner.")
        n = int.from_bytes(content[:8], "little")
        if n > min(st.MAX_HEADER_SIZE, constants.SAFETENSORS_MAX_HEADER_LENGTH) or 8 + n > total:
            raise CheckpointError(f"hub repo {repo}: {shard} has an invalid safetensors header "
                                  f"length ({n} bytes for a {total}-byte file). The repo is "
                                  f"damaged or the file is not safetensors.")
        if 8 + n <= len(content):
            raw_json = content[8:8 + n]
        else:
            r = get_session().get(url, headers={**headers, "range": f"bytes=8-{n + 7}"}, timeout=60,
                                  follow_redirects=True)
            hf_raise_for_status(r)
            raw_json = r.content
    except CheckpointError:
        raise
    except Exception as exc:
        raise _hub_error(repo, revision, shard, exc) from None
    return st.parse_header(content[:8], raw_json, total, Path(f"{repo}/{shard}"))


# ---- opening -------------------------------------------------------------------------

def _load_json(path: Path, what: str, *, unique_keys: bool = True) -> tuple[bytes, object]:
    fd = st.open_regular(path, what)
    try:
        with os.fdopen(fd, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the {what} ({exc.strerror}). Check that the "
                              f"file is readable.") from None
    return raw, strict_json.loads(raw, str(path), what, "Fix or replace the file.",
                                  unique_keys=unique_keys)


def _check_shard_name(root: Path, shard: object, index_path: Path, *, local: bool) -> None:
    fix = (f"Every weight_map value in {index_path.name} must be a file name inside the "
           f"checkpoint directory; fix the index or download the checkpoint again.")
    if not isinstance(shard, str) or not shard:
        raise CheckpointError(f"{index_path}: weight_map value {shard!r} is not a file name. {fix}")
    p = PurePosixPath(shard)
    if p.is_absolute() or shard.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", shard) \
            or ".." in p.parts or "\\" in shard:
        raise CheckpointError(f"{index_path}: weight_map names shard {shard!r}, a path outside "
                              f"the checkpoint directory. {fix}")
    if not local:
        return
    full = root / shard
    try:
        real = full.resolve()
        os.lstat(full)
    except FileNotFoundError:
        real = full.resolve()  # reported below as a missing shard
    except OSError as e:  # e.g. a name longer than the file system allows
        raise CheckpointError(f"{index_path}: weight_map names shard {shard[:80]!r}"
                              f"{'...' if len(shard) > 80 else ''}, which is not a usable file "
                              f"name here ({e.strerror}). {fix}") from None
    if not real.is_relative_to(root.resolve()):  # ".." was refused above: a symlink did this
        raise CheckpointError(f"{index_path}: shard {shard!r} is a symbolic link leading "
                              f"outside the checkpoint directory (to {real}). Copy the real "
                              f"file into the directory, or point at the directory that "
                              f"holds it.")
    if not full.is_file():
        if os.path.lexists(full):
            raise CheckpointError(f"{index_path}: weight_map names shard {shard!r} but {full} is "
                                  f"{st.file_kind(full.stat().st_mode)}, not a file. Put the real "
                                  f"shard in its place, or fix the index.")
        raise CheckpointError(f"{index_path}: weight_map names shard {shard!r} but "
                              f"{full} does not exist. Download the missing shard, or fix the "
                              f"index.")


def duplicate_index_keys(raw: bytes) -> list[str]:
    """Tensor names listed more than once in an index's weight_map (JSON keeps the last)."""
    dupes: list[str] = []

    def hook(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                dupes.append(k)
            seen.add(k)
        return dict(pairs)

    json.loads(raw.decode("utf-8"), object_pairs_hook=hook)
    return dupes


def _parse_index(index_path: Path, obj: object, root: Path, *, local: bool) -> dict[str, str]:
    if not isinstance(obj, dict) or not isinstance(obj.get("weight_map"), dict):
        raise CheckpointError(f"{index_path}: the index must be a JSON object with a "
                              f"\"weight_map\" object (tensor name -> shard file). Fix or "
                              f"replace the file.")
    weight_map = obj["weight_map"]
    if not all(isinstance(v, str) for v in weight_map.values()):
        bad = next(k for k, v in weight_map.items() if not isinstance(v, str))
        raise CheckpointError(f"{index_path}: weight_map entry {bad!r} maps to "
                              f"{weight_map[bad]!r}, not a shard file name. Fix or replace the "
                              f"index.")
    for shard in dict.fromkeys(weight_map.values()):
        _check_shard_name(root, shard, index_path, local=local)
    return dict(weight_map)


def _read_config(path: Path, where: str) -> dict:
    if not os.path.lexists(path):
        raise CheckpointError(f"{where}: no {CONFIG_NAME} found. A checkpoint directory needs "
                              f"its config.json next to the safetensors files.")
    _, cfg = _load_json(path, CONFIG_NAME)
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: config.json must hold a JSON object. Fix or replace "
                              f"the file with the model's original config.json.")
    return cfg


def open_source(spec: str | os.PathLike, revision: str | None = None) -> Source:
    """Open a local checkpoint directory or a hub repo id ``[namespace/]name[@revision]``
    (``revision`` is the same as ``@revision``)."""
    text = os.fspath(spec)
    path = Path(text).expanduser()
    if path.exists():
        if revision:
            raise CheckpointError(f"{text}: a local directory has no revision; pass a hub repo id "
                                  f"to choose revision {revision!r}.")
        return _open_local(path, text)
    # a hub id names its owner (org/name): a bare name that is not here is a mistyped folder,
    # never looked up on the hub
    hub = None if text.startswith((".", "/", "~")) or "/" not in text.partition("@")[0] else hub_repo_id(text)
    if hub is None:
        raise CheckpointError(f"{text}: no such directory. Pass a checkpoint directory, or a hub repo "
                              f"id of the form org/name[@revision].")
    if revision and hub[1] and revision != hub[1]:
        raise CheckpointError(f"{text}: names revision {hub[1]!r} and revision {revision!r} was "
                              f"also given; give one.")
    return _open_hub(hub[0], revision or hub[1], text)


def _open_local(path: Path, spec: str) -> Source:
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory. Pass the checkpoint directory (the one "
                              f"holding config.json and the safetensors files).")
    root = path.absolute()
    config = _read_config(root / CONFIG_NAME, str(root))
    fetcher = _LocalFetcher(root)
    index_path = root / INDEX_NAME
    if os.path.lexists(index_path):
        raw, obj = _load_json(index_path, "safetensors index", unique_keys=False)
        weight_map = _parse_index(index_path, obj, root, local=True)
        log.info("%s: %d tensors in %d shards (%s)", root, len(weight_map),
                 len(set(weight_map.values())), INDEX_NAME)
        return Source(root=root, spec=spec, revision=None, config=config, weight_map=weight_map,
                      index_bytes=raw, fetcher=fetcher)
    single = root / SINGLE_NAME
    if os.path.lexists(single):
        header = st.read_header(single)
        log.info("%s: %d tensors in %s", root, len(header.tensors), SINGLE_NAME)
        src = Source(root=root, spec=spec, revision=None, config=config,
                     weight_map={n: SINGLE_NAME for n in header.tensors}, index_bytes=None,
                     fetcher=fetcher)
        src._headers[SINGLE_NAME] = header
        return src
    raise CheckpointError(f"{root}: neither {INDEX_NAME} nor {SINGLE_NAME} found. Point at a "
                          f"directory holding a safetensors checkpoint.")


def _open_hub(repo: str, revision: str | None, spec: str) -> Source:
    fetcher = _HubFetcher(repo, revision)
    try:
        # One listing; config, index and (for a converted checkpoint) the manifest, in parallel.
        root = fetcher.snapshot([CONFIG_NAME, INDEX_NAME, MANIFEST_NAME])
    except CheckpointError as exc:
        raise CheckpointError(f"{spec} is not a local directory, so it was looked up on the hub: "
                              f"{exc}") from None
    where = f"hub repo {repo}@{fetcher.revision}" if fetcher.revision else f"hub repo {repo}"
    config = _read_config(root / CONFIG_NAME, where)
    index_path = root / INDEX_NAME
    if not index_path.is_file():
        try:
            header = fetcher.header(SINGLE_NAME)
        except CheckpointError:
            raise CheckpointError(f"{where}: neither {INDEX_NAME} nor {SINGLE_NAME} found. Point "
                                  f"at a repo holding a safetensors checkpoint.") from None
        src = Source(root=root, spec=spec, revision=fetcher.revision, config=config,
                     weight_map={n: SINGLE_NAME for n in header.tensors}, index_bytes=None,
                     fetcher=fetcher)
        src._headers[SINGLE_NAME] = header
        return src
    raw, obj = _load_json(index_path, "safetensors index", unique_keys=False)
    weight_map = _parse_index(index_path, obj, root, local=False)
    log.info("%s: %d tensors in %d shards", where, len(weight_map), len(set(weight_map.values())))
    return Source(root=root, spec=spec, revision=fetcher.revision, config=config,
                  weight_map=weight_map, index_bytes=raw, fetcher=fetcher)
