"""Put one rank's converted experts into a vLLM MoE layer and have vLLM build its kernel on them.

``install`` runs after the rest of the model is loaded and before vLLM's
``process_weights_after_loading``:

- ``vllm_transforms``: the bytes (in the identity layout, undoing any other) go into the layer's
  parameters as vLLM's weight loader would leave them (no slicing or padding: they are this
  rank's, padded already), and vLLM's own ``process_weights_after_loading`` converts them.
- ``kernel_ready``: the layer's ``process_weights_after_loading`` becomes vLLM's own, judged by
  the engine (``judge``): the first layer of each kind is a canary that vLLM converts from the
  canonical bytes and that must equal the stored bytes; the others run with vLLM's weight
  converter answering with the stored bytes (or, where the release offers it for the layer,
  through vLLM's own pre-processed-weights path: ``pre_processed``), and their converted
  parameters are checked equal to them afterwards. Everything vLLM does after its conversion (parameter replacement, quant config,
  kernel and experts set-up) runs unchanged.
- ``mxfp4conv_kernel`` layers are loaded by ``experts.install_mxfp4conv_kernel``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from mxfp4conv.errors import RuntimeInputError
from mxfp4conv.integrations.vllm import pre_processed, weights
from mxfp4conv.integrations.vllm.checks import LayerPlan, release_of
from mxfp4conv.integrations.vllm.judge import (
    CONVERT, READY, STRICT_ENV, Judge, Verdict, compare, converter_functions, converters_replaced, strict_from,
)

log = logging.getLogger(__name__)

ORDER = ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_bias", "w2_bias")


def _copy_into(layer, name: str, t: torch.Tensor, where: str) -> None:
    param = getattr(layer, name, None)
    if not isinstance(param, torch.Tensor):
        raise RuntimeInputError(
            f"{where} holds {name}, but vLLM's layer {getattr(layer, 'layer_name', '?')!r} has no such parameter "
            "(the checkpoint's config and the converted experts disagree); convert the source again.")
    if tuple(param.shape) != tuple(t.shape):
        raise RuntimeInputError(
            f"{where}: {name} has shape {list(t.shape)}, vLLM's parameter {list(param.shape)}; convert the "
            "source again for this server.")
    with torch.no_grad():
        param.data.copy_(t.to(param.device))


def load_canonical(layer, method: str, stored: dict[str, torch.Tensor], manifest: dict[str, Any], where: str) -> None:
    """``stored`` in the identity layout, put into the layer's parameters as vLLM's weight loader
    leaves them; vLLM's ``process_weights_after_loading`` then converts them itself."""
    for name, t in weights.loaded_form(method, canonical(stored, manifest, where)).items():
        _copy_into(layer, name, t, where)


def install(layer, plan: LayerPlan, stored, manifest: dict[str, Any], where: str,
            judge: Judge | None = None) -> None:
    """Load one rank's tensors of one layer (``stored``: {kind: tensor}, or a function that reads
    them) into ``layer`` as ``plan`` says. Kernel-ready bytes are read when vLLM processes the layer,
    so that the device holds one layer's stored copy at a time next to vLLM's parameters.
    ``judge``: the load's shared verdicts (``judge.Judge``); one of its own when None."""
    qm = layer.quant_method
    method = type(qm).__name__
    if plan.mode not in ("vllm_transforms", "kernel_ready"):
        raise ValueError(f"install() loads vllm_transforms / kernel_ready layers, not {plan.mode}")
    if plan.mode == "vllm_transforms":
        load_canonical(layer, method, stored() if callable(stored) else stored, manifest, where)
        return
    activation = getattr(layer.activation, "value", str(layer.activation)).lower()
    if judge is None:
        judge = new_judge(manifest, where)
    kind = (method, qm.mxfp4_backend.name, activation)
    vllm_process = type(qm).process_weights_after_loading
    pending = {"stored": stored}

    def process_weights_after_loading(layer_):
        try:
            got = pending.pop("stored")
            device = layer_.w13_weight.device
            on_device = {k: t.to(device) for k, t in (got() if callable(got) else got).items()}
            form = weights.kernel_form(method, qm.mxfp4_backend.name, activation, on_device, manifest, where)
            for name in ("w13_input_scale", "w2_input_scale"):
                if name in form:
                    _copy_into(layer_, name, form.pop(name), where)
            ready = {n: form[n] for n in ORDER if form.get(n) is not None}
            _judged_process(judge, kind, qm, layer_, vllm_process, on_device, ready, manifest, where)
        finally:  # vLLM's parameters hold what is kept; the stored and canonical copies go
            qm.__dict__.pop("process_weights_after_loading", None)

    qm.process_weights_after_loading = process_weights_after_loading


