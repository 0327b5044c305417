"""``mxfp4conv plan`` on small synthetic checkpoints in each family's real on-disk format."""

from __future__ import annotations

import json

import pytest

from mxfp4conv.checkpoint import load_model, open_source
from mxfp4conv.checkpoint.synthetic import make_checkpoint
from mxfp4conv.cli import main
from mxfp4conv.oracle import Target, decide


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan")
    return {
        "kimi_k3": make_checkpoint("kimi_k3", root / "k3", intermediate=512, num_layers=1),
        "deepseek_v4": make_checkpoint("deepseek_v4", root / "dsv4", num_layers=1),
        "gpt_oss": make_checkpoint("gpt_oss", root / "gptoss", num_layers=1),
        "quark_w4a4": make_checkpoint("quark", root / "q4", scheme="w_mxfp4_a_mxfp4", num_layers=1),
        "quark_w4a16": make_checkpoint("quark", root / "q16", scheme="w_mxfp4", num_layers=1),
    }


def run(capsys, *argv):
    try:
        main(list(argv))
        rc = 0
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


# (checkpoint, CLI target args, Target, expected plan fields)
PLANS = [
    ("kimi_k3", ["--arch", "mi355x", "--tp", "4"], Target("gfx950", tp=4),
     dict(backend="AITER_MXFP4_BF16", intermediate_per_rank=128, intermediate_per_rank_padded=256,
          gate_mode="separated", layout_w13="aiter_p16", layout_w2_scale="aiter_e8m0_shuffle")),
    ("kimi_k3", ["--arch", "gfx950", "--tp", "2", "--act-quant", "fp8"],
     Target("gfx950", tp=2, act_quant="fp8"),
     dict(backend="AITER_MXFP4_BF16", act_quant="fp8", intermediate_per_rank_padded=256,
          gate_mode="interleave", layout_w13="aiter_p16_gu16",
          env=("VLLM_ROCM_USE_AITER_MOE_SITUV2", "a8w4"))),
    ("kimi_k3", ["--arch", "gfx942", "--tp", "2"], Target("gfx942", tp=2),
     dict(backend="EMULATION", intermediate_per_rank_padded=256, layout_w13="identity")),
    ("kimi_k3", ["--arch", "h200"], Target("sm90"),
     dict(backend="EMULATION", vllm_backend="HUMMING", layout_w13="hopper_mma_w_xor")),
    ("kimi_k3", ["--arch", "h200", "--layout", "identity"], Target("sm90", layout="identity"),
     dict(backend="EMULATION", vllm_backend="HUMMING", layout_w13="identity")),
    ("kimi_k3", ["--arch", "gfx950", "--no-aiter"], Target("gfx950", aiter=False),
     dict(backend="EMULATION", vllm_backend="EMULATION")),
    ("deepseek_v4", ["--arch", "gfx950", "--tp", "2"], Target("gfx950", tp=2),
     dict(backend="AITER_MXFP4_BF16", intermediate_per_rank_padded=128, gate_mode="interleave",
          layout_w13="aiter_p16_gu16", layout_w2_scale="aiter_scale_a16w4",
          env="AITER_BF16_FP8_MOE_BOUND")),
    ("deepseek_v4", ["--arch", "gfx942", "--tp", "2"], Target("gfx942", tp=2),
     dict(backend="TRITON_UNFUSED", intermediate_per_rank_padded=128, layout_w13="identity")),
    ("gpt_oss", ["--arch", "gfx950", "--ep", "--tp", "2"], Target("gfx950", tp=2, ep=True),
     dict(backend="AITER_MXFP4_BF16", experts_per_rank=4, layout_w13="aiter_p16_gu16")),
    ("gpt_oss", ["--arch", "b200"], Target("sm100"),
     dict(backend="FLASHINFER_TRTLLM_MXFP4_BF16", vllm_backend="FLASHINFER_TRTLLM_MXFP4_BF16",
          layout_w13="trtllm_w13")),
    ("gpt_oss", ["--arch", "b200", "--layout", "identity"], Target("sm100", layout="identity"),
     dict(backend="EMULATION", vllm_backend="FLASHINFER_TRTLLM_MXFP4_BF16", layout_w13="identity")),
    ("quark_w4a4", ["--arch", "gfx950"], Target("gfx950"),
     dict(backend="AITER_MXFP4_MXFP4", act_quant="mxfp4", scale_pad_byte=1,
          layout_w13_scale="aiter_e8m0_shuffle")),
    ("quark_w4a16", ["--arch", "gfx950", "--backend", "emulation"],
     Target("gfx950", backend="emulation"),
     dict(backend="EMULATION", scale_pad_byte=1, layout_w13="identity")),
]


