"""The vLLM plugin's checks of a manifest against the live layer: every refusal, and the load mode.

Manifests come from the real oracle on the synthetic checkpoints; the server side is the
``EngineFacts`` a matching vLLM layer reports, changed one fact at a time. No vLLM needed.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

from checkpoint_fixtures import synth  # noqa: F401 (fixture)
from mxfp4conv.checkpoint import load_model, open_source
from mxfp4conv.convert.manifest import build_manifest
from mxfp4conv.errors import RuntimeInputError
from mxfp4conv.integrations.vllm.checks import check_layer, manifest_vllm_backend
from mxfp4conv.integrations.vllm.facts import EngineFacts, cuda_arch
from mxfp4conv.oracle import Target, decide
from mxfp4conv.runtime.act_quant import served_act_quant

METHOD = {"kimi_k3": "Mxfp4MoEMethod", "deepseek_v4": "Mxfp4MoEMethod", "gpt_oss": "GptOssMxfp4MoEMethod",
          "quark": "QuarkOCP_MX_MoEMethod"}


def manifest_of(path, target: Target) -> dict:
    src = open_source(path)
    model = load_model(src)
    return build_manifest(src, model, decide(model, target), target)


def live_facts(m: dict, family: str, rank: int = 0) -> EngineFacts:
    """The facts of a vLLM layer that fits manifest ``m`` on ``rank``."""
    from mxfp4conv.runtime.loader import parallel_layout

    t, moe = m["target"], m["moe"]
    par = parallel_layout(m)
    platform = {"gf": "rocm", "sm": "cuda", "cp": "cpu"}[t["arch"][:2]]
    situ = t["activation"] == "situ" and platform == "rocm"
    return EngineFacts(
        layer=f"{moe['layers'][0]}.experts", vllm_release="0.33.0", arch=t["arch"], platform=platform,
        method=METHOD[family], backend=manifest_vllm_backend(m),
        tp_size=1 if t["ep"] else t["tp"], tp_rank=0 if t["ep"] else rank,
        ep_size=t["tp"] if t["ep"] else 1, ep_rank=rank if t["ep"] else 0, use_ep=bool(t["ep"]),
        hidden_padded=moe["hidden_padded"], intermediate_padded=moe["intermediate_per_rank_padded"],
        local_experts=moe["experts_per_rank"], activation=t["activation"],
        situv2=served_act_quant(t, m["runtime_env"], m["layout"], "OUT")[1] if situ else None,
        aiter_moe=platform == "rocm", placement=par.placement, dp_size=par.dp, dp_rank=par.worker(rank)[0],
        global_experts=moe["num_experts"], logical_experts=moe["num_experts"], expert_ids=tuple(par.experts(rank)))


@pytest.fixture(scope="module")
def k3_gfx950(synth):  # noqa: F811
    return manifest_of(synth("kimi_k3"), Target("gfx950", tp=2))


def refused(m: dict, facts: EngineFacts, *needles: str) -> str:
    with pytest.raises(RuntimeInputError) as info:
        check_layer(m, facts, m["moe"]["layers"][0], "OUT")
    msg = str(info.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


@pytest.mark.parametrize("family,scheme,arch,mode", [
    ("kimi_k3", None, "gfx950", "kernel_ready"),
    ("deepseek_v4", None, "gfx950", "kernel_ready"),
    ("gpt_oss", None, "gfx950", "kernel_ready"),
    ("quark", "w_mxfp4_a_mxfp4", "gfx950", "kernel_ready"),
    ("gpt_oss", None, "cpu", "vllm_transforms"),
    ("deepseek_v4", None, "sm90", "mxfp4conv_kernel"),
    ("gpt_oss", None, "sm90", "mxfp4conv_kernel"),
])
def test_matching_server_is_accepted_with_its_mode(synth, family, scheme, arch, mode):  # noqa: F811
    m = manifest_of(synth(family, scheme), Target(arch, tp=2))
    for rank in (0, 1):
        plan = check_layer(m, live_facts(m, family, rank), m["moe"]["layers"][0], "OUT")
        assert (plan.mode, plan.rank, plan.prefix) == (mode, rank, m["moe"]["layers"][0])


@pytest.mark.parametrize("family,scheme,arch,layout,mode", [
    # sm100 / sm120: by default vLLM's own pick: TRTLLM-Gen's layout, written ready (Kimi-K3,
    # DeepSeek-V4), or canonical bytes that vLLM converts at start-up
    ("kimi_k3", None, "sm100", "auto", "kernel_ready"),
    ("deepseek_v4", None, "sm100", "auto", "kernel_ready"),
    ("gpt_oss", None, "sm100", "auto", "kernel_ready"),
    ("kimi_k3", None, "sm120", "auto", "vllm_transforms"),
    ("deepseek_v4", None, "sm120", "auto", "vllm_transforms"),
    # (Quark w_mxfp4 on sm100: vLLM's own converter raises there, so plan refuses it)
    ("quark", "w_mxfp4", "sm120", "auto", "vllm_transforms"),
    # vLLM's own EMULATION pick stays vLLM's
    ("quark", "w_mxfp4_a_fp8", "sm100", "auto", "vllm_transforms"),
    # mxfp4conv's kernel only when --layout asks for its format
    ("deepseek_v4", None, "sm100", "identity", "mxfp4conv_kernel"),
    ("gpt_oss", None, "sm120", "hopper_mma", "mxfp4conv_kernel"),
    # mxfp4conv's kernel is W4A16: declared fp8 activations keep vLLM's EMULATION, on sm90 too
    ("quark", "w_mxfp4_a_fp8", "sm100", "identity", "vllm_transforms"),
    ("quark", "w_mxfp4_a_fp8", "sm90", "auto", "vllm_transforms"),
])
def test_nvidia_keeps_vllm_kernel_unless_asked(synth, family, scheme, arch, layout, mode):  # noqa: F811
    m = manifest_of(synth(family, scheme), Target(arch, tp=2, layout=layout))
    assert m["target"]["options"]["serving_kernel"] == ("mxfp4conv" if mode == "mxfp4conv_kernel" else "vllm")
    plan = check_layer(m, live_facts(m, family), m["moe"]["layers"][0], "OUT")
    assert plan.mode == mode


def test_manifest_without_serving_kernel_runs_mxfp4conv_kernel(synth, caplog):  # noqa: F811
    """A manifest written before ``serving_kernel`` existed: its CUDA EMULATION format ran mxfp4conv's
    kernel, and off sm90 the log says that it replaces vLLM's pick."""
    m = manifest_of(synth("deepseek_v4"), Target("sm100", tp=2, layout="identity"))
    del m["target"]["options"]["serving_kernel"]
    with caplog.at_level(logging.WARNING):
        assert check_layer(m, live_facts(m, "deepseek_v4"), m["moe"]["layers"][0], "OUT").mode == "mxfp4conv_kernel"
    assert "replaces vLLM's FLASHINFER_TRTLLM_MXFP4_MXFP8" in caplog.text and "Convert the source again" in caplog.text


