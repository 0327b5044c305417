"""What each backend does to the expert bytes after loading (vLLM's two converters), as
layout recipes mxfp4conv can write, or the reason it cannot.

Converter S (``convert_weight_to_mxfp4_moe_kernel_format``) serves ``Mxfp4MoEMethod``
(Kimi-K3, DeepSeek-V4) and starts from ``[gate; up]`` rows. Converter G
(``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format``) serves gpt-oss and assumes gpt-oss's
row-interleaved w13 on its AITER_MXFP4_BF16 branch. ``QuarkOCP_MX_MoEMethod`` calls G for
every model on vLLM 0.33, and from 0.34 on only for gpt-oss models, S for the others
(``Release.quark_converter_s``; ``kernel_format_quark_s``).

mxfp4conv always starts from canonical ``[gate; up]`` rows (gpt-oss is de-interleaved on
read), so a recipe here is expressed on those rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mxfp4conv.oracle.arch import Arch
from mxfp4conv.oracle.decision import LayoutRecipe

GATE_UP = "[gate; up]"
# vLLM converter G read literally on a [gate; up] checkpoint: rows 0::2 then 1::2 go to GU16.
LITERAL_G_ROWS = "[gate; up] read as interleaved: rows 0::2 then 1::2 (vLLM converter G, literal)"

IDENTITY = LayoutRecipe(w13="identity", w13_scale="identity", w2="identity", w2_scale="identity")
# mxfp4conv's Triton kernel on Hopper: weights and scales in the wgmma register-operand order (the
# weights' bits in the xor order, an 8-instruction decode; the kernel also reads hopper_mma_w_rot and
# hopper_mma_w, which earlier releases wrote)
HOPPER_MMA = LayoutRecipe(w13="hopper_mma_w_xor", w13_scale="hopper_mma_s", w2="hopper_mma_w_xor",
                          w2_scale="hopper_mma_s")
KERNEL_LAYOUTS = {"identity": IDENTITY, "hopper_mma": HOPPER_MMA}
# FlashInfer TRTLLM-Gen as converter S leaves it (mxfp4conv.shuffle.trtllm)
TRTLLM_LAYOUT = LayoutRecipe(w13="trtllm_w13", w13_scale="trtllm_w13_scale", w2="trtllm_w2", w2_scale="trtllm_w2_scale")
HOPPER_MMA_ALIGN = 64  # rows in 16-row slabs, K in 64-code blocks
# Layout names mxfp4conv.shuffle.layouts provides (the manifest vocabulary).
PRODUCIBLE_LAYOUTS = frozenset({
    "identity", "aiter_p16", "aiter_p16_gu16", "aiter_e8m0_shuffle", "aiter_scale_a16w4",
    "aiter_scale_a16w4_gu16", "hopper_mma_w", "hopper_mma_w_rot", "hopper_mma_w_xor", "hopper_mma_s", "triton_gu1",
    "triton_cdna4_scale", "triton_cdna4_scale_gu1", "triton_gfx1250_scale", "triton_gfx1250_scale_gu1",
    "trtllm_w13", "trtllm_w13_scale", "trtllm_w2", "trtllm_w2_scale",
})

AITER_ENV = {"VLLM_ROCM_USE_AITER": "1"}
BOUND_ENV = {"AITER_BF16_FP8_MOE_BOUND": "0"}  # set by converter S's gfx950 AITER branch
SITUV2_ENV = "VLLM_ROCM_USE_AITER_MOE_SITUV2"  # vLLM 0.33.0: auto (= a4w4) | a4w4 | a8w4 | a16w4
# --act-quant -> (SiTUv2 mode written, kernel activations): auto keeps vLLM's default
SITUV2_MODES = {"auto": ("auto", "mxfp4"), "mxfp4": ("a4w4", "mxfp4"), "fp8": ("a8w4", "fp8"),
                "bf16": ("a16w4", "bf16")}


@dataclass(frozen=True)
class KernelFormat:
    layout: LayoutRecipe
    act_quant: str  # resolved activation quantisation of this path
    gate_mode: str = "separated"
    runtime_env: dict[str, str] = field(default_factory=dict)
    kernel_act: str = "bf16"  # what the kernel actually feeds its first GEMM
    notes: tuple[str, ...] = ()

    @property
    def is_shuffled(self) -> bool:
        return any(n.startswith("aiter_") for n in (
            self.layout.w13, self.layout.w13_scale, self.layout.w2, self.layout.w2_scale))


class NotProducible(str):
    """Why mxfp4conv cannot write the bytes this backend holds."""


class ActQuantRefused(NotProducible):
    """The backend serves the layer, but not with the requested activation quantisation."""


class ConverterRaises(NotProducible):
    """vLLM picks the backend, then its weight converter raises: the server cannot load."""


def _act_error(backend: str, requested: str, allowed: tuple[str, ...], why: str) -> ActQuantRefused:
    return ActQuantRefused(
        f"act-quant {requested} is not available on {backend} ({why}); it runs "
        f"{' or '.join(allowed)} activations")


def _triton_scale(arch: Arch, tp: int, gu1: bool) -> str:
    """The scale bytes ``_swizzle_mxfp4`` leaves on ROCm: gfx1250's shuffle_scale_moe, gfx950's
    CDNA4MXScaleLayout at tp <= 2 (should_use_cdna4_mx_scale_swizzle), else Strided."""
    if arch.on_gfx1250:
        base = "triton_gfx1250_scale"
    elif arch.on_gfx950 and tp <= 2:
        base = "triton_cdna4_scale"
    else:
        return "triton_gu1" if gu1 else "identity"
    return base + ("_gu1" if gu1 else "")


def triton_recipe(arch: Arch, tp: int, w13_gu1: bool) -> LayoutRecipe:
    """triton_kernels tensors on ROCm: Strided weights (``w13_gu1``: rows g0, u0, g1, u1, ...)."""
    return LayoutRecipe(w13="triton_gu1" if w13_gu1 else "identity",
                        w13_scale=_triton_scale(arch, tp, w13_gu1), w2="identity",
                        w2_scale=_triton_scale(arch, tp, False))


def _triton_identity(backend: str, arch: Arch, tp: int) -> NotProducible | None:
    """None where mxfp4conv writes triton_kernels' ROCm layouts; the reason elsewhere."""
    if arch.is_cuda:
        return NotProducible(
            f"{backend} on CUDA stores triton_kernels' swizzled matmul layouts "
            "(make_default_matmul_mxfp4_w_layout), which mxfp4conv does not write")
    if not arch.is_rocm:
        return NotProducible(f"{backend} has no kernel on {arch.name}")
    return None


