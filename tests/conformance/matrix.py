"""The conformance matrix: (checkpoint model, mxfp4conv Target) pairs and the vLLM layer each
one becomes, as a ``probe_moe`` case.

Families: Kimi-K3, DeepSeek-V4, gpt-oss, Quark w_mxfp4 / w_mxfp4_a_mxfp4 / w_mxfp4_a_fp8;
archs gfx950, gfx942, gfx1250, sm90, sm100, cpu; tp 1, 2, 8 and 8 with EP; AITER on and off
(ROCm); SiTUv2 modes (Kimi-K3 on ROCm); requested activation quantisation; the backends
only --moe-backend reaches (B12X, FlashInfer MoE-EP) on sm120, sm100 and sm90; and the server
option --quantization-config.moe.weight int4_per_group_32 (mxfp4conv --moe-weight) for every
family on gfx942 (where Kimi-K3 takes the int4 path), gfx950, sm100 and CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from mxfp4conv.checkpoint.canonical import Activation, MoEGeometry, MoEModel
from mxfp4conv.oracle import Target
from mxfp4conv.oracle.releases import fallback_for


def _model(family, scheme, method, act, params, routing, H, I, E, k, static=False, bias=False,
           extra=None, interleaved=False):
    return MoEModel(family=family, quant_scheme=scheme, moe_method=method,
                    activation=Activation(act, params), routing=routing,
                    geometry=MoEGeometry(H, I, E, k), layers=(), has_bias=bias,
                    static_input_scales=static, extra=extra or {}, gate_up_interleaved=interleaved)


# Published geometries (routed-expert hidden, global intermediate, experts, top-k).
MODELS: dict[str, MoEModel] = {
    "k3": _model("kimi_k3", "w_mxfp4", "mxfp4", "situ", {"beta": 4.0, "linear_beta": 25.0},
                 "DeepSeekV3", 7168, 3072, 896, 16),
    # a Kimi-K3-format export whose per-rank size falls under the models' 256 minimum at tp 8
    "k3_small": _model("kimi_k3", "w_mxfp4", "mxfp4", "situ", {"beta": 4.0, "linear_beta": 25.0},
                       "DeepSeekV3", 2048, 1024, 64, 4),
    "dsv4": _model("deepseek_v4", "w_mxfp4", "mxfp4", "silu", {"swiglu_limit": 10.0},
                   "DeepseekV4", 4096, 2048, 256, 6),
    "gpt_oss": _model("gpt_oss", "w_mxfp4", "gpt_oss_mxfp4", "swigluoai",
                      {"alpha": 1.702, "limit": 7.0}, "Renormalize", 2880, 2880, 128, 4,
                      bias=True),
    "quark_w4a16": _model("quark", "w_mxfp4", "quark", "silu", {}, "Renormalize",
                          4096, 1536, 64, 8),
    "quark_w4a4": _model("quark", "w_mxfp4_a_mxfp4", "quark", "silu", {}, "Renormalize",
                         4096, 1536, 64, 8),
    "quark_w4a8": _model("quark", "w_mxfp4_a_fp8", "quark", "swigluoai",
                         {"alpha": 1.702, "limit": 7.0}, "Renormalize", 4096, 1536, 64, 8,
                         static=True),
    # a Quark export of gpt-oss (model_type gpt_oss: vLLM 0.34 keeps converter G for it), with
    # gpt-oss's fused, row-interleaved gate_up tensors and biases
    "quark_oss": _model("quark", "w_mxfp4", "quark", "swigluoai", {"alpha": 1.702, "limit": 7.0},
                        "Renormalize", 2880, 2880, 128, 4, bias=True,
                        extra={"base_model_type": "gpt_oss"}, interleaved=True),
}
# models only some parallel layouts are run for (the rest of their cases repeat other models')
FEW_CASES = {"quark_oss": ((1, False), (8, True))}
ARCHS = ("gfx950", "gfx942", "gfx1250", "sm90", "sm100", "cpu")
PARALLEL = ((1, False), (2, False), (8, False), (8, True))
QUARK_INPUT = {"w_mxfp4": None, "w_mxfp4_a_mxfp4": "mxfp4", "w_mxfp4_a_fp8": "fp8"}
# VLLM_ROCM_USE_AITER_MOE_SITUV2 mode -> the mxfp4conv --act-quant that writes it
SITUV2_ACT = {"auto": "auto", "a4w4": "mxfp4", "a8w4": "fp8", "a16w4": "bf16"}
# mxfp4conv --act-quant -> vLLM quantization_config.moe.activation
ACT_OVERRIDE = {"auto": None, "bf16": None, "fp8": "fp8_per_tensor_static", "mxfp4": "mxfp4"}


@dataclass(frozen=True)
class Case:
    id: str
    model_name: str
    target: Target
    situv2: str | None = None  # VLLM_ROCM_USE_AITER_MOE_SITUV2 (None: vLLM's default)
    env: dict = field(default_factory=dict)

    @property
    def model(self) -> MoEModel:
        return MODELS[self.model_name]

    @property
    def platform(self) -> str:
        return self.target.arch


def model_intermediate(case: Case) -> int:
    """The per-rank intermediate size vLLM's model code hands to FusedMoE. Kimi-K3's models
    raise a per-partition size below ``min_moe_intermediate_per_partition`` (256) to 256 at
    tp > 1: the AMD model (models/kimi_k3/amd/linear.py) also under expert parallel, the
    NVIDIA one (models/kimi_k3/nvidia/model.py) not. Other families pass I / tp (I with EP)."""
    m, t = case.model, case.target
    total = m.geometry.intermediate
    if m.activation.name == "situ" and t.tp > 1:
        amd = t.arch.startswith("gfx")
        if (amd or not t.ep) and total // t.tp < 256:
            total = 256 * t.tp
    return total if t.ep else total // t.tp


def vllm_case(case: Case) -> dict:
    """The probe_moe case: the layer vLLM builds for ``case``."""
    m, t = case.model, case.target
    g = m.geometry
    method = {"mxfp4": "mxfp4", "gpt_oss_mxfp4": "gpt_oss", "quark": "quark"}[m.moe_method]
    p = m.activation.params
    env = dict(case.env)
    moe_backend, backend_env = BACKEND_REQUEST.get(t.backend, (t.backend, {}))
    env.update(backend_env)
    if t.arch.startswith("gfx"):
        env["VLLM_ROCM_USE_AITER"] = "1" if t.aiter else "0"
        if case.situv2 is not None:
            env["VLLM_ROCM_USE_AITER_MOE_SITUV2"] = case.situv2
    return {
        "method": method,
        "activation": m.activation.name,
        "situ_beta": p.get("beta") if m.activation.name == "situ" else None,
        "situ_linear_beta": p.get("linear_beta") if m.activation.name == "situ" else None,
        "swiglu_limit": p.get("swiglu_limit"),
        "routing": m.routing,
        "hidden": g.hidden,
        "intermediate_per_partition": model_intermediate(case),
        "num_experts": g.num_experts,
        "num_local_experts": g.num_experts // t.tp if t.ep else g.num_experts,
        "top_k": g.top_k,
        "tp": t.tp,
        "ep": t.ep,
        "has_bias": m.has_bias,
        "quark_input": QUARK_INPUT.get(m.quant_scheme) if method == "quark" else None,
        "moe_activation": ACT_OVERRIDE[t.act_quant],
        # --act-quant bf16 against declared activations is the server's explicit `null`
        "moe_activation_null": (t.act_quant == "bf16" and method != "mxfp4"
                                and QUARK_INPUT.get(m.quant_scheme) is not None),
        "moe_backend": "auto" if moe_backend is None else moe_backend,
        "moe_weight": t.moe_weight,
        "model_type": "gpt_oss" if "gpt_oss" in (m.family, m.extra.get("base_model_type")) else m.family,
        "env": env,
        # mxfp4conv's modelled server: amd-quark on ROCm and wherever a Quark checkpoint is served
        "packages": {"quark": t.arch.startswith("gfx") or m.moe_method == "quark"},
    }


# Backends only --moe-backend reaches (in no priority list), on the archs that gate them;
# mxfp4conv writes its own format there, asked for with --layout identity.
FORCED_BACKENDS = ("b12x", "B12X_MXFP4_BF16", "flashinfer_moe_ep_cutedsl",
                   "flashinfer_moe_ep_mega_deep_gemm")
FORCED_ARCHS = ("sm120", "sm100", "sm90")
# mxfp4conv --backend member name -> (vLLM --moe-backend string, environment it needs)
BACKEND_REQUEST = {"B12X_MXFP4_BF16": ("b12x", {"VLLM_B12X_MOE_FP4_FORCE_A16": "1"})}


def forced_cases() -> list[Case]:
    out = []
    for name, m in MODELS.items():
        if name in ("k3_small", *FEW_CASES):
            continue
        for arch in FORCED_ARCHS:
            for tp, ep in ((1, False), (8, True)):
                for b in FORCED_BACKENDS:
                    par = f"tp{tp}{'-ep' if ep else ''}"
                    out.append(Case(f"{name}-{arch}-{par}-backend_{b}", name,
                                    Target(arch, tp=tp, ep=ep, backend=b, layout="identity")))
    return out


INT4 = "int4_per_group_32"
INT4_ARCHS = ("gfx942", "gfx950", "sm100", "cpu")


def int4_cases() -> list[Case]:
    """--moe-weight int4_per_group_32 for every family: tp 1, 8 and 8 with EP; AITER on and off
    on ROCm; on gfx942 both with --layout auto and --layout identity (mxfp4conv's own format,
    the only one it writes where vLLM requantises to int4), and Kimi-K3's SiTUv2 modes there."""
    out = []
    for name, m in MODELS.items():
        if name in FEW_CASES:
            continue
        for arch in INT4_ARCHS:
            rocm = arch.startswith("gfx")
            for tp, ep in ((1, False), (8, False), (8, True)):
                if ep and m.geometry.num_experts % tp or not ep and (m.geometry.intermediate // tp) % 32:
                    continue
                par = f"tp{tp}{'-ep' if ep else ''}"
                for aiter in ((True, False) if rocm else (True,)):
                    tag = f"{name}-{arch}-{par}" + ("" if not rocm else ("-aiter" if aiter else "-noaiter"))
                    for layout in (("auto", "identity") if arch == "gfx942" else ("auto",)):
                        t = Target(arch, tp=tp, ep=ep, aiter=aiter, layout=layout, moe_weight=INT4)
                        out.append(Case(f"{tag}-int4-{layout}", name, t))
                    if arch == "gfx942" and aiter and m.activation.name == "situ":
                        for mode, aq in SITUV2_ACT.items():
                            out.append(Case(f"{tag}-int4-identity-situv2_{mode}", name,
                                            Target(arch, tp=tp, ep=ep, aiter=aiter, act_quant=aq,
                                                   layout="identity", moe_weight=INT4), situv2=mode))
    return out


def cases() -> list[Case]:
    out: list[Case] = forced_cases() + int4_cases()
    for name, m in MODELS.items():
        for arch in ARCHS:
            rocm = arch.startswith("gfx")
            for tp, ep in FEW_CASES.get(name, PARALLEL):
                if ep and m.geometry.num_experts % tp:
                    continue
                if not ep and (m.geometry.intermediate // tp) % 32:
                    continue
                par = f"tp{tp}{'-ep' if ep else ''}"
                for aiter in ((True, False) if rocm else (True,)):
                    base = Target(arch, tp=tp, ep=ep, aiter=aiter)
                    tag = f"{name}-{arch}-{par}" + ("" if not rocm else ("-aiter" if aiter else "-noaiter"))
                    out.append(Case(tag, name, base))
                    if m.activation.name == "situ" and rocm and aiter:
                        for mode, aq in SITUV2_ACT.items():
                            out.append(Case(f"{tag}-situv2_{mode}", name,
                                            Target(arch, tp=tp, ep=ep, aiter=aiter, act_quant=aq),
                                            situv2=mode))
                    if m.moe_method != "mxfp4" and tp == 1 and not ep:
                        declared = QUARK_INPUT.get(m.quant_scheme) is not None and m.moe_method == "quark"
                        for aq in ("fp8", "mxfp4") + (("bf16",) if declared else ()):
                            out.append(Case(f"{tag}-act_{aq}", name,
                                            Target(arch, tp=tp, ep=ep, aiter=aiter, act_quant=aq)))
    return out


def release_of(version: str) -> tuple[str, str | None]:
    """(the modelled release key mxfp4conv answers for vLLM ``version`` -- a release number or a
    wheel path --, the note when that release is not modelled itself)."""
    name = Path(version).name.split("-")[1] if version.endswith(".whl") else version
    release, note = fallback_for(name)
    return release.key, note


def for_release(case: Case, version: str) -> Case:
    """``case`` with mxfp4conv's answer asked for the release modelled for ``version``."""
    return replace(case, target=replace(case.target, vllm=release_of(version)[0]))