def test_identity_layout_on_rocm_lets_vllm_transform(synth):  # noqa: F811
    m = manifest_of(synth("deepseek_v4"), Target("gfx942", tp=2))  # TRITON_UNFUSED, raw bytes
    assert set(m["layout"][k] for k in ("w13", "w13_scale", "w2", "w2_scale")) == {"identity"}
    assert check_layer(m, live_facts(m, "deepseek_v4"), m["moe"]["layers"][0], "OUT").mode == "vllm_transforms"


def test_arch_mismatch(k3_gfx950):
    refused(k3_gfx950, dataclasses.replace(live_facts(k3_gfx950, "kimi_k3"), arch="gfx942"), "gfx950", "gfx942", "--arch gfx942")


def test_tp_size_mismatch(k3_gfx950):
    facts = dataclasses.replace(live_facts(k3_gfx950, "kimi_k3"), tp_size=4)
    refused(k3_gfx950, facts, "over 2 ranks", "over 4 ranks", "--tensor-parallel-size 2", "--tp 4")


def test_ep_mismatch(k3_gfx950):
    facts = dataclasses.replace(live_facts(k3_gfx950, "kimi_k3"), tp_size=1, ep_size=2, use_ep=True)
    facts = dataclasses.replace(facts, expert_ids=(0,))
    refused(k3_gfx950, facts, "MoE tensor parallel over 2", "EP over 2", "--ep")