NOT_PRODUCIBLE = {
    "MARLIN": "MARLIN repacks weights with gptq_marlin_repack and permutes scales (Marlin tiles)",
    "BATCHED_MARLIN": "BATCHED_MARLIN repacks weights with gptq_marlin_repack (Marlin tiles)",
    "FLASHINFER_TRTLLM_MXFP4_BF16": "TRTLLM permutes rows with FlashInfer's epilogue-tile "
                                    "shuffle and interleaves scales (FlashInfer functions)",
    "FLASHINFER_TRTLLM_MXFP4_MXFP8": "TRTLLM permutes rows with FlashInfer's epilogue-tile "
                                     "shuffle and interleaves scales (FlashInfer functions)",
    "FLASHINFER_CUTLASS_MXFP4_BF16": "FlashInfer CUTLASS swaps to [up; gate] and interleaves "
                                     "weights/scales with FlashInfer's sm90 mixed-GEMM layout",
    "FLASHINFER_CUTLASS_MXFP4_MXFP8": "FlashInfer CUTLASS swaps to [up; gate] and interleaves "
                                      "scales with FlashInfer's block_scale_interleave",
    "DEEPGEMM_MXFP4": "DEEPGEMM_MXFP4 transforms the scales with DeepGEMM's "
                      "transform_sf_into_required_layout",
    "CPU": "CPU prepacks weights and scales with vLLM's C++ VNNI ops",
    "XPU": "XPU is not an mxfp4conv target",
    "HUMMING": "HUMMING repacks weights and scales with the humming library's own kernel layout",
    "CUTLASS_MXFP4_MXFP4": "CUTLASS_MXFP4_MXFP4 swizzles the scales into CUTLASS 128x4 tiles",
    "B12X_MXFP4_MXFP8": "B12X keeps the checkpoint bytes in the converter, then the b12x "
                        "library prepares its own weight layout (fused_moe.prepare_weights)",
    "B12X_MXFP4_BF16": "B12X keeps the checkpoint bytes in the converter, then the b12x "
                       "library prepares its own weight layout (fused_moe.prepare_weights)",
    "FLASHINFER_MOE_EP_CUTEDSL": "FLASHINFER_MOE_EP_CUTEDSL hands the weights to FlashInfer's "
                                 "MoE-EP adapter, which dequantises and requantises them itself",
    "FLASHINFER_MOE_EP_DEEP_GEMM": "FLASHINFER_MOE_EP_DEEP_GEMM hands the weights to FlashInfer's "
                                   "MoE-EP adapter (mxfp4_moe_ep_weights), which builds its own layout",
}
# Converter G (gpt-oss, Quark) has no branch for these: its final else raises.
G_NO_BRANCH = ("B12X_MXFP4_MXFP8", "B12X_MXFP4_BF16", "FLASHINFER_MOE_EP_CUTEDSL",
               "FLASHINFER_MOE_EP_DEEP_GEMM")


