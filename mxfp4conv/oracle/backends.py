"""vLLM's MXFP4 MoE backends as a capability table, for the releases of ``oracle.releases``.

Each ``Mxfp4MoeBackend`` member lists the expert classes vLLM tries for it, in order
(``backend_to_kernel_cls``), and each class lists the gates its ``is_supported_config``
checks, in vLLM's order: device, activation, (weight, activation-quant) key, parallel
config, routing method, activation format. A gate returns ``None`` when it accepts and a
reason string when it rejects, so a selector can explain every rejection.

The modelled server (``Server``) pins the facts vLLM reads from the environment rather
than from the checkpoint: which optional packages are installed. What differs between
releases (``Release``: the TRTLLM experts classes, the gpt-oss priority list) is read from the
release the context carries (``Ctx.release``); ``backend_table(release)`` is the table of one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

from mxfp4conv.checkpoint.canonical import GENERIC_ACTIVATIONS
from mxfp4conv.oracle.arch import Arch
from mxfp4conv.oracle.releases import NEWEST, RELEASES, Release

# vLLM activation-quant keys (QuantKey names); None = unquantised (bf16) activations.
MXFP8_DYN = "kMxfp8Dynamic"
FP8_STATIC = "kFp8StaticTensorSym"
FP8_128_DYN = "kFp8Dynamic128Sym"
MXFP4_DYN = "kMxfp4Dynamic"
# --quantization-config.moe.weight names the oracle models (config/quantization.py
# QUANT_KEY_NAMES): int4_per_group_32 = kInt4Static32, read only by Mxfp4MoEMethod
# (_moe_weight_override_is_int4); OnlineQuantizationConfig._get_method_cls maps it to no
# online method, so no other layer or method changes.
INT4_G32 = "int4_per_group_32"
MOE_WEIGHTS = (INT4_G32,)
KEY_TEXT = {
    None: "bf16 (unquantised)",
    MXFP8_DYN: "mxfp8 dynamic",
    FP8_STATIC: "fp8 static per-tensor",
    FP8_128_DYN: "fp8 dynamic per-128 block",
    MXFP4_DYN: "mxfp4 dynamic",
}



@dataclass(frozen=True)
class Server:
    """What the modelled vLLM server has installed (None = the default for the platform)."""

    torch_2_8: bool = True  # torch >= 2.8
    triton_kernels: bool = True
    amd_quark: bool | None = None  # default: on ROCm, and wherever a Quark checkpoint is served
    flashinfer: bool | None = None  # default: on CUDA
    flashinfer_situ: bool = True  # flashinfer's ActivationType has Situ (sm100 TRTLLM for K3)
    deep_gemm: bool | None = None  # default: on CUDA
    humming: bool | None = None  # humming-kernels (a vLLM 0.33.0 CUDA dependency); default: on CUDA
    cpu_amx: bool = True  # the CPU platform is x86 with AMX tiles
    b12x: bool | None = None  # the b12x package (b12x.moe.fused_moe); default: on CUDA
    # Model vLLM's literal converter G for Quark w_mxfp4 on AITER_MXFP4_BF16 (de-interleave
    # of rows that are already [gate; up]); False = what the kernel actually needs.
    quark_literal_deinterleave: bool = False

    def has_amd_quark(self, arch: Arch, quark_checkpoint: bool) -> bool:
        if self.amd_quark is not None:
            return self.amd_quark
        return arch.is_rocm or quark_checkpoint

    def has_flashinfer(self, arch: Arch) -> bool:
        return self.flashinfer if self.flashinfer is not None else arch.is_cuda

    def has_deep_gemm(self, arch: Arch) -> bool:
        return self.deep_gemm if self.deep_gemm is not None else arch.is_cuda

    def has_humming(self, arch: Arch) -> bool:
        return self.humming if self.humming is not None else arch.is_cuda

    def has_b12x(self, arch: Arch) -> bool:
        return self.b12x if self.b12x is not None else arch.is_cuda

    def assumptions(self, arch: Arch, quark_checkpoint: bool) -> list[str]:
        yes = {True: "present", False: "absent"}
        out = [f"torch {'>=' if self.torch_2_8 else '<'} 2.8",
               f"triton_kernels {yes[self.triton_kernels]}",
               f"amd-quark {yes[self.has_amd_quark(arch, quark_checkpoint)]}"]
        if arch.is_cuda:
            fi = self.has_flashinfer(arch)
            out.append(f"flashinfer {yes[fi]}" + (
                f" (Situ activation {yes[self.flashinfer_situ]})" if fi else ""))
            out.append(f"deep_gemm {yes[self.has_deep_gemm(arch)]}")
            out.append(f"humming {yes[self.has_humming(arch)]}")
            out.append(f"b12x {yes[self.has_b12x(arch)]}")
        if arch.is_cpu:
            out.append(f"x86 AMX {yes[self.cpu_amx]}")
        return out


@dataclass(frozen=True)
class Ctx:
    """Everything a gate may look at (vLLM's FusedMoEConfig + platform, reduced)."""

    arch: Arch
    aiter: bool  # VLLM_ROCM_USE_AITER (with VLLM_ROCM_USE_AITER_MOE at its default, on)
    server: Server
    quark_checkpoint: bool
    activation: str
    act_key: str | None
    routing: str
    num_local_experts: int
    weight_key: str = "mxfp4"
    all2all: bool = False  # use_all2all_kernels (dp > 1 with EP)
    eplb: bool = False
    dp: int = 1
    ep: bool = False
    batched: bool = False  # BatchedExperts activation format (DeepEP-LL)
    has_bias: bool = False
    hidden: int = 0  # hidden size and per-rank intermediate size (unpadded) of the layer
    intermediate: int = 0
    situ_params: tuple = ()  # (beta, linear_beta) of a SiTU layer
    moe_backend: str = "auto"  # the --moe-backend string the server is given
    # quantization_config.moe.weight the server is given (--quantization-config.moe.weight);
    # None: not given. Only int4_per_group_32 (kInt4Static32) is modelled.
    moe_weight: str | None = None
    release: Release = RELEASES[NEWEST]  # the vLLM release whose table and lists apply


Gate = Callable[[Ctx], "str | None"]


# ---- device predicates -------------------------------------------------------------------

def _aiter_fused_moe_enabled(c: Ctx) -> str | None:
    """rocm_aiter_ops.is_fused_moe_enabled(): ROCm, aiter, CDNA > 2, AITER + MoE flags on."""
    if not c.arch.is_rocm:
        return f"needs ROCm with AITER; {c.arch.describe()}"
    if not (c.arch.cdna or 0) > 2:
        return f"AITER fused MoE needs CDNA > 2; {c.arch.describe()}"
    if not c.aiter:
        return "AITER is disabled (VLLM_ROCM_USE_AITER unset / --no-aiter)"
    return None


def _aiter_on(*archs: str) -> Callable[[Ctx], "str | None"]:
    """rocm_aiter_ops.is_enabled() and the arch is one of ``archs``."""
    def pred(c: Ctx) -> str | None:
        if not c.arch.is_rocm:
            return f"needs ROCm with AITER; {c.arch.describe()}"
        if not c.aiter:
            return "AITER is disabled (VLLM_ROCM_USE_AITER unset / --no-aiter)"
        if c.arch.name not in archs:
            return f"needs {' or '.join(archs)}; {c.arch.describe()}"
        return None
    return pred


def _oai_triton_device(c: Ctx) -> str | None:
    if c.arch.is_cuda:
        if not (9, 0) <= c.arch.capability < (13, 0):  # type: ignore[operator]
            return f"needs CUDA capability in [9.0, 13.0); {c.arch.describe()}"
    elif c.arch.is_rocm:
        if not (c.arch.on_gfx9 or c.arch.on_gfx1x):
            return f"needs gfx9 (gfx90a/942/950) or RDNA (not gfx1250); {c.arch.describe()}"
    else:
        return f"needs CUDA or ROCm; {c.arch.describe()}"
    if not c.server.triton_kernels:
        return "triton_kernels is not installed"
    return None


def _trtllm_device(c: Ctx) -> str | None:
    if not c.arch.is_cuda or c.arch.cuda_family != 100:
        return f"needs CUDA capability family 100 (sm100/sm103); {c.arch.describe()}"
    if not c.server.has_flashinfer(c.arch):
        return "flashinfer is not installed"
    return None


def _cutlass_device(c: Ctx) -> str | None:
    if not c.arch.is_cuda or not (c.arch.capability == (9, 0) or c.arch.cuda_family in (100, 120)):
        return f"needs CUDA sm90 or family 100/120; {c.arch.describe()}"
    if not c.server.has_flashinfer(c.arch):
        return "flashinfer (CUTLASS MoE) is not installed"
    return None


def _deepgemm_device(c: Ctx) -> str | None:
    if not c.arch.is_cuda or c.arch.cuda_family not in (100, 120):
        return f"needs CUDA capability family 100 or 120; {c.arch.describe()}"
    if not c.server.has_deep_gemm(c.arch):
        return "deep_gemm is not installed (is_deep_gemm_supported)"
    return None


def _marlin_device(c: Ctx) -> str | None:
    if not c.arch.is_cuda or c.arch.capability < (7, 5):  # type: ignore[operator]
        return f"needs CUDA capability >= 7.5; {c.arch.describe()}"
    return None


def _xpu_device(c: Ctx) -> str | None:
    return f"needs an Intel XPU; {c.arch.describe()}"


def _cpu_device(c: Ctx) -> str | None:
    if not c.arch.is_cpu:
        return f"needs the CPU platform; {c.arch.describe()}"
    if not c.server.cpu_amx:
        return "needs x86 with AMX tiles"
    return None


def _emulation_device(c: Ctx) -> str | None:
    if not c.server.has_amd_quark(c.arch, c.quark_checkpoint):
        return "needs the amd-quark package (has_quark()), absent on the modelled server"
    if not (c.arch.is_rocm or c.arch.is_cuda):
        return f"TritonExperts needs CUDA or ROCm (is_cuda_alike); {c.arch.describe()}"
    return None


def _humming_device(c: Ctx) -> str | None:
    if not c.arch.is_cuda or c.arch.capability < (7, 5):  # type: ignore[operator]
        return f"needs CUDA capability >= 7.5; {c.arch.describe()}"
    if not c.server.has_humming(c.arch):
        return "humming is not installed"
    return None


def _cutlass_w4a4_device(c: Ctx) -> str | None:
    # ops.mxfp4_experts_quant_supported(capability): vLLM's compiled CUTLASS MXFP4 grouped GEMM
    if not c.arch.is_cuda or c.arch.cuda_family != 100:
        return f"needs CUDA capability family 100 (the CUTLASS MXFP4 experts); {c.arch.describe()}"
    return None


def _b12x_device(c: Ctx) -> str | None:
    # B12xExperts._supports_current_device: family 120 and b12x's fused_moe is_supported()
    if not c.arch.is_cuda or c.arch.cuda_family != 120:
        return f"needs CUDA capability family 120 (sm120/sm121); {c.arch.describe()}"
    if not c.server.has_b12x(c.arch):
        return "b12x is not installed"
    return None


FLASHINFER_MOE_EP_CAPABILITIES = {(10, 0), (10, 3)}


def _moe_ep_device(c: Ctx) -> str | None:
    if not c.arch.is_cuda or c.arch.capability not in FLASHINFER_MOE_EP_CAPABILITIES:
        return f"needs CUDA capability 10.0 or 10.3; {c.arch.describe()}"
    return None


def device(pred: Callable[[Ctx], "str | None"]) -> Gate:
    def gate(c: Ctx) -> str | None:
        r = pred(c)
        return None if r is None else f"device: {r}"
    return gate


# ---- other gates ---------------------------------------------------------------------------

def activations(names: frozenset[str] | set[str],
                extra: Callable[[Ctx], "str | None"] | None = None) -> Gate:
    names = frozenset(names)

    def gate(c: Ctx) -> str | None:
        if c.activation not in names:
            return f"activation {c.activation} not supported (accepts {', '.join(sorted(names))})"
        return extra(c) if extra else None
    return gate


def _trtllm_situ(c: Ctx) -> str | None:
    if c.activation == "situ" and not c.server.flashinfer_situ:
        return "activation situ needs flashinfer's ActivationType.Situ"
    return None


def quant(*keys: "str | None", extra: Callable[[Ctx], "str | None"] | None = None) -> Gate:
    allowed = frozenset(keys)

    def gate(c: Ctx) -> str | None:
        if c.act_key not in allowed:
            accepted = ", ".join(KEY_TEXT[k] for k in keys)
            return (f"quant scheme (mxfp4 weights, {KEY_TEXT[c.act_key]} activations) not "
                    f"supported (activations accepted: {accepted})")
        return extra(c) if extra else None
    return gate


def _aiter_mxfp4_weight(c: Ctx) -> str | None:
    """AiterMxfp4Experts._supports_quant_scheme: mxfp4 weights on gfx950; int4 weights in
    groups of 32 (kInt4Static32, the gfx942 Kimi-K3 requantisation) with bf16 activations
    on gfx942 only."""
    if c.weight_key == INT4_G32:
        if c.arch.name != "gfx942" or c.act_key is not None:
            return ("quant scheme: AiterMxfp4Experts takes int4 (groups of 32) weights only with "
                    f"bf16 activations on gfx942; {c.arch.describe()}")
        return None
    if not c.arch.on_gfx950 or c.arch.on_gfx1250:
        return f"quant scheme: AiterMxfp4Experts takes mxfp4 weights only on gfx950; {c.arch.describe()}"
    return None


def _cutlass_keys(c: Ctx) -> str | None:
    if c.act_key is None and c.arch.capability != (9, 0):
        return "quant scheme: mxfp4 weights with bf16 activations only on sm90 exactly"
    if c.act_key == MXFP8_DYN and c.arch.capability < (10, 0):  # type: ignore[operator]
        return "quant scheme: mxfp4 x mxfp8 needs capability >= 10.0"
    return None


def any_quant(c: Ctx) -> str | None:
    return None


def weight_only_quant(c: Ctx) -> str | None:
    # Marlin checks the weight key alone (mxfp4 is accepted; the activation key is ignored).
    return None


def monolithic_parallel(c: Ctx) -> str | None:
    if c.all2all or c.eplb or c.dp > 1:
        return "parallel: needs no all2all kernels, no EPLB and dp <= 1"
    return None


def routing(names: set[str]) -> Gate:
    allowed = frozenset(names)

    def gate(c: Ctx) -> str | None:
        if c.routing not in allowed:
            return f"routing method {c.routing} not supported (accepts {', '.join(sorted(allowed))})"
        return None
    return gate


def standard_format(c: Ctx) -> str | None:
    return "activation format: needs Standard, deployment uses BatchedExperts" if c.batched else None


def batched_format(c: Ctx) -> str | None:
    if c.batched:
        return None
    return "activation format: needs BatchedExperts (DeepEP-LL); deployment uses Standard"


def humming_gemm(kind: str) -> Gate:
    """get_humming_moe_gemm_type(): grouped_contiguous with EP, else indexed."""
    def gate(c: Ctx) -> str | None:
        preferred = "grouped_contiguous" if c.ep else "indexed"
        return None if preferred == kind else f"preferred gemm type {preferred} != {kind}"
    return gate


def no_ep(c: Ctx) -> str | None:
    return "parallel: does not support expert parallel" if c.ep else None


def emulation_experts(c: Ctx) -> str | None:
    padded = -(-c.num_local_experts // 32) * 32
    if padded >= 1024:
        return f"TritonExperts needs round_up(num_experts, 32) < 1024; got {padded}"
    return None


def b12x_layer(c: Ctx) -> str | None:
    """B12xExperts.is_supported_config's own checks, before the framework's."""
    if c.has_bias:
        return "kernel does not support expert biases"
    if c.activation == "situ" and tuple(c.situ_params) != (4.0, 25.0):
        return "kernel supports only SiTU beta=4 and linear_beta=25"
    if c.act_key is not None and c.activation == "swigluoai_uninterleave":
        return "kernel does not support swigluoai_uninterleave with W4A8"
    if c.intermediate % 32:
        return "MXFP4 requires the per-rank intermediate size to be divisible by 32"
    if c.act_key == MXFP8_DYN:
        if c.activation not in ("silu", "situ"):
            return "MXFP4 W4A8 supports only SiLU and SiTU"
        if c.hidden % 256 or c.intermediate % 32:
            return ("MXFP4 W4A8 requires hidden size divisible by 256 and per-rank "
                    "intermediate size divisible by 32")
    return None


def b12x_parallel(c: Ctx) -> str | None:
    if c.ep or c.all2all or c.eplb:
        return "parallel: no expert parallel, all2all kernels or EPLB"
    return None


def moe_ep_parallel(c: Ctx) -> str | None:
    if not c.ep or c.batched:
        return "parallel: needs expert parallel with the Standard activation format"
    return None


def moe_ep_layer(kernel: str) -> Gate:
    """flashinfer_moe_ep_unsupported_reasons (bf16 activations, mxfp4 weights accepted by both
    kernels; DeepGEMM needs DeepSeek-V4 routing and no EPLB)."""
    def gate(c: Ctx) -> str | None:
        why = []
        if c.has_bias:
            why.append("expert bias")
        if kernel == "deep_gemm" and c.routing != "DeepseekV4":
            why.append(f"routing method {c.routing}")
        if kernel == "deep_gemm" and c.eplb:
            why.append("EPLB")
        return f"kernel does not support {', '.join(why)}" if why else None
    return gate


# ---- the table ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ExpertClass:
    name: str
    gates: tuple[Gate, ...]

    def check(self, c: Ctx) -> str | None:
        for g in self.gates:
            r = g(c)
            if r is not None:
                return r
        return None


@dataclass(frozen=True)
class Backend:
    name: str
    default_key: str | None
    classes: tuple[ExpertClass, ...] = field(default_factory=tuple)


_TRTLLM_ACTS = activations({"swigluoai", "silu", "situ"}, _trtllm_situ)
_TRTLLM_MONOLITHIC = ExpertClass("TrtLlmMxfp4ExpertsMonolithic", (
    device(_trtllm_device), _TRTLLM_ACTS, quant(None, MXFP8_DYN), monolithic_parallel,
    routing({"DeepSeekV3", "Renormalize", "RenormalizeNaive"})))


def _trtllm_classes(release: Release) -> tuple[ExpertClass, ...]:
    """The monolithic class, then the release's modular ones (Release.trtllm_modular)."""
    return (_TRTLLM_MONOLITHIC, *(
        ExpertClass(name, (device(_trtllm_device), _TRTLLM_ACTS, quant(*keys)))
        for name, keys in release.trtllm_modular))


_TRTLLM_CLASSES = _trtllm_classes(RELEASES["0.33"])  # replaced per release (backend_table)
_CUTLASS_CLASSES = (
    ExpertClass("FlashInferExperts", (
        device(_cutlass_device),
        activations({"silu", "gelu_tanh", "relu2_no_mul", "swigluoai", "swigluoai_uninterleave"}),
        quant(None, MXFP8_DYN, extra=_cutlass_keys))),
)
_OAI_TRITON_CLASSES = (
    ExpertClass("OAITritonMxfp4ExpertsMonolithic", (
        device(_oai_triton_device), activations({"swigluoai"}), quant(None), monolithic_parallel,
        routing({"Renormalize", "RenormalizeNaive"}))),
    ExpertClass("OAITritonExperts", (
        device(_oai_triton_device), activations({"swigluoai"}), quant(None))),
)
_AITER_EXPERTS = ExpertClass("AiterMxfp4Experts", (
    device(_aiter_fused_moe_enabled),
    activations({"silu", "gelu", "situ", "swigluoai", "swigluoai_uninterleave"}),
    quant(None, MXFP4_DYN, extra=_aiter_mxfp4_weight)))
_HUMMING_QUANT = quant(None, MXFP4_DYN, MXFP8_DYN, FP8_128_DYN)

_B12X_CLASSES = (
    ExpertClass("B12xExperts", (
        b12x_layer, device(_b12x_device),
        activations({"silu", "situ", "swigluoai_uninterleave", "relu2_no_mul"}),
        quant(None, MXFP8_DYN), b12x_parallel, standard_format)),
)


def _moe_ep_classes(kernel: str) -> tuple[ExpertClass, ...]:
    return (ExpertClass("FlashInferMoeEpExperts", (
        device(_moe_ep_device), activations({"silu"}), any_quant, moe_ep_parallel,
        moe_ep_layer(kernel))),)


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("B12X_MXFP4_MXFP8", MXFP8_DYN, _B12X_CLASSES),
    Backend("B12X_MXFP4_BF16", None, _B12X_CLASSES),
    Backend("DEEPGEMM_MXFP4", FP8_128_DYN, (
        ExpertClass("DeepGemmFP4Experts", (
            device(_deepgemm_device), activations({"silu", "swiglustep", "situ"}),
            quant(FP8_128_DYN))),)),
    Backend("FLASHINFER_TRTLLM_MXFP4_MXFP8", MXFP8_DYN, _TRTLLM_CLASSES),
    Backend("FLASHINFER_TRTLLM_MXFP4_BF16", None, _TRTLLM_CLASSES),
    Backend("FLASHINFER_CUTLASS_MXFP4_MXFP8", MXFP8_DYN, _CUTLASS_CLASSES),
    Backend("FLASHINFER_CUTLASS_MXFP4_BF16", None, _CUTLASS_CLASSES),
    Backend("BATCHED_MARLIN", None, (
        ExpertClass("BatchedMarlinExperts", (
            device(_marlin_device), activations(GENERIC_ACTIVATIONS), weight_only_quant,
            batched_format)),)),
    Backend("MARLIN", None, (
        ExpertClass("MarlinExperts", (
            device(_marlin_device), activations(GENERIC_ACTIVATIONS), weight_only_quant,
            standard_format)),)),
    Backend("AITER_MXFP4_BF16", None, (_AITER_EXPERTS,)),
    Backend("AITER_TRITON_MXFP4_BF16", None, (
        ExpertClass("AiterW4A16ExpertsMonolithic", (
            device(_aiter_on("gfx942", "gfx950", "gfx1250")), activations({"swigluoai", "silu"}),
            quant(None), monolithic_parallel,
            routing({"Renormalize", "RenormalizeNaive", "DeepseekV4", "DeepSeekV3"}))),)),
    Backend("AITER_MXFP4_FP8", FP8_STATIC, (
        ExpertClass("AiterW4A8ExpertsMonolithic", (
            device(_aiter_on("gfx950", "gfx1250")), activations({"swigluoai"}), quant(FP8_STATIC),
            no_ep, monolithic_parallel, routing({"Renormalize", "RenormalizeNaive"}))),)),
    Backend("AITER_MXFP4_MXFP4", MXFP4_DYN, (_AITER_EXPERTS,)),
    Backend("AITER_TRITON_MXFP4_MXFP4", MXFP4_DYN, (
        ExpertClass("AiterW4A4ExpertsMonolithic", (
            device(_aiter_on("gfx1250")),
            activations({"swigluoai", "swigluoai_uninterleave", "silu"}), quant(MXFP4_DYN),
            monolithic_parallel,
            routing({"Renormalize", "RenormalizeNaive", "DeepseekV4", "DeepSeekV3", "MiniMax2"}))),)),
    Backend("CUTLASS_MXFP4_MXFP4", MXFP4_DYN, (
        ExpertClass("CutlassExpertsMxfp4", (
            device(_cutlass_w4a4_device), quant(MXFP4_DYN), activations(GENERIC_ACTIVATIONS))),)),
    Backend("TRITON", None, _OAI_TRITON_CLASSES),
    Backend("TRITON_UNFUSED", None, (
        ExpertClass("UnfusedOAITritonExperts", (
            device(_oai_triton_device),
            activations({"silu", "gelu", "swigluoai", "swiglustep", "swigluoai_uninterleave"}),
            quant(None))),)),
    Backend("XPU", None, (
        ExpertClass("XPUExpertsMxFp4", (
            device(_xpu_device),
            activations({"silu", "gelu", "gelu_tanh", "swigluoai", "relu2_no_mul"}),
            quant(None, MXFP4_DYN))),)),
    Backend("CPU", None, (
        ExpertClass("CPUExpertsMxfp4", (
            device(_cpu_device), activations({"silu", "swigluoai", "gelu", "gelu_tanh"}),
            quant(None), routing({"Default", "Renormalize", "RenormalizeNaive", "DeepseekV4"}))),)),
    Backend("EMULATION", None, (
        ExpertClass("OCP_MXQuantizationEmulationTritonExperts", (
            device(_emulation_device), activations(GENERIC_ACTIVATIONS), any_quant,
            emulation_experts)),)),
    Backend("HUMMING", None, (
        ExpertClass("BatchedHummingGroupedExperts", (
            device(_humming_device), activations(GENERIC_ACTIVATIONS), _HUMMING_QUANT,
            batched_format, humming_gemm("grouped_masked"))),
        ExpertClass("HummingGroupedExperts", (
            device(_humming_device), activations(GENERIC_ACTIVATIONS), _HUMMING_QUANT,
            standard_format, humming_gemm("grouped_contiguous"))),
        ExpertClass("HummingIndexedExperts", (
            device(_humming_device), activations(GENERIC_ACTIVATIONS), _HUMMING_QUANT,
            standard_format, humming_gemm("indexed"))),
    )),
    Backend("FLASHINFER_MOE_EP_CUTEDSL", None, _moe_ep_classes("cutedsl")),
    Backend("FLASHINFER_MOE_EP_DEEP_GEMM", None, _moe_ep_classes("deep_gemm")),
)}



