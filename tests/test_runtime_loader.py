"""load_moe_layers on converted-format directories written straight from the format spec."""

import json
import os
import warnings

import pytest
import torch

from mxfp4conv.errors import CheckpointError, Mxfp4convError, RuntimeInputError
from mxfp4conv.runtime import MoEExperts, fused_moe, load_moe_layers
from mxfp4conv.runtime.loader import LayoutConversionWarning
from runtime_fixtures import expert64, global_experts, manifest_for, moe64, rank_tensors, rel_err, write_converted

LAYERS = ("model.layers.1.mlp", "model.layers.3.mlp")
H, H_PAD, I, E = 224, 256, 192, 4


def _write(root, *, tp=2, ep=False, layout=None, runtime_env=None, activation="swigluoai", params=None,
           bias=True, arch="cpu", backend="EMULATION", transform=None, extra=None):
    i_rank = I if ep else I // tp
    i_pad = ((i_rank + 127) // 128) * 128
    m = manifest_for(arch=arch, backend=backend, tp=tp, ep=ep, activation=activation,
                     activation_params=params or {}, hidden=H, hidden_padded=H_PAD, intermediate=I,
                     i_rank=i_rank, i_rank_padded=i_pad, num_experts=E, top_k=2, layers=LAYERS,
                     layout=layout, runtime_env=runtime_env)
    tensors, canon, ds = {}, {}, {}
    for li, prefix in enumerate(LAYERS):
        d = global_experts(100 + li, E=E, H=H, I=I, bias=bias)
        ds[prefix] = d
        for r in range(tp):
            t = rank_tensors(d, tp=tp, ep=ep, rank=r, H_pad=H_PAD, I_pad=i_pad)
            canon[(prefix, r)] = t
            for kind, v in t.items():
                tensors[f"{prefix}.experts.rank{r}.{kind}"] = transform(kind, v) if transform else v
    tensors["model.embed_tokens.weight"] = torch.randn(8, H)
    tensors.update(extra or {})
    write_converted(root, m, tensors)
    return ds, canon


def _routing(T=5, k=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    return torch.softmax(torch.randn(T, k, generator=g), -1), ids


@pytest.mark.parametrize("ep", [False, True])
def test_load_ranks_and_sum(tmp_path, ep):
    ds, canon = _write(tmp_path, tp=2, ep=ep)
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(1))
    w, ids = _routing()
    for prefix in LAYERS:
        total = 0
        for r in range(2):
            layers = load_moe_layers(tmp_path, rank=r)
            assert set(layers) == set(LAYERS)
            ex = layers[prefix]
            assert isinstance(ex, MoEExperts)
            assert (ex.hidden, ex.hidden_padded, ex.num_experts, ex.tp, ex.ep, ex.rank) == (H, H_PAD, E, 2, ep, r)
            assert ex.experts_per_rank == (2 if ep else 4) and ex.expert_offset == (2 * r if ep else 0)
            assert ex.intermediate_per_rank == (I if ep else I // 2) and ex.activation == "swigluoai"
            for kind in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_bias", "w2_bias"):
                assert torch.equal(getattr(ex, kind), canon[(prefix, r)][kind]), kind
            assert not ex.is_shuffled and ex.runtime_env_applied == {}
            total = total + fused_moe(x, ex, w, ids, backend="torch").double()
        want = moe64(x, w, ids, expert64(ds[prefix], "swigluoai", {}))
        assert rel_err(total, want) < 2e-5


def test_reads_only_this_ranks_tensors(tmp_path, monkeypatch):
    _write(tmp_path, tp=2)
    import mxfp4conv.runtime.loader as loader

    read = []
    real = loader.safe_open

    class Spy:
        def __init__(self, *a, **k):
            self.f = real(*a, **k)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *a):
            return self.f.__exit__(*a)

        def keys(self):
            return self.f.keys()

        def get_tensor(self, name):
            read.append(name)
            return self.f.get_tensor(name)

    monkeypatch.setattr(loader, "safe_open", Spy)
    load_moe_layers(tmp_path, rank=1)
    assert read and all(".experts.rank1." in n for n in read)
    assert len(read) == 2 * 6


def _edit_manifest(root, fn, restamp=True):
    """Edit mxfp4conv.json; ``restamp``: the copy in every shard's __metadata__ too, as a
    consistent (if wrong) conversion would have it."""
    from safetensors.torch import load_file, save_file

    p = root / "mxfp4conv.json"
    m = json.loads(p.read_text())
    fn(m)
    p.write_text(json.dumps(m))
    if restamp:
        for shard in sorted(root.glob("model-*.safetensors")):
            stamp = {k: v for k, v in m.items() if k != "checksums"}  # added after the shards are written
            save_file(load_file(shard), str(shard), metadata={"format": "pt", "mxfp4conv": json.dumps(stamp)})


@pytest.mark.parametrize("edit", [
    lambda m: m["layout"].update(w13="aiter_a16w4_w13"),
    lambda m: m["moe"].update(layers=m["moe"]["layers"][:1]),
    lambda m: m["target"].update(arch="gfx950"),
    lambda m: m["target"].update(activation="silu"),
    lambda m: m["moe"].update(top_k=1),
])
def test_edited_manifest_is_refused_at_load(tmp_path, edit):
    _write(tmp_path, tp=2)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    _edit_manifest(tmp_path, edit, restamp=False)
    with pytest.raises(CheckpointError, match="stamped in this shard's __metadata__ differs"):
        load_moe_layers(tmp_path, rank=0)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != "mxfp4conv.json"} == \
        {k: v for k, v in before.items() if k != "mxfp4conv.json"}