def kernel_format_s(backend: str, arch: Arch, tp: int, activation: str, act_quant: str,
                    has_static_input_scales: bool) -> KernelFormat | NotProducible:
    """Converter S; ``act_quant`` is the requested one (auto | bf16 | fp8 | mxfp4)."""
    want = "bf16" if act_quant == "auto" else act_quant
    if backend == "AITER_MXFP4_BF16" and arch.is_rocm and not arch.on_gfx1250:
        env = {**AITER_ENV, **BOUND_ENV}
        if activation == "situ":
            # vLLM 0.33.0's SiTUv2 switch (envs.py, _aiter_ops._resolve_situv2_activation);
            # Mxfp4MoEMethod sets AITER_BF16_FP8_MOE_BOUND=0 only when SiTUv2 is a4w4 or a8w4.
            mode, kernel_act = SITUV2_MODES[act_quant]
            env = {**AITER_ENV, SITUV2_ENV: mode, **({} if mode == "a16w4" else BOUND_ENV)}
            if mode == "a8w4":
                return KernelFormat(
                    LayoutRecipe(w13="aiter_p16_gu16", w13_scale="aiter_scale_a16w4_gu16",
                                 w2="aiter_p16", w2_scale="aiter_e8m0_shuffle"),
                    act_quant="fp8", gate_mode="interleave", runtime_env=env, kernel_act="fp8",
                    notes=("SiTUv2 a8w4 (VLLM_ROCM_USE_AITER_MOE_SITUV2=a8w4): w13 and its "
                           "scales use the 16-row gate/up interleave (FlyDSL a8w4 kernels).",))
            what = {"auto": "vLLM's default SiTUv2 mode auto, which is a4w4 (MXFP4 activations)",
                    "a4w4": "SiTUv2 a4w4 (MXFP4 activations)",
                    "a16w4": "SiTUv2 a16w4 (bf16 activations)"}[mode]
            return KernelFormat(
                LayoutRecipe(w13="aiter_p16", w13_scale="aiter_scale_a16w4",
                             w2="aiter_p16", w2_scale="aiter_e8m0_shuffle"),
                act_quant=kernel_act, gate_mode="separated", runtime_env=env, kernel_act=kernel_act,
                notes=(f"{what}: gate and up stay separated ([gate; up]), P16-tiled; a4w4 and "
                       f"a16w4 read the same weight bytes. The server must keep {SITUV2_ENV}={mode}.",))
        if want not in ("bf16", "fp8"):
            return _act_error(backend, want, ("bf16", "fp8"),
                              "Mxfp4MoEMethod ignores quantization_config.moe.activation")
        return KernelFormat(
            LayoutRecipe(w13="aiter_p16_gu16", w13_scale="aiter_scale_a16w4_gu16",
                         w2="aiter_p16", w2_scale="aiter_scale_a16w4"),
            act_quant=want, gate_mode="interleave", runtime_env=env, kernel_act="fp8",
            notes=("AITER feeds fp8 activations on this interleaved layout: vLLM sets "
                   "AITER_BF16_FP8_MOE_BOUND=0, so aiter's bf16 window is empty on gfx950.",))
    if backend in ("TRITON_UNFUSED", "AITER_TRITON_MXFP4_BF16") or (
            backend == "AITER_MXFP4_BF16" and arch.on_gfx1250):
        why = _triton_identity(backend, arch, tp)
        if why:
            return why
        if want != "bf16":
            return _act_error(backend, want, ("bf16",), "W4A16")
        gu1 = backend == "AITER_TRITON_MXFP4_BF16"  # aiter's moe_gemm_a16w4 reads g/u pairs
        env = dict(AITER_ENV) if backend.startswith("AITER") else {}
        return KernelFormat(triton_recipe(arch, tp, gu1), act_quant="bf16", runtime_env=env,
                            notes=(f"{backend} on ROCm reads triton_kernels tensors "
                                   "(_swizzle_mxfp4): Strided weights, scales as recorded.",))
    if backend == "FLASHINFER_TRTLLM_MXFP4_MXFP8":
        if want != "bf16":
            return _act_error(backend, want, ("bf16",), "Mxfp4MoEMethod ignores quantization_config.moe."
                              "activation; TRTLLM quantises the bf16 input to MXFP8 itself")
        return KernelFormat(
            TRTLLM_LAYOUT, act_quant="bf16", kernel_act="mxfp8",
            notes=("FlashInfer TRTLLM-Gen (TrtLlmMxfp4Experts, MXFP8 activations): w13 rows up first "
                   "([u0, g0, u1, g1, ...]), every tensor's rows in FlashInfer's 32-row epilogue-tile "
                   "order, scales in the 128 x 4 block-scale interleave (stored as vLLM keeps them: "
                   "uint8 weights, the e8m0 scale bytes viewed as float8_e4m3fn); proven byte for byte "
                   "against vLLM's converter running FlashInfer's own functions on CPU.",))
    if backend == "TRITON":
        return NotProducible(
            "converter S's TRITON branch interleaves the halves of w13's last (K) dimension "
            "before the triton_kernels layout (a suspected vLLM bug); mxfp4conv does not copy it")
    if backend == "EMULATION":
        if want != "bf16":
            return _act_error(backend, want, ("bf16",),
                              "Mxfp4MoEMethod special-cases EMULATION to W4A16")
        return KernelFormat(IDENTITY, act_quant="bf16")
    if backend in ("AITER_MXFP4_MXFP4", "AITER_MXFP4_FP8", "AITER_TRITON_MXFP4_MXFP4"):
        natural = "fp8" if backend == "AITER_MXFP4_FP8" else "mxfp4"  # S delegates to G
        if act_quant not in ("auto", natural):
            return _act_error(backend, act_quant, (natural,), "its kernel's fixed activation quant")
        return kernel_format_g(backend, arch, tp, natural, interleaved_source=False,
                               quark=False, has_static_input_scales=has_static_input_scales,
                               activation=activation)
    return NotProducible(NOT_PRODUCIBLE.get(backend, f"{backend} is not modelled"))


