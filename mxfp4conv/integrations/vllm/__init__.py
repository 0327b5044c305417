"""The mxfp4conv vLLM plugin: ``vllm serve OUT --load-format mxfp4conv``.

Installed with ``pip install -e '.[vllm]'`` from a clone as an entry point in vLLM's
``vllm.general_plugins`` group; vLLM calls ``register`` in every process it starts, which adds
the ``mxfp4conv`` load format (``model_loader.loader_class``). vLLM is imported only when
``register`` runs.
"""

from __future__ import annotations

_registered = False


def register() -> None:
    """Register the ``mxfp4conv`` load format with vLLM (idempotent)."""
    global _registered
    if _registered:
        return
    from vllm.model_executor.model_loader import register_model_loader

    from mxfp4conv.integrations.vllm.model_loader import LOAD_FORMAT, loader_class

    register_model_loader(LOAD_FORMAT)(loader_class())
    _registered = True