def backend_table(release: Release) -> dict[str, Backend]:
    """``BACKENDS`` as ``release`` builds them."""
    return _tables(release.key)


@lru_cache(maxsize=None)
def _tables(key: str) -> dict[str, Backend]:
    release = RELEASES[key]
    trtllm = _trtllm_classes(release)
    return {name: (Backend(b.name, b.default_key, trtllm) if name.startswith("FLASHINFER_TRTLLM_")
                   else b) for name, b in BACKENDS.items()}


# Legacy enum member: same value as AITER_MXFP4_BF16.
ENUM_ALIASES = {"AITER": "AITER_MXFP4_BF16"}

# map_mxfp4_backend: vLLM --moe-backend strings -> candidate members, in order.
MOE_BACKEND_STRINGS: dict[str, tuple[str, ...]] = {
    "b12x": ("B12X_MXFP4_MXFP8", "B12X_MXFP4_BF16"),
    "deep_gemm": ("DEEPGEMM_MXFP4",),
    "flashinfer_trtllm": ("FLASHINFER_TRTLLM_MXFP4_BF16", "FLASHINFER_TRTLLM_MXFP4_MXFP8"),
    "flashinfer_trtllm_afp8": ("FLASHINFER_TRTLLM_MXFP4_MXFP8",),
    "flashinfer_cutlass": ("FLASHINFER_CUTLASS_MXFP4_BF16", "FLASHINFER_CUTLASS_MXFP4_MXFP8"),
    "flashinfer_cutlass_afp8": ("FLASHINFER_CUTLASS_MXFP4_MXFP8",),
    "flashinfer_moe_ep_cutedsl": ("FLASHINFER_MOE_EP_CUTEDSL",),
    "flashinfer_moe_ep_mega_deep_gemm": ("FLASHINFER_MOE_EP_DEEP_GEMM",),
    "triton": ("TRITON",),
    "triton_unfused": ("TRITON_UNFUSED",),
    "humming": ("HUMMING",),
    "marlin": ("MARLIN",),
    "aiter": ("AITER_MXFP4_BF16", "AITER_TRITON_MXFP4_BF16", "AITER_MXFP4_FP8",
              "AITER_MXFP4_MXFP4", "AITER_TRITON_MXFP4_MXFP4"),
    "aiter_triton_mxfp4_bf16": ("AITER_TRITON_MXFP4_BF16",),
    "aiter_mxfp4_fp8": ("AITER_MXFP4_FP8",),
    "aiter_triton_mxfp4_mxfp4": ("AITER_TRITON_MXFP4_MXFP4",),
    "aiter_mxfp4_mxfp4": ("AITER_MXFP4_MXFP4",),
    "xpu": ("XPU",),
    "cpu": ("CPU",),
    "emulation": ("EMULATION",),
}