TRTLLM = ("FLASHINFER_TRTLLM_MXFP4_BF16", "FLASHINFER_TRTLLM_MXFP4_MXFP8")
FI_CUTLASS = ("FLASHINFER_CUTLASS_MXFP4_BF16", "FLASHINFER_CUTLASS_MXFP4_MXFP8")
QUARK_NO_PERMUTE_CACHE = (
    "AssertionError: the TRTLLM branch of vLLM's weight converter asserts its "
    "_cache_permute_indices argument, which QuarkOCP_MX_MoEMethod's set-up does not pass")


def kernel_format_quark_s(backend: str, arch: Arch, tp: int, resolved: str, *, activation: str,
                          has_static_input_scales: bool) -> KernelFormat | NotProducible:
    """Converter S as QuarkOCP_MX_MoEMethod calls it (a non-gpt-oss Quark model, vLLM 0.34):
    the rows as loaded ([gate; up]); ``resolved`` is the act quant of the selector's key."""
    if backend in TRTLLM:
        return ConverterRaises(QUARK_NO_PERMUTE_CACHE)
    if backend == "EMULATION":
        return emulation_format(resolved, gpt_oss=False)
    if backend in ("AITER_MXFP4_MXFP4", "AITER_MXFP4_FP8", "AITER_TRITON_MXFP4_MXFP4"):
        # S hands these to G with the rows as loaded
        return kernel_format_g(backend, arch, tp, resolved, interleaved_source=False, quark=True,
                               has_static_input_scales=has_static_input_scales,
                               activation=activation)
    # the rest run bf16 activations (a requested key falls back to them in the selector)
    return kernel_format_s(backend, arch, tp, activation, "auto", has_static_input_scales)


