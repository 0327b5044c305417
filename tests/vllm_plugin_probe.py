"""Probe run inside the vLLM harness worker (tests/vllm_code): one MoE layer, loaded two ways.

For a case ``{"method", "source", "converted", "prefix", "tp", "rank", "geometry", "env"}`` it
builds vLLM's ``RoutedExperts`` layer twice on the emulated platform and reports, for each,
every parameter (dtype, shape, sha256 of the bytes, ``is_shuffled``), the experts class vLLM's
kernel was built with and the environment after loading:

- ``normal``: the source checkpoint through vLLM's own weight loading (the layer's slicing and
  padding ``weight_loader``; gpt-oss through ``GptOssModel._load_weights_mxfp4``), then vLLM's
  ``process_weights_after_loading`` with its real converters;
- ``canary`` and ``plugin``: the converted checkpoint through the mxfp4conv plugin (``check_layer``,
  ``read_layer``, ``install``) into two layers of one load sharing one ``Judge``, then each
  layer's ``process_weights_after_loading``: the first is the engine's canary, the second takes
  the fast path where the canary agreed. ``verdicts`` and ``checked`` report the judge.
  ``convert_twice`` makes the second layer's release shuffle w13 again after its converter;
  ``strict`` is the loader's strict option.

AITER's shuffles are mxfp4conv's pure-torch ones (``mxfp4conv.shuffle.aiter``, checked against
AITER's golden vectors), installed over the harness's recording stub of ``aiter``. With a
``flashinfer`` directory in the case (emulated sm100), vLLM's TRTLLM conversion runs FlashInfer's
own Python functions (``tests/vllm_code/flashinfer_cpu.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

_BASE_ENV = dict(os.environ)
SHARD = {"w1": "w1", "gate_proj": "w1", "w3": "w3", "up_proj": "w3", "w2": "w2", "down_proj": "w2"}
SUFFIX = {"weight_packed": "weight", "weight": "weight", "weight_scale": "weight_scale", "scale": "weight_scale",
          "input_scale": "input_scale"}
# set once by vLLM's own modules when first imported (0.34: the inductor cache), not by a load
IMPORT_ENV = {"TORCHINDUCTOR_CACHE_DIR"}
EXPERT_RE = re.compile(r"\.experts\.(\d+)\.(\w+)\.(\w+)$")


def _aiter_from_mxfp4conv() -> None:
    """``aiter.ops.shuffle`` and ``aiter.utility.fp4_utils`` answered by mxfp4conv's shuffles."""
    from mxfp4conv.shuffle import aiter as ours

    shuffle = types.ModuleType("aiter.ops.shuffle")
    for name in ("shuffle_weight", "shuffle_scale", "shuffle_weight_a16w4", "shuffle_scale_a16w4"):
        setattr(shuffle, name, getattr(ours, name))
    fp4 = types.ModuleType("aiter.utility.fp4_utils")
    fp4.e8m0_shuffle = ours.e8m0_shuffle
    sys.modules["aiter.ops.shuffle"] = shuffle
    sys.modules["aiter.utility.fp4_utils"] = fp4


def _env(extra: dict[str, str]) -> None:
    for k in list(os.environ):
        if k not in _BASE_ENV:
            del os.environ[k]
    os.environ.update(_BASE_ENV)
    os.environ.update(extra)
    from vllm._aiter_ops import rocm_aiter_ops

    rocm_aiter_ops.refresh_env_variables()


def _quant_config(method: str, case: dict):
    from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4Config, Mxfp4Config

    if method == "mxfp4":
        return Mxfp4Config()
    if method == "gpt_oss":
        return GptOssMxfp4Config()
    import probe_moe  # the harness's method builder (Quark needs its quant keys)

    qc = types.SimpleNamespace(online_quantization_config=None, get_name=lambda: "quark")
    qc.get_quant_method = lambda layer, prefix: probe_moe.make_method(
        {"method": "quark", "quark_input": case.get("quark_input")}, layer.moe_config)
    return qc