# B12X_* and FLASHINFER_MOE_EP_* are in no priority list: only --moe-backend reaches them.
B12X_FORCE_A16_ENV = "VLLM_B12X_MOE_FP4_FORCE_A16"  # with --moe-backend b12x: only B12X_MXFP4_BF16


def b12x_requested(names: tuple[str, ...], key: str | None, force_a16: bool):
    """_get_requested_backends for "b12x": (candidates, or None to filter by activation as
    usual). FORCE_A16 keeps the bf16 variant; with no requested key both variants are tried,
    W4A8 first."""
    if force_a16:
        return ("B12X_MXFP4_BF16",)
    return names if key is None else None


# _get_priority_backends_for_gpt_oss(); TRITON_UNFUSED deliberately absent upstream.
_GPT_OSS_PRIORITY = (
    "FLASHINFER_TRTLLM_MXFP4_BF16", "FLASHINFER_TRTLLM_MXFP4_MXFP8", "AITER_MXFP4_BF16",
    "AITER_TRITON_MXFP4_BF16", "AITER_MXFP4_FP8", "AITER_MXFP4_MXFP4", "TRITON",
    "FLASHINFER_CUTLASS_MXFP4_BF16", "FLASHINFER_CUTLASS_MXFP4_MXFP8", "CUTLASS_MXFP4_MXFP4",
    "MARLIN", "BATCHED_MARLIN", "HUMMING", "XPU", "CPU", "EMULATION",
)
HUMMING_PREFERRED_CAPABILITIES = {(9, 0)}  # humming/priority.py: Humming ahead of Marlin


