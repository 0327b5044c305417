"""Named storage layouts for MoE expert tensors: the manifest vocabulary, as values.

A ``Layout`` (protocol in ``layout_base``) turns canonical uint8 bytes ``[E, N, K']`` (weights:
K' = K/2 fp4x2 bytes; scales: K' = K/32 e8m0 bytes) into the stored tensor and back. The
converter, the manifest, the verifier and the loader all look layouts up here by name, so they
speak of the same object.

Registered names (stored shape; the upstream call whose bytes each one equals):

AITER (CK / CK-tile / FlyDSL; ``shuffle/aiter.py``)
  identity                  [E, N, K']           the canonical bytes
  aiter_p16                 [E, N, K/2]          shuffle_weight(w, (16, 16))
  aiter_p16_gu16            [E, N, K/2]          shuffle_weight_a16w4(w13, 16, True)
  aiter_e8m0_shuffle        [ceil256(E*N), ceil8(K/32)]  e8m0_shuffle(s2d); pad 0x7F
  aiter_scale_a16w4         [E*N, ceil8(K/32)]   shuffle_scale_a16w4(s2d, E, False); column pad 0x7F
  aiter_scale_a16w4_gu16    [E*N, ceil8(K/32)]   shuffle_scale_a16w4(s2d, E, True)
  aiter_gfx1250_gu1         [E, N, K/2]          moe_shuffle_weight(w13, E, True, True), gfx1250
  aiter_scale_n32k4         [E, N/32, K]         shuffle_scale_n32k4(s, E, False, False), gfx1250
  aiter_scale_n32k4_gu1     [E, N/32, K]         shuffle_scale_n32k4(s, E, True, True), gfx1250
triton_kernels on ROCm, as vLLM 0.33.0's ``_swizzle_mxfp4`` builds them (``triton_*.py``)
  triton_gu1                [E, N, K']           w13 / w13 scale rows [g0, u0, g1, u1, ...]; Strided
                                                 (AITER_TRITON_MXFP4_BF16's interleave_gate_up)
  triton_cdna4_scale        [E, N/32, K]         CDNA4MXScaleLayout (gfx950, tp <= 2); no padding
  triton_cdna4_scale_gu1    [E, N/32, K]         interleave_gate_up, then CDNA4MXScaleLayout
  triton_gfx1250_scale      [E, N/32, K]         shuffle_scale_moe(arch="gfx1250", 32, 4)
  triton_gfx1250_scale_gu1  [E, N/32, K]         interleave_gate_up, then shuffle_scale_moe
FlashInfer TRTLLM-Gen on sm100, as vLLM's converter S leaves it (``shuffle/trtllm.py``)
  trtllm_w13                canonical shape      rows [u0, g0, u1, g1, ...], then the 32-row
                                                 epilogue-tile shuffle (get_w2_permute_indices_with_cache)
  trtllm_w13_scale          canonical shape      the same rows, then block_scale_interleave (128 x 4)
  trtllm_w2                 canonical shape      the 32-row epilogue-tile shuffle
  trtllm_w2_scale           canonical shape      the same rows, then block_scale_interleave (128 x 4)
mxfp4conv's own Triton kernels on Hopper (``shuffle/hopper.py``)
  hopper_mma_w_xor            canonical shape      fp4 in wgmma register-operand order, bits for an
                                                 8-instruction decode (what convert writes)
  hopper_mma_w_rot            canonical shape      the same words, bits for a 9-instruction decode
                                                 (what earlier releases wrote; still read)
  hopper_mma_w                canonical shape      the same words, bits for an 11-instruction decode
                                                 (what earlier releases wrote; still read)
  hopper_mma_s                canonical shape      e8m0 in the order of those words' rows

Weights on every triton_kernels path are Strided (``identity``, or ``triton_gu1`` for w13 where
the backend interleaves gate/up). The ``triton_*`` scale layouts store the contiguous storage
of the tensor vLLM builds; the kernel reads its transposed view ``[E, K, N/32]``.

Streaming: every layout here is independent per expert, so a converter can emit experts in
chunks. For any split of the experts into consecutive chunks::

    forward(x).flatten() == cat([forward_chunk(x[a:b]) ...] + [0x7F] * tail_bytes(x.shape))

``tail_bytes`` counts the row padding a whole-tensor forward appends after the last expert
(only ``aiter_e8m0_shuffle`` has any: rows are padded to a multiple of 256).
"""