def new_judge(manifest: dict[str, Any], where: str, extra_config: dict | None = None) -> Judge:
    import vllm

    from mxfp4conv.integrations.vllm.checks import manifest_release

    return Judge(where=where, manifest_release=manifest_release(manifest), engine_release=str(vllm.__version__),
                 strict=strict_from(extra_config))


def _judged_process(judge: Judge, kind: tuple, qm, layer, vllm_process, stored, ready, manifest, where) -> None:
    method, backend, _ = kind
    name = getattr(layer, "layer_name", "?")
    verdict = judge.verdict(kind)
    if verdict is None:
        judge.verdicts[kind] = _canary(judge, qm, layer, vllm_process, stored, ready, manifest, where)
        return
    if verdict.outcome == CONVERT:
        load_canonical(layer, method, stored, manifest, where)
        vllm_process(qm, layer)
        return
    module, functions = converter_functions(qm)

    def answering(fn_name, original):
        def already_converted(*args, **kwargs):
            asked = kwargs.get("mxfp4_backend", args[0] if args else None)
            if asked != qm.mxfp4_backend:
                raise RuntimeInputError(f"{where}: vLLM asked to convert for {asked}, the checkpoint holds {backend}.")
            return tuple(handed.get(n) for n in ORDER)
        return already_converted

    # vLLM keeps the tensors it is handed and may write into them: the check needs its own copy
    # (one layer's expert bytes on the device, freed after the check)
    handed = {n: _same_flags(_byte_copy(t), t) for n, t in ready.items()}
    official = pre_processed.context(qm)
    if official is not None:  # vLLM's own path for weights already in kernel format
        pre_processed.process(qm, layer, vllm_process, handed, official)
        judge.pre_processed += 1
        if judge.pre_processed == 1:
            log.info("mxfp4conv: %s: %s layers after the canary load through vLLM %s's own "
                     "weights_already_processed path (%s, %s)", where, method, judge.engine_release, method, backend)
    else:
        with converters_replaced(module, functions, answering):
            vllm_process(qm, layer)
    diff = compare(layer, ready)
    if diff is not None:
        tensor, where_diff = diff
        raise RuntimeInputError(
            f"{where}: after vLLM {judge.engine_release}'s process_weights_after_loading, MoE layer {name!r} "
            f"parameter {tensor} no longer holds the converted checkpoint's bytes (first difference at {where_diff}): "
            f"this vLLM transformed the kernel-ready bytes again (its conversion took another path than on the "
            f"canary layer {verdict.canary_layer!r}; the checkpoint was written for "
            f"{'vLLM ' + judge.manifest_release if judge.manifest_release else 'an unnamed vLLM release'}). "
            f"Nothing was served. Convert the source again for vLLM "
            f"{judge.engine_release} with `--layout identity`, so that vLLM converts at start-up, and report it.")
    judge.checked += 1