def prioritize_humming(names: tuple[str, ...], arch: Arch) -> tuple[str, ...]:
    """Move HUMMING directly ahead of the first Marlin entry where Humming is preferred."""
    if not arch.is_cuda or arch.capability not in HUMMING_PREFERRED_CAPABILITIES:
        return names
    out = [n for n in names if n != "HUMMING"]
    at = next(i for i, n in enumerate(out) if "MARLIN" in n)
    return tuple(out[:at] + ["HUMMING"] + out[at:])


def gpt_oss_priority(arch: Arch, release: Release) -> tuple[str, ...]:
    names = list(_GPT_OSS_PRIORITY)
    if arch.is_cuda and arch.cuda_family in release.triton_behind_marlin:  # after the Marlin entries
        names.remove("TRITON")
        names.insert(names.index("BATCHED_MARLIN") + 1, "TRITON")
    return prioritize_humming(tuple(names), arch)


def priority_backends(arch: Arch) -> tuple[str, ...]:
    """_get_priority_backends(): the Mxfp4MoEMethod list by platform."""
    if arch.is_rocm:
        return ("AITER_MXFP4_BF16", "EMULATION")
    if arch.is_cpu:
        return ("CPU",)
    return prioritize_humming(("FLASHINFER_TRTLLM_MXFP4_MXFP8", "DEEPGEMM_MXFP4", "MARLIN",
                               "BATCHED_MARLIN", "HUMMING"), arch)