from __future__ import annotations

from types import MappingProxyType

from mxfp4conv.lazy_torch import torch

from mxfp4conv.errors import LayoutError
from mxfp4conv.shuffle import aiter as A
from mxfp4conv.shuffle import aiter_np as AN
from mxfp4conv.shuffle import hopper as Hop
from mxfp4conv.shuffle import hopper_native as HX
from mxfp4conv.shuffle import hopper_np as HN
from mxfp4conv.shuffle.layout_base import Layout, Shape3, ceil_to, make_layout
from mxfp4conv.shuffle.triton_cdna4 import TRITON_CDNA4_SCALE, TRITON_CDNA4_SCALE_GU1
from mxfp4conv.shuffle.triton_gfx1250 import TRITON_GFX1250_SCALE, TRITON_GFX1250_SCALE_GU1
from mxfp4conv.shuffle.triton_strided import TRITON_GU1
from mxfp4conv.shuffle.trtllm import TRTLLM_LAYOUTS

__all__ = ["LAYOUTS", "Layout", "Shape3", "get_layout", "register_layout"]

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


def _rows2d(x, s: Shape3):
    return x.reshape(s[0] * s[1], s[2])


_IDENTITY = make_layout(
    "identity",
    "stored as the canonical 3-D bytes, unchanged",
    None,
    "any",
    lambda s: None,
    lambda s: s,
    lambda x, s: x,
    lambda y, s: y,
    np_chunk=lambda x, s: x,
)

_P16 = make_layout(
    "aiter_p16",
    "16-row x 16-byte tile transpose per expert (MFMA B-fragment order), w13 rows [gate; up]",
    "shuffle_weight(w, (16, 16)) == shuffle_weight_a16w4(w, 16, False) when K/2 % 64 == 0",
    "weight",
    _weight_p16,
    lambda s: s,
    lambda x, s: A.shuffle_weight(x),
    lambda y, s: A.unshuffle_weight(y),
    np_chunk=lambda x, s: AN.weight_p16(x),
)

_P16_GU16 = make_layout(
    "aiter_p16_gu16",
    "gate/up rows interleaved in 16-row blocks (GUGU16), then the 16x16 tile transpose",
    "shuffle_weight_a16w4(w13, 16, True)",
    "weight",
    _weight_gu16,
    lambda s: s,
    lambda x, s: A.shuffle_weight_a16w4(x, 16, True),
    lambda y, s: A.unshuffle_weight_a16w4(y, 16, True),
    np_chunk=lambda x, s: AN.weight_a16w4(x, 16, True),
)


def _e8m0_out(s: Shape3) -> tuple[int, int]:
    return (ceil_to(s[0] * s[1], 256), ceil_to(s[2], 8))


_E8M0 = make_layout(
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
    np_chunk=lambda x, s: AN.scale_a16w4(_rows2d(x, s), s[0], False),
)


def _a16w4_scale(gate_up: bool):
    name = "aiter_scale_a16w4_gu16" if gate_up else "aiter_scale_a16w4"
    what = ("gate row r and up row r share a dword (16-row gate/up interleave), " if gate_up else "")
    return make_layout(
        name,
        f"e8m0 scales as 2-D [E*N, ceil8(K/32)] in 32x8 tiles per expert, {what}column pad 0x7F",
        f"shuffle_scale_a16w4(s.view(E*N, K/32), E, {gate_up})",
        "scale",
        _scale_rows(name),
        lambda s: (s[0] * s[1], ceil_to(s[2], 8)),
        lambda x, s: A.shuffle_scale_a16w4(_rows2d(x, s), s[0], gate_up),
        lambda y, s: A.unshuffle_scale_a16w4(y, s[0], gate_up, shape=(s[0] * s[1], s[2])),
        np_chunk=lambda x, s: AN.scale_a16w4(_rows2d(x, s), s[0], gate_up),
    )


# ---- gfx1250 (AITER's moe_shuffle_weight / moe_shuffle_scale with arch gfx1250) ------------