def build_layer(case: dict):
    """vLLM's RoutedExperts for one layer of ``case`` on ``case['rank']``."""
    import vllm.config.vllm as V
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType,
    )
    from vllm.model_executor.layers.fused_moe.expert_map_manager import ExpertMapManager
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    from vllm._aiter_ops import rocm_aiter_ops
    from vllm.model_executor.layers.fused_moe import config as moe_config_module

    g, tp, rank, ep = case["geometry"], case["tp"], case["rank"], case.get("ep", False)
    dp = case.get("dp", 1)
    # the worker's ranks: (dp rank, tp rank) of the case, or the tp rank ``rank`` at dp 1
    dp_rank, tp_rank = case.get("dp_rank", 0), case.get("tp_rank", rank)
    V._current_vllm_config = types.SimpleNamespace(model_config=types.SimpleNamespace(
        quantization_config=None, hf_config=types.SimpleNamespace(model_type=case.get("model_type"))))
    # the process groups such a worker has (no torch.distributed here); vLLM's own make() derives the rest
    moe_config_module.get_tensor_model_parallel_rank = lambda: tp_rank
    moe_config_module.get_dp_group = lambda: types.SimpleNamespace(rank_in_group=dp_rank, world_size=dp)
    redundant = case.get("redundant", 0)  # EPLB's redundant experts (--eplb-config num_redundant_experts)
    server = types.SimpleNamespace(enable_expert_parallel=ep, all2all_backend=case.get("all2all", "allgather_reducescatter"),
                                   enable_eplb=redundant > 0, mori_ep_v2=None)  # (0.34 reads mori_ep_v2)
    par = FusedMoEParallelConfig.make(tp_size_=tp, pcp_size_=1, dp_size_=dp, sp_size_=1, vllm_parallel_config=server)
    activation = MoEActivation(case["activation"])
    manager = ExpertMapManager(max_num_batched_tokens=256, top_k=g["top_k"],
                               global_num_experts=g["num_experts"] + redundant,
                               num_redundant_experts=redundant, num_expert_group=case.get("num_expert_group"),
                               moe_parallel_config=par, placement_strategy=case.get("placement", "linear"),
                               enable_eplb=redundant > 0,
                               rocm_aiter_enabled=rocm_aiter_ops.is_fused_moe_enabled() and activation.is_gated)
    intermediate = g["intermediate"]
    k3_min = case.get("k3_min_per_partition")
    k3_padded = k3_min is not None and tp > 1 and intermediate // tp < k3_min
    if k3_padded:  # Kimi-K3's AMD model (models/kimi_k3/amd/linear.py) hands FusedMoE min * tp
        intermediate = k3_min * tp
    moe = FusedMoEConfig(
        num_experts=g["num_experts"] + redundant, experts_per_token=g["top_k"], hidden_dim=g["hidden"],
        intermediate_size=intermediate, num_local_experts=manager.local_num_experts,
        num_logical_experts=g["num_experts"], activation=activation, device="cpu",
        routing_method=RoutingMethodType[case["routing"]], moe_parallel_config=par, in_dtype=torch.bfloat16,
        has_bias=case.get("has_bias", False), activation_situ_linear_beta=case.get("situ_linear_beta"),
        activation_situ_beta=case.get("situ_beta"), swiglu_limit=case.get("swiglu_limit"))
    layer = RoutedExperts(f"{case['prefix']}.experts", torch.bfloat16, moe, _quant_config(case["method"], case),
                          expert_map_manager=manager, swiglu_limit=case.get("swiglu_limit"))
    if par.use_all2all_kernels or dp > 1:  # the EP group's all2all manager a DP worker has (sizes only)
        from vllm.model_executor.layers.fused_moe import all2all_utils

        all2all_utils.get_ep_all2all_manager = lambda: types.SimpleNamespace(
            world_size=par.ep_size, dp_world_size=dp, rank=par.ep_rank)
    if k3_padded:  # what the same model does after building its experts
        layer.w13_weight.data.zero_()
        layer.w2_weight.data.zero_()
        layer.moe_config.intermediate_size_per_partition_unpadded = g["intermediate"] // tp
    return layer


