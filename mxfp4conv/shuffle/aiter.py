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
carry ``is_shuffled = True`` (and ``aiter_original_k`` / ``aiter_padded_k`` with ``pad_k_to``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sys

import torch

from mxfp4conv.errors import LayoutError

SCALE_PAD = 0x7F  # e8m0 code of 1.0
_FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)


def _ceil(n: int, m: int) -> int:
    return -(-n // m) * m


def _storage(x: torch.Tensor) -> torch.Tensor:
    """fp4x2 has no arithmetic; move it as bytes."""
    return x.view(torch.uint8) if _FP4X2 is not None and x.dtype == _FP4X2 else x


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _inverse(perm: Sequence[int]) -> list[int]:
    return sorted(range(len(perm)), key=lambda i: perm[i])


# torch permutes single bytes slowly (~0.2 GB/s); moving wider words is 5-10x faster. Both
# tricks below give the same bytes as the plain permute (little-endian machines only).
_WIDE = sys.byteorder == "little"


def _permute_bytes(v: torch.Tensor, perm: Sequence[int]) -> torch.Tensor:
    """``v.permute(perm).contiguous()`` for a uint8 view, moving words where the shape allows."""
    last = v.ndim - 1
    if _WIDE and v.dtype == torch.uint8 and perm[-1] == last and v.shape[-1] % 8 == 0:
        # The innermost run of bytes stays together: move it as int64 words.
        v = v.contiguous()
        if v.storage_offset() % 8 == 0:
            return v.view(torch.int64).permute(*perm).contiguous().view(torch.uint8)
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
