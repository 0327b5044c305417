"""Put one rank's converted experts into a vLLM MoE layer and have vLLM build its kernel on them.

``install`` runs after the rest of the model is loaded and before vLLM's
``process_weights_after_loading``:

- ``vllm_transforms``: the bytes (in the identity layout, undoing any other) go into the layer's
  parameters as vLLM's weight loader would leave them (no slicing or padding: they are this
  rank's, padded already), and vLLM's own ``process_weights_after_loading`` converts them.
- ``kernel_ready``: the layer's ``process_weights_after_loading`` becomes vLLM's own with its
  weight converter answering with the converted bytes; everything vLLM does after its
  conversion (parameter replacement, quant config, kernel and experts set-up) runs unchanged.
- ``mxfp4conv_kernel`` layers are loaded by ``experts.install_mxfp4conv_kernel``.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

from mxfp4conv.errors import RuntimeInputError
from mxfp4conv.integrations.vllm import weights
from mxfp4conv.integrations.vllm.checks import LayerPlan

log = logging.getLogger(__name__)

# The quant method -> (module, name) of the weight converter its ``_setup_kernel`` calls.
CONVERTERS = {
    "Mxfp4MoEMethod": ("vllm.model_executor.layers.quantization.mxfp4",
                       "convert_weight_to_mxfp4_moe_kernel_format"),
    "GptOssMxfp4MoEMethod": ("vllm.model_executor.layers.quantization.mxfp4",
                             "convert_gpt_oss_weight_to_mxfp4_moe_kernel_format"),
    "QuarkOCP_MX_MoEMethod": ("vllm.model_executor.layers.quantization.quark.quark_moe",
                              "convert_gpt_oss_weight_to_mxfp4_moe_kernel_format"),
}
ORDER = ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_bias", "w2_bias")


def _copy_into(layer, name: str, t: torch.Tensor, where: str) -> None:
    param = getattr(layer, name, None)
    if not isinstance(param, torch.Tensor):
        raise RuntimeInputError(
            f"{where} holds {name}, but vLLM's layer {getattr(layer, 'layer_name', '?')!r} has no such parameter "
            "(the checkpoint's config and the converted experts disagree); convert the source again.")
    if tuple(param.shape) != tuple(t.shape):
        raise RuntimeInputError(
            f"{where}: {name} has shape {list(t.shape)}, vLLM's parameter {list(param.shape)}; convert the "
            "source again for this server.")
    with torch.no_grad():
        param.data.copy_(t.to(param.device))


@contextlib.contextmanager
def converter_answering(method: str, backend: Any, ready: tuple, where: str):
    """While active, the weight converter ``method`` calls returns ``ready`` instead of converting."""
    import importlib

    module_name, attr = CONVERTERS[method]
    module = importlib.import_module(module_name)
    original = getattr(module, attr)

    def already_converted(mxfp4_backend, *args, **kwargs):
        if mxfp4_backend != backend:
            raise RuntimeInputError(f"{where}: vLLM asked to convert for {mxfp4_backend}, the checkpoint holds {backend}.")
        return ready

    setattr(module, attr, already_converted)
    try:
        yield
    finally:
        setattr(module, attr, original)


def install(layer, plan: LayerPlan, stored: dict[str, torch.Tensor], manifest: dict[str, Any], where: str) -> None:
    """Load ``stored`` (one rank's tensors of one layer, by kind) into ``layer`` as ``plan`` says."""
    qm = layer.quant_method
    method = type(qm).__name__
    if plan.mode not in ("vllm_transforms", "kernel_ready"):
        raise ValueError(f"install() loads vllm_transforms / kernel_ready layers, not {plan.mode}")
    if plan.mode == "vllm_transforms":
        stored = canonical(stored, manifest, where)
        for name, t in weights.loaded_form(method, stored).items():
            _copy_into(layer, name, t, where)
        return
    activation = getattr(layer.activation, "value", str(layer.activation)).lower()
    form = weights.kernel_form(method, qm.mxfp4_backend.name, activation, stored, manifest, where)
    device = layer.w13_weight.device
    ready = tuple(None if form.get(n) is None else _to(form[n], device) for n in ORDER)
    for name in ("w13_input_scale", "w2_input_scale"):
        if name in form:
            _copy_into(layer, name, form[name], where)
    vllm_process = type(qm).process_weights_after_loading

    def process_weights_after_loading(layer_):
        with converter_answering(method, qm.mxfp4_backend, ready, where):
            vllm_process(qm, layer_)

    qm.process_weights_after_loading = process_weights_after_loading


def canonical(stored: dict[str, torch.Tensor], manifest: dict[str, Any], where: str) -> dict[str, torch.Tensor]:
    """``stored`` with every weight and scale in the identity layout (the layouts' inverses)."""
    from mxfp4conv.integrations.vllm.rank_tensors import canonical_shapes
    from mxfp4conv.runtime.relayout import invert_tensor

    layout, shapes = manifest.get("layout") or {}, canonical_shapes(manifest)
    out = dict(stored)
    for kind in ("w13", "w13_scale", "w2", "w2_scale"):
        name = str(layout.get(kind, "identity"))
        if name != "identity":
            out[kind] = invert_tensor(name, stored[kind], shapes[kind], f"{where} {kind}")
            log.info("%s: %s stored as %s, undone at load for vLLM's own conversion", where, kind, name)
    return out


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    flag = getattr(t, "is_shuffled", None)
    out = t.to(device)
    if flag is not None:
        out.is_shuffled = flag
    return out
