"""The runtime on vLLM 0.33.0's formats, with real bytes: Kimi-K3 SiTUv2 modes from the manifest
(a4w4 = dynamic MXFP4 activations) and checkpoints stored in the triton_kernels layouts."""

import json
import os

import pytest
import torch

from mxfp4conv.errors import CheckpointError
from mxfp4conv.runtime import fused_moe, load_moe_layers
from mxfp4conv.runtime.loader import LayoutConversionWarning
from mxfp4conv.shuffle.layouts import get_layout
from runtime_fixtures import (
    expert64, global_experts, manifest_for, moe64, mxfp4_qdq64, rank_tensors, rel_err, triton_ready,
    write_converted,
)

LAYER = "model.layers.2.mlp"
H, H_PAD, I, E = 224, 256, 256, 4
SITU = {"beta": 4.0, "linear_beta": 25.0}
KINDS = {"w13_weight": "w13", "w13_weight_scale": "w13_scale", "w2_weight": "w2", "w2_weight_scale": "w2_scale"}
K3_AITER = {"w13": "aiter_p16", "w13_scale": "aiter_scale_a16w4", "w2": "aiter_p16", "w2_scale": "aiter_e8m0_shuffle"}
K3_AITER_GU16 = {**K3_AITER, "w13": "aiter_p16_gu16", "w13_scale": "aiter_scale_a16w4_gu16"}


def _write(root, layout, *, tp=1, arch="gfx950", backend="AITER_MXFP4_BF16", activation="situ", params=SITU,
           runtime_env=None, kernel_act=None, act_quant="bf16", i_pad=None):
    i_rank = I // tp
    i_pad = i_pad or i_rank
    m = manifest_for(arch=arch, backend=backend, tp=tp, activation=activation, activation_params=params,
                     act_quant=act_quant, hidden=H, hidden_padded=H_PAD, intermediate=I, i_rank=i_rank,
                     i_rank_padded=i_pad, num_experts=E, top_k=2, layers=[LAYER], layout=layout,
                     runtime_env=runtime_env)
    if kernel_act is not None:
        m["target"]["options"]["kernel_act"] = kernel_act
    d = global_experts(7, E=E, H=H, I=I)
    tensors, canon = {}, {}
    for r in range(tp):
        canon[r] = rank_tensors(d, tp=tp, ep=False, rank=r, H_pad=H_PAD, I_pad=i_pad)
        for kind, v in canon[r].items():
            stored = get_layout(layout[KINDS[kind]]).forward(v) if kind in KINDS else v
            tensors[f"{LAYER}.experts.rank{r}.{kind}"] = stored
    write_converted(root, m, tensors, shards=1)
    return d, canon


def _routing(T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:2] for _ in range(T)])
    return torch.softmax(torch.randn(T, 2, generator=g), -1), ids


def _load(root, rank=0):
    with pytest.warns(LayoutConversionWarning):
        return load_moe_layers(root, rank=rank, backend="torch")[LAYER]


# ---- SiTUv2 ----------------------------------------------------------------------------------
@pytest.mark.parametrize("env,kernel_act,layout,mode,aq", [
    ({"VLLM_ROCM_USE_AITER_MOE_SITUV2": "auto"}, None, K3_AITER, "a4w4", "mxfp4"),
    ({"VLLM_ROCM_USE_AITER_MOE_SITUV2": "1"}, "mxfp4", K3_AITER, "a4w4", "mxfp4"),
    ({}, "mxfp4", K3_AITER, "a4w4", "mxfp4"),
    ({"VLLM_ROCM_USE_AITER_MOE_SITUV2": "a16w4"}, None, K3_AITER, "a16w4", "none"),
    ({"VLLM_ROCM_USE_AITER_MOE_SITUV2": "0"}, "bf16", K3_AITER, "a16w4", "none"),
    ({"VLLM_ROCM_USE_AITER_MOE_SITUV2": "a8w4"}, "fp8", K3_AITER_GU16, "a8w4", "fp8"),
    ({"VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4": "1"}, None, K3_AITER_GU16, "a8w4", "fp8"),
    ({}, None, K3_AITER, "a16w4", "none"),  # nothing pinned: the manifest's act_quant (bf16)
])
def test_situv2_mode_comes_from_the_manifest(tmp_path, env, kernel_act, layout, mode, aq):
    _write(tmp_path, layout, runtime_env=env, kernel_act=kernel_act)
    ex = _load(tmp_path)
    assert (ex.situv2, ex.act_quant) == (mode, aq)


