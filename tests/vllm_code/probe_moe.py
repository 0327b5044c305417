"""Probe run inside the vLLM worker: build one MXFP4 MoE layer's method the way the vLLM release
on ``sys.path`` does (0.33.0, 0.34.0 or any wheel the harness is given) and report what it decided.

A case (JSON)::

    {"method": "mxfp4" | "gpt_oss" | "quark",  # Mxfp4MoEMethod / GptOssMxfp4MoEMethod /
                                               # QuarkOCP_MX_MoEMethod
     "activation": "situ" | "silu" | "swigluoai" | ...,
     "situ_linear_beta": 25.0 | null,            # Kimi-K3 sets it
     "routing": "Renormalize" | "DeepseekV4" | ...,
     "hidden": 7168, "intermediate_per_partition": 384,
     "num_experts": 8, "num_local_experts": 8, "top_k": 2,
     "tp": 1, "ep": false,
     "quark_input": null | "mxfp4" | "fp8",     # the Quark scheme's activations
     "moe_activation": null | "mxfp4" | ...,    # quantization_config.moe.activation override
     "moe_activation_null": false | true,       # the override given as an explicit null (bf16)
     "moe_weight": null | "int4_per_group_32",  # quantization_config.moe.weight (server option)
     "moe_backend": "auto" | vLLM --moe-backend string,
     "env": {"VLLM_ROCM_USE_AITER": "1", ...},
     "packages": {"quark": true}}               # optional stubbed packages present or not

Result: ``backend`` (Mxfp4MoeBackend member name), ``experts_cls``, ``hidden_padded``,
``intermediate_padded`` (``maybe_roundup_sizes``), ``env_set`` (variables the method wrote
into ``os.environ``); or ``raised`` / ``message`` when vLLM raised. With ``moe_weight`` set
also ``online_moe_method`` (the class name vLLM's ``OnlineQuantizationConfig`` resolves for
a routed-experts layer, or None: the checkpoint method stays), ``int4`` (Mxfp4MoEMethod's
``is_k3_situ_int4_gfx942``) and, on that path, ``int4_weight_key`` / ``int4_kernel_config``
(the quant keys ``_mxfp4_quant_keys_for_experts`` gives the experts class and the outcome of
``_validate_mxfp4_experts_config``, which the kernel build runs).
"""

from __future__ import annotations

import os
import types

import torch

# imported before the first case, so that the environment they set at import is the baseline
import vllm.model_executor.layers.quantization.mxfp4  # noqa: F401
import vllm.model_executor.layers.quantization.quark.quark_moe  # noqa: F401

_BASE_ENV: dict[str, str | None] = {}


def _apply_env(env: dict[str, str]) -> dict[str, str | None]:
    """Set the case's variables over a clean base; returns the snapshot to diff against."""
    global _BASE_ENV
    if not _BASE_ENV:
        _BASE_ENV = dict(os.environ)
    for k in list(os.environ):
        if k not in _BASE_ENV:
            del os.environ[k]
    os.environ.update({k: v for k, v in _BASE_ENV.items() if v is not None})
    os.environ.update(env)
    from vllm.platforms import current_platform
    if current_platform.is_rocm():
        from vllm._aiter_ops import rocm_aiter_ops
        rocm_aiter_ops.refresh_env_variables()
    return dict(os.environ)


def _vllm_config(case: dict):
    import vllm.config.vllm as V
    from vllm.config.quantization import QuantizationConfigArgs, QuantSpec

    override = case.get("moe_activation")
    weight = case.get("moe_weight")
    null = case.get("moe_activation_null", False)  # an explicit `activation: null` (bf16)
    qargs = None
    if override or weight or null:  # the user-facing names, e.g. "mxfp4", coerced by vLLM's pydantic model
        # only the fields the user sets: from vLLM 0.34 on an explicit None means `null`
        spec = {k: v for k, v in (("activation", override), ("weight", weight)) if v is not None}
        if null:
            spec["activation"] = None
        qargs = QuantizationConfigArgs(moe=QuantSpec(**spec))
    model_config = types.SimpleNamespace(
        quantization_config=qargs,
        hf_config=types.SimpleNamespace(model_type=case.get("model_type")))
    # what FlashInfer MoE-EP's deployment check reads besides the model config
    parallel_config = types.SimpleNamespace(enable_dbo=False, enable_eplb=False)
    V._current_vllm_config = types.SimpleNamespace(
        model_config=model_config, parallel_config=parallel_config, weight_transfer_config=None)
    return qargs


