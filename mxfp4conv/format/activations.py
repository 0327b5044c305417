"""The manifest's activations and their parameters: the names the runtime's kernels compute, and the parameter
names (with their aliases and defaults) that ``activation_params`` in the manifest may use. Read by the runtime's
torch formulas, the Triton kernels and the AITER glue alike."""

from __future__ import annotations

from typing import Mapping

from mxfp4conv.errors import RuntimeInputError

ACTIVATIONS = ("situ", "silu", "swigluoai")


def _param(params: Mapping[str, float], *names: str, default=None):
    for n in names:
        if params.get(n) is not None:
            return float(params[n])
    return default


def activation_params(name: str, params: Mapping[str, float] | None) -> dict[str, float | None]:
    """The named parameters of ``name`` from manifest ``activation_params`` (aliases, defaults):
    situ -> beta, linear_beta; silu -> swiglu_limit; swigluoai -> alpha, limit."""
    params = dict(params or {})
    if name == "situ":
        return {
            "beta": _param(params, "beta", "situ_beta", "activation_situ_beta", default=1.0),
            "linear_beta": _param(params, "linear_beta", "situ_linear_beta", "activation_situ_linear_beta"),
        }
    if name == "silu":
        return {"swiglu_limit": _param(params, "swiglu_limit", "limit", "clamp_limit")}
    if name == "swigluoai":
        return {
            "alpha": _param(params, "alpha", "swiglu_alpha", default=1.702),
            "limit": _param(params, "limit", "swiglu_limit", default=7.0),
        }
    raise RuntimeInputError(
        f"The MoE activation {name!r} is not supported by the runtime; supported activations are "
        f"{', '.join(ACTIVATIONS)}. Convert the checkpoint with a supported activation or extend "
        "mxfp4conv.format.activations and the formulas in mxfp4conv.runtime.activations."
    )
