"""Greedy tokens of a checkpoint served by a real vLLM engine (run with the engine's Python).

    python vllm_greedy_tokens.py MODEL LOAD_FORMAT OUT_JSON

Writes {"tokens": [[...] per prompt], "loader": the model loader's class name, "experts": {layer:
sha256 of its parameters after loading}}. The tiny test
checkpoints have no tokenizer, so prompts are token ids. CPU MXFP4 experts need AMX in
vLLM's device check; machines without it relax that check here (the kernel itself runs on
AVX-512), which is the only change made to vLLM.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # keep the engine in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
PROMPTS = [[3, 17, 42, 5, 9, 77], [100, 2, 64, 31], [7] * 12]


def main() -> None:
    model, load_format, out = sys.argv[1:4]
    import torch
    from vllm import LLM, SamplingParams
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe

    if not torch.cpu._is_amx_tile_supported():
        cpu_moe.CPUExpertsMxfp4._supports_current_device = staticmethod(lambda: True)
    llm = LLM(model=model, load_format=load_format, skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=64, max_num_seqs=4, enforce_eager=True, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, detokenize=False)
    results = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    loader = type(get_model_loader(LoadConfig(load_format=load_format))).__name__
    with open(out, "w") as f:
        json.dump({"tokens": [list(r.outputs[0].token_ids) for r in results], "loader": loader,
                   "experts": llm.apply_model(expert_digests)[0]}, f)


def expert_digests(model) -> dict:
    """sha256 over each MoE layer's parameters (name, dtype, shape, bytes) as the kernel reads them."""
    import hashlib

    import torch

    out = {}
    for name, module in model.named_modules():
        if hasattr(module, "moe_config") and hasattr(module, "quant_method"):
            h = hashlib.sha256()
            for pname, p in sorted(module.named_parameters(recurse=False)):
                t = p.detach().contiguous().cpu()
                h.update(f"{pname}:{t.dtype}:{tuple(t.shape)}".encode())
                h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            out[name] = h.hexdigest()
    return out


if __name__ == "__main__":
    main()