def test_ep_checkpoint_on_tp_server(synth):  # noqa: F811
    m = manifest_of(synth("kimi_k3"), Target("gfx950", tp=2, ep=True))
    facts = dataclasses.replace(live_facts(m, "kimi_k3"), tp_size=2, ep_size=1, use_ep=False,
                                expert_ids=tuple(range(m["moe"]["num_experts"])))
    refused(m, facts, "EP over 2 ranks", "MoE tensor parallel over 2", "--enable-expert-parallel")


def test_ep_round_robin_placement(synth):  # noqa: F811
    m = manifest_of(synth("kimi_k3"), Target("gfx950", tp=2, ep=True))
    check_layer(m, live_facts(m, "kimi_k3", rank=1), m["moe"]["layers"][0], "OUT")
    refused(m, dataclasses.replace(live_facts(m, "kimi_k3"), placement="round_robin"), "round_robin", "linear")


def test_rank_out_of_range(k3_gfx950):
    refused(k3_gfx950, dataclasses.replace(live_facts(k3_gfx950, "kimi_k3"), tp_rank=2), "0..1", "rank 2")


def test_backend_mismatch(k3_gfx950):
    facts = dataclasses.replace(live_facts(k3_gfx950, "kimi_k3"), backend="TRITON_UNFUSED")
    refused(k3_gfx950, facts, "AITER_MXFP4_BF16", "TRITON_UNFUSED", "mxfp4conv plan")


def test_padded_hidden_mismatch(k3_gfx950):
    live = live_facts(k3_gfx950, "kimi_k3")
    facts = dataclasses.replace(live, hidden_padded=live.hidden_padded + 256)
    refused(k3_gfx950, facts, "hidden size (padded)", str(live.hidden_padded), str(live.hidden_padded + 256))


def test_padded_intermediate_mismatch(k3_gfx950):
    live = live_facts(k3_gfx950, "kimi_k3")
    facts = dataclasses.replace(live, intermediate_padded=live.intermediate_padded + 128)
    refused(k3_gfx950, facts, "intermediate size per rank (padded)", str(live.intermediate_padded + 128))