DSV4_ROCM_PRIORITY = ("AITER_MXFP4_BF16", "TRITON_UNFUSED")


def filter_by_activation(names: tuple[str, ...],
                         key: str | None) -> tuple[tuple[str, ...], dict[str, str]]:
    """_filter_by_activation: (kept, {dropped: why}). With a requested key: the matching
    backends and EMULATION, then the bf16 ones as a higher-precision fallback."""
    if key is not None:
        matching = tuple(n for n in names if BACKENDS[n].default_key == key or n == "EMULATION")
        kept = matching + tuple(n for n in names
                                if BACKENDS[n].default_key is None and n not in matching)
    else:
        bf16 = tuple(n for n in names if BACKENDS[n].default_key is None)
        kept = bf16 if bf16 else names
    dropped = {
        n: (f"not tried: its activation quant is {KEY_TEXT[BACKENDS[n].default_key]}, "
            f"the layer's is {KEY_TEXT[key]}")
        for n in names if n not in kept
    }
    return kept, dropped


def try_backend(name: str, ctx: Ctx) -> tuple[str | None, str]:
    """(accepting class or None, reason): the first class whose gates all pass."""
    reasons = []
    for cls in backend_table(ctx.release)[name].classes:
        r = cls.check(ctx)
        if r is None:
            return cls.name, f"{cls.name}: all gates pass"
        reasons.append(f"{cls.name}: {r}")
    return None, "; ".join(reasons)


def parse_backend(value: str) -> tuple[str, ...]:
    """--backend: vLLM --moe-backend string or Mxfp4MoeBackend member name -> candidates."""
    raw = value.strip()
    if raw in MOE_BACKEND_STRINGS:  # exact vLLM string first: "aiter" != the member AITER
        return MOE_BACKEND_STRINGS[raw]
    member = ENUM_ALIASES.get(raw.upper(), raw.upper())
    if raw == raw.upper() and member in BACKENDS:
        return (member,)
    if raw.lower() in MOE_BACKEND_STRINGS:
        return MOE_BACKEND_STRINGS[raw.lower()]
    if member in BACKENDS:
        return (member,)
    from mxfp4conv.errors import OracleError
    raise OracleError(
        f"Unknown backend {value!r}. Use a vLLM --moe-backend string "
        f"({', '.join(MOE_BACKEND_STRINGS)}) or an Mxfp4MoeBackend member name "
        f"({', '.join(BACKENDS)})."
    )
