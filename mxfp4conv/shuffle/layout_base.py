"""The one protocol every named layout follows (``Layout``) and the plumbing that builds one.

A layout family lives in its own module (``aiter`` shuffles in ``layouts``, ``hopper``,
``triton_strided``, ``triton_cdna4``, ``triton_gfx1250``) and builds its ``Layout`` values with
``make_layout``; ``layouts`` holds the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from mxfp4conv.lazy_torch import torch

from mxfp4conv.errors import LayoutError

Shape3 = tuple[int, int, int]


def ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class Layout:
    """A named, exactly invertible byte layout of a 3-D expert tensor.

    ``check(shape3d)`` raises ``LayoutError`` for shapes the layout (and the AITER call it equals)
    cannot take; ``forward``/``forward_chunk`` check first. ``forward_chunk`` defaults to the
    flattened ``forward`` and ``tail_bytes`` to 0, which is right for any layout without
    trailing padding.
    """

    name: str
    description: str
    aiter_call: str | None
    applies_to: str  # "weight", "scale" or "any"
    check: Callable[[Shape3], None] = field(repr=False)
    out_shape: Callable[[Shape3], tuple[int, ...]] = field(repr=False)
    forward: Callable[[torch.Tensor], torch.Tensor] = field(repr=False)
    inverse: Callable[[torch.Tensor, Shape3], torch.Tensor] = field(repr=False)
    forward_chunk: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None, repr=False)
    tail_bytes: Callable[[Shape3], int] | None = field(default=None, repr=False)
    vllm_call: str | None = None  # the vLLM code path whose bytes this layout equals, if any
    # ``forward_chunk`` on a uint8 numpy array (flat result), without torch; None where only
    # the torch path exists. Same bytes (tested layout by layout).
    forward_np: Callable | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.forward_chunk is None:
            object.__setattr__(self, "forward_chunk", lambda x: self.forward(x).reshape(-1))
        if self.tail_bytes is None:
            object.__setattr__(self, "tail_bytes", lambda shape3d: 0)


# ---- shared plumbing ------------------------------------------------------------------------


def shape3(name: str, shape) -> Shape3:
    s = tuple(int(d) for d in shape)
    if len(s) != 3 or s[0] < 0 or s[1] <= 0 or s[2] <= 0:
        raise LayoutError(
            f"layout {name!r} works on 3-D expert tensors [E, N, K'] with N, K' > 0; got shape {s}."
        )
    return s


def as_u8(name: str, x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.uint8:
        return x
    if x.element_size() == 1 and x.dtype in (torch.float4_e2m1fn_x2, torch.float8_e8m0fnu, torch.int8):
        return x.view(torch.uint8)
    raise LayoutError(f"layout {name!r} moves raw bytes; got a {x.dtype} tensor. Pass the uint8 (fp4x2 / e8m0) bytes.")


def stored_as(name: str, y: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    y = as_u8(name, y)
    n = 1
    for d in shape:
        n *= d
    if y.numel() != n:
        raise LayoutError(
            f"layout {name!r}: a stored tensor of shape {tuple(y.shape)} ({y.numel()} bytes) cannot be "
            f"the layout of that canonical shape, which is stored as {shape} ({n} bytes)."
        )
    return y.reshape(shape)


def make_layout(name, description, aiter_call, applies_to, constraint, out_shape, fwd, inv, chunk=None, tail=None,
                vllm_call=None, np_chunk=None):
    """A Layout whose entry points validate shapes with ``constraint(shape3d)``. ``np_chunk(x, s)``:
    the per-chunk forward on a contiguous uint8 numpy array, if the layout has one."""

    def check(shape3d) -> None:
        constraint(shape3(name, shape3d))

    def shape_of(shape3d):
        s = shape3(name, shape3d)
        constraint(s)
        return out_shape(s)

    def forward(x):
        x = as_u8(name, x)
        s = shape3(name, x.shape)
        constraint(s)
        return fwd(x.contiguous(), s) if s[0] else x.new_empty(out_shape(s))

    def inverse(y, shape3d):
        s = shape3(name, shape3d)
        constraint(s)
        y = stored_as(name, y, out_shape(s))
        return inv(y, s).reshape(s) if s[0] else y.new_empty(s)

    def forward_chunk(x):
        x = as_u8(name, x)
        s = shape3(name, x.shape)
        constraint(s)
        if not s[0]:
            return x.new_empty(0)
        return (chunk or fwd)(x.contiguous(), s).reshape(-1)

    def tail_bytes(shape3d) -> int:
        s = shape3(name, shape3d)
        constraint(s)
        return tail(s) if tail else 0

    def forward_np(x):
        s = shape3(name, x.shape)
        constraint(s)
        if x.dtype != np.uint8:
            raise LayoutError(f"layout {name!r} moves raw bytes; got a numpy {x.dtype} array. Pass uint8 bytes.")
        if not s[0]:
            return np.empty(0, dtype=np.uint8)
        return np_chunk(np.ascontiguousarray(x), s).reshape(-1)

    return Layout(name, description, aiter_call, applies_to, check, shape_of, forward, inverse, forward_chunk, tail_bytes,
                  vllm_call, forward_np if np_chunk else None)
