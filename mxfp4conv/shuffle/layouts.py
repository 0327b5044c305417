"""Named storage layouts for MoE expert tensors: the manifest vocabulary, as values.

A ``Layout`` turns canonical uint8 bytes ``[E, N, K']`` (weights: K' = K/2 fp4x2 bytes; scales:
K' = K/32 e8m0 bytes) into the stored tensor and back. The converter, the manifest, the
verifier and the loader all look layouts up here by name, so they speak of the same object.

Streaming: every layout here is independent per expert, so a converter can emit experts in
chunks. For any split of the experts into consecutive chunks::

    forward(x).flatten() == cat([forward_chunk(x[a:b]) ...] + [0x7F] * tail_bytes(x.shape))

``tail_bytes`` counts the row padding a whole-tensor forward appends after the last expert
(only ``aiter_e8m0_shuffle`` has any: rows are padded to a multiple of 256).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from mxfp4conv.errors import LayoutError
from mxfp4conv.shuffle import aiter as A
from mxfp4conv.shuffle import hopper as Hop

Shape3 = tuple[int, int, int]


def _ceil(n: int, m: int) -> int:
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

    def __post_init__(self):
        if self.forward_chunk is None:
            object.__setattr__(self, "forward_chunk", lambda x: self.forward(x).reshape(-1))
        if self.tail_bytes is None:
            object.__setattr__(self, "tail_bytes", lambda shape3d: 0)


# ---- shared plumbing ------------------------------------------------------------------------


def _shape3(name: str, shape) -> Shape3:
    s = tuple(int(d) for d in shape)
    if len(s) != 3 or s[0] < 0 or s[1] <= 0 or s[2] <= 0:
        raise LayoutError(
            f"layout {name!r} works on 3-D expert tensors [E, N, K'] with N, K' > 0; got shape {s}."
        )
    return s


def _u8(name: str, x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.uint8:
        return x
    if x.element_size() == 1 and x.dtype in (torch.float4_e2m1fn_x2, torch.float8_e8m0fnu, torch.int8):
        return x.view(torch.uint8)
    raise LayoutError(f"layout {name!r} moves raw bytes; got a {x.dtype} tensor. Pass the uint8 (fp4x2 / e8m0) bytes.")


def _stored(name: str, y: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    y = _u8(name, y)
    n = 1
    for d in shape:
        n *= d
    if y.numel() != n:
        raise LayoutError(
            f"layout {name!r}: a stored tensor of shape {tuple(y.shape)} ({y.numel()} bytes) cannot be "
            f"the layout of that canonical shape, which is stored as {shape} ({n} bytes)."
        )
    return y.reshape(shape)


def _make(name, description, aiter_call, applies_to, constraint, out_shape, fwd, inv, chunk=None, tail=None):
    """A Layout whose entry points validate shapes with ``constraint(shape3d)``."""

    def check(shape3d) -> None:
        constraint(_shape3(name, shape3d))

    def shape_of(shape3d):
        s = _shape3(name, shape3d)
        constraint(s)
        return out_shape(s)

    def forward(x):
        x = _u8(name, x)
        s = _shape3(name, x.shape)
        constraint(s)
        return fwd(x.contiguous(), s) if s[0] else x.new_empty(out_shape(s))

    def inverse(y, shape3d):
        s = _shape3(name, shape3d)
        constraint(s)
        y = _stored(name, y, out_shape(s))
        return inv(y, s).reshape(s) if s[0] else y.new_empty(s)

    def forward_chunk(x):
        x = _u8(name, x)
        s = _shape3(name, x.shape)
        constraint(s)
        if not s[0]:
            return x.new_empty(0)
        return (chunk or fwd)(x.contiguous(), s).reshape(-1)

    def tail_bytes(shape3d) -> int:
        s = _shape3(name, shape3d)
        constraint(s)
        return tail(s) if tail else 0

    return Layout(name, description, aiter_call, applies_to, check, shape_of, forward, inverse, forward_chunk, tail_bytes)


# ---- constraints (same rules and messages as the AITER functions) ---------------------------


def _weight_p16(s: Shape3) -> None:
    A._tile_plan(s, (16, 16), False, 1, "aiter_p16 (shuffle_weight)")


def _weight_gu16(s: Shape3) -> None:
    A._gui_plan(s, (16, 16), True, "aiter_p16_gu16 (shuffle_weight_a16w4 gate_up=True)")


def _scale_rows(label: str):
    def constraint(s: Shape3) -> None:
        if s[1] % 32:
            raise LayoutError(
                f"{label}: scales of shape {s} have N = {s[1]} rows per expert, not a multiple of 32; "
                f"the 32-row scale tiles would straddle experts. Pad N per expert to a multiple of 32."
            )

    return constraint


# ---- the built-in layouts -------------------------------------------------------------------


def _rows2d(x: torch.Tensor, s: Shape3) -> torch.Tensor:
    return x.reshape(s[0] * s[1], s[2])


_IDENTITY = _make(
    "identity",
    "stored as the canonical 3-D bytes, unchanged",
    None,
    "any",
    lambda s: None,
    lambda s: s,
    lambda x, s: x,
    lambda y, s: y,
)

_P16 = _make(
    "aiter_p16",
    "16-row x 16-byte tile transpose per expert (MFMA B-fragment order), w13 rows [gate; up]",
    "shuffle_weight(w, (16, 16)) == shuffle_weight_a16w4(w, 16, False) when K/2 % 64 == 0",
    "weight",
    _weight_p16,
    lambda s: s,
    lambda x, s: A.shuffle_weight(x),
    lambda y, s: A.unshuffle_weight(y),
)

_P16_GU16 = _make(
    "aiter_p16_gu16",
    "gate/up rows interleaved in 16-row blocks (GUGU16), then the 16x16 tile transpose",
    "shuffle_weight_a16w4(w13, 16, True)",
    "weight",
    _weight_gu16,
    lambda s: s,
    lambda x, s: A.shuffle_weight_a16w4(x, 16, True),
    lambda y, s: A.unshuffle_weight_a16w4(y, 16, True),
)


def _e8m0_out(s: Shape3) -> tuple[int, int]:
    return (_ceil(s[0] * s[1], 256), _ceil(s[2], 8))


_E8M0 = _make(
    "aiter_e8m0_shuffle",
    "e8m0 scales as 2-D [ceil256(E*N), ceil8(K/32)] in 32x8 tiles (one dword per lane), pad 0x7F",
    "e8m0_shuffle(s.view(E*N, K/32)) == shuffle_scale(s2d)",
    "scale",
    _scale_rows("aiter_e8m0_shuffle"),
    _e8m0_out,
    lambda x, s: A.e8m0_shuffle(_rows2d(x, s)),
    lambda y, s: A.e8m0_unshuffle(y, shape=(s[0] * s[1], s[2])),
    # per-expert bytes = the interleaved-path shuffle (same tiles, no row padding)
    chunk=lambda x, s: A.shuffle_scale_a16w4(_rows2d(x, s), s[0], False),
    tail=lambda s: (_e8m0_out(s)[0] - s[0] * s[1]) * _e8m0_out(s)[1],
)


def _a16w4_scale(gate_up: bool):
    name = "aiter_scale_a16w4_gu16" if gate_up else "aiter_scale_a16w4"
    what = ("gate row r and up row r share a dword (16-row gate/up interleave), " if gate_up else "")
    return _make(
        name,
        f"e8m0 scales as 2-D [E*N, ceil8(K/32)] in 32x8 tiles per expert, {what}column pad 0x7F",
        f"shuffle_scale_a16w4(s.view(E*N, K/32), E, {gate_up})",
        "scale",
        _scale_rows(name),
        lambda s: (s[0] * s[1], _ceil(s[2], 8)),
        lambda x, s: A.shuffle_scale_a16w4(_rows2d(x, s), s[0], gate_up),
        lambda y, s: A.unshuffle_scale_a16w4(y, s[0], gate_up, shape=(s[0] * s[1], s[2])),
    )


# ---- gfx1250 (AITER's moe_shuffle_weight / moe_shuffle_scale with arch gfx1250) ------------


def _weight_gu1(s: Shape3) -> None:
    A._gate_up_rows(s, "aiter_gfx1250_gu1 (interleave_gate_up_rows)")
    A._tile_plan(s, (16, 16), False, 1, "aiter_gfx1250_gu1 (shuffle_weight)")


_GFX1250_GU1 = _make(
    "aiter_gfx1250_gu1",
    "gate/up rows interleaved one by one (g0, u0, g1, u1, ...), then the 16x16 tile transpose",
    "moe_shuffle_weight(w13, E, True, True) on gfx1250 == shuffle_weight(interleave_gate_up_rows(w13))",
    "weight",
    _weight_gu1,
    lambda s: s,
    lambda x, s: A.moe_shuffle_weight(x, s[0], True, True, arch="gfx1250"),
    lambda y, s: A.moe_unshuffle_weight(y, s[0], True, True, arch="gfx1250"),
)


def _n32k4_scale(gate_up: bool):
    name = "aiter_scale_n32k4_gu1" if gate_up else "aiter_scale_n32k4"
    what = "rows gate/up interleaved one by one first, " if gate_up else ""

    def constraint(s: Shape3) -> None:
        A._n32k4_plan(s[0], s[1], s[2], gate_up, name)

    return _make(
        name,
        f"e8m0 scales as [E, N/32, (K/32)*32]: {what}32-row x 4-column blocks stored contiguously per expert",
        f"moe_shuffle_scale(s, E, {gate_up}, {gate_up}) on gfx1250 == shuffle_scale_n32k4(s, E, {gate_up}, {gate_up})",
        "scale",
        constraint,
        lambda s: (s[0], s[1] // 32, s[2] * 32),
        lambda x, s: A.shuffle_scale_n32k4(x, s[0], gate_up, gate_up),
        lambda y, s: A.unshuffle_scale_n32k4(y, s[0], gate_up, gate_up),
    )


# ---- mxfp4conv's Triton kernel on Hopper (sm90): wgmma register-operand order -------------

_HOPPER_W = _make(
    "hopper_mma_w",
    "fp4 in 16-row x 64-code blocks, one 16-byte wgmma A fragment per lane, bits re-encoded for a 4-op bf16 decode",
    None,
    "weight",
    Hop.check_weight,
    lambda s: s,
    lambda x, s: Hop.weight_forward(x),
    lambda y, s: Hop.weight_inverse(y, s),
)

_HOPPER_S = _make(
    "hopper_mma_s",
    "e8m0 in 16-row x 2-group blocks, each lane group's rows g and g+8 in one 4-byte word",
    None,
    "scale",
    Hop.check_scale,
    lambda s: s,
    lambda x, s: Hop.scale_forward(x),
    lambda y, s: Hop.scale_inverse(y, s),
)


_REGISTRY: dict[str, Layout] = {
    lay.name: lay
    for lay in (
        _IDENTITY, _P16, _P16_GU16, _E8M0, _a16w4_scale(False), _a16w4_scale(True),
        _GFX1250_GU1, _n32k4_scale(False), _n32k4_scale(True), _HOPPER_W, _HOPPER_S,
    )
}
LAYOUTS = MappingProxyType(_REGISTRY)  # read-only view; add with register_layout


def get_layout(name: str) -> Layout:
    """The layout called ``name``; ``LayoutError`` listing the known names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise LayoutError(f"unknown layout {name!r}; known layouts: {', '.join(sorted(_REGISTRY))}.") from None


def register_layout(layout: Layout, replace: bool = False) -> Layout:
    """Add ``layout`` to the registry (e.g. a kernel's own layout). Re-registering a name needs ``replace``."""
    if not isinstance(layout, Layout):
        raise TypeError(f"register_layout needs a Layout, got {type(layout).__name__}")
    current = _REGISTRY.get(layout.name)
    if current is not None and current is not layout and not replace:
        raise LayoutError(f"a layout named {layout.name!r} is already registered; pass replace=True to override it.")
    _REGISTRY[layout.name] = layout
    return layout
