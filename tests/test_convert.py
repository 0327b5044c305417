"""convert + verify on tiny synthetic checkpoints of every family, for every oracle case.

The expected per-rank tensors are built here independently of the converter: the source
bytes are read with safetensors, stacked, sliced for the rank, padded as vLLM's loader
pads, and passed through the AITER-named functions of ``mxfp4conv.shuffle.aiter``.
"""

from __future__ import annotations

import dataclasses

import json
from pathlib import Path

import pytest

import torch
from safetensors import safe_open

from hopper_words import HOPPER_BITS_ROT, hopper_words, xor_words_solved

from mxfp4conv.checkpoint import load_model, open_source
from mxfp4conv.checkpoint.synthetic import make_checkpoint
from mxfp4conv.convert.run import convert
from mxfp4conv.convert.verify import VerifyError, verify
from mxfp4conv.errors import Mxfp4convError, OracleError
from mxfp4conv.oracle import decide
from mxfp4conv.oracle.decision import Target
from mxfp4conv.shuffle import aiter

# (family, scheme, arch, tp, ep, act_quant)
CASES = [
    (fam, None, arch, tp, False, "auto")
    for fam in ("kimi_k3", "deepseek_v4", "quark", "gpt_oss")
    for arch in ("gfx950", "gfx942", "gfx1250")
    for tp in (1, 2)
] + [
    (fam, None, "gfx950", 2, True, "auto") for fam in ("kimi_k3", "deepseek_v4", "quark", "gpt_oss")
] + [
    ("kimi_k3", None, "gfx942", 2, True, "auto"),
    ("kimi_k3", None, "gfx950", 1, False, "fp8"),
    ("kimi_k3", None, "gfx950", 2, False, "fp8"),
    ("quark", "w_mxfp4_a_mxfp4", "gfx950", 1, False, "auto"),
    ("quark", "w_mxfp4_a_mxfp4", "gfx942", 2, False, "auto"),
    ("quark", "w_mxfp4_a_fp8", "gfx950", 1, False, "auto"),
    ("quark", "w_mxfp4_a_fp8", "gfx950", 2, True, "auto"),
    ("quark", "w_mxfp4_a_fp8", "gfx942", 2, False, "auto"),
    # sm90: mxfp4conv's Hopper layouts (64-padded)
    ("kimi_k3", None, "sm90", 1, False, "auto"),
    ("kimi_k3", None, "sm90", 2, False, "auto"),
    ("gpt_oss", None, "sm90", 2, False, "auto"),
    ("deepseek_v4", None, "sm90", 2, True, "auto"),
    ("quark", "w_mxfp4_a_mxfp4", "sm90", 1, False, "auto"),  # W4A4: raw bytes
]

_SOURCES: dict = {}
# Small but not trivial: H/32 = 4 scale columns (padded to 8 by the AITER scale shuffles);
# 6 experts of 128 rows give 768 scale rows under TP (a multiple of 256) and 384 per EP rank
# (e8m0_shuffle pads 128 rows at the tail).
GEOMETRY = dict(hidden=128, intermediate=128, num_experts=6, top_k=2)


def source_for(tmp_path_factory, family, scheme, **geometry):
    key = (family, scheme, tuple(sorted(geometry.items())))
    if key not in _SOURCES:
        root = tmp_path_factory.mktemp("src")
        _SOURCES[key] = make_checkpoint(family, root / f"{family}-{scheme}", scheme=scheme, seed=3,
                                        **{**GEOMETRY, **geometry})
    return _SOURCES[key]


def source_bytes(src_dir: Path) -> int:
    return sum(p.stat().st_size for p in src_dir.glob("*.safetensors"))


# ---- independent expectation -------------------------------------------------------------

