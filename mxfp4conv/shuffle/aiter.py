"""AITER's MXFP4 weight and e8m0 scale pre-shuffles in plain torch, byte for byte, with inverses.

Names, argument order and accepted shapes follow ``aiter/ops/shuffle.py`` at HEAD (the bytes are
the same on every release since v0.1.6; scale column padding in the interleaved path exists
from v0.1.18). Differences from AITER, on purpose:

- every shape AITER rejects (assert, view error, missing argument) raises ``LayoutError`` with
  a message saying what to change;
- padding added by a scale shuffle is always 0x7F (e8m0 1.0) for 1-byte dtypes (1 for wider
  dtypes), where AITER's default scale shuffle leaves ``torch.empty`` garbage;
- each function has an exact inverse (``unshuffle_*``); where the forward pads, the inverse
  takes the original ``shape`` to cut the padding off again.

Weights may be uint8 or ``torch.float4_e2m1fn_x2`` (also bf16/fp16 for ``shuffle_weight``),
scales uint8 or ``torch.float8_e8m0fnu``; outputs have the input's dtype. Like AITER, outputs
carry ``is_shuffled = True`` (and ``aiter_original_k`` / ``aiter_padded_k`` with ``pad_k_to``),
except the gfx1250-only ``shuffle_weight_f4`` / ``shuffle_scale_n32k4``, which AITER leaves unmarked.

``moe_shuffle_weight`` / ``moe_shuffle_scale`` take the target as an ``arch`` keyword (default
"gfx950") where AITER asks the GPU it runs on; "gfx1250" selects the 1-row gate/up interleave
and the n32k4 scale layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import sys

import numpy as np
from mxfp4conv.lazy_torch import torch

from mxfp4conv.errors import LayoutError

SCALE_PAD = 0x7F  # e8m0 code of 1.0


def _ceil(n: int, m: int) -> int:
    return -(-n // m) * m


def _storage(x: torch.Tensor) -> torch.Tensor:
    """fp4x2 has no arithmetic; move it as bytes."""
    fp4x2 = getattr(torch, "float4_e2m1fn_x2", None)
    return x.view(torch.uint8) if fp4x2 is not None and x.dtype == fp4x2 else x


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _inverse(perm: Sequence[int]) -> list[int]:
    return sorted(range(len(perm)), key=lambda i: perm[i])


# torch permutes single bytes slowly (~0.2 GB/s) and even 8-byte words at only ~0.5 GB/s;
# numpy moves a run of bytes that stays together as one opaque (void) item at 2.5-3.5 GB/s,
# and releases the GIL while it copies. Where the innermost output axis pairs two bytes from
# elsewhere, pairs built as int16 words are the fastest (about 1 GB/s). All paths give the
# same bytes as the plain permute.
_WIDE = sys.byteorder == "little"


def _kept_tail(shape: Sequence[int], perm: Sequence[int]) -> int:
    """How many trailing axes ``perm`` leaves in place."""
    k = 0
    while k < len(perm) and perm[len(perm) - 1 - k] == len(perm) - 1 - k:
        k += 1
    return k


def _permute_bytes(v: torch.Tensor, perm: Sequence[int]) -> torch.Tensor:
    """``v.permute(perm).contiguous()`` for a uint8 view, moving runs of bytes as single items."""
    if v.dtype == torch.uint8 and v.device.type == "cpu":
        k = _kept_tail(v.shape, perm)
        unit = 1
        for d in v.shape[v.ndim - k:]:
            unit *= d
        if k < v.ndim and unit >= 2:
            a = v.contiguous().numpy()
            items = a.reshape(*a.shape[: a.ndim - k], unit).view(np.dtype((np.void, unit)))[..., 0]
            return torch.from_numpy(np.ascontiguousarray(items.transpose(perm[: v.ndim - k]))
                                    .view(np.uint8)).reshape([v.shape[p] for p in perm])
    if _WIDE and v.dtype == torch.uint8 and v.shape[perm[-1]] == 2:
        # The innermost output axis pairs two bytes: build the pairs as int16, permute the rest.
        p = perm[-1]
        pairs = v.select(p, 0).to(torch.int16) | (v.select(p, 1).to(torch.int16) << 8)
        rest = [d - (d > p) for d in perm[:-1]]
        return pairs.permute(*rest).contiguous().view(torch.uint8)
    return v.permute(*perm).contiguous()


def _apply(x: torch.Tensor, view: Sequence[int], perm: Sequence[int], out: Sequence[int]) -> torch.Tensor:
    return _permute_bytes(x.reshape(*view), perm).reshape(*out)


def _undo(y: torch.Tensor, view: Sequence[int], perm: Sequence[int], out: Sequence[int]) -> torch.Tensor:
    permuted = [view[p] for p in perm]
    return _permute_bytes(y.reshape(*permuted), _inverse(perm)).reshape(*out)


def _mark(y: torch.Tensor, **attrs) -> torch.Tensor:
    y.is_shuffled = True
    for k, v in attrs.items():
        setattr(y, k, v)
    return y


# ---------------------------------------------------------------------------------------------
# weights
# ---------------------------------------------------------------------------------------------


def _tile_plan(shape: tuple[int, ...], layout, use_int4: bool, elem_size: int, fn: str):
    if len(shape) < 2:
        raise LayoutError(f"{fn}: the weight must be at least 2-D [.., N, K], got shape {shape}.")
    n_lane, k_lane = layout
    bn, bk = n_lane, 2 * k_lane
    k = 32 if use_int4 else 16 // elem_size
    n, kd = shape[-2], shape[-1]
    if bn <= 0 or bk <= 0 or bk % k:
        raise LayoutError(f"{fn}: layout {tuple(layout)} is not usable for {elem_size}-byte elements "
                          f"(2*layout[1] = {bk} must be a positive multiple of {k}).")
    if n <= 0 or n % bn:
        raise LayoutError(
            f"{fn}: weight of shape {shape} has N = {n} rows, which is not a multiple of the tile "
            f"height {bn}; pad N (the output features) to a multiple of {bn}."
        )
    if kd <= 0 or kd % bk:
        raise LayoutError(
            f"{fn}: weight of shape {shape} has {kd} entries per row (the last dimension; bytes for "
            f"fp4x2, i.e. K/2), not a multiple of {bk}; pad K so that the last dimension is a "
            f"multiple of {bk} (pad_k_to={bk} does this with zeros)."
        )
    lead = 1
    for d in shape[:-2]:
        lead *= d
    view = (lead, n // bn, bn, kd // bk, bk // k, k)
    return view, (0, 1, 3, 4, 2, 5)


def _gui_plan(shape: tuple[int, ...], layout, gate_up: bool, fn: str):
    if len(shape) != 3:
        raise LayoutError(f"{fn}: the interleaved (a16w4) path needs a 3-D weight [E, N, K/2], got shape {shape}.")
    e, n, kpk = shape
    n_lane, k_pack = layout
    if not 0 < n_lane <= 64 or k_pack <= 0:
        raise LayoutError(f"{fn}: NLane must be in 1..64 and KPack positive, got layout {tuple(layout)}.")
    k_lane = 64 // n_lane
    halves = 2 if gate_up else 1
    rows = halves * n_lane
    if n <= 0 or n % rows:
        what = "gate and up halves each need" if gate_up else "N needs"
        raise LayoutError(
            f"{fn}: weight of shape {shape} has N = {n} rows; the {what} a multiple of {n_lane} "
            f"rows, so N must be a multiple of {rows}. Pad the intermediate size accordingly."
        )
    kb = k_lane * k_pack
    if kpk <= 0 or kpk % kb:
        raise LayoutError(
            f"{fn}: weight of shape {shape} has {kpk} bytes per row; the interleaved (a16w4) layout "
            f"needs a multiple of {kb} (K a multiple of {2 * kb} fp4 elements). Pad K, or use the "
            f"default shuffle_weight, which needs only a multiple of 32 bytes."
        )
    n0, k0 = n // rows, kpk // kb
    if gate_up:
        return (e, 2, n0, n_lane, k0, k_lane, k_pack), (0, 2, 1, 4, 5, 3, 6)
    return (e, n0, n_lane, k0, k_lane, k_pack), (0, 1, 3, 4, 2, 5)


def _weight_plan(shape, layout, use_int4, is_guinterleave, gate_up, elem_size, fn):
    if is_guinterleave:
        return _gui_plan(shape, layout, gate_up, fn)
    return _tile_plan(shape, layout, use_int4, elem_size, fn)


def _check_pad_k(pad_k_to: int, use_int4: bool, is_guinterleave: bool, fn: str) -> None:
    if pad_k_to < 0:
        raise LayoutError(f"{fn}: pad_k_to must be >= 0, got {pad_k_to}.")
    if pad_k_to and (use_int4 or is_guinterleave):
        raise LayoutError(f"{fn}: pad_k_to is not supported with is_guinterleave=True or use_int4=True (AITER rejects it too).")


def shuffle_weight(
    x: torch.Tensor,
    layout=(16, 16),
    use_int4: bool = False,
    is_guinterleave: bool = False,
    gate_up: bool = False,
    pad_k_to: int = 0,
) -> torch.Tensor:
    """AITER ``shuffle_weight``: per expert, a tile transpose of ``layout[0]`` rows x 16 bytes.

    ``is_guinterleave=True`` is the a16w4 layout (3-D only); with ``gate_up`` it first interleaves
    gate/up in blocks of ``layout[0]`` rows. ``pad_k_to`` zero-pads the last dimension to a
    multiple of it first (default path only).
    """
    fn = "shuffle_weight"
    dtype = x.dtype
    b = _storage(x)
    _check_pad_k(pad_k_to, use_int4, is_guinterleave, fn)
    attrs = {}
    if pad_k_to:
        k = b.shape[-1]
        kp = _ceil(k, pad_k_to)
        if kp != k:
            b = torch.cat([b, b.new_zeros(*b.shape[:-1], kp - k)], dim=-1)
        attrs = {"aiter_original_k": k, "aiter_padded_k": kp}
    view, perm = _weight_plan(_shape(b), layout, use_int4, is_guinterleave, gate_up, b.element_size(), fn)
    y = _apply(b, view, perm, b.shape).view(dtype)
    if is_guinterleave and gate_up:
        attrs["is_guinterleave"] = True
    return _mark(y, **attrs)


def unshuffle_weight(
    x: torch.Tensor,
    layout=(16, 16),
    use_int4: bool = False,
    is_guinterleave: bool = False,
    gate_up: bool = False,
    pad_k_to: int = 0,
    shape: Sequence[int] | None = None,
) -> torch.Tensor:
    """Exact inverse of ``shuffle_weight`` with the same arguments.

    With ``pad_k_to`` the original ``shape`` (or the tensor's ``aiter_original_k``) says how many
    entries per row to keep.
    """
    fn = "unshuffle_weight"
    dtype = x.dtype
    b = _storage(x)
    _check_pad_k(pad_k_to, use_int4, is_guinterleave, fn)
    view, perm = _weight_plan(_shape(b), layout, use_int4, is_guinterleave, gate_up, b.element_size(), fn)
    out = _undo(b, view, perm, b.shape)
    keep = out.shape[-1]
    if shape is not None:
        shape = tuple(shape)
        ok = shape[:-1] == _shape(out)[:-1] and (
            _ceil(shape[-1], pad_k_to) == keep if pad_k_to else shape[-1] == keep
        )
        if not ok:
            raise LayoutError(f"{fn}: original shape {shape} does not shuffle to {_shape(b)} with pad_k_to={pad_k_to}.")
        keep = shape[-1]
    elif pad_k_to:
        keep = getattr(x, "aiter_original_k", None)
        if keep is None:
            raise LayoutError(f"{fn}: pass the original shape to undo pad_k_to={pad_k_to} (how many bytes per row to keep).")
    return out[..., :keep].contiguous().view(dtype)


def shuffle_weight_a16w4(src: torch.Tensor, NLane: int, gate_up: bool) -> torch.Tensor:  # noqa: N803 (AITER's name)
    """AITER ``shuffle_weight_a16w4`` = ``shuffle_weight(src, (NLane, 16), is_guinterleave=True, gate_up)``."""
    return shuffle_weight(src, layout=(NLane, 16), is_guinterleave=True, gate_up=gate_up)


def unshuffle_weight_a16w4(src: torch.Tensor, NLane: int, gate_up: bool) -> torch.Tensor:  # noqa: N803
    """Exact inverse of ``shuffle_weight_a16w4``."""
    return unshuffle_weight(src, layout=(NLane, 16), is_guinterleave=True, gate_up=gate_up)


# ---------------------------------------------------------------------------------------------
# scales
# ---------------------------------------------------------------------------------------------

# A 32-row x 8-column block of scales becomes 256 bytes = 64 dwords, one per lane (lane = 16*j + l):
# input (32a + 16n + l, 8b + 4q + j) -> output a*32*Kp + 256*b + 64*j + 4*l + 2*q + n.
_TILE_PERM = (0, 3, 5, 2, 4, 1)
_GUI_PERM = (0, 1, 4, 6, 3, 5, 2)
_GUI_GATE_UP_PERM = (0, 2, 4, 6, 3, 5, 1)


def _scale_bytes(src: torch.Tensor, fn: str) -> tuple[torch.Tensor, int]:
    if src.ndim != 2:
        raise LayoutError(f"{fn}: the scale must be a 2-D tensor [E*N, K/32], got shape {_shape(src)}; flatten experts into rows first.")
    if src.element_size() == 1:
        return src.view(torch.uint8), SCALE_PAD
    return src, 1


def _pad_to(b: torch.Tensor, rows: int, cols: int, fill: int) -> torch.Tensor:
    m, k = b.shape
    if (rows, cols) == (m, k):
        return b.contiguous()
    out = torch.full((rows, cols), fill, dtype=b.dtype, device=b.device)
    out[:m, :k] = b
    return out


def _scale_plan(m: int, ks: int, experts_cnt, is_guinterleave: bool, gate_up: bool, fn: str):
    """(padded rows, padded cols, view, perm) of a scale shuffle for an unpadded [m, ks] input."""
    kp = _ceil(ks, 8)
    if not is_guinterleave:
        mp = _ceil(m, 256)
        return mp, kp, (mp // 32, 2, 16, kp // 8, 2, 4), _TILE_PERM
    if experts_cnt is None:
        raise LayoutError(f"{fn}: experts_cnt is required when is_guinterleave=True (rows are split per expert).")
    if experts_cnt <= 0 or m % experts_cnt:
        raise LayoutError(f"{fn}: {m} scale rows cannot be split evenly over experts_cnt={experts_cnt}.")
    n = m // experts_cnt
    if n == 0 or n % 32:
        raise LayoutError(
            f"{fn}: {n} scale rows per expert ({m} rows / {experts_cnt} experts) is not a multiple of "
            f"32; the interleaved scale shuffle has no row padding. Pad N per expert to a multiple of 32."
        )
    if gate_up:
        view = (experts_cnt, 2, n // 32, 16, kp // 8, 2, 4)
        return m, kp, view, _GUI_GATE_UP_PERM
    return m, kp, (experts_cnt, n // 32, 2, 16, kp // 8, 2, 4), _GUI_PERM


def shuffle_scale(
    src: torch.Tensor | None,
    experts_cnt: int | None = None,
    is_guinterleave: bool = False,
    gate_up: bool = False,
) -> torch.Tensor | None:
    """AITER ``shuffle_scale``: e8m0 ``[E*N, K/32]`` into 32x8 tiles (one dword per lane).

    Default: rows padded to 256, columns to 8 (= ``e8m0_shuffle``). ``is_guinterleave``: per
    expert, columns padded to 8, no row padding; ``gate_up`` pairs gate row r with up row r.
    ``None`` and float32 inputs are returned unchanged, as in AITER.
    """
    if src is None or src.dtype == torch.float32:
        return src
    fn = "shuffle_scale"
    b, fill = _scale_bytes(src, fn)
    m, ks = b.shape
    mp, kp, view, perm = _scale_plan(m, ks, experts_cnt, is_guinterleave, gate_up, fn)
    y = _apply(_pad_to(b, mp, kp, fill), view, perm, (mp, kp)).view(src.dtype)
    return _mark(y)


def unshuffle_scale(
    src: torch.Tensor | None,
    experts_cnt: int | None = None,
    is_guinterleave: bool = False,
    gate_up: bool = False,
    shape: Sequence[int] | None = None,
) -> torch.Tensor | None:
    """Exact inverse of ``shuffle_scale``; ``shape`` is the original ``[M, K/32]`` (default: no padding was added)."""
    if src is None or src.dtype == torch.float32:
        return src
    fn = "unshuffle_scale"
    b, _ = _scale_bytes(src, fn)
    m, ks = tuple(shape) if shape is not None else _shape(b)
    mp, kp, view, perm = _scale_plan(m, ks, experts_cnt, is_guinterleave, gate_up, fn)
    if (mp, kp) != _shape(b):
        raise LayoutError(
            f"{fn}: a scale of original shape {(m, ks)} shuffles to {(mp, kp)}, not {_shape(b)}; "
            f"pass the original shape the scale had before padding."
        )
    return _undo(b.contiguous(), view, perm, (mp, kp))[:m, :ks].contiguous().view(src.dtype)


def shuffle_scale_a16w4(src: torch.Tensor, experts_cnt: int, gate_up: bool) -> torch.Tensor:
    """AITER ``shuffle_scale_a16w4`` = ``shuffle_scale(src, experts_cnt, True, gate_up)``."""
    return shuffle_scale(src, experts_cnt=experts_cnt, is_guinterleave=True, gate_up=gate_up)


def unshuffle_scale_a16w4(src: torch.Tensor, experts_cnt: int, gate_up: bool, shape: Sequence[int] | None = None) -> torch.Tensor:
    """Exact inverse of ``shuffle_scale_a16w4``."""
    return unshuffle_scale(src, experts_cnt=experts_cnt, is_guinterleave=True, gate_up=gate_up, shape=shape)


def e8m0_shuffle(scale: torch.Tensor) -> torch.Tensor:
    """AITER ``fp4_utils.e8m0_shuffle`` = default ``shuffle_scale`` (pads to [ceil256, ceil8] with 0x7F)."""
    return shuffle_scale(scale)


def e8m0_unshuffle(scale: torch.Tensor, shape: Sequence[int] | None = None) -> torch.Tensor:
    """Exact inverse of ``e8m0_shuffle``; ``shape`` is the scale's shape before padding."""
    return unshuffle_scale(scale, shape=shape)


# ---------------------------------------------------------------------------------------------
# gfx1250 (and the arch-dispatching MoE wrappers)
# ---------------------------------------------------------------------------------------------
#
# AITER's ``moe_shuffle_weight`` / ``moe_shuffle_scale`` pick their branch from the GPU they run
# on (``get_gfx()``). An offline converter has no such GPU, so here the target is an explicit
# ``arch`` keyword (default "gfx950"); only "gfx1250" takes the gfx1250 branch, like AITER.
# The gfx1250 gate/up interleave is 1 row (g0, u0, g1, u1, ...), not the 16-row blocks of the
# a16w4 layout, and its scales use the n32k4 layout, not the 32x8 tiles of ``shuffle_scale``.

DEFAULT_ARCH = "gfx950"


def _on_gfx1250(arch: str, fn: str) -> bool:
    if not isinstance(arch, str) or not arch:
        raise LayoutError(f"{fn}: arch must be a gfx name such as 'gfx950' or 'gfx1250', got {arch!r}.")
    return arch == "gfx1250"


def _gate_up_rows(shape: tuple[int, ...], fn: str) -> int:
    if len(shape) < 2:
        raise LayoutError(f"{fn}: needs rows on dim 1, i.e. a tensor [E, 2*I, ...]; got shape {shape}.")
    if shape[1] % 2:
        raise LayoutError(
            f"{fn}: tensor of shape {shape} has {shape[1]} rows on dim 1; gate and up halves need an "
            f"even count (rows [gate; up], 2*I). Pass the fused w13 with both halves of I rows."
        )
    return shape[1] // 2


def interleave_gate_up_rows(w: torch.Tensor) -> torch.Tensor:
    """AITER ``interleave_gate_up_rows``: ``[E, 2*I, ...]`` rows [g0..g(I-1), u0..u(I-1)] -> [g0, u0, g1, u1, ...]."""
    b = _storage(w)
    half = _gate_up_rows(_shape(b), "interleave_gate_up_rows")
    e, rest = b.shape[0], b.shape[2:]
    return b.reshape(e, 2, half, *rest).transpose(1, 2).reshape(b.shape).contiguous().view(w.dtype)


def deinterleave_gate_up_rows(w: torch.Tensor) -> torch.Tensor:
    """Exact inverse of ``interleave_gate_up_rows``: rows [g0, u0, g1, u1, ...] -> [gate; up]."""
    b = _storage(w)
    half = _gate_up_rows(_shape(b), "deinterleave_gate_up_rows")
    e, rest = b.shape[0], b.shape[2:]
    return b.reshape(e, half, 2, *rest).transpose(1, 2).reshape(b.shape).contiguous().view(w.dtype)


def _f4_plan(shape: tuple[int, ...], fn: str):
    if len(shape) not in (2, 3):
        raise LayoutError(f"{fn}: the weight must be [rows, K/2] or [E, rows, K/2] (one matrix per expert), got shape {shape}.")
    rows, kp = shape[-2], shape[-1]
    if rows <= 0 or rows % 16:
        raise LayoutError(f"{fn}: weight of shape {shape} has {rows} rows, not a multiple of 16; pad the rows (output features) to a multiple of 16.")
    if kp <= 0 or kp % 16:
        raise LayoutError(
            f"{fn}: weight of shape {shape} has {kp} bytes per row (K/2), not a multiple of 16; "
            f"pad K with zeros to a multiple of 32 fp4 elements."
        )
    lead = shape[0] if len(shape) == 3 else 1
    return (lead, rows // 16, 16, kp // 16, 16), (0, 1, 3, 2, 4)


def shuffle_weight_f4(src: torch.Tensor) -> torch.Tensor:
    """AITER gfx1250 ``shuffle_weight_f4``: a plain 16-row x 16-byte tile transpose of packed fp4.

    AITER takes one 2-D matrix ``[rows, K/2]``; a 3-D ``[E, rows, K/2]`` is shuffled per expert
    (the same bytes as calling it on each expert). Needs rows % 16 and K/2 % 16. Where K/2 % 32
    == 0 the bytes equal default ``shuffle_weight``. Like AITER, the output carries no
    ``is_shuffled`` attribute.
    """
    b = _storage(src)
    view, perm = _f4_plan(_shape(b), "shuffle_weight_f4")
    return _apply(b, view, perm, b.shape).view(src.dtype)


def unshuffle_weight_f4(src: torch.Tensor) -> torch.Tensor:
    """Exact inverse of ``shuffle_weight_f4``."""
    b = _storage(src)
    view, perm = _f4_plan(_shape(b), "unshuffle_weight_f4")
    return _undo(b, view, perm, b.shape).view(src.dtype)


def _moe_weight_gu1(x: torch.Tensor, is_guinterleave: bool, gate_up: bool, fn: str) -> bool:
    if is_guinterleave and gate_up and x.ndim != 3:
        raise LayoutError(f"{fn}: the gate/up interleave needs a 3-D w13 [E, 2*I, K/2], got shape {_shape(x)}.")
    return is_guinterleave and gate_up


def moe_shuffle_weight(
    src: torch.Tensor,
    experts_cnt: int | None = None,
    is_guinterleave: bool = False,
    gate_up: bool = False,
    layout=(16, 16),
    *,
    arch: str = DEFAULT_ARCH,
) -> torch.Tensor:
    """AITER ``moe_shuffle_weight`` for the target ``arch`` (AITER asks the GPU; we are told).

    gfx1250: with both ``is_guinterleave`` and ``gate_up``, ``interleave_gate_up_rows`` (1-row
    GUGU) first, then default ``shuffle_weight(src, layout)``. Other archs:
    ``shuffle_weight(src, layout, is_guinterleave=..., gate_up=...)`` (16-row GUGU).
    ``experts_cnt`` is accepted for AITER's signature and unused, as there.
    """
    fn = "moe_shuffle_weight"
    if _on_gfx1250(arch, fn):
        if _moe_weight_gu1(src, is_guinterleave, gate_up, fn):
            src = interleave_gate_up_rows(src)
        return shuffle_weight(src, layout=layout)
    return shuffle_weight(src, layout=layout, is_guinterleave=is_guinterleave, gate_up=gate_up)


def moe_unshuffle_weight(
    src: torch.Tensor,
    experts_cnt: int | None = None,
    is_guinterleave: bool = False,
    gate_up: bool = False,
    layout=(16, 16),
    *,
    arch: str = DEFAULT_ARCH,
) -> torch.Tensor:
    """Exact inverse of ``moe_shuffle_weight`` with the same arguments and ``arch``."""
    fn = "moe_unshuffle_weight"
    if _on_gfx1250(arch, fn):
        gu1 = _moe_weight_gu1(src, is_guinterleave, gate_up, fn)
        out = unshuffle_weight(src, layout=layout)
        return deinterleave_gate_up_rows(out) if gu1 else out
    return unshuffle_weight(src, layout=layout, is_guinterleave=is_guinterleave, gate_up=gate_up)


def _n32k4_plan(e: int, n: int, ks: int, gu1: bool, fn: str):
    """(view, perm) over 4-byte words of a contiguous [E, N, Ks] scale.

    Byte (e, 32a + r, 4c + q) goes to out[e, a, 128c + 4r + q]; with the 1-row gate/up
    interleave, r = 2j + h for source row h*N/2 + 16a + j (h = 0 gate, 1 up).
    """
    if gu1 and n % 2:
        raise LayoutError(f"{fn}: the gate/up interleaved (GUGU) n32k4 scale needs N = 2*I rows per expert, got N = {n}.")
    if n <= 0 or n % 32:
        raise LayoutError(
            f"{fn}: scale with {n} rows per expert (N) is not a multiple of 32; the n32k4 layout "
            f"has no row padding. Pad N per expert to a multiple of 32 (for w13, I to a multiple of 16)."
        )
    if ks <= 0 or ks % 4:
        raise LayoutError(
            f"{fn}: scale with {ks} e8m0 columns per row (K/32) is not a multiple of 4, i.e. K = "
            f"{32 * ks} is not a multiple of 128; the n32k4 layout has no column padding. Pad K to "
            f"a multiple of 128 (zero weights, scale 0x7F) before shuffling."
        )
    c = ks // 4
    if gu1:
        return (e, 2, n // 32, 16, c), (0, 2, 4, 3, 1)
    return (e, n // 32, 32, c), (0, 1, 3, 2)


def _scale_words(b: torch.Tensor) -> torch.Tensor:
    """A contiguous uint8 [..., Ks] (Ks % 4 == 0) as int32 words: moving words moves the same bytes."""
    b = b.contiguous()
    if b.storage_offset() % 4:
        b = b.clone()
    return b.reshape(-1).view(torch.int32)


def _n32k4_input(src: torch.Tensor, experts_cnt, fn: str) -> torch.Tensor:
    if src.element_size() != 1:
        raise LayoutError(f"{fn}: the n32k4 layout moves e8m0 bytes; got a {src.dtype} tensor. Pass uint8 or float8_e8m0fnu scales.")
    s = src.view(torch.uint8)
    if s.ndim == 2:
        if experts_cnt is None:
            raise LayoutError(f"{fn}: a 2-D scale [E*N, K/32] needs experts_cnt to split its rows per expert; pass experts_cnt or a 3-D [E, N, K/32] scale.")
        if experts_cnt <= 0 or s.shape[0] % experts_cnt:
            raise LayoutError(f"{fn}: {s.shape[0]} scale rows cannot be split evenly over experts_cnt={experts_cnt}.")
        return s.reshape(experts_cnt, s.shape[0] // experts_cnt, s.shape[1])
    if s.ndim != 3:
        raise LayoutError(f"{fn}: the scale must be 2-D [E*N, K/32] (with experts_cnt) or 3-D [E, N, K/32], got shape {_shape(s)}.")
    return s


def shuffle_scale_n32k4(
    src: torch.Tensor,
    experts_cnt: int | None = None,
    is_guinterleave: bool = False,
    gate_up: bool = False,
) -> torch.Tensor:
    """AITER gfx1250 ``shuffle_scale_n32k4``: e8m0 ``[E, N, K/32]`` -> uint8 ``[E, N/32, (K/32)*32]``.

    Per expert, each 32-row x 4-column block is stored contiguously (row-major), blocks ordered
    by row block then column block: byte (32a + r, 4c + q) -> [a, 128c + 4r + q]. With both
    ``is_guinterleave`` and ``gate_up`` the rows are first interleaved 1 by 1 (g0, u0, g1, ...).
    A 2-D ``[E*N, K/32]`` input needs ``experts_cnt``. Needs N % 32 and (K/32) % 4; no padding.
    As in AITER the output is uint8 whatever the input's 1-byte dtype, without ``is_shuffled``.
    """
    fn = "shuffle_scale_n32k4"
    s = _n32k4_input(src, experts_cnt, fn)
    e, n, ks = s.shape
    view, perm = _n32k4_plan(e, n, ks, is_guinterleave and gate_up, fn)
    if e == 0:
        return s.new_empty(0, n // 32, ks * 32)
    words = _scale_words(s).reshape(view).permute(*perm).contiguous()
    return words.reshape(-1).view(torch.uint8).reshape(e, n // 32, ks * 32)


def unshuffle_scale_n32k4(
    src: torch.Tensor,
    experts_cnt: int | None = None,
    is_guinterleave: bool = False,
    gate_up: bool = False,
    shape: Sequence[int] | None = None,
) -> torch.Tensor:
    """Exact inverse of ``shuffle_scale_n32k4``: uint8 ``[E, N, K/32]``, or ``shape`` (e.g. the original 2-D ``[E*N, K/32]``)."""
    fn = "unshuffle_scale_n32k4"
    if src.element_size() != 1 or src.ndim != 3:
        raise LayoutError(f"{fn}: expects the uint8 n32k4 scale [E, N/32, (K/32)*32], got {src.dtype} of shape {_shape(src)}.")
    y = src.view(torch.uint8)
    e, a, width = y.shape
    if width % 128:
        raise LayoutError(f"{fn}: last dimension {width} of shape {_shape(y)} is not (K/32)*32 with K/32 a multiple of 4.")
    n, ks = 32 * a, width // 32
    out3 = (e, n, ks)
    if shape is not None:
        shape = tuple(int(d) for d in shape)
        ok = shape == out3 or (len(shape) == 2 and shape == (e * n, ks) and experts_cnt in (None, e))
        if not ok:
            raise LayoutError(f"{fn}: a scale of original shape {shape} does not shuffle to {_shape(y)} (experts_cnt={experts_cnt}).")
    view, perm = _n32k4_plan(e, n, ks, is_guinterleave and gate_up, fn)
    if e == 0:
        return y.new_empty(shape if shape is not None else out3)
    permuted = [view[p] for p in perm]
    words = _scale_words(y).reshape(permuted).permute(*_inverse(perm)).contiguous()
    return words.reshape(-1).view(torch.uint8).reshape(shape if shape is not None else out3)


def moe_shuffle_scale(
    src: torch.Tensor | None,
    experts_cnt: int | None = None,
    is_guinterleave: bool = False,
    gate_up: bool = False,
    *,
    arch: str = DEFAULT_ARCH,
) -> torch.Tensor | None:
    """AITER ``moe_shuffle_scale`` for the target ``arch``: gfx1250 -> ``shuffle_scale_n32k4``, else ``shuffle_scale``."""
    if _on_gfx1250(arch, "moe_shuffle_scale"):
        return shuffle_scale_n32k4(src, experts_cnt, is_guinterleave=is_guinterleave, gate_up=gate_up)
    return shuffle_scale(src, experts_cnt=experts_cnt, is_guinterleave=is_guinterleave, gate_up=gate_up)


def moe_unshuffle_scale(
    src: torch.Tensor | None,
    experts_cnt: int | None = None,
    is_guinterleave: bool = False,
    gate_up: bool = False,
    *,
    arch: str = DEFAULT_ARCH,
    shape: Sequence[int] | None = None,
) -> torch.Tensor | None:
    """Exact inverse of ``moe_shuffle_scale``; ``shape`` is the original scale shape (needed where the forward padded)."""
    if _on_gfx1250(arch, "moe_unshuffle_scale"):
        return unshuffle_scale_n32k4(src, experts_cnt, is_guinterleave=is_guinterleave, gate_up=gate_up, shape=shape)
    return unshuffle_scale(src, experts_cnt=experts_cnt, is_guinterleave=is_guinterleave, gate_up=gate_up, shape=shape)