def _canary(judge: Judge, qm, layer, vllm_process, stored, ready, manifest, where) -> Verdict:
    """vLLM converts this layer's canonical bytes itself; its result is compared with the stored bytes."""
    method = type(qm).__name__
    name = getattr(layer, "layer_name", "?")
    t0 = time.perf_counter()
    load_canonical(layer, method, stored, manifest, where)
    module, functions = converter_functions(qm)
    seen: list[str] = []

    def watching(fn_name, original):
        def converter(*args, **kwargs):
            seen.append(fn_name)
            return original(*args, **kwargs)
        return converter

    with converters_replaced(module, functions, watching):
        vllm_process(qm, layer)
    diff = compare(layer, ready)
    seconds = time.perf_counter() - t0
    written = f"vLLM {judge.manifest_release}" if judge.manifest_release else "an unnamed vLLM release"
    if diff is None and len(seen) == 1:
        log.info("mxfp4conv: %s: canary layer %s: vLLM %s's own conversion of the canonical bytes equals the "
                 "checkpoint's (written for %s) in every tensor (%.2f s); the other layers of this kind skip "
                 "vLLM's conversion", where, name, judge.engine_release, written, seconds)
        return Verdict(READY, "equal", name, seconds)
    if diff is None:
        reason = (f"vLLM {judge.engine_release} converted layer {name!r} through {len(seen)} calls of "
                  f"{', '.join(sorted(set(seen))) or 'no converter function mxfp4conv knows'}, so the plugin cannot "
                  "hand it the converted bytes; vLLM converts every layer itself (the bytes are equal: only the "
                  "start-up saving is lost)")
        log.warning("mxfp4conv: %s: %s", where, reason)
        return Verdict(CONVERT, reason, name, seconds)
    tensor, where_diff = diff
    message = (f"{where}: the converted checkpoint's bytes for MoE layer {name!r} ({method}, {qm.mxfp4_backend.name}) "
               f"differ from what this vLLM {judge.engine_release} makes of the same weights: {tensor} first "
               f"differs at {where_diff}. The checkpoint was written for {written}.")
    if judge.strict:
        raise RuntimeInputError(
            f"{message} Strict mode ({STRICT_ENV}=1 or the loader's \"strict\" option) refuses to load it. Convert "
            f"the source again with `mxfp4conv convert ... --vllm {release_of(judge.engine_release)}` (or "
            "`--layout identity`), or serve it without strict mode: vLLM then converts the canonical bytes itself.")
    log.warning("mxfp4conv: %s vLLM is handed the canonical bytes of every layer of this kind and converts them "
                "itself (correct; only the start-up saving is lost). Convert the source again with --vllm %s to "
                "get it back.", message, release_of(judge.engine_release))
    return Verdict(CONVERT, message, name, seconds)


def canonical(stored: dict[str, torch.Tensor], manifest: dict[str, Any], where: str) -> dict[str, torch.Tensor]:
    """``stored`` with every weight and scale in the identity layout (the layouts' inverses)."""
    from mxfp4conv.integrations.vllm.rank_tensors import canonical_shapes
    from mxfp4conv.runtime.relayout import invert_tensor

    layout, shapes = manifest.get("layout") or {}, canonical_shapes(manifest)
    out = dict(stored)
    for kind in ("w13", "w13_scale", "w2", "w2_scale"):
        name = str(layout.get(kind, "identity"))
        if name != "identity":
            out[kind] = invert_tensor(name, stored[kind], shapes[kind], f"{where} {kind}")
            log.info("%s: %s stored as %s, undone at load for vLLM's own conversion", where, kind, name)
    return out


def _same_flags(copy: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``copy`` with ``t``'s ``is_shuffled`` mark (vLLM's AITER path reads it)."""
    flag = getattr(t, "is_shuffled", None)
    if flag is not None:
        copy.is_shuffled = flag
    return copy


def _byte_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t``'s bytes in its dtype and shape (a plain memcpy for fp4 / e8m0 too)."""
    if t.element_size() == 1 and t.is_contiguous():
        return t.view(torch.uint8).clone().view(t.dtype)
    return t.clone()