class Raw:
    """Source tensors as uint8/float, straight from the files."""

    def __init__(self, root: Path):
        self.root = root
        self.wm = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]

    def get(self, name: str) -> torch.Tensor:
        with safe_open(self.root / self.wm[name], "pt") as f:
            return f.get_tensor(name)

    def u8(self, name: str) -> torch.Tensor:
        t = self.get(name)
        return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def stacked_source(raw: Raw, layer):
    """[E, 2I, H/2], [E, 2I, H/32], [E, H, I/2], [E, H, I/32] and optional biases/input scales."""
    if layer.fused is not None:
        f = layer.fused
        def deint(t):
            return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1)
        w13 = raw.u8(f.gate_up_blocks.name)
        w2 = raw.u8(f.down_blocks.name)
        out = {"w13_weight": deint(w13.reshape(w13.shape[0], w13.shape[1], -1)),
               "w13_weight_scale": deint(raw.u8(f.gate_up_scales.name)),
               "w2_weight": w2.reshape(w2.shape[0], w2.shape[1], -1),
               "w2_weight_scale": raw.u8(f.down_scales.name)}
        if f.gate_up_bias is not None:
            out["w13_bias"] = deint(raw.get(f.gate_up_bias.name).float())
            out["w2_bias"] = raw.get(f.down_bias.name).float()
        return out
    ex = layer.experts
    out = {
        "w13_weight": torch.stack([torch.cat([raw.u8(e.gate.name), raw.u8(e.up.name)]) for e in ex]),
        "w13_weight_scale": torch.stack([torch.cat([raw.u8(e.gate_scale.name), raw.u8(e.up_scale.name)]) for e in ex]),
        "w2_weight": torch.stack([raw.u8(e.down.name) for e in ex]),
        "w2_weight_scale": torch.stack([raw.u8(e.down_scale.name) for e in ex]),
    }
    if ex[0].gate_bias is not None:
        out["w13_bias"] = torch.stack([torch.cat([raw.get(e.gate_bias.name).float(), raw.get(e.up_bias.name).float()]) for e in ex])
        out["w2_bias"] = torch.stack([raw.get(e.down_bias.name).float() for e in ex])
    if ex[0].gate_input_scale is not None:
        out["w13_input_scale"] = torch.stack([torch.maximum(raw.get(e.gate_input_scale.name).float().reshape(()),
                                                            raw.get(e.up_input_scale.name).float().reshape(())) for e in ex])
        out["w2_input_scale"] = torch.stack([raw.get(e.down_input_scale.name).float().reshape(()) for e in ex])
    return out


