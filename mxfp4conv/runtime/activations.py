"""Gated activations of the routed experts, in fp32, on the canonical ``[gate | up]`` halves.

Names follow vLLM's ``MoEActivation`` values; parameters are the manifest's
``activation_params``:

- ``situ`` (Kimi-K3 SituGLU): ``beta * tanh(g / beta) * sigmoid(g)`` times
  ``linear_beta * tanh(u / linear_beta)`` when ``linear_beta > 0``, else times ``u``
  (vLLM's kernel treats a missing linear_beta as -1.0, i.e. passthrough).
- ``silu``: ``silu(g) * u``; with ``swiglu_limit`` (DeepSeek-V4) ``g = min(g, limit)`` and
  ``u = clamp(u, -limit, limit)`` first (vLLM ``silu_and_mul_with_clamp``, alpha 1, beta 0).
- ``swigluoai`` (gpt-oss): ``g = min(g, limit)``, ``u = clamp(u, -limit, limit)``,
  ``(u + 1) * g * sigmoid(alpha * g)`` with alpha 1.702, limit 7.0 by default. The canonical
  layout already de-interleaved gpt-oss rows, so gate and up are halves here too.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

from mxfp4conv.format.activations import activation_params



def situ(g: torch.Tensor, u: torch.Tensor, beta: float = 1.0, linear_beta: float | None = None) -> torch.Tensor:
    gate = beta * torch.tanh(g / beta) * torch.sigmoid(g)
    if linear_beta is not None and linear_beta > 0:
        u = linear_beta * torch.tanh(u / linear_beta)
    return gate * u


def silu(g: torch.Tensor, u: torch.Tensor, swiglu_limit: float | None = None) -> torch.Tensor:
    if swiglu_limit is not None:
        g = torch.clamp(g, max=swiglu_limit)
        u = torch.clamp(u, -swiglu_limit, swiglu_limit)
    return g * torch.sigmoid(g) * u


def swigluoai(g: torch.Tensor, u: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    g = torch.clamp(g, max=limit)
    u = torch.clamp(u, -limit, limit)
    return (u + 1.0) * g * torch.sigmoid(alpha * g)


def resolve_activation(name: str, params: Mapping[str, float] | None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``(gate, up) -> out`` for a manifest activation name and its parameters."""
    p = activation_params(name, params)
    fn = {"situ": situ, "silu": silu, "swigluoai": swigluoai}[name]
    return lambda g, u: fn(g, u, **p)