def test_situv2_a4w4_runs_mxfp4_activations(tmp_path):
    d, _ = _write(tmp_path, K3_AITER, tp=2, runtime_env={"VLLM_ROCM_USE_AITER_MOE_SITUV2": "auto"})
    x = torch.randn(6, H, generator=torch.Generator().manual_seed(1)) * 3
    w, ids = _routing()
    got = sum(fused_moe(x, _load(tmp_path, r), w, ids).double() for r in range(2))  # no act_quant flag
    want = moe64(x, w, ids, expert64(d, "situ", SITU, act_q=lambda v, _: mxfp4_qdq64(v)))
    plain = moe64(x, w, ids, expert64(d, "situ", SITU))
    assert rel_err(got, want) < 1e-5
    assert rel_err(want, plain) > 1e-3  # a16w4 would be visibly different
    w4a16 = sum(fused_moe(x, _load(tmp_path, r), w, ids, act_quant="none").double() for r in range(2))
    assert rel_err(w4a16, plain) < 1e-5


def test_situv2_on_aiter_sets_aiters_own_switch(tmp_path, monkeypatch):
    for var in ("VLLM_ROCM_USE_AITER_MOE_SITUV2", "AITER_SITUV2_A4W4", "AITER_SITUV2_A8W4"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AITER_SITUV2_A8W4", "1")  # left over from another mode: vLLM clears it
    _write(tmp_path, K3_AITER, runtime_env={"VLLM_ROCM_USE_AITER_MOE_SITUV2": "auto"})
    ex = load_moe_layers(tmp_path, backend="aiter")[LAYER]
    assert ex.situv2 == "a4w4" and ex.is_shuffled
    assert os.environ["AITER_SITUV2_A4W4"] == "1" and "AITER_SITUV2_A8W4" not in os.environ
    assert ex.runtime_env_applied == {"VLLM_ROCM_USE_AITER_MOE_SITUV2": "auto", "AITER_SITUV2_A4W4": "1"}


@pytest.mark.parametrize("layout,env,kernel_act,match", [
    (K3_AITER, {"VLLM_ROCM_USE_AITER_MOE_SITUV2": "a8w4"}, None, "with the 16-row gate/up interleave"),
    (K3_AITER_GU16, {"VLLM_ROCM_USE_AITER_MOE_SITUV2": "auto"}, None, "without the 16-row gate/up interleave"),
    (K3_AITER_GU16, {}, None, "SiTUv2 a16w4"),
    (K3_AITER, {"VLLM_ROCM_USE_AITER_MOE_SITUV2": "a4w4"}, "fp8", "contradict"),
    (K3_AITER, {"VLLM_ROCM_USE_AITER_MOE_SITUV2": "a2w4"}, None, "does not accept"),
])
def test_situv2_contradictions_are_refused(tmp_path, layout, env, kernel_act, match):
    _write(tmp_path, layout, runtime_env=env, kernel_act=kernel_act)
    with pytest.raises(CheckpointError, match=match) as err:
        load_moe_layers(tmp_path, backend="torch")
    assert str(tmp_path) in str(err.value)


def test_situv2_mode_ignored_off_aiter_situ(tmp_path):
    # gfx1250 (Triton W4A16) and non-SiTU layers do not run aiter's SiTUv2 kernels
    _write(tmp_path, {k: "identity" for k in K3_AITER}, arch="gfx1250",
           runtime_env={"VLLM_ROCM_USE_AITER_MOE_SITUV2": "auto"})
    ex = load_moe_layers(tmp_path, backend="torch")[LAYER]
    assert ex.situv2 is None and ex.act_quant == "none"


def test_unknown_act_quant_in_manifest_is_refused(tmp_path):
    _write(tmp_path, K3_AITER, act_quant="int3")
    with pytest.raises(CheckpointError, match="target.act_quant is 'int3'"):
        load_moe_layers(tmp_path, backend="torch")


# ---- triton_kernels layouts ------------------------------------------------------------------
TRITON_RECIPES = [  # (arch, backend, tp, layout) as vLLM 0.33.0's _swizzle_mxfp4 leaves the bytes;
    # I per rank padded to 256 (vLLM's gfx950 rule, and what CDNA4MXScaleLayout's 8-column tiles need)
    ("gfx950", "TRITON_UNFUSED", 1, {"w13": "identity", "w13_scale": "triton_cdna4_scale",
                                     "w2": "identity", "w2_scale": "triton_cdna4_scale"}),
    ("gfx950", "AITER_TRITON_MXFP4_BF16", 2, {"w13": "triton_gu1", "w13_scale": "triton_cdna4_scale_gu1",
                                              "w2": "identity", "w2_scale": "triton_cdna4_scale"}),
    ("gfx942", "AITER_TRITON_MXFP4_BF16", 2, {"w13": "triton_gu1", "w13_scale": "triton_gu1",
                                              "w2": "identity", "w2_scale": "identity"}),
    ("gfx1250", "AITER_TRITON_MXFP4_BF16", 2, {"w13": "triton_gu1", "w13_scale": "triton_gfx1250_scale_gu1",
                                               "w2": "identity", "w2_scale": "triton_gfx1250_scale"}),
]


@pytest.mark.parametrize("arch,backend,tp,layout", TRITON_RECIPES, ids=[f"{r[0]}-{r[1]}-tp{r[2]}" for r in TRITON_RECIPES])
def test_triton_layout_checkpoints_run_on_torch(tmp_path, arch, backend, tp, layout):
    d, canon = _write(tmp_path, layout, tp=tp, arch=arch, backend=backend, activation="silu", params={}, i_pad=256)
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(2))
    w, ids = _routing(5, seed=3)
    total = 0
    for r in range(tp):
        ex = _load(tmp_path, r)
        assert ex.is_canonical and ex.stored_layout == layout and not ex.is_shuffled
        for kind in KINDS:
            assert torch.equal(getattr(ex, kind), canon[r][kind]), kind
        total = total + fused_moe(x, ex, w, ids).double()
    assert rel_err(total, moe64(x, w, ids, expert64(d, "silu", {}))) < 2e-5