def apply_layout(name: str, x: torch.Tensor) -> torch.Tensor:
    E, N, K = x.shape
    if name == "identity":
        return x
    if name == "aiter_p16":
        return aiter.shuffle_weight(x, (16, 16))
    if name == "aiter_p16_gu16":
        return aiter.shuffle_weight_a16w4(x, 16, True)
    if name == "aiter_e8m0_shuffle":
        return aiter.e8m0_shuffle(x.reshape(E * N, K))
    if name == "aiter_scale_a16w4":
        return aiter.shuffle_scale_a16w4(x.reshape(E * N, K), E, False)
    if name == "aiter_scale_a16w4_gu16":
        return aiter.shuffle_scale_a16w4(x.reshape(E * N, K), E, True)
    if name == "hopper_mma_w_xor":  # what convert writes for sm90
        return xor_words_solved(hopper_words(x, HOPPER_BITS_ROT))
    if name == "hopper_mma_s":  # byte 4g + 2h + j of a 16-row x 2-group block: row 8h + g, group 2b + j
        return x.reshape(E, N // 16, 2, 8, K // 2, 2).permute(0, 1, 4, 3, 2, 5).reshape(E, N, K)
    # triton_kernels layouts, from docs/kernel-ready-format.md
    if name.endswith("_gu1") or name == "triton_gu1":  # gate row i -> 2i, up row i -> 2i + 1
        x = torch.stack((x[:, : N // 2], x[:, N // 2:]), dim=2).reshape(E, N, K)
        name = name[: -len("_gu1")] if name != "triton_gu1" else "identity"
        if name == "identity":
            return x
    if name == "triton_cdna4_scale":  # (32a + 16p + l, 8b + 4q + j) -> [a, 256b + 64j + 4l + 2q + p]
        return x.reshape(E, N // 32, 2, 16, K // 8, 2, 4).permute(0, 1, 4, 6, 3, 5, 2).reshape(E, N // 32, 32 * K)
    if name == "triton_gfx1250_scale":  # (32a + r, 4c + q) -> [a, 128c + 4r + q]
        return x.reshape(E, N // 32, 32, K // 4, 4).permute(0, 1, 3, 2, 4).reshape(E, N // 32, 32 * K)
    raise AssertionError(f"test does not know layout {name}")


def expected_rank_tensors(src: dict, d, rank: int) -> dict[str, torch.Tensor]:
    H, Hp, I, Ip, T = d.hidden, d.hidden_padded, d.intermediate, d.intermediate_per_rank_padded, d.tp
    if d.ep:
        es = slice(rank * d.experts_per_rank, (rank + 1) * d.experts_per_rank)
        i0, i1 = 0, I
    else:
        es = slice(None)
        i0, i1 = rank * (I // T), (rank + 1) * (I // T)
    ir = i1 - i0
    E = d.experts_per_rank
    out = {}
    for kind, div, pad in (("w13_weight", 2, 0), ("w13_weight_scale", 32, d.scale_pad_byte)):
        s = src[kind][es]
        t = torch.full((E, 2 * Ip, Hp // div), pad, dtype=torch.uint8)
        t[:, :ir, :H // div] = s[:, i0:i1]
        t[:, Ip:Ip + ir, :H // div] = s[:, I + i0:I + i1]
        out[kind] = t
    for kind, div, pad in (("w2_weight", 2, 0), ("w2_weight_scale", 32, d.scale_pad_byte)):
        s = src[kind][es]
        t = torch.full((E, Hp, Ip // div), pad, dtype=torch.uint8)
        t[:, :H, :ir // div] = s[:, :, i0 // div:i1 // div]
        out[kind] = t
    if "w13_bias" in src:
        b = torch.zeros(E, 2 * Ip)
        b[:, :ir] = src["w13_bias"][es, i0:i1]
        b[:, Ip:Ip + ir] = src["w13_bias"][es, I + i0:I + i1]
        out["w13_bias"] = b
        b2 = torch.zeros(E, Hp)
        if d.ep or rank == 0:
            b2[:, :H] = src["w2_bias"][es]
        out["w2_bias"] = b2
    if "w13_input_scale" in src:
        out["w13_input_scale"] = src["w13_input_scale"][es].clone()
        out["w2_input_scale"] = src["w2_input_scale"][es].clone()
    lay = d.layout
    for kind, lname in (("w13_weight", lay.w13), ("w13_weight_scale", lay.w13_scale),
                        ("w2_weight", lay.w2), ("w2_weight_scale", lay.w2_scale)):
        out[kind] = apply_layout(lname, out[kind])
    return out


def read_out(out: Path) -> dict[str, torch.Tensor]:
    wm = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    res = {}
    for shard in sorted(set(wm.values())):
        with safe_open(out / shard, "pt") as f:
            for k in f.keys():
                res[k] = f.get_tensor(k)
    assert set(res) == set(wm)
    return res


# ---- the cases ------------------------------------------------------------------------

@pytest.mark.parametrize("family,scheme,arch,tp,ep,act", CASES,
                         ids=[f"{c[0]}-{c[1] or 'w'}-{c[2]}-tp{c[3]}{'-ep' if c[4] else ''}-{c[5]}" for c in CASES])
def test_convert_every_byte(tmp_path, tmp_path_factory, family, scheme, arch, tp, ep, act):
    src_dir = source_for(tmp_path_factory, family, scheme)
    target = Target(arch=arch, tp=tp, ep=ep, act_quant=act)
    model = load_model(open_source(str(src_dir)))
    try:
        d = decide(model, target)
    except OracleError as exc:  # vLLM raises here: ask for mxfp4conv's own format explicitly
        assert "raises" in str(exc)
        target = dataclasses.replace(target, layout="identity")
        d = decide(model, target)
    out = tmp_path / "out"
    # about four shards, so that a layer straddles a shard boundary
    convert(str(src_dir), out, target, shard_size=source_bytes(src_dir) // 4, progress="none")

    manifest = json.loads((out / "mxfp4conv.json").read_text())
    assert manifest["target"]["backend"] == d.backend and manifest["layout"] == d.layout.as_dict()
    assert manifest["moe"]["layers"] == [layer.prefix for layer in model.layers]

    got = read_out(out)
    raw = Raw(src_dir)
    # non-expert tensors byte-identical
    expert_names = model.expert_tensor_names()
    plain = [n for n in raw.wm if n not in expert_names]
    assert plain
    for n in plain:
        a, b = raw.get(n), got[n]
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), n
    assert not any(n in got for n in expert_names)
    # expert tensors: every byte
    for layer in model.layers:
        src = stacked_source(raw, layer)
        for r in range(tp):
            exp = expected_rank_tensors(src, d, r)
            for kind, want in exp.items():
                name = f"{layer.prefix}.experts.rank{r}.{kind}"
                have = got.pop(name)
                assert have.shape == want.shape, (name, have.shape, want.shape)
                if want.dtype == torch.uint8:
                    assert torch.equal(have.view(torch.uint8), want), name
                else:
                    assert have.dtype == torch.float32 and torch.equal(have.view(torch.int32), want.view(torch.int32)), name
    assert set(got) == set(plain)  # nothing else was written

    # sidecars unchanged, config.json untouched
    for f in ("config.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / f).read_bytes() == (src_dir / f).read_bytes()
    # every shard stamped with the manifest, all of it but the crc32 of the expert tensors
    stamped = {k: v for k, v in manifest.items() if k != "checksums"}
    out_wm = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(manifest["checksums"]["crc32"]) == {n for n in out_wm if ".experts.rank" in n}
    for shard in out.glob("model-*.safetensors"):
        with safe_open(shard, "pt") as f:
            md = f.metadata()
        assert md["format"] == "pt" and json.loads(md["mxfp4conv"]) == stamped
    rep = verify(out, str(src_dir))
    assert rep.ok and len(rep.layers) == len(model.layers)


def test_shards_respect_size_and_naming(tmp_path, tmp_path_factory):
    src_dir = source_for(tmp_path_factory, "kimi_k3", None)
    out = tmp_path / "o"
    convert(str(src_dir), out, Target(arch="gfx950", tp=2), shard_size=source_bytes(src_dir) // 8, progress="none")
    shards = sorted(out.glob("model-*.safetensors"))
    n = len(shards)
    assert n > 2
    assert [s.name for s in shards] == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    for s in shards:
        size = s.stat().st_size
        with safe_open(s, "pt") as f:
            single = len(list(f.keys())) == 1
        assert size <= source_bytes(src_dir) // 8 or single
    total = sum(s.stat().st_size for s in shards)
    assert index["metadata"]["total_size"] < total  # data only, headers excluded


def test_two_runs_identical_and_workers_do_not_change_bytes(tmp_path, tmp_path_factory):
    src_dir = source_for(tmp_path_factory, "gpt_oss", None)
    t = Target(arch="gfx950", tp=2)
    convert(str(src_dir), tmp_path / "a", t, shard_size=source_bytes(src_dir) // 5, progress="none", workers=1)
    convert(str(src_dir), tmp_path / "b", t, shard_size=source_bytes(src_dir) // 5, progress="none", workers=3, chunk_bytes=10_000)
    fa = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert fa == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in fa:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_source_is_never_modified(tmp_path, tmp_path_factory):
    src_dir = source_for(tmp_path_factory, "deepseek_v4", None)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in src_dir.rglob("*") if p.is_file()}
    convert(str(src_dir), tmp_path / "o", Target(arch="gfx950"), progress="none")
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in src_dir.rglob("*") if p.is_file()}
    assert before == after


# ---- bad input ------------------------------------------------------------------------

def test_refuses_non_empty_out(tmp_path, tmp_path_factory):
    src_dir = source_for(tmp_path_factory, "kimi_k3", None)
    out = tmp_path / "o"
    out.mkdir()
    (out / "something").write_text("x")
    with pytest.raises(Mxfp4convError, match="not empty; pass --resume"):
        convert(str(src_dir), out, Target(arch="gfx950"), progress="none")
    assert sorted(p.name for p in out.iterdir()) == ["something"]
    convert(str(src_dir), out, Target(arch="gfx950"), progress="none", force=True)
    assert (out / "mxfp4conv.json").is_file()


def test_refuses_out_inside_source(tmp_path, tmp_path_factory):
    src_dir = source_for(tmp_path_factory, "kimi_k3", None)
    with pytest.raises(Mxfp4convError, match="overlaps the source"):
        convert(str(src_dir), src_dir / "conv", Target(arch="gfx950"), progress="none")
    assert not (src_dir / "conv").exists()


def test_oracle_refusal_writes_nothing(tmp_path, tmp_path_factory):
    src_dir = source_for(tmp_path_factory, "kimi_k3", None)
    out = tmp_path / "o"
    with pytest.raises(Mxfp4convError):
        convert(str(src_dir), out, Target(arch="gfx950", tp=3), progress="none")
    assert not out.exists()


def test_converted_checkpoint_is_not_a_source(tmp_path, tmp_path_factory):
    src_dir = source_for(tmp_path_factory, "kimi_k3", None)
    convert(str(src_dir), tmp_path / "o", Target(arch="gfx950"), progress="none")
    with pytest.raises(Mxfp4convError, match="converted"):
        convert(str(tmp_path / "o"), tmp_path / "o2", Target(arch="gfx950"), progress="none")
    assert not (tmp_path / "o2").exists()


def _poison_scale(src_dir: Path, tmp_path: Path, family: str):
    """A copy of the source with one scale byte set to 0xFF; returns (dir, tensor, offset)."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(src_dir, bad)
    model = load_model(open_source(str(bad)))
    layer = model.layers[-1]
    ref = layer.experts[3].up_scale if layer.experts else layer.fused.down_scales
    s = open_source(str(bad))
    info = s.tensor_info(ref.name)
    off = 5 if layer.experts else info.nbytes - 7
    with open(bad / info.shard, "r+b") as f:
        f.seek(info.begin + off)
        f.write(b"\xff")
    return bad, ref.name, off


@pytest.mark.parametrize("family", ["kimi_k3", "gpt_oss"])
def test_nan_scales_refused_and_named(tmp_path, tmp_path_factory, family):
    src_dir = source_for(tmp_path_factory, family, None)
    bad, name, off = _poison_scale(src_dir, tmp_path, family)
    out = tmp_path / "o"
    with pytest.raises(Mxfp4convError) as ei:
        convert(str(bad), out, Target(arch="gfx942"), progress="none")
    msg = str(ei.value)
    assert name in msg and f"byte offset {off}" in msg and "--allow-nan-scales" in msg
    assert not list(out.glob("model-*.safetensors")) and not (out / "mxfp4conv.json").exists()
    convert(str(bad), tmp_path / "o2", Target(arch="gfx942"), progress="none", allow_nan_scales=True)
    assert verify(tmp_path / "o2", str(bad)).ok


def test_bad_shard_size(tmp_path, tmp_path_factory):
    src_dir = source_for(tmp_path_factory, "kimi_k3", None)
    with pytest.raises(Mxfp4convError, match="not a size"):
        convert(str(src_dir), tmp_path / "o", Target(arch="gfx950"), shard_size="five", progress="none")
    assert not (tmp_path / "o").exists()


def test_verify_detects_a_flipped_expert_byte(tmp_path, tmp_path_factory):
    src_dir = source_for(tmp_path_factory, "deepseek_v4", None)
    out = tmp_path / "o"
    convert(str(src_dir), out, Target(arch="gfx950", tp=2), progress="none")
    wm = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    model = load_model(open_source(str(src_dir)))
    name = f"{model.layers[0].prefix}.experts.rank1.w2_weight"
    from mxfp4conv.checkpoint.safetensors_io import read_header

    h = read_header(out / wm[name])
    b, _ = h.absolute(name)
    with open(out / wm[name], "r+b") as f:
        f.seek(b + 1000)
        x = f.read(1)
        f.seek(b + 1000)
        f.write(bytes([x[0] ^ 0x10]))
    with pytest.raises(VerifyError) as ei:  # structure is fine, the recorded checksum is not
        verify(out)
    assert ei.value.cls == "checksum" and ei.value.where == {"shard": wm[name], "tensor": name}
    with pytest.raises(VerifyError) as ei:
        verify(out, str(src_dir))
    e = ei.value
    assert e.where["tensor"] == name and e.where["rank"] == 1 and e.where["layer"] == model.layers[0].prefix


@pytest.mark.parametrize("family,tp,ep,arch", [("kimi_k3", 2, False, "gfx950"), ("deepseek_v4", 2, True, "gfx950"),
                                               ("quark", 2, False, "gfx942"), ("deepseek_v4", 1, False, "gfx950")])
def test_direct_reader_matches_read_expert_path(tmp_path_factory, family, tp, ep, arch):
    from mxfp4conv.checkpoint.experts import read_expert
    from mxfp4conv.convert.direct_read import DirectReader, build_chunk_direct
    from mxfp4conv.convert.rank_tensors import WEIGHT_KINDS, RankGeometry, build_chunk

    src_dir = source_for(tmp_path_factory, family, None)
    source = open_source(str(src_dir))
    model = load_model(source)
    g = RankGeometry.from_decision(decide(model, Target(arch=arch, tp=tp, ep=ep)))
    reader = DirectReader(source)
    layer = model.layers[-1]
    for r in range(tp):
        experts = range(g.expert_range(r).start + 1, g.expert_range(r).stop)
        ranks = g.owner(experts.start)
        direct = build_chunk_direct(reader, layer, experts, g, ranks, WEIGHT_KINDS)
        for rr in ranks:
            ref = build_chunk([read_expert(source, layer, e) for e in experts], g, rr, WEIGHT_KINDS)
            for k in WEIGHT_KINDS:
                assert torch.equal(direct[(rr, k)], ref[k]), (rr, k)
    reader.close()


def test_rich_progress_bar_renders_bytes():
    import io

    from mxfp4conv.convert.progress import Progress

    buf = io.StringIO()
    p = Progress(2_000_000, "rich", stream=buf)
    p.describe("model-00001-of-00001.safetensors")
    p.advance(2_000_000)
    p.close()
    out = buf.getvalue()
    assert "model-00001-of-00001.safetensors" in out and "2.0" in out and "MB" in out