def test_truncated_shard_is_a_clear_error(tmp_path):
    _write(tmp_path, tp=2)
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-1])
    with pytest.raises(CheckpointError, match=f"{shard.name}.*truncated"):
        load_moe_layers(tmp_path, rank=0)


@pytest.mark.parametrize("edit,kwargs,exc,match", [
    (lambda m: m.update(version=3), {}, CheckpointError, "version 3"),
    (lambda m: m.update(format="other"), {}, CheckpointError, "format 'other'"),
    (None, {"arch": "gfx950"}, RuntimeInputError, "arch 'cpu'.*arch 'gfx950'"),
    (None, {"tp": 4}, RuntimeInputError, "tp=2.*tp=4"),
    (None, {"rank": 2}, RuntimeInputError, "rank 2 is out of range.*0..1"),
    (None, {"rank": -1}, RuntimeInputError, "rank -1"),
    (None, {"backend": "AITER_MXFP4_BF16"}, RuntimeInputError, "'EMULATION'.*'AITER_MXFP4_BF16'"),
    (None, {"backend": "aiter"}, RuntimeInputError, "backend 'aiter' needs"),
    (lambda m: m["moe"].update(hidden_padded=512), {}, CheckpointError, "rank0.w13_weight has shape"),
    (lambda m: m["moe"].update(layers=["model.layers.9.mlp"]), {}, CheckpointError, "model.layers.9.mlp.experts.rank0.w13_weight"),
])
def test_mismatches_are_refused(tmp_path, edit, kwargs, exc, match):
    _write(tmp_path, tp=2)
    if edit:
        _edit_manifest(tmp_path, edit)
    with pytest.raises(exc, match=match):
        load_moe_layers(tmp_path, **kwargs)


def test_matching_request_and_alias(tmp_path):
    _write(tmp_path, tp=2, arch="gfx942")
    assert load_moe_layers(tmp_path, rank=1, arch="gfx942", tp=2, backend="EMULATION")
    try:
        from mxfp4conv.oracle import resolve_arch  # noqa: F401
    except ImportError:
        return
    assert load_moe_layers(tmp_path, arch="mi300x", tp=2)