@pytest.mark.parametrize("name,args,target,exp", PLANS, ids=[f"{p[0]}-{'_'.join(p[1])}" for p in PLANS])
def test_plan_json_matches_oracle(capsys, ckpts, name, args, target, exp):
    rc, out, err = run(capsys, "plan", str(ckpts[name]), *args, "--json")
    assert rc == 0, err
    got = json.loads(out)
    model = load_model(open_source(str(ckpts[name])))
    want = decide(model, target).plan_json()
    assert {k: got[k] for k in want} == json.loads(json.dumps(want))
    assert got["family"] == model.family and got["quant_scheme"] == model.quant_scheme
    for key, value in exp.items():
        if key.startswith("layout_"):
            assert got["layout"][key[len("layout_"):]] == value
        elif key == "env" and isinstance(value, tuple):
            assert got["runtime_env"].get(value[0]) == value[1]
            assert "VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4" not in got["runtime_env"]  # not read by 0.33
        elif key == "env":
            assert value in got["runtime_env"]
        elif key == "vllm_backend":
            assert got["options"]["vllm_backend"] == value
        else:
            assert got[key] == value, key
    assert [c for c in got["candidates"] if c["selected"]][0]["backend"] == got["backend"]
    assert all(c["reason"] for c in got["candidates"])


def test_plan_human_trace(capsys, ckpts):
    rc, short, _ = run(capsys, "plan", str(ckpts["kimi_k3"]), "--arch", "h200", "--tp", "4")
    assert rc == 0
    for text in ("Backend: EMULATION (vLLM would pick HUMMING); 2 rejected before it (--trace lists why)",
                 "[gate; up]", "Padded geometry per rank", "Kimi-K3 model rule", "Server environment"):
        assert text in short, text
    assert "Backends tried" not in short and "AITER" not in short  # no AITER on an NVIDIA target
    assert len(short.splitlines()) <= 15
    for flag in ("--trace", "-v"):
        rc, out, _ = run(capsys, "plan", str(ckpts["kimi_k3"]), "--arch", "h200", "--tp", "4", flag)
        assert rc == 0 and "Backends tried, in order" in out, flag
        assert "  1. FLASHINFER_TRTLLM_MXFP4_MXFP8: rejected: " in out and "  3. HUMMING: vLLM's pick: " in out
        assert "Modelled vLLM server" in out
    rc, out, _ = run(capsys, "plan", str(ckpts["kimi_k3"]), "--arch", "gfx950", "--act-quant", "fp8")
    out = " ".join(out.split())
    assert rc == 0 and "VLLM_ROCM_USE_AITER_MOE_SITUV2=a8w4" in out and "aiter_p16_gu16" in out


@pytest.mark.parametrize("flag,version", [
    (["--vllm", "0.33"], "0.33.0"), (["--vllm", "0.33.0"], "0.33.0"), (["--vllm", "v0.34"], "0.34.0"),
    (["--vllm", "0.34.0"], "0.34.0")])
def test_plan_names_the_vllm_release(capsys, ckpts, flag, version):
    rc, out, _ = run(capsys, "plan", str(ckpts["deepseek_v4"]), "--arch", "gfx950", *flag)
    flat = " ".join(out.split())
    assert rc == 0 and f"vLLM {version} (the release modelled)" in flat and "Note:" not in flat
    rc, out, _ = run(capsys, "plan", str(ckpts["deepseek_v4"]), "--arch", "gfx950", "--json", *flag)
    got = json.loads(out)
    assert rc == 0 and got["vllm"] == version and got["vllm_resolution"]["note"] is None


@pytest.mark.parametrize("installed,version", [(None, None), ("0.33.0", "0.33.0"), ("0.34.2", "0.34.0"),
                                               ("0.35.1", "0.34.0"), ("0.32.0", "0.33.0")])
def test_plan_auto_follows_the_installed_vllm(capsys, ckpts, monkeypatch, installed, version):
    """--vllm auto (the default): the vLLM installed beside mxfp4conv, else the newest modelled;
    a release that is not modelled falls back, and plan says to which and what checks it."""
    from mxfp4conv.oracle import releases

    monkeypatch.setattr(releases, "installed_vllm", lambda: installed)
    version = version or releases.RELEASES[releases.AUTO_WITHOUT_VLLM].version
    rc, out, _ = run(capsys, "plan", str(ckpts["deepseek_v4"]), "--arch", "gfx950")
    flat = " ".join(out.split())
    where = f"the installed vLLM {installed}" if installed else "no vLLM installed here"
    assert rc == 0 and f"vLLM {version} (the release modelled, --vllm auto: {where})" in flat, flat
    modelled = installed in (None, "0.33.0")
    assert ("Note:" not in flat) == modelled, flat
    if not modelled:
        assert f"vLLM {installed} is not" in flat and f"uses vLLM {version}" in flat and "canary" in flat
    rc, out, _ = run(capsys, "plan", str(ckpts["deepseek_v4"]), "--arch", "gfx950", "--json")
    got = json.loads(out)
    assert got["vllm"] == version and got["vllm_resolution"]["installed"] == installed