def kernel_format_g(backend: str, arch: Arch, tp: int, resolved: str, *,
                    interleaved_source: bool, quark: bool,
                    has_static_input_scales: bool,
                    literal_deinterleave: bool = False,
                    activation: str = "swigluoai",
                    has_bias: bool = True) -> KernelFormat | NotProducible:
    """Converter G. ``resolved`` is the act quant the selector's key gives. Its triton_kernels
    branches keep the w13 rows as loaded: gpt-oss's interleaved rows are ``triton_gu1`` of
    mxfp4conv's canonical [gate; up]."""
    if quark and backend in TRTLLM:  # GptOssMxfp4MoEMethod passes the cache, Quark never
        return ConverterRaises(QUARK_NO_PERMUTE_CACHE)
    if backend in FI_CUTLASS and not has_bias:
        return ConverterRaises(
            "AssertionError: the FlashInfer CUTLASS branch of convert_gpt_oss_weight_to_mxfp4_"
            "moe_kernel_format asserts w13_bias and w2_bias, which this checkpoint's experts lack")
    if backend == "AITER_MXFP4_BF16" and arch.is_rocm and not arch.on_gfx1250:
        gate_up, notes = GATE_UP, []
        if quark and not interleaved_source:
            if literal_deinterleave:
                gate_up = LITERAL_G_ROWS
                notes.append(
                    "Modelling vLLM literally: converter G de-interleaves w13 rows as if they "
                    "were gpt-oss [g0, u0, g1, u1, ...], but a Quark checkpoint loads as "
                    "[gate; up], so gate and up rows get mixed (suspected vLLM bug).")
            else:
                notes.append(
                    "Suspected vLLM bug: converter G de-interleaves w13 rows as if they were "
                    "gpt-oss [g0, u0, g1, u1, ...], but Quark w_mxfp4 checkpoints load as "
                    "[gate; up]. mxfp4conv writes what the AITER kernel needs (GU16 of the "
                    "real [gate; up] rows), not vLLM's scrambled rows.")
        layout = LayoutRecipe(w13="aiter_p16_gu16", w13_scale="aiter_scale_a16w4_gu16",
                              w2="aiter_p16", w2_scale="aiter_scale_a16w4", gate_up=gate_up)
        notes.append("AITER W4A16 with the gate/up interleave (gate_mode INTERLEAVE): aiter "
                     "feeds bf16 below AITER_BF16_FP8_MOE_BOUND tokens (default 256), fp8 above.")
        return KernelFormat(layout, act_quant=resolved, gate_mode="interleave",
                            runtime_env=dict(AITER_ENV), kernel_act="bf16 (fp8 for M >= 256)",
                            notes=tuple(notes))
    if backend == "AITER_MXFP4_BF16":
        return NotProducible("AiterMxfp4Experts takes mxfp4 weights only on gfx950")
    if backend in TRTLLM:
        if not interleaved_source or not has_bias:
            return NotProducible(
                f"converter G's {backend} branch swaps every two w13 rows, which are a gpt-oss "
                "checkpoint's g/u pairs, and permutes its biases; mxfp4conv writes that layout for "
                "gpt-oss only")
        mxfp8 = backend.endswith("MXFP8")
        return KernelFormat(
            TRTLLM_LAYOUT, act_quant=resolved, kernel_act="mxfp8" if mxfp8 else "bf16",
            notes=("FlashInfer TRTLLM-Gen for gpt-oss (converter G): the checkpoint's g/u row pairs "
                   "swapped to [u0, g0, u1, g1, ...], every tensor's rows in FlashInfer's 32-row "
                   "epilogue-tile order, scales in the 128 x 4 block-scale interleave: the bytes "
                   "converter S leaves for Kimi-K3 / DeepSeek-V4. The biases are stored as loaded; the "
                   "vLLM plugin puts them in the same row order (float32) when it loads the layer.",))
    if backend in G_NO_BRANCH:
        return ConverterRaises(
            f"ValueError: convert_gpt_oss_weight_to_mxfp4_moe_kernel_format has no {backend} "
            "branch (Unsupported mxfp4_backend)")
    if backend == "CUTLASS_MXFP4_MXFP4":
        return ConverterRaises(
            "ValueError: convert_gpt_oss_weight_to_mxfp4_moe_kernel_format has no "
            "CUTLASS_MXFP4_MXFP4 branch")
    if backend == "AITER_TRITON_MXFP4_MXFP4":
        swiglu = activation in ("swigluoai", "swigluoai_uninterleave")
        if swiglu and interleaved_source:
            return NotProducible(
                "converter G interleaves gpt-oss's already interleaved w13 rows again for "
                "AITER_TRITON_MXFP4_MXFP4 (rows g/u-paired twice); mxfp4conv has no layout for that")
        return KernelFormat(
            LayoutRecipe(w13="triton_gu1" if swiglu else "identity",
                         w13_scale="triton_gfx1250_scale_gu1" if swiglu else "triton_gfx1250_scale",
                         w2="identity", w2_scale="triton_gfx1250_scale"),
            act_quant="mxfp4", runtime_env=dict(AITER_ENV), kernel_act="mxfp4",
            notes=("AITER_TRITON_MXFP4_MXFP4 (gfx1250 moe_gemm_a4w4): column-major views of the "
                   "weights, scales through shuffle_scale_moe"
                   + (", w13 rows g/u-paired for the SwiGLU epilogue." if swiglu else "."),))
    if backend == "AITER_MXFP4_MXFP4":
        if interleaved_source:
            return NotProducible(
                "converter G's AITER_MXFP4_MXFP4 branch keeps gpt-oss's interleaved w13 rows; "
                "mxfp4conv's kernel-ready format stores w13 as [gate; up]")
        return KernelFormat(
            LayoutRecipe(w13="aiter_p16", w13_scale="aiter_e8m0_shuffle",
                         w2="aiter_p16", w2_scale="aiter_e8m0_shuffle"),
            act_quant="mxfp4", gate_mode="separated", runtime_env=dict(AITER_ENV),
            kernel_act="mxfp4",
            notes=("AITER CK W4A4: plain 16x16 tile shuffle of the weights and e8m0_shuffle of "
                   "the scales, no gate/up interleave.",))
    if backend == "AITER_MXFP4_FP8":
        if not has_static_input_scales and not quark:
            return ConverterRaises(
                "AttributeError: AITER_MXFP4_FP8's converter reads layer.w13_input_scale, "
                "which GptOssMxfp4MoEMethod never creates (no static fp8 input scales)")
        if not has_static_input_scales:
            return ConverterRaises(
                "ValueError: AITER_MXFP4_FP8 needs static per-tensor fp8 input scales "
                "(w13_input_scale / w2_input_scale), which this checkpoint does not have")
        why = _triton_identity(backend, arch, tp)
        if why:
            return why
        return KernelFormat(
            triton_recipe(arch, tp, interleaved_source), act_quant="fp8",
            runtime_env=dict(AITER_ENV), kernel_act="fp8",
            notes=("AITER_MXFP4_FP8 (Triton moe_gemm_a8w4) reads triton_kernels tensors with "
                   "the w13 rows as loaded; the input scales are reduced to one scalar max per "
                   "tensor.",))
    if backend in ("TRITON", "AITER_TRITON_MXFP4_BF16"):
        why = _triton_identity(backend, arch, tp)
        if why:
            return why
        notes = [f"{backend} on ROCm reads triton_kernels tensors (_swizzle_mxfp4) with the w13 "
                 "rows as loaded" + (" (gpt-oss's g/u pairs)." if interleaved_source else ".")]
        if quark and backend == "AITER_TRITON_MXFP4_BF16":
            notes.append("vLLM keeps a Quark checkpoint's [gate; up] rows here although aiter's "
                         "moe_gemm_a16w4 reads g/u pairs; mxfp4conv writes vLLM's bytes.")
        env = dict(AITER_ENV) if backend.startswith("AITER") else {}
        return KernelFormat(triton_recipe(arch, tp, interleaved_source), act_quant="bf16",
                            runtime_env=env, notes=tuple(notes))
    if backend == "EMULATION":  # vLLM keeps the rows as loaded; mxfp4conv stores [gate; up]
        return emulation_format(resolved, gpt_oss=interleaved_source)
    return NotProducible(NOT_PRODUCIBLE.get(backend, f"{backend} is not modelled"))


