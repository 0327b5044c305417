"""Probe run inside the vLLM worker: build one MoE layer's method as ``probe_moe`` does, give it
a tiny layer (``tiny_layer``: 2 experts, H = I = 256) with seeded bytes, run the vLLM release's
own ``process_weights_after_loading`` and report what its weight converter did (whichever
converter the release's method calls: 0.34's Quark method calls converter S for a model whose
``model_type`` is not gpt_oss).

A case is a ``probe_moe`` case plus ``seed`` and ``w13_rows`` ("gate_up", or "interleaved"
for a gpt-oss checkpoint, whose w13 rows are stored ``[g0, u0, ...]``), and optionally
``flashinfer``: the directory of an extracted ``flashinfer-python`` wheel, whose own Python
functions then answer vLLM's TRTLLM branches (``flashinfer_cpu``; the result's ``flashinfer``
lists what ran).

What runs for real: vLLM's methods and converters (``convert_weight_to_mxfp4_moe_kernel_format``,
``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format``, ``_swizzle_mxfp4``) and the wheel's
bundled ``triton_kernels`` (``convert_layout``, ``StridedLayout``, ``CDNA4MXScaleLayout``: pure
Python, CPU tensors). What stands in (``AITER_STAND_INS``), every call recorded with its
arguments: AITER's shuffles, answered by mxfp4conv's byte-exact reimplementations in
``mxfp4conv.shuffle.aiter`` (each proven against vectors made by AITER's own code in
``tests/test_aiter_golden.py``), and aiter's ``shuffle_scale_moe`` (gfx1250), which is not
reimplemented as a function: the stand-in records its input and returns it unchanged (its bytes
are proven by the golden vectors of ``tests/data/triton_kernels``). Kernel construction
(``make_mxfp4_moe_kernel``: prepare/finalize, GPU expert objects) is skipped by clearing the
method's ``experts_cls`` after selection; it does not touch the weights.

Result: ``backend``; ``tensors`` (w13, w13_scale, w2, w2_scale -> ``{"kind": "torch" |
"triton_kernels", "layout": triton_kernels layout class or None, "shape", "bytes"}``, bytes
in memory order, base64); ``calls`` (``{"fn", "args", "kwargs"}``; tensors summarised as
``{"shape", "dtype"}``, and ``shuffle_scale_moe``'s input kept as ``input`` bytes, ``[E, N, K/32]``);
``env_set``; or ``raised`` / ``message``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

import probe_moe as PM
import tiny_layer as T

REPO = Path(__file__).resolve().parent.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from mxfp4conv.shuffle import aiter as A  # noqa: E402

CALLS: list[dict] = []


def _summary(v):
    if isinstance(v, torch.Tensor):
        return {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (tuple, list)):
        return [_summary(x) for x in v]
    return type(v).__name__


def _recorded(name: str, impl):
    def call(*args, **kwargs):
        entry = {"fn": name, "args": [_summary(a) for a in args],
                 "kwargs": {k: _summary(v) for k, v in kwargs.items()}}
        CALLS.append(entry)
        return impl(entry, *args, **kwargs)
    return call


def _moe_scale_identity(entry, scale, **kwargs):
    entry["input"] = T.encode(scale.transpose(-2, -1))
    return scale


# module -> function -> stand-in (entry, *args, **kwargs) -> result
AITER_STAND_INS = {
    "aiter.ops.shuffle": {
        "shuffle_weight": lambda e, *a, **k: A.shuffle_weight(*a, **k),
        "shuffle_scale": lambda e, *a, **k: A.shuffle_scale(*a, **k),
        "shuffle_weight_a16w4": lambda e, *a, **k: A.shuffle_weight_a16w4(*a, **k),
        "shuffle_scale_a16w4": lambda e, *a, **k: A.shuffle_scale_a16w4(*a, **k),
    },
    "aiter.utility.fp4_utils": {"e8m0_shuffle": lambda e, *a, **k: A.e8m0_shuffle(*a, **k)},
    "aiter.ops.triton.utils.shuffle": {"shuffle_scale_moe": _moe_scale_identity},
}


def _install_stand_ins() -> None:
    import importlib

    for mod_name, fns in AITER_STAND_INS.items():
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:  # aiter absent on this platform: the converter cannot call it
            continue
        for fn, impl in fns.items():
            setattr(mod, fn, _recorded(fn, impl))


def _memory_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` in memory order (t must be a dense view of its storage)."""
    order = sorted(range(t.ndim), key=lambda d: (t.stride(d), t.shape[d]), reverse=True)
    dense = t.permute(order).contiguous()
    return dense.view(torch.uint8).flatten()


