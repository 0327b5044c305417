"""Sources: local sharded / single-file directories and hub repos through the HF cache."""

import hashlib
import importlib
import json
import os
import shutil
import stat

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from checkpoint_fixtures import copy_of, load_index, save_index, synth, tree_digest  # noqa: F401
from mxfp4conv.checkpoint import open_source
from mxfp4conv.errors import CheckpointError


def test_sharded_weight_map_offsets_and_reads(synth):
    root = synth("gpt_oss")
    src = open_source(root)
    index = load_index(root)
    assert src.weight_map == index["weight_map"]
    # gpt-oss shards are 0-indexed; names come from the index, never rebuilt.
    assert src.shards() == ["model-00000-of-00001.safetensors", "model-00001-of-00001.safetensors"]
    assert src.fingerprint() == hashlib.sha256((root / "model.safetensors.index.json").read_bytes()).hexdigest()
    assert src.sidecar_files() == ["config.json", "generation_config.json", "tokenizer_config.json"]
    assert src.config["model_type"] == "gpt_oss" and src.revision is None
    for name in src.tensor_names():
        shard = src.weight_map[name]
        with safe_open(root / shard, "pt") as f:
            want = f.get_tensor(name)
        got = src.read_tensor(name)
        info = src.tensor_info(name)
        assert info.shard == shard and info.nbytes == want.numel() * want.element_size()
        assert got.dtype == want.dtype and torch.equal(got, want), name
        assert bytes(src.read_bytes(name)) == (root / shard).read_bytes()[info.begin:info.end]


def test_raw_dtype_views(synth):
    src = open_source(synth("deepseek_v4"))
    w = src.read_tensor("layers.0.ffn.experts.0.w1.weight")
    s = src.read_tensor("layers.0.ffn.experts.0.w1.scale")
    assert src.tensor_info("layers.0.ffn.experts.0.w1.scale").dtype == "F8_E8M0"
    assert w.dtype == torch.int8 and s.dtype == torch.uint8  # e8m0 as raw bytes, never cast
    assert int(s.min()) > 100 and int(s.max()) < 0xFF