def emulation_format(act_quant: str, gpt_oss: bool) -> KernelFormat:
    """mxfp4conv's own identity layout, labelled EMULATION (see ``select``)."""
    notes = ()
    if gpt_oss:
        notes = ("gpt-oss: vLLM's identity-layout backends keep the checkpoint's interleaved "
                 "w13 rows; the mxfp4conv format stores them de-interleaved as [gate; up] and "
                 "applies SwiGLU-OAI to the two halves (vLLM's swigluoai_uninterleave math).",)
    return KernelFormat(IDENTITY, act_quant=act_quant, kernel_act=act_quant, notes=notes)


# Mxfp4MoEMethod._setup_kernel_k3_situ_gfx942 (vLLM 0.33.0): what gfx942's opt-in int4 path
# does to each of w13 and w2 at load, in place of converter S, eight experts at a time.
K3_INT4_CONVERSION = (
    "for w13 and w2, eight experts at a time: dequantise MXFP4 to float32 with AITER "
    "(fp4_utils.mxfp4_to_f32 x e8m0_to_f32 per block of 32) and round to bf16; requantise with "
    "aiter.ops.quant.per_1x32_i4_quant (symmetric int4 in [-7, 7] per group of 32 along K, "
    "scale = max|w| / 7 (at least 1e-6 / 7) in bf16, stored [E, K/32, N]); tile the int8 values "
    "with shuffle_weight(layout=(16, 16)) ([gate; up] rows kept, no gate/up interleave), pack "
    "eight values into four bytes (pack_int8_to_packed_int4: byte j = v[j] | v[j+4] << 4) as "
    "[E, N, K/2] i4x2; scales through shuffle_scale_for_int4(group_size=32), flattened to one "
    "dimension; the MXFP4 tensors are freed and both weights are tagged is_shuffled")