def _report(value) -> dict:
    layout = None
    if hasattr(value, "storage") and hasattr(value.storage, "data"):  # triton_kernels Tensor
        layout = type(value.storage.layout).__name__
        data, kind = value.storage.data, "triton_kernels"
    elif hasattr(value, "weight_scale"):  # PrecisionConfig (triton_kernels 3.5.1 / 3.6)
        return _report(value.weight_scale)
    elif isinstance(value, torch.Tensor):
        data, kind = value.data, "torch"
    else:
        return {"kind": type(value).__name__}
    return {"kind": kind, "layout": layout, "shape": list(data.shape),
            "dtype": str(data.dtype).replace("torch.", ""), "bytes": T.encode(_memory_bytes(data))}


def _fill(layer, case: dict) -> None:
    src = T.canonical(case["seed"])
    if case.get("w13_rows") == "interleaved":
        src = {**src, "w13": T.interleave_rows(src["w13"]),
               "w13_scale": T.interleave_rows(src["w13_scale"])}
    for name, attr in (("w13", "w13_weight"), ("w13_scale", "w13_weight_scale"),
                       ("w2", "w2_weight"), ("w2_scale", "w2_weight_scale")):
        p = getattr(layer, attr)
        assert tuple(p.shape) == tuple(src[name].shape), (attr, tuple(p.shape))
        p.data.view(torch.uint8).copy_(src[name])
    for attr in ("w13_bias", "w2_bias"):
        if getattr(layer, attr, None) is not None:
            getattr(layer, attr).data.normal_(generator=torch.Generator().manual_seed(case["seed"]))
    for attr in ("w13_input_scale", "w2_input_scale"):
        p = getattr(layer, attr, None)
        if isinstance(p, torch.Tensor):
            p.data.fill_(0.5)


def probe(case: dict) -> dict:
    import stubs  # the worker's

    import vllm.distributed as D
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.utils import import_utils

    for name, present in case.get("packages", {}).items():
        stubs.set_present(name, present)
    import_utils._has_module.cache_clear()
    import_utils._has_module_spec.cache_clear()
    before = PM._apply_env(case.get("env", {}))
    PM._vllm_config(case)
    # should_use_cdna4_mx_scale_swizzle reads the tensor-parallel size at conversion time
    D.get_tensor_model_parallel_world_size = lambda tp=case["tp"]: tp  # the TP group (EP or not)
    moe, _ = PM.moe_config(case)
    _install_stand_ins()
    if case.get("flashinfer"):  # FlashInfer's own functions for the TRTLLM branches
        import flashinfer_cpu

        flashinfer_used = flashinfer_cpu.install_into_stub(case["flashinfer"])
    CALLS.clear()
    try:
        method = PM.make_method(case, moe)
        out = {"backend": method.mxfp4_backend.name}
        if case.get("flashinfer"):
            out["flashinfer"] = flashinfer_used
        method.experts_cls = None  # skip building the GPU kernel objects
        layer = torch.nn.Module()
        layer.activation = MoEActivation(case["activation"])
        method.create_weights(layer, T.EXPERTS, T.HIDDEN, T.INTERMEDIATE, torch.bfloat16,
                              weight_loader=lambda *a, **k: None)
        _fill(layer, case)
        method.process_weights_after_loading(layer)
    except (ValueError, NotImplementedError, AssertionError, RuntimeError, AttributeError) as e:
        return {**locals().get("out", {}), "raised": type(e).__name__,
                "message": (str(e).splitlines() or [""])[0][:300], "calls": list(CALLS)}
    w13_scale = getattr(method, "w13_precision_config", None) or layer.w13_weight_scale
    w2_scale = getattr(method, "w2_precision_config", None) or layer.w2_weight_scale
    # triton_kernels backends: the tensors vLLM keeps (0.34 backs the parameters with their
    # storage and keeps the triton_kernels tensors as <name>_triton; 0.33 replaces the parameters)
    w13 = getattr(layer, "w13_weight_triton", layer.w13_weight)
    w2 = getattr(layer, "w2_weight_triton", layer.w2_weight)
    out["tensors"] = {"w13": _report(w13), "w13_scale": _report(w13_scale),
                      "w2": _report(w2), "w2_scale": _report(w2_scale)}
    out["calls"] = list(CALLS)
    out["env_set"] = {k: v for k, v in os.environ.items() if before.get(k) != v}
    return out