def _source_tensors(root: Path, prefix: str):
    from safetensors import safe_open

    weight_map = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    for name, shard in weight_map.items():
        if name.startswith(prefix + ".experts."):
            with safe_open(str(root / shard), framework="pt") as f:
                yield name, f.get_tensor(name)


def load_normal(layer, case: dict) -> None:
    """The source checkpoint's experts of the layer, loaded the way vLLM's models load them."""
    root, prefix = Path(case["source"]), case["prefix"]
    if case["method"] == "gpt_oss":
        _load_gpt_oss(layer, case, _source_tensors(root, prefix))
        return
    for name, t in _source_tensors(root, prefix):
        m = EXPERT_RE.search(name)
        expert, proj, suffix = int(m.group(1)), m.group(2), m.group(3)
        shard = SHARD[proj]
        param_name = ("w2" if shard == "w2" else "w13") + "_" + SUFFIX[suffix]
        param = getattr(layer, param_name)
        for physical in _physical(expert, case):
            param.weight_loader(param, t, weight_name=f"{layer.layer_name}.{param_name}", shard_id=shard,
                                expert_id=physical)


def _physical(expert: int, case: dict) -> list[int]:
    """The physical experts that hold logical ``expert``: itself, and with EPLB's redundant experts
    the copies vLLM's own mapping loads it into (build_expert_params_mapping over
    EplbState.build_initial_global_physical_to_logical_map)."""
    redundant = case.get("redundant", 0)
    if not redundant:
        return [expert]
    from vllm.distributed.eplb.eplb_state import EplbState

    p2l = EplbState.build_initial_global_physical_to_logical_map(case["geometry"]["num_experts"], redundant)
    return [p for p, logical in enumerate(p2l) if logical == expert]


def _load_gpt_oss(layer, case: dict, weights) -> None:
    from vllm.model_executor.layers.fused_moe import config as moe_config
    from vllm.model_executor.models import gpt_oss

    tp, rank = case["tp"], case["rank"]
    one = types.SimpleNamespace(world_size=1, rank_in_group=0)
    # the process groups a tp-rank worker has (no torch.distributed here)
    gpt_oss.get_tensor_model_parallel_world_size = lambda: tp
    moe_config.get_tensor_model_parallel_rank = lambda: rank
    gpt_oss.get_dp_group = lambda: one
    gpt_oss.get_pcp_group = lambda: one
    root = torch.nn.Module()
    node = root
    parts = layer.layer_name.split(".")
    for part in parts[:-1]:
        child = torch.nn.Module()
        node.add_module(part, child)
        node = child
    node.add_module(parts[-1], layer)
    g = case["geometry"]
    root.parallel_config = types.SimpleNamespace(enable_expert_parallel=False)
    root.config = types.SimpleNamespace(num_local_experts=g["num_experts"], intermediate_size=g["intermediate"])
    root._try_load_streamed_expert = lambda *a, **k: False
    weights = gpt_oss.GptOssForCausalLM.hf_to_vllm_mapper.apply(weights)  # what GptOssForCausalLM does
    gpt_oss.GptOssModel._load_weights_mxfp4(root, g["num_experts"], 0, weights, [])


READS: list[str] = []  # the layers load_plugin's reader has read, in order


def load_plugin(layer, case: dict, judge=None) -> str:
    from mxfp4conv.integrations.vllm.checks import check_layer
    from mxfp4conv.integrations.vllm.facts import layer_facts
    from mxfp4conv.integrations.vllm.layer import install
    from mxfp4conv.integrations.vllm.rank_tensors import layer_manifest, layer_tensors
    from mxfp4conv.runtime.loader import _weight_map, read_manifest

    root = Path(case["converted"])
    manifest = read_manifest(root)
    plan = check_layer(manifest, layer_facts(layer), case["prefix"], str(root))
    weight_map = _weight_map(root)

    def read():  # read when vLLM processes the layer, as the loader does
        READS.append(plan.prefix)
        return layer_tensors(root, weight_map, manifest, plan)[0]

    install(layer, plan, read, layer_manifest(manifest, plan), str(root), judge)
    return plan.mode