def test_local_experts_mismatch(k3_gfx950):
    live = live_facts(k3_gfx950, "kimi_k3")
    refused(k3_gfx950, dataclasses.replace(live, local_experts=live.local_experts // 2), "experts per rank")


def test_activation_mismatch(k3_gfx950):
    refused(k3_gfx950, dataclasses.replace(live_facts(k3_gfx950, "kimi_k3"), activation="silu"), "situ", "silu")


def test_situv2_mode_mismatch(k3_gfx950):
    live = live_facts(k3_gfx950, "kimi_k3").situv2
    assert live in ("a4w4", "a16w4")  # w13 stored separated
    for other in {"a4w4", "a8w4", "a16w4"} - {live}:
        refused(k3_gfx950, dataclasses.replace(live_facts(k3_gfx950, "kimi_k3"), situv2=other), "SiTUv2", live, other)


def test_situv2_a8w4_checkpoint(synth):  # noqa: F811
    m = manifest_of(synth("kimi_k3"), Target("gfx950", tp=2, act_quant="fp8"))
    assert live_facts(m, "kimi_k3").situv2 == "a8w4"
    check_layer(m, live_facts(m, "kimi_k3"), m["moe"]["layers"][0], "OUT")
    refused(m, dataclasses.replace(live_facts(m, "kimi_k3"), situv2="a4w4"), "a8w4", "a4w4")


def test_situv2_mode_from_runtime_env(k3_gfx950):
    assert k3_gfx950["runtime_env"]["VLLM_ROCM_USE_AITER_MOE_SITUV2"] == "auto"  # vLLM 0.33.0: auto = a4w4
    m = {**k3_gfx950, "runtime_env": {**k3_gfx950["runtime_env"], "VLLM_ROCM_USE_AITER_MOE_SITUV2": "a4w4"}}
    check_layer(m, live_facts(m, "kimi_k3"), m["moe"]["layers"][0], "OUT")
    refused(m, dataclasses.replace(live_facts(m, "kimi_k3"), situv2="a16w4"), "VLLM_ROCM_USE_AITER_MOE_SITUV2=a4w4", "a16w4")


def test_kernel_ready_bytes_of_another_release_are_left_to_the_engine(k3_gfx950, caplog):
    """The manifest's release does not bind: the live vLLM judges kernel-ready bytes at load (its
    canary, tests/test_vllm_plugin_params.py); the check says which releases meet."""
    caplog.set_level(logging.INFO)
    m = {**k3_gfx950, "vllm": "0.33.0"}
    assert check_layer(m, live_facts(m, "kimi_k3"), m["moe"]["layers"][0], "OUT").mode == "kernel_ready"
    assert "served by vLLM" not in caplog.text
    facts = dataclasses.replace(live_facts(m, "kimi_k3"), vllm_release="0.34.0")
    assert check_layer(m, facts, m["moe"]["layers"][0], "OUT").mode == "kernel_ready"
    assert "decided for vLLM 0.33 and is served by vLLM 0.34.0" in caplog.text and "canary" in caplog.text


def test_other_release_converting_identity_bytes_is_accepted(synth, caplog):  # noqa: F811
    caplog.set_level(logging.INFO)
    m = {**manifest_of(synth("gpt_oss"), Target("cpu", tp=1)), "vllm": "0.33.0"}
    facts = dataclasses.replace(live_facts(m, "gpt_oss"), vllm_release="0.32.0")
    assert check_layer(m, facts, m["moe"]["layers"][0], "OUT").mode == "vllm_transforms"
    assert "decided for vLLM 0.33" in caplog.text and "0.32.0" in caplog.text


def test_other_quant_method(k3_gfx950):
    refused(k3_gfx950, dataclasses.replace(live_facts(k3_gfx950, "kimi_k3"), method="Fp8MoEMethod"), "Fp8MoEMethod")


def test_layout_vllm_cannot_be_handed_is_undone_for_vllm(synth):  # noqa: F811
    """AITER bytes whose (method, backend) has no ready-made form: vLLM converts identity bytes."""
    m = manifest_of(synth("deepseek_v4"), Target("gfx950", tp=2))
    facts = live_facts(m, "deepseek_v4")
    assert check_layer(m, facts, m["moe"]["layers"][0], "OUT").mode == "kernel_ready"
    facts = dataclasses.replace(facts, method="QuarkOCP_MX_MoEMethod", activation="situ")
    m = {**m, "target": {**m["target"], "activation": "situ"}, "runtime_env": {}}
    assert check_layer(m, facts, m["moe"]["layers"][0], "OUT").mode == "vllm_transforms"


def test_cuda_arch_names():
    assert [cuda_arch(*c) for c in ((9, 0), (10, 0), (10, 3), (12, 0), (8, 9))] == ["sm90", "sm100", "sm100", "sm120", "sm89"]


def test_dp_ep_layout_maps_every_worker_to_its_rank(synth):  # noqa: F811
    m = manifest_of(synth("deepseek_v4"), Target("gfx950", tp=2, dp=2, ep=True))
    for rank in range(4):
        facts = live_facts(m, "deepseek_v4", rank)
        assert (facts.dp_size, facts.server_tp, facts.dp_rank) == (2, 2, rank // 2)
        assert check_layer(m, facts, m["moe"]["layers"][0], "OUT").rank == rank


def test_dp_layout_mismatch_names_both_layouts(synth):  # noqa: F811
    m = manifest_of(synth("deepseek_v4"), Target("gfx950", tp=2, dp=2, ep=True))
    facts = dataclasses.replace(live_facts(m, "deepseek_v4", 1), ep_size=8, ep_rank=1, dp_size=4, expert_ids=(1,))
    refused(m, facts, "tp 2 x dp 2 with expert parallel (MoE: EP over 4 ranks", "tp 2 x dp 4 with expert parallel",
            "--tensor-parallel-size 2 --data-parallel-size 2 --enable-expert-parallel", "--tp 2 --dp 4 --ep")


def test_same_moe_layout_from_other_tp_dp_is_served(synth, caplog):  # noqa: F811
    """Converted for tp 4 without EP, served with dp 2 x tp 2 without EP: vLLM flattens both to
    MoE tensor parallel over 4 ranks, rank r reads the same bytes."""
    m = manifest_of(synth("deepseek_v4"), Target("gfx950", tp=4))
    facts = dataclasses.replace(live_facts(m, "deepseek_v4", 3), dp_size=2, dp_rank=1)
    with caplog.at_level(logging.INFO):
        assert check_layer(m, facts, m["moe"]["layers"][0], "OUT").rank == 3
    assert "laid out the same" in caplog.text


def test_eplb_redundant_experts_take_vllms_initial_placement(synth):  # noqa: F811
    """EPLB with 4 redundant experts over 4 EP ranks: 12 physical experts, 3 a rank, physical p
    holding logical p, then p - 8; each worker gathers its slots' logical experts."""
    m = manifest_of(synth("deepseek_v4"), Target("gfx950", tp=2, dp=2, ep=True))
    for rank, logical in enumerate([(0, 1, 2), (3, 4, 5), (6, 7, 0), (1, 2, 3)]):
        facts = dataclasses.replace(live_facts(m, "deepseek_v4", rank), enable_eplb=True, global_experts=12,
                                    logical_experts=8, local_experts=3,
                                    expert_ids=tuple(range(3 * rank, 3 * rank + 3)))
        plan = check_layer(m, facts, m["moe"]["layers"][0], "OUT")
        assert (plan.rank, plan.experts, plan.mode) == (rank, logical, "kernel_ready")
    eplb = dataclasses.replace(live_facts(m, "deepseek_v4"), enable_eplb=True)  # no redundant experts
    assert check_layer(m, eplb, m["moe"]["layers"][0], "OUT").experts is None


def test_eplb_redundant_experts_refused_where_they_cannot_be_gathered(synth):  # noqa: F811
    tp = manifest_of(synth("deepseek_v4"), Target("gfx950", tp=4))  # no EP in the checkpoint
    facts = dataclasses.replace(live_facts(tp, "deepseek_v4"), use_ep=True, tp_size=1, ep_size=4, enable_eplb=True,
                                global_experts=12, logical_experts=8, local_experts=3, expert_ids=(0, 1, 2))
    refused(tp, facts, "EPLB with 4 redundant experts", "MoE tensor parallel over 4 ranks", "--ep")
    own = manifest_of(synth("deepseek_v4"), Target("sm90", tp=2, dp=2, ep=True))  # mxfp4conv's kernel
    facts = dataclasses.replace(live_facts(own, "deepseek_v4"), enable_eplb=True, global_experts=12,
                                logical_experts=8, local_experts=3, expert_ids=(0, 1, 2))
    refused(own, facts, "mxfp4conv's own kernel", "EPLB with redundant experts", "--backend PICK")