def _online_moe_method(qargs) -> str | None:
    """The online method vLLM composes over the checkpoint's for a routed-experts layer
    (resolve_quant_method: OnlineQuantizationConfig.resolve_quant_method_cls)."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig

    found = OnlineQuantizationConfig(qargs).resolve_quant_method_cls(
        RoutedExperts, "model.layers.1.mlp.experts")
    return None if found is None else found[-1].__name__


def _int4_kernel_check(method, moe) -> dict:
    """What the kernel build of the int4 path validates (make_mxfp4_moe_kernel)."""
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as O

    from vllm.config.quantization import QUANT_KEY_NAMES

    w, a = O._mxfp4_quant_keys_for_experts(method.experts_cls, method.mxfp4_backend)
    names = {v: k for k, v in QUANT_KEY_NAMES.items()}
    try:
        O._validate_mxfp4_experts_config(method.experts_cls, moe, method.mxfp4_backend)
        ok = "ok"
    except ValueError as e:
        ok = "ValueError: " + (str(e).splitlines() or [""])[0][:300]
    return {"int4_weight_key": names.get(w, str(w)), "int4_act_key": None if a is None else names.get(a, str(a)),
            "int4_kernel_config": ok}


def moe_config(case: dict):
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType,
    )

    tp, ep = case["tp"], case["ep"]
    par = FusedMoEParallelConfig(
        tp_size=1 if ep else tp, pcp_size=1, dp_size=1, ep_size=tp if ep else 1,
        tp_rank=0, pcp_rank=0, dp_rank=0, ep_rank=0, sp_size=1, use_ep=ep,
        all2all_backend="allgather_reducescatter", enable_eplb=False)
    return FusedMoEConfig(
        num_experts=case["num_experts"], experts_per_token=case["top_k"],
        hidden_dim=case["hidden"], intermediate_size=case["intermediate_per_partition"],
        num_local_experts=case["num_local_experts"], num_logical_experts=case["num_experts"],
        activation=MoEActivation(case["activation"]), device="cpu",
        routing_method=RoutingMethodType[case["routing"]], moe_parallel_config=par,
        in_dtype=torch.bfloat16, moe_backend=case.get("moe_backend", "auto"),
        has_bias=case.get("has_bias", False),
        activation_situ_linear_beta=case.get("situ_linear_beta"),
        activation_situ_beta=case.get("situ_beta"),
        swiglu_limit=case.get("swiglu_limit"),
    ), par


def make_method(case: dict, moe):
    if case["method"] == "mxfp4":
        from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4MoEMethod
        return Mxfp4MoEMethod(moe)
    if case["method"] == "gpt_oss":
        from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4MoEMethod
        return GptOssMxfp4MoEMethod(moe)
    from vllm.model_executor.layers.quantization.quark.quark_moe import QuarkOCP_MX_MoEMethod
    from vllm.model_executor.layers.quantization.utils import quant_utils as QU
    act = {None: None, "mxfp4": QU.kMxfp4Dynamic, "fp8": QU.kFp8StaticTensorSym}[case.get("quark_input")]
    return QuarkOCP_MX_MoEMethod(moe, QU.kMxfp4Static, act)


def probe(case: dict) -> dict:
    import stubs  # the worker's

    from vllm.utils import import_utils

    for name, present in case.get("packages", {}).items():
        stubs.set_present(name, present)
    import_utils._has_module.cache_clear()  # vLLM caches "is it installed" per process
    import_utils._has_module_spec.cache_clear()
    before = _apply_env(case.get("env", {}))
    qargs = _vllm_config(case)
    moe, par = moe_config(case)
    try:
        method = make_method(case, moe)
        backend = method.mxfp4_backend
        out = {"backend": backend.name if backend.value != "AITER_MXFP4_BF16" else "AITER_MXFP4_BF16",
               "experts_cls": getattr(method.experts_cls, "__name__", None)}
        h, i = method.maybe_roundup_sizes(case["hidden"], case["intermediate_per_partition"],
                                          torch.bfloat16, par)
        out.update(hidden_padded=h, intermediate_padded=i)
        if case.get("moe_weight"):
            out["int4"] = bool(getattr(method, "is_k3_situ_int4_gfx942", False))
            if out["int4"]:
                out.update(_int4_kernel_check(method, moe))
    except (ValueError, NotImplementedError, AssertionError) as e:
        out = {"raised": type(e).__name__, "message": (str(e).splitlines() or [""])[0][:300]}
    out["env_set"] = {k: v for k, v in os.environ.items() if before.get(k) != v}
    if case.get("moe_weight"):
        out["online_moe_method"] = _online_moe_method(qargs)
    return out
