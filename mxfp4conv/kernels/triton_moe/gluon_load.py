"""The Gluon kernel modules, imported on first use: a Triton without Gluon (or whose Gluon differs from
the one they were written for) falls back to the Triton kernels, warned about once.
"""

from __future__ import annotations

import functools
import warnings

import triton
import triton.compiler.errors


@functools.lru_cache(maxsize=None)
def _gluon_module():
    """mxfp4conv.kernels.triton_moe.gluon_few_tokens, or None where this Triton has no Gluon (or not the parts it uses)."""
    try:
        from mxfp4conv.kernels.triton_moe import gluon_few_tokens
    except (ImportError, AttributeError, TypeError):
        return None
    return gluon_few_tokens


@functools.lru_cache(maxsize=None)
def _gluon_grouped_module():
    """mxfp4conv.kernels.triton_moe.gluon_grouped (the caller has checked _gluon_module)."""
    from mxfp4conv.kernels.triton_moe import gluon_grouped
    return gluon_grouped


@functools.lru_cache(maxsize=None)
def _gluon_wgmma_module():
    """mxfp4conv.kernels.triton_moe.gluon_wgmma (the caller has checked _gluon_module)."""
    from mxfp4conv.kernels.triton_moe import gluon_wgmma
    return gluon_wgmma


_GLUON_BROKEN: list[str] = []  # why the Gluon kernels failed to compile here, once they have


def _compiled_or_none(run, required: bool):
    """run(), or None where its Gluon kernels fail to compile and were not required (warned about
    once; later calls skip the Gluon paths)."""
    try:
        return run()
    except triton.compiler.errors.CompilationError as exc:
        if required:
            raise
        _GLUON_BROKEN.append(str(exc).splitlines()[-1] if str(exc) else type(exc).__name__)
        warnings.warn(f"mxfp4conv: the Gluon MoE kernels do not compile with triton {triton.__version__} "
                      f"({_GLUON_BROKEN[0]}); the hopper_mma kernels run instead.", RuntimeWarning, stacklevel=4)
        return None