def test_triton_layout_with_a_wrong_stored_shape_is_refused(tmp_path):
    layout = TRITON_RECIPES[1][3]
    _write(tmp_path, layout, tp=2, arch="gfx950", backend="AITER_TRITON_MXFP4_BF16", activation="silu", params={},
           i_pad=256)
    m = json.loads((tmp_path / "mxfp4conv.json").read_text())
    m["moe"]["hidden_padded"] = 512  # the stored tensors no longer fit the geometry
    (tmp_path / "mxfp4conv.json").write_text(json.dumps(m))
    from safetensors.torch import load_file, save_file

    for shard in tmp_path.glob("model-*.safetensors"):  # stamped consistently, so the shape check is what refuses
        stamp = {k: v for k, v in m.items() if k != "checksums"}  # added after the shards are written
        save_file(load_file(shard), str(shard), metadata={"format": "pt", "mxfp4conv": json.dumps(stamp)})
    with pytest.raises(CheckpointError, match="w13_weight has shape|cannot undo layout"):
        load_moe_layers(tmp_path, backend="torch")


# ---- written by convert, checked by verify, read back by the loader --------------------------
@pytest.mark.parametrize("arch,backend,tp,layout", [TRITON_RECIPES[1], TRITON_RECIPES[3]],
                         ids=["gfx950-aiter-triton", "gfx1250-aiter-triton"])
def test_convert_writes_triton_layouts(tmp_path, monkeypatch, arch, backend, tp, layout):
    import dataclasses

    import mxfp4conv.oracle as oracle
    from mxfp4conv.checkpoint.synthetic import make_checkpoint
    from mxfp4conv.convert.run import convert
    from mxfp4conv.convert.verify import verify
    from mxfp4conv.oracle.decision import LayoutRecipe, Target
    from test_runtime_e2e import _check, _source_oracle

    real = oracle.decide

    def with_recipe(model, target):  # stands in for the oracle's recipe for this backend
        d = real(model, target)
        return dataclasses.replace(d, layout=LayoutRecipe(**layout), is_shuffled=False, gate_mode="separated")

    monkeypatch.setattr(oracle, "decide", with_recipe)
    src = make_checkpoint("deepseek_v4", tmp_path / "src", seed=5, hidden=256, intermediate=512, num_experts=4,
                          top_k=2, num_layers=1)
    out = tmp_path / "out"
    # vLLM 0.33.0 has no backend for DeepSeek-V4 on gfx1250: there only the explicit request for
    # mxfp4conv's own format converts (its recipe replaced above by the one under test)
    convert(str(src), out, Target(arch=arch, tp=tp, layout="identity" if arch == "gfx1250" else "auto"),
            progress="none")
    m = json.loads((out / "mxfp4conv.json").read_text())
    assert {k: m["layout"][k] for k in layout} == layout
    assert verify(out, str(src)).ok
    model, fns = _source_oracle(src)
    _check(out, model, fns, tp, torch.float32, 2e-5)


@pytest.mark.skipif(not triton_ready(), reason="the Triton kernel module is not importable here")
def test_triton_layout_checkpoint_runs_on_the_triton_backend(tmp_path):
    arch, backend, tp, layout = TRITON_RECIPES[1]
    d, _ = _write(tmp_path, layout, tp=tp, arch=arch, backend=backend, activation="silu", params={}, i_pad=256)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(2))
    w, ids = _routing(5, seed=3)
    total = 0
    for r in range(tp):
        with pytest.warns(LayoutConversionWarning, match="triton_cdna4_scale"):
            ex = load_moe_layers(tmp_path, rank=r, backend="triton", device=dev)[LAYER]
        total = total + fused_moe(x.to(dev), ex, w.to(dev), ids.to(dev), backend="triton").double().cpu()
    tol = 5e-3 if dev == "cuda" else 2e-5  # TF32 tl.dot on a GPU
    assert rel_err(total, moe64(x, w, ids, expert64(d, "silu", {}))) < tol