def convert_twice(qm):
    """A release whose ``process_weights_after_loading`` shuffles w13 once more after its
    converter (here: mxfp4conv's AITER ``shuffle_weight`` over the converted bytes)."""
    from mxfp4conv.shuffle.aiter import shuffle_weight

    cls = type(qm)
    original = cls.process_weights_after_loading

    def process_weights_after_loading(self, layer):
        original(self, layer)
        w = layer.w13_weight
        w.data.view(torch.uint8).copy_(shuffle_weight(w.data.view(torch.uint8)))

    cls.process_weights_after_loading = process_weights_after_loading
    return lambda: setattr(cls, "process_weights_after_loading", original)


def expert_ids(layer) -> list[int]:
    """The global ids of the layer's local experts in local order, from vLLM's expert map."""
    emap = layer.expert_map_manager.expert_map
    n = layer.moe_config.num_experts
    if emap is None:
        return list(range(n))
    m = emap.reshape(-1)[:n].tolist()
    return [g for _, g in sorted((local, g) for g, local in enumerate(m) if local >= 0)]


def state(layer) -> dict:
    params = {}
    for name, p in sorted(layer.named_parameters()):
        t = p.detach().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        params[name] = [str(t.dtype), list(t.shape), hashlib.sha256(data).hexdigest(),
                        getattr(p, "is_shuffled", None)]
        if t.numel() <= 16:  # scalars such as static input scales: their values too
            params[name].append(t.float().reshape(-1).tolist())
    qm = layer.quant_method
    kernel = getattr(qm, "moe_kernel", None)
    return {"params": params, "backend": qm.mxfp4_backend.name, "expert_ids": expert_ids(layer),
            "parallel": {k: getattr(layer.moe_config.moe_parallel_config, k) for k in (
                "tp_size", "tp_rank", "dp_size", "dp_rank", "ep_size", "ep_rank", "use_ep")},
            "placement": layer.expert_placement_strategy,
            "experts": type(kernel.fused_experts).__name__ if kernel is not None else None,
            "env": {k: v for k, v in os.environ.items() if _BASE_ENV.get(k) != v and k not in IMPORT_ENV}}


def probe(case: dict) -> dict:
    _aiter_from_mxfp4conv()
    if case.get("flashinfer"):  # sm100: FlashInfer's own functions for vLLM's TRTLLM conversion
        import flashinfer_cpu

        flashinfer_cpu.install_into_stub(case["flashinfer"])
    _env(case["server_env"])  # what a server of the source sets by hand (`mxfp4conv plan` says it)
    normal_layer = build_layer(case)
    load_normal(normal_layer, case)
    loaded = all(bool(getattr(normal_layer, n).any()) for n in ("w13_weight", "w2_weight", "w13_weight_scale"))
    normal_layer.quant_method.process_weights_after_loading(normal_layer)
    normal = state(normal_layer)

    _env({})
    from mxfp4conv.integrations.vllm.layer import new_judge
    from mxfp4conv.integrations.vllm.model_loader import refresh_engine_env
    from mxfp4conv.runtime.loader import apply_runtime_env, read_manifest

    manifest = read_manifest(Path(case["converted"]))
    apply_runtime_env(manifest["runtime_env"])  # the loader's load_model
    refresh_engine_env()
    # two layers of one load, one judge: the first is the canary, the second takes the fast path
    judge = new_judge(manifest, case["converted"], {"strict": case.get("strict", False)})
    out = {"normal": {**normal, "loaded": loaded}}
    for role in ("canary", "plugin"):
        layer = build_layer(case)
        undo = convert_twice(layer.quant_method) if role == "plugin" and case.get("convert_twice") else None
        READS.clear()
        mode = load_plugin(layer, case, judge)
        read_before_process = len(READS)
        try:
            layer.quant_method.process_weights_after_loading(layer)
        except Exception as e:  # noqa: BLE001 (the plugin's refusal is the result)
            out[role] = {"raised": type(e).__name__, "message": str(e), "mode": mode}
            break
        finally:
            if undo is not None:
                undo()
        out[role] = {**state(layer), "mode": mode, "read_before_process": read_before_process}
    out["verdicts"] = [[v.outcome, v.reason] for v in judge.verdicts.values()]
    out["checked"] = judge.checked
    out["pre_processed"] = judge.pre_processed
    return out


