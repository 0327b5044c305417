"""Which format mxfp4conv writes for an NVIDIA target, and which kernel then serves it.

On NVIDIA, vLLM's MXFP4 MoE backends (TRTLLM-Gen, FlashInfer CUTLASS, DeepGEMM, Marlin,
triton_kernels, HUMMING) convert the experts at load into layouts mxfp4conv mostly does not
write. mxfp4conv's own format (``EMULATION``: identity or ``hopper_mma`` bytes) is served by
mxfp4conv's Triton W4A16 kernel, which the vLLM plugin builds in place of vLLM's pick. That
kernel is tuned and measured on Hopper only, so:

- sm90 (Hopper): the default stays mxfp4conv's format; ``plan`` says that its kernel replaces
  vLLM's pick. ``--backend`` naming vLLM's pick keeps vLLM's kernel (canonical bytes below).
- every other NVIDIA target (sm100, sm120): the default keeps vLLM's own backend: its converted
  layout where mxfp4conv writes it (FlashInfer TRTLLM-Gen for Kimi-K3, DeepSeek-V4, gpt-oss on sm100,
  ``formats``), else the canonical bytes
  (identity layout, ``[gate; up]`` rows) per rank, padded as vLLM pads for its pick; the plugin
  puts them into vLLM's parameters and vLLM's own ``process_weights_after_loading`` converts
  them (``vllm_transforms``). mxfp4conv's format only on request (``--layout identity`` or
  ``hopper_mma``), and ``plan`` then says that its kernel replaces vLLM's, unmeasured there.

``serving_kernel`` (recorded in the manifest's options) names who runs the experts behind the
vLLM plugin: ``vllm`` or ``mxfp4conv``.
"""

from __future__ import annotations

from dataclasses import replace

from mxfp4conv.oracle.arch import Arch
from mxfp4conv.oracle.formats import IDENTITY, KernelFormat, NotProducible

MEASURED_ARCH = "sm90"  # where mxfp4conv's Triton MoE kernel is tuned and measured
VLLM, MXFP4CONV = "vllm", "mxfp4conv"  # serving_kernel values
# methods the vLLM plugin loads (integrations.vllm.facts.METHODS), by the oracle's moe_method
PLUGIN_METHODS = ("mxfp4", "gpt_oss_mxfp4", "quark")


def keeps_vllm_backend(arch: Arch, moe_method: str, own_format: bool, forced: bool) -> bool:
    """Whether an unwritable pick of vLLM's is kept (canonical bytes vLLM converts) rather than
    replaced by mxfp4conv's format: NVIDIA, a method the plugin loads, no ``--layout``; on sm90
    only when ``--backend`` names the pick."""
    if not arch.is_cuda or own_format or moe_method not in PLUGIN_METHODS:
        return False
    return arch.name != MEASURED_ARCH or forced


def vllm_converts(backend: str, why: NotProducible, canonical: KernelFormat, arch: Arch,
                  kernel_act: str) -> KernelFormat:
    """The canonical bytes (``canonical``: the identity format with its activation checks done)
    for ``backend``, which vLLM converts itself at load; ``kernel_act``: the activations vLLM's
    kernel runs (the bytes' ``act_quant`` stays what mxfp4conv's runtime computes from them)."""
    note = (f"vLLM's {backend} converts the experts at load into a layout mxfp4conv does not write "
            f"({why}). This plan keeps vLLM's backend: it writes the canonical bytes (identity "
            f"layout, [gate; up] rows) of each rank, padded as vLLM pads them for {backend}; the "
            f"vLLM plugin puts them into vLLM's parameters and vLLM converts them at start-up as "
            f"usual, so the server runs vLLM's own {backend} kernel (start-up saves the slicing and "
            f"padding, not the conversion).")
    if arch.name != MEASURED_ARCH:
        note += (" --layout identity (or hopper_mma) writes mxfp4conv's own format instead, whose "
                 f"Triton kernel would replace {backend}; that kernel is not measured on {arch.name}.")
    return replace(canonical, layout=IDENTITY, gate_mode="separated", kernel_act=kernel_act,
                   notes=(*canonical.notes, note))


def layout_replaces(arch: Arch, vllm_backend: str | None) -> bool:
    """Whether ``--layout`` replaces vLLM's pick with mxfp4conv's format even where mxfp4conv writes
    the pick's layout too (NVIDIA: ``--layout`` is the request for mxfp4conv's kernel; vLLM's own
    EMULATION keeps the bytes mxfp4conv's format holds, so it stays)."""
    return arch.is_cuda and vllm_backend not in (None, "EMULATION")


def serving_kernel(arch: Arch, backend: str, own_format: bool, kernel_act: str) -> str:
    """Who runs the experts behind the vLLM plugin: mxfp4conv's Triton kernel for its own format on
    NVIDIA (sm90's default, elsewhere only when ``--layout`` asks), else vLLM's pick. That kernel
    computes W4A16 only, so a checkpoint declaring fp8 / mxfp4 activations keeps vLLM's EMULATION,
    which quantises them as declared."""
    if (arch.is_cuda and backend == "EMULATION" and kernel_act == "bf16"
            and (own_format or arch.name == MEASURED_ARCH)):
        return MXFP4CONV
    return VLLM


def replacement_note(arch: Arch, vllm_backend: str | None, vllm_cls: str | None, kernel_layout: str,
                     own_format: bool) -> str:
    """What ``plan`` says when mxfp4conv's kernel serves an NVIDIA target in place of vLLM's pick."""
    if vllm_backend is None:
        pick = "vLLM has no backend for this deployment"
    else:
        pick = f"vLLM would run {vllm_backend}" + (f" ({vllm_cls})" if vllm_cls else "")
    head = (f"Served through the vLLM plugin, this checkpoint runs mxfp4conv's Triton MoE kernel "
            f"(W4A16, {kernel_layout} layout), which replaces vLLM's pick: {pick}.")
    if arch.name != MEASURED_ARCH:
        return (f"{head} That kernel is tuned on Hopper and not measured on {arch.name}: it may be "
                f"much slower than vLLM's own kernel there. --layout {kernel_layout} asked for it; "
                "drop --layout to keep vLLM's backend.")
    if vllm_backend == "TRITON":
        measured = ("docs/performance.md times it against triton_kernels (vLLM's TRITON) on an H200 "
                    "and an H100")
    elif vllm_backend == "HUMMING":
        measured = ("on one H100 (docs/performance.md, 2026-12-07) Humming took 1.06-1.67x its time on "
                    "Kimi-K3-like layers and 0.98-1.32x on DeepSeek-V3-like ones: within 2-13% of it at 2-64 "
                    "tokens on DeepSeek-V3-like layers, where both run near the copy bandwidth, and 2.4% "
                    "faster at one point there (skewed routing, 8 tokens; in a second run it took 1.10x ours)")
    else:
        measured = f"it has not been measured against {vllm_backend or 'vLLM'} here"
    keep = (f" Pass --backend {vllm_backend} to keep vLLM's kernel (canonical bytes that vLLM converts "
            "at start-up)." if vllm_backend and vllm_backend != "EMULATION" and not own_format else "")
    return f"{head} On {arch.name} this is the default; {measured}.{keep}"
