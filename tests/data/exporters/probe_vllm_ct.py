"""Record which MoE method vLLM 0.33.0's own code builds for each compressed-tensors export here
(not run in CI: it needs the real compressed-tensors package, which vLLM's config parser uses).

For every fixture with a compressed-tensors ``quantization_config`` and every platform, the
probe (run by ``tests/vllm_code/harness.py`` in a worker on an emulated platform) applies vLLM's
``KimiK3ForConditionalGenerationConfig`` rewrite where the architecture asks for it, parses
the fixture's real config with ``CompressedTensorsConfig.from_config`` (or ``Mxfp4Config``
after the rewrite), and builds the routed experts' method with
``CompressedTensorsMoEMethod.get_moe_method`` as vLLM's model loader does. Recorded: the method
class, its experts class and backend, whether it took the CUTLASS W4A4 path, and the
activation key it carries.

``ops.mxfp4_experts_quant_supported`` is a compiled CUDA query (the harness stubs
``torch.ops._C``); the probe answers it with the CUDA kernel's rule, capability 100-119.

Run with a Python that has compressed-tensors 0.20 (see make_fixtures.py), from the
repository root:

    VENV/bin/python tests/data/exporters/probe_vllm_ct.py
"""

from __future__ import annotations

import copy
import json
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "vllm033_ct_methods.json"
PLATFORMS = ("gfx950", "sm90", "sm100")
# a Kimi-K3 config (the synthetic example's) declaring dynamic fp8 activations: vLLM rewrites it
K3_CASE = {
    "name": "kimi_k3_declared_fp8", "architectures": ["KimiK3ForConditionalGeneration"],
    "prefix": "language_model.model.layers.1.block_sparse_moe", "projs": ["w1", "w3", "w2"],
    "activation": "situ",
}


def probe(case: dict) -> dict:
    """Inside the vLLM worker."""
    import torch

    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType,
    )
    from vllm.model_executor.models.config import KimiK3ForConditionalGenerationConfig

    torch.ops._C.mxfp4_experts_quant_supported = lambda cap: 100 <= cap < 120
    qc = copy.deepcopy(case["quantization_config"])
    mc = types.SimpleNamespace(hf_config=types.SimpleNamespace(quantization_config=qc),
                               hf_text_config=types.SimpleNamespace(quantization_config=qc),
                               model_arch_config=types.SimpleNamespace(quantization_config=qc))
    if set(case["architectures"]) & {"KimiK3ForConditionalGeneration", "KimiK3MTPModel"}:
        KimiK3ForConditionalGenerationConfig.verify_and_update_model_config(mc)
    par = FusedMoEParallelConfig(
        tp_size=1, pcp_size=1, dp_size=1, ep_size=1, tp_rank=0, pcp_rank=0, dp_rank=0,
        ep_rank=0, sp_size=1, use_ep=False, all2all_backend="allgather_reducescatter",
        enable_eplb=False)
    act = case["activation"]
    moe = FusedMoEConfig(
        num_experts=4, experts_per_token=2, hidden_dim=128, intermediate_size=64,
        num_local_experts=4, num_logical_experts=4, activation=MoEActivation(act), device="cpu",
        routing_method=RoutingMethodType["RenormalizeNaive"], moe_parallel_config=par,
        in_dtype=torch.bfloat16, moe_backend="auto", has_bias=False,
        activation_situ_beta=4.0 if act == "situ" else None,
        activation_situ_linear_beta=25.0 if act == "situ" else None)
    try:
        if qc["quant_method"] == "mxfp4":
            from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4Config
            method = Mxfp4Config.from_config(qc)._make_moe_method(moe)
        else:
            from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (  # noqa: E501
                CompressedTensorsConfig,
            )
            from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (  # noqa: E501
                CompressedTensorsMoEMethod,
            )

            class RoutedExperts(torch.nn.Module):  # matched by class name, like vLLM's layer
                pass

            layer = RoutedExperts()
            layer.moe_config = moe
            gate, up, down = case["projs"]
            layer.ckpt_gate_proj_name, layer.ckpt_up_proj_name, layer.ckpt_down_proj_name = gate, up, down
            cfg = CompressedTensorsConfig.from_config(qc)
            method = CompressedTensorsMoEMethod.get_moe_method(
                cfg, layer, layer_name=f"{case['prefix']}.experts")
    except Exception as e:  # noqa: BLE001 - recorded as vLLM's answer
        return {"raised": type(e).__name__, "message": str(e).splitlines()[0][:300]}
    key = getattr(method, "activation_key", None)
    backend = getattr(method, "mxfp4_backend", None)
    return {"quant_method": qc["quant_method"], "method": type(method).__name__,
            "experts_cls": getattr(getattr(method, "experts_cls", None), "__name__", None),
            "backend": getattr(backend, "name", None),
            "use_cutlass_mxfp4": getattr(method, "use_cutlass_mxfp4", None),
            "activation_key": None if key is None else str(key)}


def _cases() -> list[dict]:
    out = []
    for cfg_path in sorted(HERE.glob("ct_*/config.json")):
        cfg = json.loads(cfg_path.read_text())
        name = cfg_path.parent.name
        prefix = "model.layers.1.block_sparse_moe" if "kimi_linear" in name else (
            "model.layers.1.mlp" if "deepseek_v3" in name else "model.layers.0.mlp")
        out.append({"name": name, "architectures": cfg["architectures"], "prefix": prefix,
                    "projs": ["gate_proj", "up_proj", "down_proj"], "activation": "silu",
                    "quantization_config": cfg["quantization_config"]})
    sys.path.insert(0, str(HERE.parent.parent.parent))
    import tempfile

    from mxfp4conv.checkpoint.synthetic import make_checkpoint
    with tempfile.TemporaryDirectory() as d:
        k3 = json.loads((make_checkpoint("kimi_k3", Path(d) / "k3", num_layers=1) / "config.json").read_text())
    qc = k3["text_config"]["quantization_config"]
    qc["config_groups"]["group_0"]["input_activations"] = {
        "num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}
    out.append({**K3_CASE, "quantization_config": qc})
    return out


def main() -> None:
    sys.path.insert(0, str(HERE.parent.parent))
    from vllm_code.harness import require_vllm, run_probe

    src = require_vllm()
    cases = _cases()
    record = {}
    for platform in PLATFORMS:
        found = run_probe(platform, f"{Path(__file__).resolve()}:probe", cases, src=src)
        for c, r in zip(cases, found):
            record.setdefault(c["name"], {})[platform] = r
    OUT.write_text(json.dumps({"vllm": "0.33.0", "results": record}, indent=1, sort_keys=True) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
