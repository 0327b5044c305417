"""vLLM 0.33.0's MoE methods for compressed-tensors MXFP4 experts.

``CompressedTensorsW4A4Mxfp4MoEMethod`` is the MoE method of compressed-tensors
MXFP4 checkpoints of every architecture except Kimi-K3 (whose config vLLM rewrites to
``mxfp4``) and except fp8-dynamic W4A8 ones (``CompressedTensorsW4A8Mxfp4MoEMethod``).

It does not go through the MXFP4 oracle. Its constructor picks the experts class itself:

- ``CutlassExpertsMxfp4`` when ``_supports_current_device()``: CUDA and
  ``ops.mxfp4_experts_quant_supported(capability)``, which the CUDA kernel answers with
  ``100 <= capability < 120`` (sm100 / sm103 / sm110 families). W4A4: the activations are
  quantised to MXFP4 dynamically, whatever the checkpoint's ``input_activations`` say.
- ``XPUExpertsMxFp4`` on Intel XPU.
- otherwise ``MarlinExperts`` (W4A16: bf16 activations; the weights are repacked by
  ``prepare_moe_fp4_layer_for_marlin``). Marlin is a CUDA kernel: on ROCm this path has no
  kernel to run.

The declared ``input_activations`` are not read by the method (only ``_is_mxfp4`` of the
weights decides it), so a W4A4 checkpoint runs W4A16 on Hopper, and a W4A16 one runs W4A4 on
Blackwell. ``--moe-backend b12x`` and the FlashInfer MoE-EP backends (which route through
``select_mxfp4_moe_backend``) are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mxfp4conv.checkpoint.canonical import MoEModel
from mxfp4conv.errors import OracleError
from mxfp4conv.oracle.arch import Arch

METHOD = "CompressedTensorsW4A4Mxfp4MoEMethod"
SELECTOR = f"{METHOD}.__init__"


@dataclass
class Choice:
    """The method's own pick, shaped like the oracle's walk over candidates."""

    selector: str = SELECTOR
    tried: list[tuple[str, bool, str]] = field(default_factory=list)
    pick: str | None = None
    cls: str | None = None
    error: str | None = None
    key: str | None = None
    act_quant: str = "bf16"
    int4: bool = False  # this method never reads quantization_config.moe.weight (gfx942's int4 path)


def cutlass_supported(arch: Arch) -> bool:
    """``mxfp4_experts_quant_supported(capability)``: CUDA with 100 <= capability < 120."""
    if not arch.is_cuda or arch.capability is None:
        return False
    cap = arch.capability[0] * 10 + arch.capability[1]
    return 100 <= cap < 120


def choose(model: MoEModel, arch: Arch, backend: str | None, act_quant: str) -> Choice:
    if backend is not None:
        raise OracleError(
            f"--backend {backend}: {METHOD} (compressed-tensors MXFP4 experts of "
            f"{model.extra.get('base_model_type') or model.family}) picks its kernel itself "
            "(CUTLASS W4A4 on sm100-family GPUs, XPU, otherwise Marlin W4A16); only its b12x and "
            "FlashInfer MoE-EP overrides, which mxfp4conv does not model, take a backend.")
    declared = model.declared_act or "none (weight-only)"
    c = Choice()
    cutlass = cutlass_supported(arch)
    c.tried.append(("CUTLASS_MXFP4_MXFP4", cutlass,
                    "CutlassExpertsMxfp4._supports_current_device(): "
                    + (f"{arch.describe()} passes mxfp4_experts_quant_supported (W4A4: activations "
                       f"quantised to MXFP4 dynamically; the checkpoint declares {declared})"
                       if cutlass else
                       f"needs CUDA capability 100-119 (mxfp4_experts_quant_supported); "
                       f"{arch.describe()}")))
    if cutlass:
        c.pick, c.cls, c.act_quant = "CUTLASS_MXFP4_MXFP4", "CutlassExpertsMxfp4", "mxfp4"
    else:
        why = ("MarlinExperts (W4A16: bf16 activations, the declared input_activations "
               f"{declared} are not read by {METHOD})")
        if not arch.is_cuda:
            why += f"; Marlin is a CUDA kernel, so vLLM 0.33.0 cannot serve it on {arch.describe()}"
        c.tried.append(("MARLIN", True, why))
        c.pick, c.cls, c.act_quant = "MARLIN", "MarlinExperts", "bf16"
    if act_quant not in ("auto", c.act_quant):
        raise OracleError(
            f"--act-quant {act_quant}: {METHOD} runs {c.act_quant} activations on "
            f"{arch.describe()} ({c.cls}) and takes no activation override; use --act-quant auto.")
    return c


def declared_act_note(model: MoEModel, vllm_pick: str | None = None) -> str | None:
    """Why an ``Mxfp4MoEMethod`` does (not) run the activations a checkpoint declares."""
    if model.moe_method != "mxfp4" or not model.declared_act:
        return None
    if model.moe_class == "CompressedTensorsW4A8Mxfp4MoEMethod":
        note = (f"The checkpoint declares {model.declared_act} input activations: vLLM 0.33.0 "
                "serves it with CompressedTensorsW4A8Mxfp4MoEMethod, an Mxfp4MoEMethod whose "
                "backend selection does not read them; only the Humming backend consumes the "
                "declared activation key")
        if vllm_pick == "HUMMING":
            return note + (", and Humming is vLLM's pick here, so vLLM runs the declared "
                           "activations.")
        return note + ", so the backend vLLM picks here runs its own activation format."
    return (f"The checkpoint declares {model.declared_act} input activations, but vLLM 0.33.0 "
            "rewrites this Kimi-K3 compressed-tensors config to quant_method mxfp4 "
            "(KimiK3ForConditionalGenerationConfig), so Mxfp4MoEMethod serves the experts and the "
            "declared activations are not read.")
