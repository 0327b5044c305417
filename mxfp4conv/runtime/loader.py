"""Serve-time loader of a converted (kernel-ready) checkpoint: one rank's routed experts.

Reads ``mxfp4conv.json``, refuses a checkpoint whose format/version or target does not match
the request, then reads only ``{P}.experts.rank{r}.*`` tensors of the requested rank (one
``safe_open`` per shard, tensor by tensor). When the backend that will run cannot consume the
stored layout (an AITER shuffle anywhere but ROCm + aiter, or any non-identity layout for the
torch reference), the tensors are brought back to the canonical layout with the layouts'
inverses, and the loader says so once.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from mxfp4conv.checkpoint import strict_json
from mxfp4conv.checkpoint.safetensors_io import read_header
from mxfp4conv.convert.crc import crc32
from mxfp4conv.format.manifest import MANIFEST_NAME, SHARD_RE, expert_checksums, load_manifest, stamped_part
from mxfp4conv.errors import CheckpointError, RuntimeInputError
from mxfp4conv.runtime.experts import TENSOR_NAMES, WEIGHT_KINDS, MoEExperts, is_aiter_layout
from mxfp4conv.runtime.relayout import to_canonical

log = logging.getLogger(__name__)

INDEX = "model.safetensors.index.json"
RUNTIME_BACKENDS = ("auto", "torch", "triton", "aiter")
# set to 1 to load expert bytes without checking them against the manifest's crc32s (for bytes
# verified offline, e.g. with `mxfp4conv verify OUT`); load_moe_layers(check_checksums=False) too
SKIP_CHECKSUMS_ENV = "MXFP4CONV_SKIP_CHECKSUMS"


class LayoutConversionWarning(UserWarning):
    """The stored layout was converted at load time because the backend cannot consume it."""


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    root = Path(path)
    manifest = load_manifest(root)
    if manifest is None:
        raise CheckpointError(
            f"{root} has no {MANIFEST_NAME}, so it is not a checkpoint converted by mxfp4conv. "
            "Convert it first with `mxfp4conv convert SOURCE OUT --arch ...`, and load OUT."
        )
    _check_release(manifest, root / MANIFEST_NAME)
    return manifest


def _check_release(manifest: dict[str, Any], where: Path) -> None:
    """Refuse bytes decided for a vLLM release this mxfp4conv does not model: the runtime
    follows the manifest's release (``oracle.releases``; e.g. AITER's pads), and an unknown
    one gives it nothing to follow. (In vLLM, the plugin's live checks judge instead.)"""
    from mxfp4conv.oracle.releases import RELEASE_LIST, release_of_version

    recorded = manifest.get("vllm")
    if recorded is None:
        return
    if release_of_version(str(recorded)) is None:
        known = ", ".join(r.version for r in RELEASE_LIST)
        raise CheckpointError(
            f"{where}: this checkpoint was converted for vLLM {recorded}, but this mxfp4conv models "
            f"vLLM {known}; its backend, padding, layouts and server environment may not be what "
            f"that release does. Convert the source again with `mxfp4conv convert ... --vllm "
            f"{RELEASE_LIST[-1].key}` (or the release the server runs), or load it with the "
            "mxfp4conv release that wrote it.")


def _resolve_arch(name: str) -> str:
    try:
        from mxfp4conv.oracle import resolve_arch
    except ImportError:  # oracle not available: compare names as given
        return name.lower()
    try:
        return resolve_arch(name)
    except Exception:  # unknown alias: let the comparison below name it
        return name.lower()


def rank_tensor_names(weight_map: dict[str, str], prefix: str, rank: int, where) -> dict[str, str]:
    """{kind: tensor name} of one layer's experts on ``rank``; every weight and scale must be there."""
    base = f"{prefix}.experts.rank{rank}."
    names = {kind: base + suffix for kind, suffix in TENSOR_NAMES.items() if base + suffix in weight_map}
    missing = [base + TENSOR_NAMES[k] for k in WEIGHT_KINDS if k not in names]
    if missing:
        raise CheckpointError(
            f"{where}: tensor {missing[0]} is not in {INDEX} (layer {prefix!r}, rank {rank}); the conversion "
            "is incomplete or for other ranks. Convert the source again.")
    return names


def is_rocm(device: torch.device) -> bool:
    return device.type == "cuda" and getattr(torch.version, "hip", None) is not None


def aiter_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("aiter") is not None


def _triton_moe():
    try:
        from mxfp4conv.kernels import triton_moe
    except Exception:  # no triton (or no usable build) here
        return None
    return triton_moe


def triton_layout(layout: dict[str, str]) -> str | None:
    """The Triton kernels' name for a set of stored layouts (w13, w13_scale, w2, w2_scale), or
    None when they cannot read it."""
    tm = _triton_moe()
    if tm is None:
        return "identity" if all(layout.get(k, "identity") == "identity" for k in WEIGHT_KINDS) else None
    return tm.layout_of(layout)


def choose_backend(requested: str, layout: dict[str, str], device: torch.device, act_quant: str = "none") -> str:
    """Runtime backend (torch | triton | aiter) for ``auto`` or an explicit request: aiter for an
    AITER layout with aiter on ROCm, else triton on a GPU (W4A16 only), else torch."""
    if requested != "auto":
        return requested
    stored_aiter = any(is_aiter_layout(layout.get(k, "identity")) for k in WEIGHT_KINDS)
    if stored_aiter and is_rocm(device) and aiter_available():
        return "aiter"
    if device.type == "cuda" and act_quant == "none" and _triton_moe() is not None:
        return "triton"
    return "torch"


def _consumable(backend: str, layout: dict[str, str]) -> bool:
    names = [layout.get(k, "identity") for k in WEIGHT_KINDS]
    if backend == "aiter":
        return True  # checked separately: must be an AITER layout
    if backend == "triton":
        return triton_layout(layout) is not None
    return all(n == "identity" for n in names)


def apply_runtime_env(env: dict[str, str]) -> dict[str, str]:
    """Set the manifest's runtime environment in ``os.environ``; returns what was set."""
    applied = {}
    for key, value in (env or {}).items():
        value = str(value)
        old = os.environ.get(key)
        if old is not None and old != value:
            log.warning("runtime_env: overriding %s=%s with %s (required by the converted checkpoint)", key, old, value)
        os.environ[key] = value
        applied[key] = value
    if applied:
        log.info("runtime_env set: %s", ", ".join(f"{k}={v}" for k, v in applied.items()))
    return applied


def _weight_map(root: Path) -> dict[str, str]:
    index = root / INDEX
    if index.is_file():
        fix = "Re-run `mxfp4conv convert`."
        try:
            obj = strict_json.loads(index.read_bytes(), str(index), "safetensors index", fix)
        except OSError as exc:
            raise CheckpointError(f"{index}: cannot read the index ({exc.strerror}). {fix}") from None
        wm = obj.get("weight_map") if isinstance(obj, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(v, str) and SHARD_RE.match(v) for v in wm.values()):
            raise CheckpointError(f"{index} is not the index mxfp4conv writes (a weight_map of tensor "
                                  f"names to model-NNNNN-of-NNNNN.safetensors shards). {fix}")
        return dict(wm)
    single = root / "model.safetensors"
    if single.is_file():
        return {name: single.name for name in read_header(single).tensors}
    raise CheckpointError(f"{root} has neither {INDEX} nor model.safetensors; the conversion is incomplete.")


def _shard_headers(root: Path, weight_map: dict[str, str], manifest: dict) -> dict:
    """Every shard's header, checked (complete file, the manifest stamped in it)."""
    headers = {}
    for shard in sorted(set(weight_map.values())):
        spath = root / shard
        if not spath.is_file():
            raise CheckpointError(f"{spath} (listed in {INDEX}) is missing; the conversion is incomplete.")
        headers[shard] = read_header(spath)  # a truncated or damaged shard fails here, with its name
        _check_stamp(headers[shard], manifest)
    return headers


def checksums_to_check(manifest: dict, root: Path, weight_map: dict[str, str],
                       check: bool = True) -> dict[str, int] | None:
    """The manifest's crc32 of every routed-expert tensor, or None when checking is switched off
    (``check`` False, or ``MXFP4CONV_SKIP_CHECKSUMS=1``). The table must name exactly the
    expert tensors of ``weight_map`` (the index)."""
    if not check or os.environ.get(SKIP_CHECKSUMS_ENV, "").strip().lower() in ("1", "true", "yes"):
        return None
    table = expert_checksums(manifest)
    if table is None:
        raise CheckpointError(
            f"{root / MANIFEST_NAME} records no crc32 of the expert tensors (an mxfp4conv that did not "
            f"record them converted it), so the bytes cannot be checked as they load. Convert the source "
            f"again; or, for bytes you verified yourself (`mxfp4conv verify {root} --source SOURCE`), load "
            f"with check_checksums=False, or set {SKIP_CHECKSUMS_ENV}=1 for the vLLM plugin.")
    experts = {n for n in weight_map if ".experts.rank" in n}
    if table.keys() != experts:
        odd = sorted(experts - table.keys()) or sorted(table.keys() - experts)
        what = "lacks" if odd[0] in experts else "names a tensor the index does not hold,"
        raise CheckpointError(
            f"{root / MANIFEST_NAME}: its crc32 table {what} {odd[0]}; the manifest was edited or "
            f"belongs to another conversion. Convert the source again.")
    return table


def _check_crc(spath: Path, name: str, t: torch.Tensor, crcs: dict[str, int]) -> None:
    """The tensor's bytes against the crc32 convert recorded for them."""
    want = crcs.get(name)
    rank = name.split(".experts.rank", 1)[-1].split(".", 1)[0]
    if want is None:
        raise CheckpointError(
            f"{spath.parent / MANIFEST_NAME} records no crc32 for {name} (rank {rank}); the manifest was "
            f"edited or belongs to another conversion. Convert the source again.")
    flat = t.reshape(-1)
    got = crc32(flat.view(torch.uint8).numpy() if flat.numel() else b"")
    if got != want:
        raise CheckpointError(
            f"{spath}: the bytes of tensor {name} (rank {rank}) changed since convert wrote them: crc32 "
            f"{got:08x}, {MANIFEST_NAME} records {want:08x}. Copy the shard again or convert the source "
            f"again (`mxfp4conv verify {spath.parent}` checks every shard). Loading was stopped so that "
            f"no wrong weight is served; {SKIP_CHECKSUMS_ENV}=1 (or check_checksums=False) skips the "
            f"check for bytes you verified yourself.")


def _read_tensors(root: Path, names: list[str], weight_map: dict[str, str], headers: dict,
                  crcs: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """``crcs``: {name: crc32} each tensor read is checked against (None: no check)."""
    by_shard: dict[str, list[str]] = defaultdict(list)
    for n in names:
        by_shard[weight_map[n]].append(n)
    out = {}
    for shard, shard_names in by_shard.items():
        spath = root / shard
        header = headers[shard]
        for n in shard_names:
            if n not in header.tensors:
                raise CheckpointError(f"{spath} does not hold {n}, although {INDEX} says it does; re-run `mxfp4conv convert`.")
        try:
            with safe_open(str(spath), framework="pt", device="cpu") as f:
                for n in shard_names:
                    out[n] = f.get_tensor(n)
                    if crcs is not None:
                        _check_crc(spath, n, out[n], crcs)
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{spath}: the shard cannot be read ({exc}); re-run `mxfp4conv convert`.") from None
    return out


def _check_stamp(header, manifest: dict) -> None:
    """Every shard carries the manifest it was written with: an edited mxfp4conv.json, or
    shards of two conversions mixed, must not load."""
    stamped = header.metadata.get("mxfp4conv")
    try:
        same = stamped is not None and json.loads(stamped) == stamped_part(manifest)
    except (ValueError, RecursionError):
        same = False
    if not same:
        raise CheckpointError(
            f"{header.path}: the manifest stamped in this shard's __metadata__ differs from "
            f"{MANIFEST_NAME} (the manifest was edited, or shards of different conversions are mixed). "
            f"Restore the original {MANIFEST_NAME}, or convert the source again.")


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def _check_int(manifest_moe: dict, key: str, where: str) -> int:
    v = manifest_moe.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise CheckpointError(f"{where}: moe.{key} is {v!r}, expected a non-negative integer; re-run `mxfp4conv convert`.")
    return v


def _check_request(manifest: dict, where: str, rank: int, arch: str | None, tp: int | None, backend: str) -> None:
    target = manifest["target"]
    m_tp = int(target.get("tp", 1))
    if arch is not None and _resolve_arch(arch) != _resolve_arch(str(target.get("arch"))):
        raise RuntimeInputError(
            f"{where} was converted for arch {target.get('arch')!r}, but arch {arch!r} was requested. "
            f"Load it on a {target.get('arch')} server, or convert the source again with --arch {arch}."
        )
    if tp is not None and int(tp) != m_tp:
        raise RuntimeInputError(
            f"{where} was converted for tp={m_tp}{' with --ep' if target.get('ep') else ''}, but tp={tp} was "
            f"requested. Serve it with tp={m_tp}, or convert the source again with --tp {tp}."
        )
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < m_tp:
        raise RuntimeInputError(
            f"rank {rank!r} is out of range for {where}, which holds ranks 0..{m_tp - 1} (tp={m_tp}). "
            "Pass the MoE rank of this process: vLLM's tensor-parallel rank flattened with the data-parallel "
            "rank, parallel_layout(path).moe_rank(dp_rank, tp_rank)."
        )
    if backend not in RUNTIME_BACKENDS:
        if backend.upper() != str(target.get("backend", "")).upper():
            raise RuntimeInputError(
                f"{where} was converted for backend {target.get('backend')!r}, but backend {backend!r} was "
                f"requested. Use backend='auto' (or one of {', '.join(RUNTIME_BACKENDS)}), or convert the "
                f"source again for {backend}."
            )


def parallel_layout(manifest_or_path) -> "MoeParallel":  # noqa: F821
    """The parallel layout a converted checkpoint was written for (a ``MoeParallel``): the
    server's tp / dp / placement, ``moe_rank(dp_rank, tp_rank)`` (vLLM's flattening: the rank
    to pass to ``load_moe_layers``), ``experts(rank)`` and ``expert_map(rank)``. Manifests of
    version 1 hold tp ranks with data parallel 1 and linear placement."""
    from mxfp4conv.format.parallel import from_record

    m = manifest_or_path if isinstance(manifest_or_path, dict) else read_manifest(Path(manifest_or_path))
    t = m["target"]
    return from_record(t.get("parallel"), tp=int(t["tp"]), ep=bool(t["ep"]), num_experts=int(m["moe"]["num_experts"]))


def _device(device) -> torch.device:
    """``device`` as a torch device that exists here: a missing GPU is one clear error, before
    anything is read (torch would fail later, on the first copy, with a driver traceback)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise RuntimeInputError(f"device {device!r} is not a torch device name ({exc}); pass e.g. 'cpu' or 'cuda:0'.") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= count:
            have = (f"only {count} CUDA device(s): load on cuda:0 to cuda:{count - 1}, or on" if count
                    else "no CUDA device: load on")
            raise RuntimeInputError(f"device {device!r}: this machine has {have} device='cpu' (the torch "
                                    f"reference backend).")
    return dev


def load_moe_layers(
    path: str | os.PathLike,
    rank: int = 0,
    device: str | torch.device = "cpu",
    backend: str = "auto",
    arch: str | None = None,
    tp: int | None = None,
    check_checksums: bool = True,
) -> dict[str, MoEExperts]:
    """Load this rank's routed experts of every MoE layer, keyed by module prefix.

    ``rank``: the MoE rank (tp x dp flattened as vLLM does: ``parallel_layout(path).moe_rank(
    dp_rank, tp_rank)``); each layer knows its global expert ids (``expert_ids``, ``expert_map``).

    ``backend``: ``auto`` | ``torch`` | ``triton`` | ``aiter``, or the manifest's vLLM backend
    name (which must match). ``arch`` / ``tp``: when given, must match the manifest.
    ``check_checksums``: check every expert tensor's bytes against the manifest's crc32 as they
    are read (False, or ``MXFP4CONV_SKIP_CHECKSUMS=1``: only for bytes verified offline).
    """
    root = Path(path)
    manifest = read_manifest(root)
    where = str(root)
    _check_request(manifest, where, rank, arch, tp, backend)
    weight_map = _weight_map(root)
    # only the shards this rank reads: a node may hold its ranks' share of the files alone
    mine = {n for prefix in (manifest["moe"].get("layers") or [])
            for n in rank_tensor_names(weight_map, prefix, rank, where).values()}
    headers = _shard_headers(root, {n: s for n, s in weight_map.items() if n in mine}, manifest)
    crcs = checksums_to_check(manifest, root, weight_map, check_checksums)
    target, moe, layout = manifest["target"], manifest["moe"], manifest["layout"]
    dev = _device(device)
    stored_layout = {k: str(layout.get(k, "identity")) for k in WEIGHT_KINDS}
    stored_aiter = any(is_aiter_layout(n) for n in stored_layout.values())
    runtime_env = {str(k): str(v) for k, v in (manifest.get("runtime_env") or {}).items()}
    from mxfp4conv.runtime.act_quant import served_act_quant

    target_act, situv2_mode = served_act_quant(target, runtime_env, stored_layout, where)
    run_backend = choose_backend(backend if backend in RUNTIME_BACKENDS else "auto", stored_layout, dev, target_act)
    if run_backend == "aiter" and not stored_aiter:
        raise RuntimeInputError(
            f"backend 'aiter' needs a checkpoint converted for an AITER backend (aiter_* layouts), but {where} "
            f"was converted for {target.get('backend')!r} with layouts {stored_layout}. Use backend='torch' or "
            "'triton', or convert the source again with --arch gfx950."
        )
    convert = not _consumable(run_backend, stored_layout)
    if convert:
        msg = (
            f"{where} stores experts in layouts {stored_layout} for {target.get('backend')!r} on "
            f"{target.get('arch')!r}; backend {run_backend!r} on {dev} cannot consume them, so they are "
            "converted to the canonical identity layout with the layouts' inverses at load time."
        )
        warnings.warn(msg, LayoutConversionWarning, stacklevel=2)

    hidden = _check_int(moe, "hidden", where)
    num_experts = _check_int(moe, "num_experts", where)
    m_tp = int(target.get("tp", 1))
    ep = bool(target.get("ep", False))
    experts_per_rank = _check_int(moe, "experts_per_rank", where)  # validate_manifest checked it against tp / ep
    par = parallel_layout(manifest)
    ids = tuple(par.experts(rank))
    geometry = dict(
        hidden=hidden,
        hidden_padded=_check_int(moe, "hidden_padded", where),
        intermediate=_check_int(moe, "intermediate", where),
        intermediate_per_rank=_check_int(moe, "intermediate_per_rank", where),
        intermediate_per_rank_padded=_check_int(moe, "intermediate_per_rank_padded", where),
        num_experts=num_experts,
        experts_per_rank=experts_per_rank,
        expert_offset=ids[0] if ids else 0,
        expert_ids=ids,
        parallel=par.record(_check_int(moe, "intermediate", where)),
        top_k=int(moe.get("top_k", 0)),
    )
    activation = target["activation"]
    if not activation:
        raise CheckpointError(f"{where}: the manifest's target has no 'activation'; re-run `mxfp4conv convert`.")
    params = target["activation_params"] or {}
    applied = apply_runtime_env(runtime_env) if run_backend == "aiter" else {}
    if situv2_mode and run_backend == "aiter":
        from mxfp4conv.runtime.situv2 import sync_aiter_env

        applied.update(sync_aiter_env(situv2_mode))
    if runtime_env and run_backend != "aiter":
        log.info("runtime_env %s not applied: it is for AITER, and backend %s runs these experts", runtime_env, run_backend)

    layers = moe.get("layers") or []
    if not layers:
        raise CheckpointError(f"{where}: moe.layers is empty; the manifest lists no MoE layer to load.")
    result: dict[str, MoEExperts] = {}
    for prefix in layers:
        wanted = rank_tensor_names(weight_map, prefix, rank, where)
        tensors = _read_tensors(root, list(wanted.values()), weight_map, headers, crcs)
        t = {kind: tensors[name] for kind, name in wanted.items()}
        ex = MoEExperts(
            prefix=prefix,
            w13_weight=_as_bytes(t["w13"]),
            w13_weight_scale=_as_bytes(t["w13_scale"]),
            w2_weight=_as_bytes(t["w2"]),
            w2_weight_scale=_as_bytes(t["w2_scale"]),
            w13_bias=t["w13_bias"].float() if "w13_bias" in t else None,
            w2_bias=t["w2_bias"].float() if "w2_bias" in t else None,
            w13_input_scale=t["w13_input_scale"].float().reshape(-1) if "w13_input_scale" in t else None,
            w2_input_scale=t["w2_input_scale"].float().reshape(-1) if "w2_input_scale" in t else None,
            arch=str(target.get("arch")),
            backend=str(target.get("backend")),
            tp=m_tp,
            ep=ep,
            rank=rank,
            act_quant=target_act,
            activation=str(activation),
            activation_params={k: float(v) for k, v in params.items() if v is not None},
            layout=dict(stored_layout),
            stored_layout=dict(stored_layout),
            gate_mode=str(target.get("gate_mode", "separated")).lower(),
            situv2=situv2_mode,
            is_shuffled=stored_aiter,
            runtime_env=runtime_env,
            runtime_env_applied=applied,
            manifest=manifest,
            **geometry,
        )
        _check_shapes(ex, f"{prefix}.experts.rank{rank}.")
        if convert:
            ex = to_canonical(ex)
        ex = _to_device(ex, dev)
        tm = _triton_moe()
        if tm is not None and triton_layout(ex.layout) in tm.HOPPER_SETS:
            # the Hopper kernels' large-scale flag: one reduction now rather than at the first forward
            # (which may be inside a CUDA graph capture)
            tm._big_scales(ex.w13_weight_scale, ex.w2_weight_scale)
        result[prefix] = ex
    return result


# stored with the canonical 3-D shape
SHAPE_KEEPING = ("identity", "triton_gu1", "hopper_mma_w", "hopper_mma_w_rot", "hopper_mma_w_xor", "hopper_mma_s")


def _check_shapes(ex: MoEExperts, base: str) -> None:
    for kind in WEIGHT_KINDS:
        t = ex.tensor(kind)
        if ex.layout[kind] in SHAPE_KEEPING and tuple(t.shape) != ex.shape3d(kind):
            raise CheckpointError(
                f"{base}{TENSOR_NAMES[kind]} has shape {list(t.shape)}, but the manifest's geometry (experts "
                f"{ex.experts_per_rank}, hidden_padded {ex.hidden_padded}, intermediate_per_rank_padded "
                f"{ex.intermediate_per_rank_padded}) needs {list(ex.shape3d(kind))}; re-run `mxfp4conv convert`."
            )
    e, h, i = ex.experts_per_rank, ex.hidden_padded, ex.intermediate_per_rank_padded
    for name, t, shape in (
        ("w13_bias", ex.w13_bias, (e, 2 * i)),
        ("w2_bias", ex.w2_bias, (e, h)),
        ("w13_input_scale", ex.w13_input_scale, (e,)),
        ("w2_input_scale", ex.w2_input_scale, (e,)),
    ):
        if t is not None and tuple(t.shape) != shape:
            raise CheckpointError(f"{base}{name} has shape {list(t.shape)}, expected {list(shape)}; re-run `mxfp4conv convert`.")


def _to_device(ex: MoEExperts, dev: torch.device) -> MoEExperts:
    import dataclasses

    if dev.type != "cpu":
        moved = {
            name: getattr(ex, name).to(dev)
            for name in TENSOR_NAMES.values()
            if getattr(ex, name) is not None
        }
        ex = dataclasses.replace(ex, **moved)
    if ex.is_aiter:
        # AITER's fused_moe picks its pre-shuffled kernels from this attribute.
        ex.w13_weight.is_shuffled = True
        ex.w2_weight.is_shuffled = True
    return ex