def _weight_gu1(s: Shape3) -> None:
    A._gate_up_rows(s, "aiter_gfx1250_gu1 (interleave_gate_up_rows)")
    A._tile_plan(s, (16, 16), False, 1, "aiter_gfx1250_gu1 (shuffle_weight)")


_GFX1250_GU1 = make_layout(
    "aiter_gfx1250_gu1",
    "gate/up rows interleaved one by one (g0, u0, g1, u1, ...), then the 16x16 tile transpose",
    "moe_shuffle_weight(w13, E, True, True) on gfx1250 == shuffle_weight(interleave_gate_up_rows(w13))",
    "weight",
    _weight_gu1,
    lambda s: s,
    lambda x, s: A.moe_shuffle_weight(x, s[0], True, True, arch="gfx1250"),
    lambda y, s: A.moe_unshuffle_weight(y, s[0], True, True, arch="gfx1250"),
    np_chunk=lambda x, s: AN.weight_p16(AN.interleave_gate_up_rows(x)),
)


def _n32k4_scale(gate_up: bool):
    name = "aiter_scale_n32k4_gu1" if gate_up else "aiter_scale_n32k4"
    what = "rows gate/up interleaved one by one first, " if gate_up else ""

    def constraint(s: Shape3) -> None:
        A._n32k4_plan(s[0], s[1], s[2], gate_up, name)

    return make_layout(
        name,
        f"e8m0 scales as [E, N/32, (K/32)*32]: {what}32-row x 4-column blocks stored contiguously per expert",
        f"moe_shuffle_scale(s, E, {gate_up}, {gate_up}) on gfx1250 == shuffle_scale_n32k4(s, E, {gate_up}, {gate_up})",
        "scale",
        constraint,
        lambda s: (s[0], s[1] // 32, s[2] * 32),
        lambda x, s: A.shuffle_scale_n32k4(x, s[0], gate_up, gate_up),
        lambda y, s: A.unshuffle_scale_n32k4(y, s[0], gate_up, gate_up),
        np_chunk=lambda x, s: AN.scale_n32k4(x, gate_up),
    )


# ---- mxfp4conv's Triton kernel on Hopper (sm90): wgmma register-operand order -------------

_HOPPER_DECODES = {"plain": "4-op-a-register bf16 decode", "rot": "9-instruction bf16 decode (rotations and masks)",
                   "xor": "8-instruction bf16 decode (a linear map over GF(2) of the words' bits)"}


def _hopper_weight(order: str) -> Layout:
    name = "hopper_mma_w" if order == "plain" else f"hopper_mma_w_{order}"
    return make_layout(
        name,
        "fp4 in 16-row x 64-code blocks, one 16-byte wgmma A fragment per lane, bits re-encoded for a "
        + _HOPPER_DECODES[order],
        None,
        "weight",
        lambda s: Hop.check_weight(s, name),
        lambda s: s,
        lambda x, s: Hop.weight_forward(x, order),
        lambda y, s: Hop.weight_inverse(y, s, order),
        np_chunk=lambda x, s: HX.weight_forward(x, order),
    )


_HOPPER_W = _hopper_weight("plain")
_HOPPER_W_ROT = _hopper_weight("rot")
_HOPPER_W_XOR = _hopper_weight("xor")

_HOPPER_S = make_layout(
    "hopper_mma_s",
    "e8m0 in 16-row x 2-group blocks, each lane group's rows g and g+8 in one 4-byte word",
    None,
    "scale",
    Hop.check_scale,
    lambda s: s,
    lambda x, s: Hop.scale_forward(x),
    lambda y, s: Hop.scale_inverse(y, s),
    np_chunk=lambda x, s: HN.scale_forward(x),
)


_REGISTRY: dict[str, Layout] = {
    lay.name: lay
    for lay in (
        _IDENTITY, _P16, _P16_GU16, _E8M0, _a16w4_scale(False), _a16w4_scale(True),
        _GFX1250_GU1, _n32k4_scale(False), _n32k4_scale(True), _HOPPER_W, _HOPPER_W_ROT, _HOPPER_W_XOR, _HOPPER_S,
        TRITON_GU1, TRITON_CDNA4_SCALE, TRITON_CDNA4_SCALE_GU1, TRITON_GFX1250_SCALE, TRITON_GFX1250_SCALE_GU1,
        *TRTLLM_LAYOUTS,
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