K3_INT4_PYTHON = (
    "Every step is a torch function of the checkpoint bytes (no compiled kernel), so the result is "
    "deterministic and could run on CPU, but vLLM runs it on the GPU holding the weights and "
    "AITER's bytes differ between AITER releases (shuffle_scale_for_int4 and the bf16 scale "
    "packing have changed); the rounding makes it lossy: int4 values are not the MXFP4 values")


def k3_int4_not_producible() -> NotProducible:
    return NotProducible(
        "vLLM requantises the MXFP4 experts to groupwise int4 at load (lossy), and its MXFP4 "
        "parameters only accept the checkpoint's MXFP4 bytes: it re-runs that requantisation on "
        "whatever is loaded, so no pre-converted int4 layout exists to write")


def k3_int4_env(act_quant: str) -> dict[str, str]:
    """The server environment of the gfx942 int4 path: AITER on, the SiTUv2 switch (vLLM's
    default auto = a4w4 unless --act-quant bf16 asks for a16w4) and, unless a16w4,
    AITER_BF16_FP8_MOE_BOUND=0, which Mxfp4MoEMethod.__init__ writes on both Kimi-K3 paths."""
    mode, _ = SITUV2_MODES[act_quant]
    return {**AITER_ENV, SITUV2_ENV: mode, **({} if mode == "a16w4" else BOUND_ENV)}