def test_plan_for_an_unmodelled_release_names_its_stand_in(capsys, ckpts):
    rc, out, _ = run(capsys, "plan", str(ckpts["deepseek_v4"]), "--arch", "gfx950", "--vllm", "0.36")
    flat = " ".join(out.split())
    assert rc == 0 and "vLLM 0.34.0 (the release modelled)" in flat
    assert "vLLM 0.36 is not modelled" in flat and "nearest older modelled release" in flat


@pytest.mark.parametrize("args,texts", [
    (["--arch", "gfx950", "--tp", "3"], ["cannot split", "512"]),
    (["--arch", "gfx950", "--tp", "32"], ["not a multiple of the MXFP4 block"]),
    (["--arch", "gfx942", "--backend", "aiter"], ["cannot serve", "only on gfx950"]),
    (["--arch", "gfx950", "--vllm", "latest"], ["Unknown --vllm release 'latest'", "0.33.0", "0.34.0"]),
    (["--arch", "gfx942", "--moe-weight", "int4_per_group_32"],
     ["--moe-weight int4_per_group_32", "AiterMxfp4Experts", "requantises", "--layout identity"]),
])
def test_plan_refusals_exit_1(capsys, ckpts, args, texts):
    rc, out, err = run(capsys, "plan", str(ckpts["kimi_k3"]), *args, "--json")
    assert rc == 1 and out == ""
    assert err.startswith("error: ") and "Traceback" not in err
    flat = " ".join(err.split())
    for t in texts:
        assert t in flat, flat


def test_plan_moe_weight_int4_with_own_layout(capsys, ckpts):
    """vLLM's gfx942 int4 path: plan states vLLM's pick, padding and environment, and writes
    mxfp4conv's own format (the same decision as the library's)."""
    rc, out, _ = run(capsys, "plan", str(ckpts["kimi_k3"]), "--arch", "mi300x", "--tp", "8", "--ep",
                     "--moe-weight", "int4_per_group_32", "--layout", "identity", "--json")
    assert rc == 0
    got = json.loads(out)
    model = load_model(open_source(str(ckpts["kimi_k3"])))
    d = decide(model, Target("gfx942", tp=8, ep=True, layout="identity", moe_weight="int4_per_group_32"))
    assert got["backend"] == d.backend == "EMULATION"
    for k in ("vllm_backend", "vllm_expert_class", "vllm_int4_requant", "vllm_runtime_env",
              "vllm_hidden_padded", "vllm_intermediate_padded", "moe_weight"):
        assert got["options"][k] == d.options[k], k
    assert got["options"]["vllm_int4_requant"] is True
    assert any("requantises" in n for n in got["notes"])
    rc, out, _ = run(capsys, "plan", str(ckpts["kimi_k3"]), "--arch", "gfx950", "--moe-weight",
                     "int4_per_group_32", "--json")
    assert rc == 0 and any("ignores --quantization-config.moe.weight" in n for n in json.loads(out)["notes"])
    rc, _, err = run(capsys, "plan", str(ckpts["kimi_k3"]), "--arch", "gfx942", "--moe-weight", "int8")
    assert rc == 2 and "--moe-weight" in err


def test_plan_on_converted_checkpoint(capsys, tmp_path):
    out_dir = tmp_path / "converted"
    out_dir.mkdir()
    manifest = {"format": "mxfp4conv-kernel-layout", "version": 1,
                "target": {"arch": "gfx950", "backend": "AITER_MXFP4_BF16", "tp": 8, "ep": False,
                           "act_quant": "bf16"},
                "layout": {"w13": "aiter_p16"}, "moe": {}, "runtime_env": {"AITER_BF16_FP8_MOE_BOUND": "0"},
                "source": {"repo": "moonshotai/Kimi-K3"}}
    (out_dir / "mxfp4conv.json").write_text(json.dumps(manifest))
    rc, out, _ = run(capsys, "plan", str(out_dir), "--arch", "mi355x", "--tp", "8")
    assert rc == 0 and "already converted" in out and "AITER_MXFP4_BF16" in out
    rc, out, _ = run(capsys, "plan", str(out_dir), "--arch", "gfx950", "--tp", "8", "--json")
    assert rc == 0 and json.loads(out)["already_converted"] is True
    rc, out, err = run(capsys, "plan", str(out_dir), "--arch", "gfx942", "--tp", "8")
    assert rc == 1 and "already converted" in err and "moonshotai/Kimi-K3" in " ".join(err.split())
