"""Read one MoE layer's ``{P}.experts.rank{r}.*`` tensors of a converted checkpoint, checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mxfp4conv.errors import CheckpointError
from mxfp4conv.runtime.experts import WEIGHT_KINDS
from mxfp4conv.runtime.loader import _read_tensors, _shard_headers, checksums_to_check, rank_tensor_names


def for_experts(manifest: dict[str, Any], n: int) -> dict[str, Any]:
    """The manifest as a layer of ``n`` local experts sees it (EPLB's physical slots): the same
    but ``moe.experts_per_rank``."""
    return {**manifest, "moe": {**manifest["moe"], "experts_per_rank": n}}


def canonical_shapes(manifest: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The canonical (identity) shape of every expert tensor kind of one rank."""
    moe = manifest["moe"]
    e, h, i = int(moe["experts_per_rank"]), int(moe["hidden_padded"]), int(moe["intermediate_per_rank_padded"])
    return {"w13": (e, 2 * i, h // 2), "w13_scale": (e, 2 * i, h // 32), "w2": (e, h, i // 2),
            "w2_scale": (e, h, i // 32), "w13_bias": (e, 2 * i), "w2_bias": (e, h),
            "w13_input_scale": (e,), "w2_input_scale": (e,)}


def stored_shape(manifest: dict[str, Any], kind: str) -> tuple[int, ...]:
    shape = canonical_shapes(manifest)[kind]
    name = str((manifest.get("layout") or {}).get(kind, "identity")) if kind in WEIGHT_KINDS else "identity"
    if name == "identity":
        return shape
    from mxfp4conv.shuffle.layouts import get_layout

    return tuple(get_layout(name).out_shape(shape))


def read_layer(root: Path, weight_map: dict[str, str], manifest: dict[str, Any], prefix: str, rank: int) -> dict[str, torch.Tensor]:
    """{kind: tensor} of one layer and rank: weights and scales as uint8 bytes, the rest as stored,
    each checked against the manifest's crc32 as it is read (unless MXFP4CONV_SKIP_CHECKSUMS=1)."""
    names = rank_tensor_names(weight_map, prefix, rank, root)
    wanted = {n: weight_map[n] for n in names.values()}
    crcs = checksums_to_check(manifest, Path(root), weight_map)
    # the shards this rank reads: complete files, each stamped with this manifest
    got = _read_tensors(root, list(wanted), wanted, _shard_headers(root, wanted, manifest), crcs)
    out = {}
    for kind, name in names.items():
        t = got[name]
        if kind in WEIGHT_KINDS:
            if t.element_size() != 1:
                raise CheckpointError(f"{root}: {name} is {t.dtype}, expected raw 1-byte MXFP4 / e8m0 bytes; convert the source again.")
            t = t.view(torch.uint8)
        want = stored_shape(manifest, kind)
        if tuple(t.shape) != want:
            raise CheckpointError(
                f"{root}: {name} has shape {list(t.shape)}, but the manifest's geometry and layout need "
                f"{list(want)}; convert the source again.")
        out[kind] = t
    return out


def gather_experts(root: Path, weight_map: dict[str, str], manifest: dict[str, Any], prefix: str,
                   experts: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """{kind: tensor} of a layer holding the logical ``experts`` in this order (EPLB's physical
    slots, a logical expert possibly twice): each expert's bytes taken from the rank that holds
    it, read (and checked) as that rank's tensors. The stored layouts keep each expert's bytes
    together (what ``convert`` writes expert by expert), followed by the layout's own trailing
    padding, which is rebuilt for the gathered count."""
    from mxfp4conv.format.manifest import SHUFFLE_PAD_BYTE
    from mxfp4conv.runtime.loader import parallel_layout

    par = parallel_layout(manifest)
    owner = {}
    for r in range(par.ranks):
        for local, e in enumerate(par.experts(r)):
            owner.setdefault(e, (r, local))
    ranks = {owner[e][0]: read_layer(root, weight_map, manifest, prefix, owner[e][0]) for e in experts}
    n, e_r = len(experts), int(manifest["moe"]["experts_per_rank"])
    target = for_experts(manifest, n)
    out = {}
    for kind in ranks[owner[experts[0]][0]]:
        name = str((manifest.get("layout") or {}).get(kind, "identity")) if kind in WEIGHT_KINDS else "identity"
        if name == "identity":
            out[kind] = torch.stack([ranks[owner[e][0]][kind][owner[e][1]] for e in experts])
            continue
        from mxfp4conv.shuffle.layouts import get_layout

        lay = get_layout(name)
        tail = int(lay.tail_bytes(canonical_shapes(manifest)[kind]))
        parts = []
        for e in experts:
            r, local = owner[e]
            flat = ranks[r][kind].reshape(-1)
            per = (flat.numel() - tail) // e_r
            parts.append(flat[local * per:(local + 1) * per])
        new_tail = int(lay.tail_bytes(canonical_shapes(target)[kind]))
        parts.append(torch.full((new_tail,), SHUFFLE_PAD_BYTE, dtype=torch.uint8))
        out[kind] = torch.cat(parts).reshape(stored_shape(target, kind))
    return out


def layer_manifest(manifest: dict[str, Any], plan) -> dict[str, Any]:
    """The manifest as a ``checks.LayerPlan``'s layer sees it (its own expert count under EPLB)."""
    return manifest if plan.experts is None else for_experts(manifest, len(plan.experts))


def layer_tensors(root: Path, weight_map: dict[str, str], manifest: dict[str, Any], plan) -> tuple[dict, dict]:
    """(stored tensors, manifest as the layer sees it) for a ``checks.LayerPlan``."""
    if plan.experts is None:
        return read_layer(root, weight_map, manifest, plan.prefix, plan.rank), manifest
    return gather_experts(root, weight_map, manifest, plan.prefix, plan.experts), layer_manifest(manifest, plan)