def test_single_file_checkpoint(tmp_path):
    t = {"a": torch.arange(6, dtype=torch.uint8), "b": torch.ones(2, dtype=torch.bfloat16)}
    save_file(t, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.txt").write_text("x")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "junk").write_text("x")
    src = open_source(str(tmp_path))
    assert src.shards() == ["model.safetensors"] and src.tensor_names() == ["a", "b"]
    assert torch.equal(src.read_tensor("a"), t["a"])
    raw = (tmp_path / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert src.fingerprint() == hashlib.sha256(raw[:8 + n]).hexdigest()
    assert src.sidecar_files() == ["config.json", "sub/notes.txt"]


def test_read_only_source_is_readable(synth, tmp_path):
    root = copy_of(synth("kimi_k3"), tmp_path / "ro")
    before = tree_digest(root)
    for p in root.iterdir():
        p.chmod(stat.S_IRUSR)
    root.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        src = open_source(root)
        for name in src.tensor_names()[:20]:
            src.read_tensor(name)
        src.close()
    finally:
        root.chmod(0o755)
        for p in root.iterdir():
            p.chmod(0o644)
    assert tree_digest(root) == before


@pytest.mark.parametrize("bad, message", [
    ("../outside.safetensors", "outside the checkpoint directory"),
    ("/etc/passwd", "outside the checkpoint directory"),
    ("model-00009-of-00009.safetensors", "does not exist"),
])
def test_index_shard_names_are_checked(synth, tmp_path, bad, message):
    root = copy_of(synth("quark"), tmp_path / "ck")
    index = load_index(root)
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = bad
    save_index(root, index)
    with pytest.raises(CheckpointError) as err:
        open_source(root)
    assert message in str(err.value) and repr(bad) in str(err.value)


def test_symlinked_shard_leading_outside_is_refused(synth, tmp_path):
    root = copy_of(synth("quark"), tmp_path / "ck")
    shard = root / "model-00002-of-00002.safetensors"
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(shard, outside)
    shard.symlink_to(outside)
    with pytest.raises(CheckpointError, match="symbolic link leading outside"):
        open_source(root)
    # A symlink that stays inside the directory is fine.
    inside = root / "real.bin"
    shutil.move(outside, inside)
    shard.unlink()
    shard.symlink_to(inside.name)
    assert open_source(root).read_tensor("model.layers.2.mlp.experts.7.down_proj.weight").numel() > 0


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no such directory"):
        open_source(str(tmp_path / "nope" / "x"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="neither model.safetensors.index.json"):
        open_source(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(CheckpointError, match="JSON object"):
        open_source(tmp_path)


# ---- hub -----------------------------------------------------------------------------

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An HF hub cache dir, offline mode on."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _cache_repo(cache, repo, ckpt, files):
    base = cache / f"models--{repo.replace('/', '--')}"
    snap = base / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(COMMIT)
    for f in files:
        shutil.copy(ckpt / f, snap / f)
    return snap


def test_hub_source_from_cache_fetches_lazily(synth, hub_cache):
    ckpt = synth("deepseek_v4")
    # Only config, index and the first shard are cached: opening and reading tensors of
    # that shard must work without the second one.
    snap = _cache_repo(hub_cache, "org/dsv4", ckpt, ["config.json", "model.safetensors.index.json",
                                                      "model-00001-of-00002.safetensors",
                                                      "tokenizer_config.json"])
    src = open_source("org/dsv4")
    assert src.is_hub and src.revision == COMMIT and src.root == snap
    first = [n for n, s in src.weight_map.items() if s == "model-00001-of-00002.safetensors"]
    second = [n for n, s in src.weight_map.items() if s == "model-00002-of-00002.safetensors"]
    with safe_open(ckpt / "model-00001-of-00002.safetensors", "pt") as f:
        assert torch.equal(src.read_tensor(first[0]).view(torch.uint8).reshape(-1),
                           f.get_tensor(first[0]).view(torch.uint8).reshape(-1))
    assert src.has_local("model-00001-of-00002.safetensors")
    assert not src.has_local("model-00002-of-00002.safetensors")
    with pytest.raises(CheckpointError) as err:
        src.read_tensor(second[0])
    assert "HF_HUB_OFFLINE" in str(err.value) and "model-00002-of-00002.safetensors" in str(err.value)
    assert src.sidecar_files() == ["config.json", "tokenizer_config.json"]
    assert open_source(f"org/dsv4@{COMMIT}").revision == COMMIT


def test_hub_offline_not_cached_is_a_clear_error(hub_cache):
    with pytest.raises(CheckpointError) as err:
        open_source("org/missing-model@main")
    msg = str(err.value)
    assert "org/missing-model@main" in msg and "HF_HUB_OFFLINE" in msg and "config.json" in msg


class _FakeHub:
    """Serves a local checkpoint as if it were a hub repo, in place of huggingface_hub's
    download functions and HTTP session: downloads copy files into a snapshot dir, range
    requests read the local shard. Records everything fetched."""

    def __init__(self, ckpt, snap, http):
        self.ckpt, self.snap, self.http = ckpt, snap, http
        self.downloads, self.ranges, self.snapshot_calls = [], [], []

    def _copy(self, rel):
        self.downloads.append(rel)
        (self.snap / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.ckpt / rel, self.snap / rel)

    def hf_hub_download(self, repo_id, filename, revision=None, **kw):
        from huggingface_hub.errors import EntryNotFoundError

        if not (self.ckpt / filename).is_file():
            raise EntryNotFoundError(f"{filename} is not in {repo_id}")
        self._copy(filename)
        return str(self.snap / filename)

    def snapshot_download(self, repo_id, revision=None, allow_patterns=None, max_workers=8, **kw):
        from huggingface_hub.utils import filter_repo_objects

        self.snapshot_calls.append((list(allow_patterns), max_workers))
        files = [p.relative_to(self.ckpt).as_posix() for p in self.ckpt.rglob("*") if p.is_file()]
        for rel in filter_repo_objects(files, allow_patterns=allow_patterns):
            if not (self.snap / rel).is_file():
                self._copy(rel)
        return str(self.snap)

    def list_repo_files(self, repo_id, revision=None, **kw):
        return sorted(p.relative_to(self.ckpt).as_posix() for p in self.ckpt.rglob("*") if p.is_file())

    def try_to_load_from_cache(self, repo_id, filename, revision=None, **kw):
        return str(self.snap / filename) if (self.snap / filename).is_file() else None

    def get(self, url, headers, **kw):
        http = self.http
        rel = url.split(f"/resolve/{COMMIT}/")[1]
        first, last = (int(x) for x in headers["range"].split("=")[1].split("-"))
        data = (self.ckpt / rel).read_bytes()
        self.ranges.append((rel, first, last))
        return http.Response(206, content=data[first:last + 1], request=http.Request("GET", url),
                             headers={"content-range": f"bytes {first}-{last}/{len(data)}"})


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """fake_hub(ckpt) -> a _FakeHub serving ckpt, online."""
    import huggingface_hub
    from huggingface_hub import constants, utils

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    http = importlib.import_module(type(utils.get_session()).__module__.split(".")[0])

    def serve(ckpt):
        snap = tmp_path / "snapshots" / COMMIT
        snap.mkdir(parents=True)
        hub = _FakeHub(ckpt, snap, http)
        for name in ("hf_hub_download", "snapshot_download", "try_to_load_from_cache", "list_repo_files"):
            monkeypatch.setattr(huggingface_hub, name, getattr(hub, name))
        monkeypatch.setattr(utils, "get_session", lambda: hub)
        return hub

    return serve


def test_hub_online_inspect_fetches_headers_by_range_only(synth, fake_hub):
    from mxfp4conv.checkpoint.summary import inspect_source

    ckpt = synth("kimi_k3")
    hub = fake_hub(ckpt)
    report = inspect_source("moonshotai/tiny-k3")
    d = report.data
    assert d["family"] == "kimi_k3" and len(d["moe"]["layers"]) == 2
    # Nothing wrong, but the NaN-scale sample could not look at shards not downloaded.
    assert [p["severity"] for p in d["problems"]] == ["warning"] and "--full" in d["problems"][0]["message"]
    assert d["source"]["revision"] == COMMIT
    # Only config and index were downloaded, in one snapshot call (that also looked for a
    # manifest and found none); the shards were never downloaded, their headers came from
    # ranged reads within the header.
    assert sorted(hub.downloads) == ["config.json", "model.safetensors.index.json"]
    assert len(hub.snapshot_calls) == 1 and "mxfp4conv.json" in hub.snapshot_calls[0][0]
    shards = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    assert {r[0] for r in hub.ranges} == shards and all(first == 0 for _, first, _ in hub.ranges)
    for rel in shards:
        n = int.from_bytes((ckpt / rel).read_bytes()[:8], "little")
        assert open_source(ckpt).header(rel).tensors == open_source("moonshotai/tiny-k3").header(rel).tensors
        assert n < 100_000
    # Reading a tensor downloads just its shard.
    src = open_source("moonshotai/tiny-k3")
    name = "language_model.model.layers.2.block_sparse_moe.experts.7.w2.weight_scale"
    with safe_open(ckpt / src.weight_map[name], "pt") as f:
        assert torch.equal(src.read_tensor(name), f.get_tensor(name))
    assert hub.downloads[-1] == src.weight_map[name] and set(hub.downloads) - shards == {
        "config.json", "model.safetensors.index.json"}


def test_hub_ids_follow_huggingface_hub_rules():
    from mxfp4conv.checkpoint.source import hub_repo_id

    assert hub_repo_id("gpt2") == ("gpt2", None)
    assert hub_repo_id("openai/gpt-oss-20b@refs/pr/1") == ("openai/gpt-oss-20b", "refs/pr/1")
    for bad in ("a/b/c", "foo--bar", "name.git", "x@", "-x", "a b"):
        assert hub_repo_id(bad) is None, bad
    with pytest.raises(CheckpointError, match="no such directory"):
        open_source("a/b/c")


def test_a_bare_name_that_is_no_directory_is_never_looked_up_on_the_hub(synth, fake_hub, tmp_path, monkeypatch):
    hub = fake_hub(synth("gpt_oss"))
    monkeypatch.chdir(tmp_path)
    for name in ("no-such-dir", "gpt2", "gpt2@main"):
        with pytest.raises(CheckpointError, match=r"no such directory\. Pass a checkpoint directory, or a hub "
                                                  r"repo id of the form org/name\[@revision\]\."):
            open_source(name)
    assert hub.snapshot_calls == []


def test_hub_id_and_revision_argument(synth, fake_hub):
    hub = fake_hub(synth("gpt_oss"))
    src = open_source("openai-community/gpt2")
    assert src.is_hub and src.revision == COMMIT and len(src.weight_map) > 0
    assert open_source("openai-community/gpt2", revision=COMMIT).revision == COMMIT
    with pytest.raises(CheckpointError, match="give one"):
        open_source("openai-community/gpt2@main", revision="v1")
    assert len(hub.snapshot_calls) == 2


def test_hub_prefetch_fetches_missing_files_in_one_parallel_call(synth, fake_hub):
    hub = fake_hub(synth("deepseek_v4"))
    src = open_source("org/dsv4")
    calls = len(hub.snapshot_calls)
    src.prefetch(src.shards(), max_workers=4)
    assert hub.snapshot_calls[calls:] == [(src.shards(), 4)]
    assert all(src.has_local(s) for s in src.shards())
    src.prefetch(src.shards())  # nothing left to fetch: no call
    assert len(hub.snapshot_calls) == calls + 1


def test_hub_remote_header_is_validated_like_a_local_one(synth, fake_hub, tmp_path):
    """Why the remote header reader is our own: the shard's size comes with the ranged read,
    so a truncated shard on the hub is refused before anything is downloaded
    (huggingface_hub's get_safetensors_metadata returns the parsed JSON only)."""
    ckpt = copy_of(synth("kimi_k3"), tmp_path / "k3")
    shard = ckpt / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1])
    hub = fake_hub(ckpt)
    src = open_source("org/k3")
    with pytest.raises(CheckpointError, match="truncated") as err:
        src.header(shard.name)
    assert "org/k3/model-00002-of-00002.safetensors" in str(err.value)
    assert shard.name not in hub.downloads


def test_convert_from_the_hub_fetches_shards_and_sidecars_in_one_parallel_call(synth, fake_hub, tmp_path):
    from mxfp4conv.convert import convert
    from mxfp4conv.convert.verify import verify
    from mxfp4conv.oracle import Target

    ckpt = synth("quark", "w_mxfp4")
    hub = fake_hub(ckpt)
    convert("amd/tiny-quark", tmp_path / "out", Target("gfx950", tp=2), progress="none")
    shards = sorted(open_source(ckpt).shards())
    (opening, fetch) = hub.snapshot_calls
    assert sorted(fetch[0]) == sorted(shards + ["generation_config.json", "tokenizer_config.json"])
    assert fetch[1] == 8
    assert verify(tmp_path / "out", str(ckpt)).ok
