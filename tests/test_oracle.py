"""The backend oracle: vLLM's MXFP4 MoE decision per (family, arch, act-quant, tp), with the
expected values taken from vLLM's selection tables, round-up rules and converters."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mxfp4conv.checkpoint.canonical import Activation, MoEGeometry, MoEModel
from mxfp4conv.errors import OracleError
from mxfp4conv.oracle import Decision, Server, Target, decide, resolve_arch
from mxfp4conv.oracle.backends import BACKENDS, MOE_BACKEND_STRINGS, parse_backend
from mxfp4conv.oracle.formats import LITERAL_G_ROWS, PRODUCIBLE_LAYOUTS
from mxfp4conv.oracle.roundup import backend_alignment, padded_geometry
from mxfp4conv.oracle.select import vllm_literal_w13_rows


def model(family, scheme, method, act, params, routing, H, I, E, k, static=False, bias=False):
    return MoEModel(family=family, quant_scheme=scheme, moe_method=method,
                    activation=Activation(act, params), routing=routing,
                    geometry=MoEGeometry(H, I, E, k), layers=(), has_bias=bias,
                    static_input_scales=static)


# Published geometries (routed-expert hidden, global intermediate, experts, top-k).
K3 = model("kimi_k3", "w_mxfp4", "mxfp4", "situ", {"beta": 4.0, "linear_beta": 25.0},
           "DeepSeekV3", 3584, 3072, 896, 16)
DSV4 = model("deepseek_v4", "w_mxfp4", "mxfp4", "silu", {"swiglu_limit": 10.0},
             "DeepseekV4", 7168, 3072, 256, 6)
GPT_OSS = model("gpt_oss", "w_mxfp4", "gpt_oss_mxfp4", "swigluoai",
                {"alpha": 1.702, "limit": 7.0}, "Renormalize", 2880, 2880, 128, 4, bias=True)
# AMD's Quark export of Kimi-K3 (W4A4 declared) and Quark exports of other models.
QUARK_K3_W4A4 = model("quark", "w_mxfp4_a_mxfp4", "quark", "situ",
                      {"beta": 4.0, "linear_beta": 25.0}, "DeepSeekV3", 3584, 3072, 896, 16)
QUARK_W4A16 = model("quark", "w_mxfp4", "quark", "silu", {}, "RenormalizeNaive",
                    4096, 1536, 64, 8)
QUARK_W4A8_OAI = model("quark", "w_mxfp4_a_fp8", "quark", "swigluoai",
                       {"alpha": 1.702, "limit": 7.0}, "Renormalize", 4096, 1536, 64, 8,
                       static=True)
QUARK_W4A8_SILU = model("quark", "w_mxfp4_a_fp8", "quark", "silu", {}, "Renormalize",
                        4096, 1536, 64, 8, static=True)
QUARK_W4A8_DSV3 = model("quark", "w_mxfp4_a_fp8", "quark", "swigluoai", {}, "DeepSeekV3",
                        4096, 1536, 64, 8, static=True)
QUARK_W4A6 = model("quark", "w_mxfp4_a_mxfp6_e3m2", "quark", "silu", {}, "Renormalize",
                   4096, 1536, 64, 8)

A16W4 = dict(w13="aiter_p16", w13_scale="aiter_scale_a16w4", w2="aiter_p16",
             w2_scale="aiter_e8m0_shuffle")
A8W4 = dict(w13="aiter_p16_gu16", w13_scale="aiter_scale_a16w4_gu16", w2="aiter_p16",
            w2_scale="aiter_e8m0_shuffle")
GU16 = dict(w13="aiter_p16_gu16", w13_scale="aiter_scale_a16w4_gu16", w2="aiter_p16",
            w2_scale="aiter_scale_a16w4")
W4A4 = dict(w13="aiter_p16", w13_scale="aiter_e8m0_shuffle", w2="aiter_p16",
            w2_scale="aiter_e8m0_shuffle")
CDNA4 = dict(w13="identity", w13_scale="triton_cdna4_scale", w2="identity",
             w2_scale="triton_cdna4_scale")
IDENT = dict(w13="identity", w13_scale="identity", w2="identity", w2_scale="identity")
TRTLLM = dict(w13="trtllm_w13", w13_scale="trtllm_w13_scale", w2="trtllm_w2", w2_scale="trtllm_w2_scale")
HOPPER = dict(w13="hopper_mma_w_xor", w13_scale="hopper_mma_s", w2="hopper_mma_w_xor", w2_scale="hopper_mma_s")
AITER_ENV = {"VLLM_ROCM_USE_AITER": "1"}
S_ENV = {"VLLM_ROCM_USE_AITER": "1", "AITER_BF16_FP8_MOE_BOUND": "0"}

# (id, model, target, expected). Expected keys: backend, vllm (vLLM's own pick), act, H, I
# (per-rank padded), layout, gate_mode, env, tried (backends in order), selected_reason,
# rejected {backend: substring of its reason}.
CASES = [
    # ---- Kimi-K3 (SiTU, DeepSeekV3 routing) ----
    # vLLM 0.33.0's default SiTUv2 mode is auto (= a4w4: MXFP4 activations, a16w4's bytes)
    ("k3-gfx950-tp8-auto", K3, Target("gfx950", tp=8),
     dict(backend="AITER_MXFP4_BF16", vllm="AITER_MXFP4_BF16", act="mxfp4", H=3584, I=384,
          layout=A16W4, gate_mode="separated",
          env={**S_ENV, "VLLM_ROCM_USE_AITER_MOE_SITUV2": "auto"}, tried=["AITER_MXFP4_BF16"],
          selected_reason="_use_k3_situ_aiter")),
    ("k3-gfx950-tp8-a16w4", K3, Target("gfx950", tp=8, act_quant="bf16"),
     dict(backend="AITER_MXFP4_BF16", act="bf16", H=3584, I=384, layout=A16W4,
          gate_mode="separated",
          env={"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MOE_SITUV2": "a16w4"})),
    ("k3-gfx950-tp8-a4w4", K3, Target("gfx950", tp=8, act_quant="mxfp4"),
     dict(backend="AITER_MXFP4_BF16", act="mxfp4", layout=A16W4, gate_mode="separated",
          env={**S_ENV, "VLLM_ROCM_USE_AITER_MOE_SITUV2": "a4w4"})),
    ("k3-gfx950-tp8-a8w4", K3, Target("gfx950", tp=8, act_quant="fp8"),
     dict(backend="AITER_MXFP4_BF16", act="fp8", H=3584, I=384, layout=A8W4,
          gate_mode="interleave",
          env={**S_ENV, "VLLM_ROCM_USE_AITER_MOE_SITUV2": "a8w4"})),
    ("k3-mi355x-tp16-k3rule", K3, Target("mi355x", tp=16),
     dict(backend="AITER_MXFP4_BF16", H=3584, I=256, I_real=192, layout=A16W4)),
    ("k3-gfx950-tp1", K3, Target("gfx950"), dict(backend="AITER_MXFP4_BF16", I=3072)),
    ("k3-gfx950-ep8", K3, Target("gfx950", tp=8, ep=True),
     dict(backend="AITER_MXFP4_BF16", I=3072, I_real=3072, experts=112)),
    ("k3-gfx942-tp8", K3, Target("gfx942", tp=8),
     dict(backend="EMULATION", vllm="EMULATION", act="bf16", H=3584, I=384, layout=IDENT,
          gate_mode="separated", env={}, tried=["AITER_MXFP4_BF16", "EMULATION"],
          rejected={"AITER_MXFP4_BF16": "only on gfx950"}, selected_reason="amd-quark")),
    ("k3-gfx942-tp16", K3, Target("mi300x", tp=16), dict(backend="EMULATION", I=256, I_real=192)),
    ("k3-gfx1250-tp8", K3, Target("gfx1250", tp=8),
     dict(backend="EMULATION", I=384, layout=IDENT,
          rejected={"AITER_MXFP4_BF16": "only on gfx950"})),
    ("k3-gfx950-no-aiter", K3, Target("gfx950", tp=8, aiter=False),
     dict(backend="EMULATION", I=384, rejected={"AITER_MXFP4_BF16": "AITER is disabled"})),
    ("k3-h200-tp8", K3, Target("h200", tp=8),
     dict(backend="EMULATION", vllm="HUMMING", I=384, layout=HOPPER,
          tried=["FLASHINFER_TRTLLM_MXFP4_MXFP8", "DEEPGEMM_MXFP4", "HUMMING", "EMULATION"],
          rejected={"FLASHINFER_TRTLLM_MXFP4_MXFP8": "family 100",
                    "DEEPGEMM_MXFP4": "family 100 or 120", "HUMMING": "humming library"},
          selected_reason="mxfp4conv fallback", producible=["MARLIN", "HUMMING", "EMULATION"],
          kernel="mxfp4conv")),
    # sm90: --backend naming vLLM's pick keeps vLLM's kernel (canonical bytes vLLM converts)
    ("k3-h200-keep-humming", K3, Target("h200", tp=8, backend="humming"),
     dict(backend="HUMMING", vllm="HUMMING", I=384, layout=IDENT, kernel="vllm")),
    # --layout identity keeps the canonical bytes (32-aligned); hopper_mma pads to 64
    ("k3-h200-identity", K3, Target("h200", tp=8, layout="identity"),
     dict(backend="EMULATION", vllm="HUMMING", I=384, layout=IDENT)),
    ("gptoss-h200-tp2", GPT_OSS, Target("h200", tp=2),
     dict(backend="EMULATION", H=2880, I=1472, I_real=1440, layout=HOPPER)),
    ("gptoss-h200-tp2-identity", GPT_OSS, Target("h200", tp=2, layout="identity"),
     dict(backend="EMULATION", H=2880, I=1440, I_real=1440, layout=IDENT)),
    # vLLM's own converter raises for Quark w_mxfp4 on sm90 (test_refusals): --layout asks for
    # mxfp4conv's own format
    ("quark-h200-tp3-hopper", QUARK_W4A16, Target("h200", tp=3, vllm="0.33", layout="hopper_mma"),
     dict(backend="EMULATION", H=4096, I=512, I_real=512, layout=HOPPER)),
    # sm100 / sm120: mxfp4conv's own format only when --layout asks for it
    ("k3-b200-hopper-forced", K3, Target("b200", layout="hopper_mma"),
     dict(backend="EMULATION", I=3072, layout=HOPPER, kernel="mxfp4conv")),
    ("k3-b200-identity-forced", K3, Target("b200", tp=8, layout="identity"),
     dict(backend="EMULATION", vllm="FLASHINFER_TRTLLM_MXFP4_MXFP8", I=384, layout=IDENT,
          kernel="mxfp4conv", selected_reason="mxfp4conv fallback")),
    # by default vLLM's pick is kept: TRTLLM-Gen's layout, written by mxfp4conv (shuffle.trtllm)
    ("k3-b200", K3, Target("b200", tp=8),
     dict(backend="FLASHINFER_TRTLLM_MXFP4_MXFP8", vllm="FLASHINFER_TRTLLM_MXFP4_MXFP8", I=384,
          layout=TRTLLM, act="bf16", kernel="vllm", selected_reason="flashinfer assumed installed")),
    # forced to TRTLLM's bf16 variant (same converter branch): canonical bytes vLLM converts
    ("k3-b200-trtllm-bf16", K3, Target("b200", tp=8, backend="FLASHINFER_TRTLLM_MXFP4_BF16"),
     dict(backend="FLASHINFER_TRTLLM_MXFP4_BF16", layout=IDENT, kernel="vllm")),
    ("k3-sm120", K3, Target("sm120"),
     dict(backend="DEEPGEMM_MXFP4", vllm="DEEPGEMM_MXFP4", layout=IDENT, kernel="vllm")),
    # vLLM raises here; --layout asks for mxfp4conv's own format explicitly
    ("k3-cpu-own-format", K3, Target("cpu", layout="identity"),
     dict(backend="EMULATION", vllm=None, I=3072, selected_reason="mxfp4conv fallback")),
    # _use_k3_situ_aiter takes AITER_MXFP4_BF16 on gfx950 whatever --moe-backend says
    ("k3-forced-emulation", K3, Target("gfx950", tp=8, backend="emulation"),
     dict(backend="AITER_MXFP4_BF16", vllm="AITER_MXFP4_BF16", I=384, tried=["AITER_MXFP4_BF16"])),
    ("k3-forced-emulation-no-aiter", K3, Target("gfx950", tp=8, aiter=False, backend="emulation"),
     dict(backend="EMULATION", vllm="EMULATION", I=384, tried=["EMULATION"])),
    ("k3-forced-legacy-aiter", K3, Target("gfx950", tp=8, backend="AITER"),
     dict(backend="AITER_MXFP4_BF16", layout=A16W4)),
    # W4A4 on Mxfp4MoEMethod (converter S delegates to G): DeepSeek-V4, where no K3 bypass applies
    ("dsv4-forced-w4a4", DSV4, Target("gfx950", tp=8, backend="aiter_mxfp4_mxfp4"),
     dict(backend="AITER_MXFP4_MXFP4", act="mxfp4", I=384, H=7168, layout=W4A4)),
    # ---- DeepSeek-V4 (SiLU + swiglu_limit, DeepseekV4 routing) ----
    ("dsv4-gfx950-tp8", DSV4, Target("gfx950", tp=8),
     dict(backend="AITER_MXFP4_BF16", act="bf16", H=7168, I=384, layout=GU16,
          gate_mode="interleave", env=S_ENV, selected_reason="AiterMxfp4Experts")),
    ("dsv4-gfx942-tp8", DSV4, Target("gfx942", tp=8),
     dict(backend="TRITON_UNFUSED", vllm="TRITON_UNFUSED", H=7168, I=384, layout=IDENT, env={},
          tried=["AITER_MXFP4_BF16", "TRITON_UNFUSED"], selected_reason="UnfusedOAITritonExperts")),
    ("dsv4-gfx950-no-aiter-tp8", DSV4, Target("gfx950", tp=8, aiter=False),
     dict(backend="TRITON_UNFUSED", I=512, layout=IDENT)),
    ("dsv4-gfx950-no-aiter-tp2", DSV4, Target("gfx950", tp=2, aiter=False),
     dict(backend="TRITON_UNFUSED", vllm="TRITON_UNFUSED", I=1536, layout=CDNA4)),
    ("dsv4-gfx1250-no-aiter-own-format", DSV4, Target("gfx1250", tp=8, aiter=False, layout="identity"),
     dict(backend="EMULATION", vllm=None, rejected={"TRITON_UNFUSED": "not gfx1250"})),
    ("dsv4-b200-0.33", DSV4, Target("b200", tp=8, vllm="0.33"),
     dict(backend="FLASHINFER_TRTLLM_MXFP4_MXFP8", vllm="FLASHINFER_TRTLLM_MXFP4_MXFP8", kernel="vllm", layout=TRTLLM,
          selected_reason="TrtLlmMxfp4ExpertsModular: all gates pass")),
    # vLLM 0.34 split the modular TRTLLM class by activation quantisation
    ("dsv4-b200-0.34", DSV4, Target("b200", tp=8, vllm="0.34"),
     dict(backend="FLASHINFER_TRTLLM_MXFP4_MXFP8", vllm="FLASHINFER_TRTLLM_MXFP4_MXFP8", kernel="vllm", layout=TRTLLM,
          selected_reason="TrtLlmMxfp4Mxfp8ExpertsModular: all gates pass")),
    ("dsv4-h100", DSV4, Target("h100", tp=8), dict(backend="EMULATION", vllm="HUMMING")),
    # ---- Quark OCP-MX (no activation passed to the round-up: 256 on ROCm) ----
    ("quark-k3-w4a4-gfx950-tp8", QUARK_K3_W4A4, Target("gfx950", tp=8),
     dict(backend="AITER_MXFP4_MXFP4", act="mxfp4", H=3584, I=384, I_real=384, layout=W4A4,
          gate_mode="separated", env=AITER_ENV, scale_pad=0x01,
          tried=["AITER_MXFP4_MXFP4", "FLASHINFER_TRTLLM_MXFP4_MXFP8", "AITER_MXFP4_FP8",
                 "FLASHINFER_CUTLASS_MXFP4_MXFP8"], rejected={"AITER_MXFP4_FP8": "not tried"})),
    ("quark-k3-w4a4-gfx942", QUARK_K3_W4A4, Target("gfx942", tp=8),
     dict(backend="EMULATION", vllm="EMULATION", act="mxfp4", I=384, scale_pad=0x01,
          rejected={"AITER_MXFP4_MXFP4": "only on gfx950"})),
    ("quark-w4a4-no-aiter", QUARK_K3_W4A4, Target("gfx950", tp=8, aiter=False),
     dict(backend="EMULATION", act="mxfp4", rejected={"AITER_MXFP4_MXFP4": "AITER is disabled"})),
    ("quark-w4a4-h100", QUARK_K3_W4A4, Target("h100", tp=8),
     dict(backend="EMULATION", vllm="EMULATION", act="mxfp4")),
    ("quark-w4a16-gfx950-0.33", QUARK_W4A16, Target("gfx950", tp=2, vllm="0.33"),
     dict(backend="AITER_MXFP4_BF16", act="bf16", H=4096, I=768, layout=GU16,
          gate_mode="interleave", env=AITER_ENV, scale_pad=0x01)),
    # vLLM 0.34 converts a non-gpt-oss Quark model with converter S: it sets the bound
    ("quark-w4a16-gfx950-0.34", QUARK_W4A16, Target("gfx950", tp=2, vllm="0.34"),
     dict(backend="AITER_MXFP4_BF16", act="bf16", H=4096, I=768, layout=GU16,
          gate_mode="interleave", env={**AITER_ENV, "AITER_BF16_FP8_MOE_BOUND": "0"}, scale_pad=0x01)),
    ("quark-w4a8-oai-gfx950-tp4", QUARK_W4A8_OAI, Target("gfx950", tp=4),
     dict(backend="AITER_MXFP4_FP8", vllm="AITER_MXFP4_FP8", act="fp8", H=4096, I=512,
          layout=IDENT, selected_reason="AiterW4A8ExpertsMonolithic",
          rejected={"AITER_MXFP4_MXFP4": "not tried"})),
    ("quark-w4a8-oai-gfx950-tp1", QUARK_W4A8_OAI, Target("gfx950"),
     dict(backend="AITER_MXFP4_FP8", vllm="AITER_MXFP4_FP8", act="fp8", I=1536, layout=CDNA4)),
    ("quark-w4a8-silu", QUARK_W4A8_SILU, Target("gfx950", tp=4),
     dict(backend="EMULATION", vllm="EMULATION", act="fp8",
          rejected={"AITER_MXFP4_FP8": "activation silu not supported"})),
    ("quark-w4a8-dsv3-routing", QUARK_W4A8_DSV3, Target("gfx950", tp=4),
     dict(backend="EMULATION", vllm="EMULATION",
          rejected={"AITER_MXFP4_FP8": "routing method DeepSeekV3 not supported"})),
    ("quark-w4a6-unselected", QUARK_W4A6, Target("gfx950"),
     dict(backend="EMULATION", vllm="EMULATION", act="mxfp6_e3m2", I=1536, tried=["EMULATION"],
          selected_reason="stays NONE")),
    ("quark-w4a16-as-w4a4", QUARK_W4A16, Target("gfx950", tp=2, act_quant="mxfp4"),
     dict(backend="AITER_MXFP4_MXFP4", act="mxfp4", layout=W4A4)),
    # ---- gpt-oss (SwiGLU-OAI, Renormalize, biases) ----
    ("gptoss-gfx950", GPT_OSS, Target("gfx950"),
     dict(backend="AITER_MXFP4_BF16", act="bf16", H=3072, I=3072, layout=GU16,
          gate_mode="interleave", env=AITER_ENV, scale_pad=0x00,
          tried=["FLASHINFER_TRTLLM_MXFP4_BF16", "AITER_MXFP4_BF16",  # then the filtered-out ones
                 "FLASHINFER_TRTLLM_MXFP4_MXFP8", "AITER_MXFP4_FP8", "AITER_MXFP4_MXFP4",
                 "FLASHINFER_CUTLASS_MXFP4_MXFP8", "CUTLASS_MXFP4_MXFP4"],
          rejected={"FLASHINFER_TRTLLM_MXFP4_BF16": "family 100",
                    "FLASHINFER_TRTLLM_MXFP4_MXFP8": "not tried"})),
    # converter G keeps gpt-oss's g/u row pairs (triton_gu1 of [gate; up]) for triton_kernels
    ("gptoss-gfx942", GPT_OSS, Target("gfx942"),
     dict(backend="AITER_TRITON_MXFP4_BF16", vllm="AITER_TRITON_MXFP4_BF16", H=3072, I=3072,
          layout=dict(w13="triton_gu1", w13_scale="triton_gu1", w2="identity", w2_scale="identity"))),
    ("gptoss-gfx942-no-aiter", GPT_OSS, Target("gfx942", aiter=False),
     dict(backend="TRITON", vllm="TRITON", layout=dict(w13="triton_gu1", w13_scale="triton_gu1",
                                                       w2="identity", w2_scale="identity"))),
    ("gptoss-gfx950-no-aiter", GPT_OSS, Target("gfx950", aiter=False),
     dict(backend="TRITON", vllm="TRITON",
          layout=dict(w13="triton_gu1", w13_scale="triton_cdna4_scale_gu1", w2="identity",
                      w2_scale="triton_cdna4_scale"))),
    ("gptoss-gfx1250", GPT_OSS, Target("gfx1250"),
     dict(backend="AITER_TRITON_MXFP4_BF16", vllm="AITER_TRITON_MXFP4_BF16",
          layout=dict(w13="triton_gu1", w13_scale="triton_gfx1250_scale_gu1", w2="identity",
                      w2_scale="triton_gfx1250_scale"))),
    ("gptoss-h100", GPT_OSS, Target("h100"),
     dict(backend="EMULATION", vllm="TRITON", rejected={"TRITON": "swizzled"})),
    ("gptoss-b200", GPT_OSS, Target("b200"),
     dict(backend="FLASHINFER_TRTLLM_MXFP4_BF16", vllm="FLASHINFER_TRTLLM_MXFP4_BF16", H=3072, I=2944,
          layout=TRTLLM, kernel="vllm", selected_reason="TrtLlmMxfp4ExpertsMonolithic: all gates")),
    ("gptoss-sm120", GPT_OSS, Target("sm120"),
     dict(backend="MARLIN", vllm="MARLIN", layout=IDENT, kernel="vllm",
          rejected={"FLASHINFER_CUTLASS_MXFP4_BF16": "only on sm90 exactly"})),
    ("gptoss-cpu", GPT_OSS, Target("cpu"),
     dict(backend="EMULATION", vllm="CPU", rejected={"CPU": "VNNI"})),
]


@pytest.mark.parametrize("name,m,target,exp", CASES, ids=[c[0] for c in CASES])
def test_decision_table(name, m, target, exp):
    d = decide(m, target)
    assert d.backend == exp["backend"]
    if "vllm" in exp:
        assert d.options["vllm_backend"] == exp["vllm"]
    if "act" in exp:
        assert d.act_quant == exp["act"]
    if "H" in exp:
        assert d.hidden_padded == exp["H"]
    if "I" in exp:
        assert d.intermediate_per_rank_padded == exp["I"]
    if "I_real" in exp:
        assert d.intermediate_per_rank == exp["I_real"]
    if "experts" in exp:
        assert d.experts_per_rank == exp["experts"]
    if "layout" in exp:
        got = d.layout.as_dict()
        assert {k: got[k] for k in exp["layout"]} == exp["layout"]
        assert d.layout.gate_up == "[gate; up]"
        assert d.is_shuffled == any(v.startswith("aiter_") for v in exp["layout"].values())
    if "gate_mode" in exp:
        assert d.gate_mode == exp["gate_mode"]
    if "env" in exp:
        assert d.runtime_env == exp["env"]
    if "scale_pad" in exp:
        assert d.scale_pad_byte == exp["scale_pad"]
    if "tried" in exp:
        assert [c.backend for c in d.candidates] == exp["tried"]
    if "kernel" in exp:  # who runs the experts behind the vLLM plugin
        assert d.options["serving_kernel"] == exp["kernel"]
    if "producible" in exp:
        assert d.options["producible"] == exp["producible"]
    for backend, text in exp.get("rejected", {}).items():
        (c,) = [c for c in d.candidates if c.backend == backend and not c.selected]
        assert text in c.reason, c.reason
    selected = [c for c in d.candidates if c.selected]
    assert len(selected) == 1 and selected[0].backend == d.backend
    if "selected_reason" in exp:
        assert exp["selected_reason"] in selected[0].reason
    assert all(c.reason for c in d.candidates)
    _check_invariants(d)


def _check_invariants(d: Decision) -> None:
    """Whatever the target: never a backend that cannot read the bytes."""
    for v in (d.layout.w13, d.layout.w13_scale, d.layout.w2, d.layout.w2_scale):
        assert v in PRODUCIBLE_LAYOUTS
    assert d.backend in d.options["producible"]
    vllm = d.options["vllm_backend"]
    if vllm != d.backend:
        kernel_layout = d.options["kernel_layout"]
        assert d.backend == "EMULATION" and d.layout.as_dict()["w13"] == {"identity": "identity",
                                                                          "hopper_mma": "hopper_mma_w_xor"}[kernel_layout]
        assert any("cannot write" in n or "raises" in n or "asks for mxfp4conv's own format" in n for n in d.notes)
        align = 64 if kernel_layout == "hopper_mma" else 32
        assert d.hidden_padded % align == 0 and d.intermediate_per_rank_padded % align == 0
    assert d.intermediate_per_rank_padded >= d.intermediate_per_rank
    assert any(n.startswith("Modelled vLLM server") for n in d.notes)


# ---- refusals -------------------------------------------------------------------------------

REFUSALS = [
    ("unknown-arch", K3, Target("gfx9000"), ["Unknown target arch", "gfx942", "mi355x"]),
    ("tp-not-dividing", DSV4, Target("gfx950", tp=5), ["cannot split", "3072"]),
    ("per-rank-not-32", K3, Target("gfx950", tp=128), ["not a multiple of the MXFP4 block", "24"]),
    ("gptoss-tp4-720", GPT_OSS, Target("h100", tp=4), ["720", "multiple of the MXFP4 block"]),
    ("ep-experts", DSV4, Target("gfx950", tp=3, ep=True), ["divisible by 3"]),
    ("forced-aiter-gfx942", K3, Target("gfx942", backend="aiter"),
     ["--backend aiter cannot serve", "AiterMxfp4Experts", "only on gfx950", "AITER_TRITON_MXFP4_BF16",
      "activation situ not supported"]),
    ("k3-cpu", K3, Target("cpu"), ["cannot serve", "raises NotImplementedError",
                                    "--layout identity"]),
    ("dsv4-gfx1250", DSV4, Target("gfx1250", tp=8), ["cannot serve",
                                                      "No MXFP4 MoE backend"]),
    ("gptoss-fp8-no-scales", GPT_OSS, Target("gfx950", act_quant="fp8"),
     ["AITER_MXFP4_FP8's weight converter raises", "input scales"]),
    ("trtllm-fp8-activations", K3, Target("b200", act_quant="fp8"),
     ["act-quant fp8 is not available on FLASHINFER_TRTLLM_MXFP4_MXFP8", "MXFP8 itself"]),
    ("forced-cpu-unwritable", GPT_OSS, Target("cpu", backend="cpu"),
     ["vLLM would serve", "CPU", "cannot write", "EMULATION"]),
    ("forced-triton-on-cuda-s", K3, Target("h100", backend="triton"),
     ["cannot serve", "activation situ not supported"]),
    ("forced-emulation-cuda-no-quark", K3, Target("h100", backend="emulation"),
     ["amd-quark"]),
    ("forced-aiter-fp8-w4a4", QUARK_K3_W4A4, Target("gfx950", backend="aiter_mxfp4_fp8"),
     ["offers no backend for mxfp4 dynamic"]),
    ("forced-on-unselected-quark", QUARK_W4A6, Target("gfx950", backend="aiter"), ["only EMULATION"]),
    ("unknown-backend", K3, Target("gfx950", backend="fastest"), ["Unknown backend", "aiter_mxfp4_fp8"]),
    ("dsv4-mxfp4-act", DSV4, Target("gfx950", act_quant="mxfp4"), ["act-quant mxfp4", "ignores"]),
    ("unknown-vllm", K3, Target("gfx950", vllm="0.3x"), ["Unknown --vllm release '0.3x'", "0.33.0", "0.34.0"]),
    ("k3-fp8-gfx942", K3, Target("gfx942", act_quant="fp8"), ["act-quant fp8", "W4A16"]),
    ("k3-fp8-h200", K3, Target("h200", act_quant="fp8"), ["act-quant fp8", "HUMMING"]),
    ("quark-w4a4-as-bf16", QUARK_K3_W4A4, Target("gfx950", act_quant="bf16", vllm="0.33"), ["no override"]),
    ("quark-w4a4-as-fp8", QUARK_K3_W4A4, Target("gfx950", act_quant="fp8", vllm="0.33"), ["conflicts", "0.33.0"]),
    # vLLM 0.33's converter G asserts expert biases (FlashInfer CUTLASS) and a permute cache
    # (TRTLLM) that Quark's set-up lacks; 0.34's converter S still asserts the cache on sm100
    ("quark-w4a16-sm90-0.33", QUARK_W4A16, Target("h200", vllm="0.33"),
     ["vLLM 0.33.0 cannot serve", "AssertionError", "w13_bias", "fails at load", "--layout identity"]),
    ("quark-w4a16-sm100-0.33", QUARK_W4A16, Target("b200", vllm="0.33"),
     ["vLLM 0.33.0 cannot serve", "AssertionError", "_cache_permute_indices", "fails at load"]),
    ("quark-w4a16-sm100-0.34", QUARK_W4A16, Target("b200", vllm="0.34"),
     ["vLLM 0.34.0 cannot serve", "AssertionError", "_cache_permute_indices", "fails at load"]),
    ("bad-act-quant", K3, Target("gfx950", act_quant="int8"), ["Unknown --act-quant"]),
    ("bad-layout", K3, Target("h200", layout="marlin"), ["Unknown --layout", "hopper_mma"]),
    ("layout-on-aiter", K3, Target("gfx950", layout="hopper_mma"), ["--layout hopper_mma", "AITER_MXFP4_BF16"]),
    ("quark-dynamic-fp8", model("quark", "w_mxfp4_a_fp8", "quark", "swigluoai", {},
                                "Renormalize", 2048, 1024, 8, 2, static=False),
     Target("gfx950"), ["dynamic fp8"]),
]


@pytest.mark.parametrize("name,m,target,texts", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusals(name, m, target, texts):
    with pytest.raises(OracleError) as exc:
        decide(m, target)
    for t in texts:
        assert t in str(exc.value), str(exc.value)


# ---- vLLM quirks: both readings ---------------------------------------------------------------

def test_quark_w_mxfp4_deinterleave_both_readings():
    correct = decide(QUARK_W4A16, Target("gfx950", tp=2, vllm="0.33"))
    literal = decide(QUARK_W4A16, Target("gfx950", tp=2, vllm="0.33"), Server(quark_literal_deinterleave=True))
    assert correct.layout.gate_up == "[gate; up]"
    assert any("Suspected vLLM bug" in n for n in correct.notes)
    assert literal.layout.gate_up == LITERAL_G_ROWS
    assert any("Modelling vLLM literally" in n for n in literal.notes)
    # gpt-oss is really interleaved on disk: both readings agree there (no bug note).
    g = decide(GPT_OSS, Target("gfx950", vllm="0.33"), Server(quark_literal_deinterleave=True))
    assert g.layout.gate_up == "[gate; up]" and not any("bug" in n for n in g.notes)


def test_quark_w_mxfp4_on_0_34_is_converter_s():
    """vLLM 0.34 converts non-gpt-oss Quark models with converter S: [gate; up] rows GU16'd
    as they are (no de-interleave), AITER_BF16_FP8_MOE_BOUND=0; a gpt-oss Quark export keeps G."""
    for server in (Server(), Server(quark_literal_deinterleave=True)):
        d = decide(QUARK_W4A16, Target("gfx950", tp=2, vllm="0.34"), server)
        assert d.options["converter"] == "S" and d.layout.gate_up == "[gate; up]"
        assert not any("bug" in n for n in d.notes) and d.runtime_env["AITER_BF16_FP8_MOE_BOUND"] == "0"
    oss = replace(QUARK_W4A16, extra={"base_model_type": "gpt_oss"})
    assert decide(oss, Target("gfx950", tp=2, vllm="0.34")).options["converter"] == "G"
    assert decide(QUARK_W4A16, Target("gfx950", tp=2, vllm="0.33")).options["converter"] == "G"


def test_activation_override_wins_on_0_34():
    """0.34: --quantization-config.moe.activation overrides the checkpoint (a warning); explicit
    null is bf16. 0.33 refuses both (test_refusals)."""
    w4a4 = replace(QUARK_W4A16, quant_scheme="w_mxfp4_a_mxfp4")
    fp8 = decide(w4a4, Target("gfx950", act_quant="fp8", vllm="0.34"))
    assert fp8.options["vllm_backend"] == "EMULATION" and fp8.act_quant == "fp8"
    assert any("overrides the checkpoint's declared mxfp4 dynamic" in n for n in fp8.notes), fp8.notes
    bf16 = decide(w4a4, Target("gfx950", act_quant="bf16", vllm="0.34"))
    assert bf16.options["vllm_backend"] == "AITER_MXFP4_BF16" and bf16.act_quant == "bf16"
    assert any("moe.activation null" in n for n in bf16.notes), bf16.notes


def test_quark_w4a16_sm90_serves_on_0_34():
    d = decide(QUARK_W4A16, Target("h200", vllm="0.34"))
    assert d.options["vllm_backend"] == "FLASHINFER_CUTLASS_MXFP4_BF16" and d.options["vllm_raises"] is None
    assert d.backend == "EMULATION" and d.options["converter"] == "S"


def test_unmodelled_release_falls_back_with_a_note():
    for asked, used in (("0.35", "0.34.0"), ("0.36.2", "0.34.0"), ("0.33.7", "0.33.0"), ("0.31", "0.33.0")):
        d = decide(K3, Target("gfx950", vllm=asked))
        assert d.options["vllm_release"] == used
        assert "canary" in d.notes[0] and asked in d.notes[0], d.notes[0]
    assert not any("canary" in n for n in decide(K3, Target("gfx950", vllm="0.34.0")).notes)


def test_literal_deinterleave_scrambles_gate_and_up_rows():
    I, K = 64, 16
    gate = torch.full((I, K), 1, dtype=torch.uint8)
    up = torch.full((I, K), 2, dtype=torch.uint8)
    w13 = torch.cat([gate, up])  # how vLLM loads a Quark per-expert checkpoint
    rows = vllm_literal_w13_rows(I)
    assert sorted(rows) == list(range(2 * I))
    literal = w13[rows]
    # vLLM's literal reading puts up rows into the "gate" half that GU16 then interleaves.
    assert (literal[:I] == 2).sum() > 0 and (literal[I:] == 1).sum() > 0
    # The same permutation applied to a truly interleaved (gpt-oss) tensor is exactly right.
    interleaved = torch.stack([gate, up], dim=1).reshape(2 * I, K)
    assert torch.equal(interleaved[rows], w13)


def test_k3_rule_under_ep_follows_the_platform_model():
    # AMD model (models/kimi_k3/amd/linear.py) pads under EP too: 3072 / 16 < 256 -> 256 x 16
    d = decide(K3, Target("gfx950", tp=16, ep=True))
    assert d.intermediate_per_rank == 3072 and d.intermediate_per_rank_padded == 4096
    assert any("also under EP" in n for n in d.notes)
    # NVIDIA model: not under EP
    d = decide(K3, Target("h200", tp=16, ep=True, layout="identity"))
    assert d.intermediate_per_rank_padded == 3072


def test_server_assumptions_switch_nvidia_picks():
    no_situ = Server(flashinfer_situ=False)
    assert decide(K3, Target("b200"), no_situ).options["vllm_backend"] == "DEEPGEMM_MXFP4"
    bare = Server(flashinfer_situ=False, deep_gemm=False)
    assert decide(K3, Target("b200"), bare).options["vllm_backend"] == "MARLIN"
    assert decide(K3, Target("sm120"), Server(deep_gemm=False)).options["vllm_backend"] == "MARLIN"
    # gpt-oss on sm90 without triton_kernels: CUTLASS BF16 (sm90 exactly), still not writable.
    d = decide(GPT_OSS, Target("h100"), Server(triton_kernels=False))
    assert d.options["vllm_backend"] == "FLASHINFER_CUTLASS_MXFP4_BF16"
    # K3 on gfx942 without amd-quark: vLLM has nothing (EMULATION is its only fallback).
    with pytest.raises(OracleError, match="raises NotImplementedError"):
        decide(K3, Target("gfx942"), Server(amd_quark=False))
    d = decide(K3, Target("gfx942", layout="identity"), Server(amd_quark=False))
    assert d.options["vllm_backend"] is None and d.backend == "EMULATION"


def test_dsv4_aiter_kernel_runs_fp8_activations():
    d = decide(DSV4, Target("gfx950", tp=8))
    assert d.act_quant == "bf16" and d.options["kernel_act"] == "fp8"
    assert decide(DSV4, Target("gfx950", tp=8, act_quant="fp8")).layout == d.layout


def test_producible_lists_what_forcing_accepts():
    d = decide(DSV4, Target("gfx950", tp=8))
    assert d.options["producible"] == ["AITER_MXFP4_BF16", "AITER_TRITON_MXFP4_BF16",
                                       "AITER_MXFP4_MXFP4", "TRITON_UNFUSED", "EMULATION"]
    for b in d.options["producible"]:
        assert decide(DSV4, Target("gfx950", tp=8, backend=b)).backend == b


# ---- round-up, arch, table ---------------------------------------------------------------------

@pytest.mark.parametrize("H,I,out", [((2880, 720), None, (2880, 736)), ((2880, 360), None, (2880, 384)),
                                     ((2880, 2880), None, (2880, 2880)), ((90, 90), None, (96, 96))])
def test_emulation_round_up_vllm_table(H, I, out):
    i_mult, h_mult, _ = backend_alignment("EMULATION", "rocm", None)
    h, i = H
    assert (-(-h // h_mult) * h_mult, -(-i // i_mult) * i_mult) == out


def test_round_up_rule_order():
    # vLLM's test_aiter_mxfp4_bf16_silu_preserves_native_tp_shard: (7168, 3072 @ TP8) -> (7168, 384)
    g = padded_geometry(backend="AITER_MXFP4_BF16", platform="rocm", activation="silu",
                        hidden=7168, intermediate=3072, num_experts=8, tp=8, ep=False)
    assert (g.hidden_padded, g.intermediate_per_rank_padded) == (7168, 384)
    # Without the activation (gpt-oss / Quark) the same backend takes the 256 row.
    g = padded_geometry(backend="AITER_MXFP4_BF16", platform="rocm", activation=None,
                        hidden=7168, intermediate=3072, num_experts=8, tp=8, ep=False)
    assert g.intermediate_per_rank_padded == 512
    assert backend_alignment("MARLIN", "cuda", "situ")[:2] == (128, 256)
    assert backend_alignment("TRITON", "cuda", None)[:2] == (64, None)
    assert backend_alignment("TRITON_UNFUSED", "rocm", "silu", cdna=4)[:2] == (256, 256)
    assert backend_alignment("TRITON_UNFUSED", "rocm", "silu", cdna=3)[:2] == (128, 128)
    assert backend_alignment("AITER_MXFP4_MXFP4", "rocm", None)[:2] == (128, 256)
    assert backend_alignment("CPU", "cpu", None)[:2] == (32, 32)
    assert backend_alignment("EMULATION", "rocm", "situ")[:2] == (32, 32)  # before the ROCm rows


def test_resolve_arch_aliases():
    expect = {"mi300x": "gfx942", "MI325X": "gfx942", "mi350x": "gfx950", "mi355x": "gfx950",
              "h100": "sm90", "H200": "sm90", "h20": "sm90", "b200": "sm100", "gb200": "sm100",
              "gfx1250": "gfx1250", "sm120": "sm120", "cpu": "cpu"}
    assert {k: resolve_arch(k) for k in expect} == expect
    with pytest.raises(OracleError, match="Known archs: gfx942"):
        resolve_arch("a100")


def test_backend_table_is_complete():
    for name, members in MOE_BACKEND_STRINGS.items():
        assert parse_backend(name) == members
        assert all(m in BACKENDS for m in members)
    assert parse_backend("AITER") == ("AITER_MXFP4_BF16",)
    assert parse_backend("aiter_mxfp4_bf16") == ("AITER_MXFP4_BF16",)
    assert all(b.classes for b in BACKENDS.values())


def test_every_recipe_layout_is_registered():
    from mxfp4conv.shuffle.layouts import get_layout

    for name in PRODUCIBLE_LAYOUTS:
        assert get_layout(name).name == name


def test_moe_weight_names_and_manifest_request():
    """--moe-weight: only the modelled name is accepted, and a manifest's request keeps it."""
    from mxfp4conv.convert.manifest import _request, target_from_manifest

    m = MoEModel(family="kimi_k3", quant_scheme="w_mxfp4", moe_method="mxfp4",
                 activation=Activation("situ", {"beta": 4.0, "linear_beta": 25.0}),
                 routing="DeepSeekV3", geometry=MoEGeometry(2048, 1024, 64, 4), layers=())
    with pytest.raises(OracleError, match="Unknown --moe-weight"):
        decide(m, Target("gfx942", moe_weight="int8_per_channel_static"))
    t = Target("gfx942", tp=8, ep=True, layout="identity", moe_weight="int4_per_group_32")
    manifest = {"target": {"request": _request(t)}, "vllm": "0.33.0"}
    assert target_from_manifest(manifest) == t


def test_sm90_plan_states_the_humming_measurement():
    """Where mxfp4conv's kernel replaces vLLM's Humming on sm90, plan says what was measured, and
    the one point where Humming was ahead, with the way to keep vLLM's kernel."""
    d = decide(DSV4, Target("h100", tp=8))
    (note,) = [n for n in d.notes if "replaces vLLM's pick" in n]
    assert "HUMMING" in note and "1.06-1.67x" in note and "2.4% faster" in note and "second run" in note
    assert "--backend HUMMING" in note