def probe_kernel(case: dict) -> dict:
    """CUDA (emulated): the plugin builds vLLM's modular kernel around mxfp4conv's Triton experts;
    the layer's ``apply`` (vLLM's prepare / finalize around the experts) against mxfp4conv's torch
    reference on the same converted experts."""
    from mxfp4conv.integrations.vllm.checks import check_layer
    from mxfp4conv.integrations.vllm.facts import layer_facts
    from mxfp4conv.integrations.vllm.model_loader import load_into_mxfp4conv_kernel
    from mxfp4conv.runtime import fused_moe, load_moe_layers
    from mxfp4conv.runtime.loader import read_manifest

    root = Path(case["converted"])
    manifest = read_manifest(root)
    layer = build_layer(case)
    plan = check_layer(manifest, layer_facts(layer), case["prefix"], str(root))
    picked = layer.quant_method.mxfp4_backend.name
    load_into_mxfp4conv_kernel(root, [(layer, plan)])
    layer.quant_method.process_weights_after_loading(layer)
    g = torch.Generator().manual_seed(0)
    tokens, hidden, e, k = 5, case["geometry"]["hidden"], case["geometry"]["num_experts"], case["geometry"]["top_k"]
    x = torch.randn(tokens, hidden, generator=g).to(torch.float16)  # bf16 tl.dot is wrong in the Triton interpreter
    topk_weights = torch.rand(tokens, k, generator=g).softmax(-1)
    topk_ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(tokens)]).to(torch.int32)
    from vllm.v1.worker.workspace import init_workspace_manager

    init_workspace_manager(torch.device("cpu"))  # what a vLLM worker does at start
    out = layer.quant_method.apply(layer, x, topk_weights, topk_ids, None, None)
    ref = fused_moe(x, load_moe_layers(root, rank=plan.rank)[case["prefix"]], topk_weights, topk_ids,
                    backend="torch", act_quant="none")
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    kernel = layer.quant_method.moe_kernel
    return {"mode": plan.mode, "picked": picked, "experts": type(kernel.fused_experts).__name__,
            "prepare": type(kernel.prepare_finalize).__name__, "rel_err": err, "ref_norm": ref.float().norm().item(),
            "w13_layout": manifest["layout"]["w13"]}


