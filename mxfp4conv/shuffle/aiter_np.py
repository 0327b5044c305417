"""numpy forward transforms of the AITER layouts ``convert`` writes (no torch).

The same (view, permutation, padding) plans as ``aiter.py``'s shuffles, applied to uint8
numpy arrays: a layout is a permutation of bytes, so any way of moving them gives the same
result (the tests compare every one with its torch path). Runs of bytes that stay together
move as single opaque items, which is what makes numpy fast here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mxfp4conv.shuffle.aiter import SCALE_PAD, _gui_plan, _scale_plan, _tile_plan


def _kept_tail(perm: Sequence[int]) -> int:
    k = 0
    while k < len(perm) and perm[len(perm) - 1 - k] == len(perm) - 1 - k:
        k += 1
    return k


def permute_bytes(a: np.ndarray, perm: Sequence[int]) -> np.ndarray:
    """``a.transpose(perm)`` as a new contiguous uint8 array."""
    a = np.ascontiguousarray(a)
    k = _kept_tail(perm)
    unit = int(np.prod(a.shape[a.ndim - k:], dtype=np.int64)) if k else 1
    if k < a.ndim and unit >= 2:
        items = a.reshape(*a.shape[: a.ndim - k], unit).view(np.dtype((np.void, unit)))[..., 0]
        out = np.ascontiguousarray(items.transpose(perm[: a.ndim - k])).view(np.uint8)
        return out.reshape([a.shape[p] for p in perm])
    return np.ascontiguousarray(a.transpose(perm))


def weight_p16(x: np.ndarray) -> np.ndarray:
    """``shuffle_weight(x, (16, 16))`` of a uint8 ``[E, N, K/2]``."""
    view, perm = _tile_plan(tuple(x.shape), (16, 16), False, 1, "aiter_p16 (shuffle_weight)")
    return permute_bytes(x.reshape(view), perm).reshape(x.shape)


def weight_a16w4(x: np.ndarray, n_lane: int, gate_up: bool) -> np.ndarray:
    """``shuffle_weight_a16w4(x, n_lane, gate_up)`` of a uint8 ``[E, N, K/2]``."""
    view, perm = _gui_plan(tuple(x.shape), (n_lane, 16), gate_up, "shuffle_weight_a16w4")
    return permute_bytes(x.reshape(view), perm).reshape(x.shape)


def scale_a16w4(s2d: np.ndarray, experts: int, gate_up: bool) -> np.ndarray:
    """``shuffle_scale_a16w4(s2d, experts, gate_up)`` of uint8 ``[E*N, K/32]`` -> ``[E*N, ceil8(K/32)]``."""
    m, ks = s2d.shape
    mp, kp, view, perm = _scale_plan(m, ks, experts, True, gate_up, "shuffle_scale_a16w4")
    if (mp, kp) != (m, ks):
        padded = np.full((mp, kp), SCALE_PAD, dtype=np.uint8)
        padded[:m, :ks] = s2d
        s2d = padded
    return permute_bytes(s2d.reshape(view), perm).reshape(mp, kp)
