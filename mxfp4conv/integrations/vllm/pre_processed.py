"""vLLM's own path for weights already in kernel format (``weights_already_processed``).

vLLM 0.33.0 and 0.34.0 let a quant method declare ``supports_pre_processed_weights``; inside
``vllm.model_executor.utils.weights_already_processed()`` its ``process_weights_after_loading``
then skips the tensor transforms and only builds the kernel on the parameters as they are
(written for vLLM's weight cache). For MXFP4 MoE, ``Mxfp4MoEMethod`` has it, for one backend:
``FLASHINFER_TRTLLM_MXFP4_MXFP8`` (any other raises there). Where the live release offers it for
the layer's (method, backend), the plugin's fast path uses it: the stored kernel-ready bytes are put
into the layer's parameters with the quant method's own ``replace_parameter`` (what its conversion
ends with), and vLLM builds its kernel on them. The engine's checks (``judge``) apply unchanged:
the canary layer is still converted by vLLM itself, and every fast-path layer's parameters are
compared with the stored bytes afterwards.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Callable

import torch

# (quant method, backend) for which vLLM's pre-processed path skips exactly its weight converter
SUPPORTED = {("Mxfp4MoEMethod", "FLASHINFER_TRTLLM_MXFP4_MXFP8")}


def context(qm) -> Callable[[], contextlib.AbstractContextManager] | None:
    """vLLM's ``weights_already_processed`` where the live release offers it for ``qm``'s layer."""
    if (type(qm).__name__, qm.mxfp4_backend.name) not in SUPPORTED:
        return None
    if getattr(type(qm), "supports_pre_processed_weights", False) is not True:
        return None
    try:
        from vllm.model_executor.utils import weights_already_processed
    except ImportError:
        return None
    return weights_already_processed


def process(qm, layer, vllm_process, handed: dict[str, torch.Tensor], ready_context) -> None:
    """The stored bytes into the layer's parameters, then vLLM's own pre-processed path."""
    replace = importlib.import_module(type(qm).__module__).replace_parameter
    for name, t in handed.items():
        replace(layer, name, t)
    with ready_context():
        vllm_process(qm, layer)