def probe_cost(case: dict) -> dict:
    """Seconds and peak resident memory of one way of loading the layer (``case["phase"]``):
    ``normal`` (vLLM's weight loader and conversion of the source), ``canary`` (the plugin's canary:
    canonical bytes converted by vLLM, compared) or ``fast`` (the plugin's fast path: the stored
    bytes handed over, checked). One phase per worker process, so that the peaks are its own."""
    import threading
    import time

    from mxfp4conv.integrations.vllm.judge import READY, Verdict
    from mxfp4conv.integrations.vllm.layer import new_judge
    from mxfp4conv.integrations.vllm.model_loader import refresh_engine_env
    from mxfp4conv.runtime.loader import apply_runtime_env, read_manifest

    _aiter_from_mxfp4conv()
    phase = case["phase"]
    if phase == "normal":
        _env(case["server_env"])
    else:
        _env({})
        apply_runtime_env(read_manifest(Path(case["converted"]))["runtime_env"])
        refresh_engine_env()
    layer = build_layer(case)
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    rss0, peak, done = rss(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    if phase == "normal":
        load_normal(layer, case)
    else:
        judge = new_judge(read_manifest(Path(case["converted"])), case["converted"])
        if phase == "fast":  # as after a canary that agreed
            kind = (type(layer.quant_method).__name__, layer.quant_method.mxfp4_backend.name,
                    getattr(layer.activation, "value", str(layer.activation)).lower())
            judge.verdicts[kind] = Verdict(READY, "equal", "earlier layer", 0.0)
        load_plugin(layer, case, judge)
    t1 = time.perf_counter()
    layer.quant_method.process_weights_after_loading(layer)
    t2 = time.perf_counter()
    done.set()
    sampler.join()
    layer_bytes = sum(p.numel() * p.element_size() for n, p in layer.named_parameters()
                      if n in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"))
    return {"phase": phase, "load_s": t1 - t0, "process_s": t2 - t1, "layer_bytes": layer_bytes,
            "peak_rss_growth_bytes": max(peak[0], rss()) - rss0}


def _real_regions(w13, w13_scale, w2, w2_scale, inter_padded: int, ir: int, hidden: int) -> dict:
    """sha256 of the real (unpadded) bytes of one rank's experts: gate and up rows of w13 and the
    intermediate columns of w2, every local expert."""
    def h(t):
        return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()

    out = {}
    for name, t, div in (("w13_weight", w13, 2), ("w13_weight_scale", w13_scale, 32)):
        t = t.view(torch.uint8)
        out[name + ".gate"] = h(t[:, :ir, : hidden // div])
        out[name + ".up"] = h(t[:, inter_padded: inter_padded + ir, : hidden // div])
    for name, t, div in (("w2_weight", w2, 2), ("w2_weight_scale", w2_scale, 32)):
        out[name] = h(t.view(torch.uint8)[:, :hidden, : ir // div])
    return out


def probe_params(case: dict) -> dict:
    """A target in mxfp4conv's format (CUDA): vLLM's own weight loading of the source into the
    layer of this worker, against the experts the plugin's rank mapping loads from the converted
    checkpoint (mxfp4conv's runtime loader, brought back to the canonical layout): the expert map
    and the real bytes of every local expert."""
    from mxfp4conv.integrations.vllm.checks import check_layer
    from mxfp4conv.integrations.vllm.facts import layer_facts
    from mxfp4conv.runtime import load_moe_layers
    from mxfp4conv.runtime.loader import read_manifest

    _env(case.get("server_env", {}))
    layer = build_layer(case)
    load_normal(layer, case)
    g = case["geometry"]
    ir = layer.moe_config.intermediate_size_per_partition_unpadded or layer.intermediate_size_per_partition
    normal = _real_regions(layer.w13_weight.data, layer.w13_weight_scale.data, layer.w2_weight.data,
                           layer.w2_weight_scale.data, layer.intermediate_size_per_partition, ir, g["hidden"])
    root = Path(case["converted"])
    manifest = read_manifest(root)
    facts = layer_facts(layer)
    try:
        plan = check_layer(manifest, facts, case["prefix"], str(root))
    except Exception as e:  # noqa: BLE001 (the plugin's refusal is the result)
        return {"raised": type(e).__name__, "message": str(e), "expert_ids": expert_ids(layer)}
    from mxfp4conv.runtime.relayout import canonical

    ex = canonical(load_moe_layers(root, rank=plan.rank, backend="torch")[case["prefix"]])
    ours = _real_regions(ex.w13_weight, ex.w13_weight_scale, ex.w2_weight, ex.w2_weight_scale,
                         ex.intermediate_per_rank_padded, ex.intermediate_per_rank, ex.hidden)
    kernel = probe_kernel(case) if case.get("kernel") else None  # the layer's apply on these experts
    return {"mode": plan.mode, "rank": plan.rank, "expert_ids": expert_ids(layer), "kernel": kernel,
            "facts_expert_ids": list(facts.expert_ids), "loaded_expert_ids": list(ex.global_ids),
            "normal": normal, "plugin": ours, "ir": [ir, ex.intermediate_per_rank],
            "loaded": bool(layer.w13_weight.data.any()), "backend": layer.quant_method.mxfp4_backend.name,
            "parallel": {k: getattr(layer.moe_config.moe_parallel_config, k) for k in (
                "tp_size", "tp_rank", "dp_size", "dp_rank", "ep_size", "ep_rank", "use_ep")}}
