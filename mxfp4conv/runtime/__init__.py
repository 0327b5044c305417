"""Serve-time runtime: load a converted checkpoint's experts and run the fused MoE forward.

Needs torch (and Triton for the ``triton`` backend): the runtime extra, ``pip install -e
'.[runtime]'`` from a clone; the converter itself does not.
"""

try:
    import torch  # noqa: F401
except ImportError:
    raise ImportError("mxfp4conv.runtime needs torch, which is not installed: install the runtime extra "
                      "(pip install -e '.[runtime]' from a clone of mxfp4conv; "
                      "a CPU-only machine gets the small CPU build of torch with --index-url "
                      "https://download.pytorch.org/whl/cpu). Converting and verifying need no torch.") from None

from mxfp4conv.runtime.dispatch import fused_moe  # noqa: E402
from mxfp4conv.runtime.experts import MoEExperts  # noqa: E402
from mxfp4conv.runtime.loader import load_moe_layers, parallel_layout  # noqa: E402

__all__ = ["MoEExperts", "fused_moe", "load_moe_layers", "parallel_layout"]