def test_not_converted_directory(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(Mxfp4convError, match="no mxfp4conv.json"):
        load_moe_layers(tmp_path)


# ---- AITER-shuffled checkpoints --------------------------------------------------------------
AITER_LAYOUTS = [
    {"w13": "aiter_p16", "w13_scale": "aiter_scale_a16w4", "w2": "aiter_p16", "w2_scale": "aiter_e8m0_shuffle"},
    {"w13": "aiter_p16_gu16", "w13_scale": "aiter_scale_a16w4_gu16", "w2": "aiter_p16", "w2_scale": "aiter_scale_a16w4"},
]


def _situv2_env(layout):
    """The SiTUv2 mode each w13 layout serves (a8w4 reads the gate/up interleave)."""
    mode = "a8w4" if layout["w13"].endswith("gu16") else "a16w4"
    return {"AITER_BF16_FP8_MOE_BOUND": "0", "VLLM_ROCM_USE_AITER_MOE_SITUV2": mode}


def _forward(layout):
    from mxfp4conv.shuffle.layouts import get_layout

    kinds = {"w13_weight": "w13", "w13_weight_scale": "w13_scale", "w2_weight": "w2", "w2_weight_scale": "w2_scale"}

    def transform(kind, v):
        return get_layout(layout[kinds[kind]]).forward(v) if kind in kinds else v

    return transform


@pytest.mark.parametrize("layout", AITER_LAYOUTS)
def test_aiter_checkpoint_unshuffled_for_torch(tmp_path, layout):
    pytest.importorskip("mxfp4conv.shuffle.layouts")
    gate_mode = "interleave" if layout["w13"].endswith("gu16") else "separated"
    ds, canon = _write(tmp_path, tp=2, layout=layout, arch="gfx950", backend="AITER_MXFP4_BF16",
                       activation="situ", params={"beta": 4.0, "linear_beta": 25.0},
                       bias=False, transform=_forward(layout), runtime_env=_situv2_env(layout))
    _edit_manifest(tmp_path, lambda m: m["target"].update(gate_mode=gate_mode))
    with pytest.warns(LayoutConversionWarning) as rec:
        layers = load_moe_layers(tmp_path, rank=1, backend="torch")
    assert len(rec) == 1 and "inverses" in str(rec[0].message)
    ex = layers[LAYERS[0]]
    assert ex.is_canonical and not ex.is_shuffled and ex.stored_layout == layout
    for kind in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"):
        assert torch.equal(getattr(ex, kind), canon[(LAYERS[0], 1)][kind]), kind
    assert ex.runtime_env_applied == {}


@pytest.mark.parametrize("layout", AITER_LAYOUTS)
def test_aiter_checkpoint_kept_for_aiter(tmp_path, layout, monkeypatch):
    pytest.importorskip("mxfp4conv.shuffle.layouts")
    for var in ("AITER_BF16_FP8_MOE_BOUND", "VLLM_ROCM_USE_AITER_MOE_SITUV2", "AITER_SITUV2_A8W4", "AITER_SITUV2_A4W4"):
        monkeypatch.delenv(var, raising=False)
    gate_mode = "interleave" if layout["w13"].endswith("gu16") else "separated"
    ds, canon = _write(tmp_path, tp=2, layout=layout, arch="gfx950", backend="AITER_MXFP4_BF16",
                       activation="situ", params={"beta": 4.0, "linear_beta": 25.0},
                       bias=False, transform=_forward(layout), runtime_env=_situv2_env(layout))
    _edit_manifest(tmp_path, lambda m: m["target"].update(gate_mode=gate_mode))
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayoutConversionWarning)
        layers = load_moe_layers(tmp_path, rank=0, backend="aiter")
    ex = layers[LAYERS[1]]
    assert ex.is_shuffled and ex.w13_weight.is_shuffled and ex.w2_weight.is_shuffled
    assert ex.layout == layout and not ex.is_canonical
    assert os.environ["AITER_BF16_FP8_MOE_BOUND"] == "0"
    env = _situv2_env(layout)
    aiter_switch = {"AITER_SITUV2_A8W4": "1"} if ex.situv2 == "a8w4" else {}
    assert ex.runtime_env_applied == {**env, **aiter_switch}
    assert ex.situv2 == env["VLLM_ROCM_USE_AITER_MOE_SITUV2"] and "AITER_SITUV2_A4W4" not in os.environ
    assert ex.act_quant == ("fp8" if ex.situv2 == "a8w4" else "none")
    # the torch backend still computes the right answer from the shuffled bytes (W4A16 math)
    x = torch.randn(4, H, generator=torch.Generator().manual_seed(3))
    w, ids = _routing(4)
    total = sum(fused_moe(x, load_moe_layers(tmp_path, rank=r, backend="aiter")[LAYERS[1]], w, ids,
                          backend="torch", act_quant="none").double() for r in range(2))
    want = moe64(x, w, ids, expert64(ds[LAYERS[1]], "situ", {"beta": 4.0, "linear_beta": 25.0}))
    assert rel_err(total, want) < 2e-5


# ---- the Hopper layouts ----------------------------------------------------------------------
HOPPER = {"w13": "hopper_mma_w", "w13_scale": "hopper_mma_s", "w2": "hopper_mma_w", "w2_scale": "hopper_mma_s"}
HOPPER_ROT = {**HOPPER, "w13": "hopper_mma_w_rot", "w2": "hopper_mma_w_rot"}
HOPPER_XOR = {**HOPPER, "w13": "hopper_mma_w_xor", "w2": "hopper_mma_w_xor"}  # what convert writes


@pytest.mark.parametrize("stored", [HOPPER_XOR, HOPPER_ROT, HOPPER], ids=["w_xor", "w_rot", "w"])
def test_hopper_layout_is_inverted_for_torch_and_shape_checked(tmp_path, stored):
    from mxfp4conv.shuffle.layouts import get_layout

    names = {"w13_weight": "w13", "w13_weight_scale": "w13_scale", "w2_weight": "w2", "w2_weight_scale": "w2_scale"}

    def transform(kind, v):
        return get_layout(stored[names[kind]]).forward(v) if kind in names else v

    ds, canon = _write(tmp_path, tp=2, arch="sm90", layout=stored, transform=transform)
    with pytest.warns(LayoutConversionWarning, match=stored["w13"]):
        ex = load_moe_layers(tmp_path, rank=1, backend="torch")[LAYERS[0]]
    assert ex.is_canonical and ex.stored_layout["w13"] == stored["w13"] and not ex.is_shuffled
    for kind, name in names.items():
        assert torch.equal(ex.tensor(name).view(torch.uint8), canon[(LAYERS[0], 1)][kind].view(torch.uint8))
    _edit_manifest(tmp_path, lambda m: m["moe"].update(hidden_padded=512))
    with pytest.raises(CheckpointError, match="rank0.w13_weight has shape"):
        load_moe_layers(tmp_path, backend="torch")
