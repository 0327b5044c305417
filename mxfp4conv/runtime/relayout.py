"""Bring stored expert tensors back to the canonical identity layout with the layouts' inverses."""

from __future__ import annotations

import dataclasses

import torch

from mxfp4conv.errors import CheckpointError, LayoutError
from mxfp4conv.runtime.experts import TENSOR_NAMES, WEIGHT_KINDS, MoEExperts


def invert_tensor(layout_name: str, stored: torch.Tensor, shape3d: tuple[int, int, int], where: str) -> torch.Tensor:
    """Stored bytes in ``layout_name`` -> canonical uint8 ``[E, N, K']``."""
    b = stored.view(torch.uint8)
    if layout_name == "identity":
        return b.reshape(shape3d)
    from mxfp4conv.shuffle.layouts import get_layout

    try:
        layout = get_layout(layout_name)
        out = layout.inverse(b, shape3d)
    except (LayoutError, KeyError, ValueError, RuntimeError) as exc:
        raise CheckpointError(
            f"{where}: cannot undo layout {layout_name!r} for canonical shape {list(shape3d)} "
            f"(stored shape {list(stored.shape)}): {exc}. The checkpoint's manifest and tensors "
            "disagree; re-run `mxfp4conv convert` for this target."
        ) from exc
    return out.reshape(shape3d).contiguous()


def to_canonical(ex: MoEExperts) -> MoEExperts:
    """A copy of ``ex`` whose weight and scale tensors are in the identity layout."""
    changes = {}
    for kind in WEIGHT_KINDS:
        name = ex.layout.get(kind, "identity")
        where = f"{ex.prefix}.experts.rank{ex.rank}.{TENSOR_NAMES[kind]}"
        t = invert_tensor(name, ex.tensor(kind), ex.shape3d(kind), where)
        changes[TENSOR_NAMES[kind]] = t
    return dataclasses.replace(
        ex, **changes, layout={k: "identity" for k in WEIGHT_KINDS}, is_shuffled=False,
    )


def canonical(ex: MoEExperts) -> MoEExperts:
    """``ex`` in the identity layout (its stored layouts inverted once, the copy kept on ``ex``)."""
    if ex.is_canonical:
        return ex
    cached = getattr(ex, "_canonical_cache", None)
    if cached is None:
        cached = to_canonical(ex)
        object.__setattr__(ex, "_canonical_cache", cached)
    return cached
