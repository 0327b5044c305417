"""numpy forward transforms of the AITER layouts ``convert`` writes (no torch).

The same (view, permutation, padding) plans as ``aiter.py``'s shuffles, applied to uint8
numpy arrays: a layout is a permutation of bytes, so any way of moving them gives the same
result (the tests compare every one with its torch path). Runs of bytes that stay together
move as single opaque items, which is what makes numpy fast here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mxfp4conv.shuffle.aiter import SCALE_PAD, _gui_plan, _n32k4_plan, _scale_plan, _tile_plan


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


def interleave_gate_up_rows(x: np.ndarray) -> np.ndarray:
    """``interleave_gate_up_rows`` of a uint8 ``[E, 2*I, ...]``: rows [gate; up] -> [g0, u0, g1, ...]."""
    e, n = x.shape[:2]
    rest = x.shape[2:]
    return permute_bytes(x.reshape(e, 2, n // 2, *rest), (0, 2, 1, *range(3, 3 + len(rest)))).reshape(x.shape)


def scale_n32k4(x: np.ndarray, gu1: bool) -> np.ndarray:
    """``shuffle_scale_n32k4(x, E, gu1, gu1)`` of a uint8 ``[E, N, K/32]`` -> ``[E, N/32, (K/32)*32]``."""
    e, n, ks = x.shape
    view, perm = _n32k4_plan(e, n, ks, gu1, "shuffle_scale_n32k4")
    # the plan moves 4-byte words: the bytes of a word stay together as a trailing axis
    moved = permute_bytes(x.reshape(*view, 4), (*perm, len(view)))
    return moved.reshape(e, n // 32, ks * 32)


def cdna4_scale(x: np.ndarray) -> np.ndarray:
    """triton_kernels' CDNA4 scale swizzle (``triton_cdna4.swizzle``) of a uint8 ``[E, N, K/32]``."""
    e, n, ks = x.shape
    t = x.reshape(e, n // 32, 2, 16, ks // 8, 2, 4)
    return permute_bytes(t, (0, 1, 4, 6, 3, 5, 2)).reshape(e, n // 32, ks * 32)
