"""Make the exporter fixtures in this folder with the real exporting libraries (not run in CI).

Each fixture is a tiny random model quantised and saved by the library that writes such
checkpoints in the wild, so names, dtype strings, shapes and config keys are exactly the
library's. Beside each checkpoint folder ``NAME/`` the script writes ``NAME.reference.safetensors``:
the routed experts dequantised by the exporting library's own code (compressed-tensors'
``MXFP4PackedCompressor.decompress``; Quark's weight quantizer on the quantised model), so
tests can compare values without the library installed.

Run in a throwaway virtual environment (CPU only; torch as in the project):

    python -m venv --system-site-packages VENV
    VENV/bin/pip install --no-deps compressed-tensors==0.20.0 llmcompressor==0.14.0.1 \
        amd-quark==0.13 transformers==5.23.0 tokenizers==0.23.3 accelerate==1.15.0 loguru \
        frozendict psutil datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 xxhash pyarrow \
        pandas onnx protobuf ml-dtypes onnxslim
    VENV/bin/python tests/data/exporters/make_fixtures.py [NAME ...]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

HERE = Path(__file__).resolve().parent
# Tiny but valid MXFP4 MoE geometry: hidden 128, expert intermediate 64, 4 experts, top-2.
H, I, E, K = 128, 64, 4, 2
COMMON = dict(hidden_size=H, num_attention_heads=2, vocab_size=64,
              max_position_embeddings=256, tie_word_embeddings=False,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)
ARCHS = {
    "qwen3_moe": dict(COMMON, intermediate_size=2 * I, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K,
                      num_hidden_layers=1, num_key_value_heads=1, head_dim=32, decoder_sparse_step=1,
                      mlp_only_layers=[], norm_topk_prob=True),
    "deepseek_v3": dict(COMMON, intermediate_size=2 * I, moe_intermediate_size=I, n_routed_experts=E, num_experts_per_tok=K,
                        num_hidden_layers=2, first_k_dense_replace=1, n_group=1, topk_group=1,
                        num_key_value_heads=2, kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=16,
                        qk_nope_head_dim=16, v_head_dim=16, n_shared_experts=1, num_mtp_layers=0),
    "kimi_linear": dict(COMMON, intermediate_size=2 * I, moe_intermediate_size=I, num_experts=E, num_experts_per_token=K,
                        num_hidden_layers=2, first_k_dense_replace=1, num_key_value_heads=2,
                        kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=16,
                        v_head_dim=16, linear_head_dim=32, linear_num_heads=2, n_shared_experts=1,
                        layer_types=["linear_attention", "full_attention"]),
    "gpt_oss": dict(COMMON, intermediate_size=I, num_local_experts=E, num_experts_per_tok=K,
                    num_hidden_layers=1, num_key_value_heads=1, head_dim=32,
                    layer_types=["full_attention"]),
}
CT_SCHEMES = {"w_mxfp4": "MXFP4A16", "w_mxfp4_a_mxfp4": "MXFP4", "w_mxfp4_a_fp8": "MXFP4XFP8"}


def _base_model(arch: str, work: Path):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(arch, **ARCHS[arch])
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    with torch.no_grad():  # spread the weights so MXFP4 groups use several exponents
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.02).mul_(torch.exp2(torch.randint(-3, 4, p.shape[:-1] + (1,))))
    path = work / "base"
    model.save_pretrained(path)
    return path


def _finish(tmp: Path, name: str, reference: dict[str, torch.Tensor], meta: dict) -> None:
    out = HERE / name
    if out.exists():
        shutil.rmtree(out)
    keep = {"config.json", "model.safetensors", "model.safetensors.index.json",
            "generation_config.json"}
    out.mkdir()
    for f in tmp.iterdir():
        if f.name in keep or f.name.startswith("model-"):
            shutil.copy2(f, out / f.name)
    save_file({k: v.contiguous() for k, v in sorted(reference.items())},
              str(HERE / f"{name}.reference.safetensors"),
              metadata={k: str(v) for k, v in meta.items()})
    print(f"wrote {out.relative_to(HERE)} ({sum(p.stat().st_size for p in out.iterdir())} bytes)")


def make_compressed_tensors(arch: str, scheme: str) -> None:
    """llmcompressor oneshot (data-free MXFP4 presets), saved compressed."""
    import compressed_tensors
    import llmcompressor
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from llmcompressor import oneshot
    from llmcompressor.modeling.moe.linearize import load_quantizable_moe
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    name = f"ct_{arch}_{scheme}"
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        base = _base_model(arch, work)
        with load_quantizable_moe():
            model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
        ignore = ["lm_head", "re:.*mlp\\.gate$", "re:.*block_sparse_moe\\.gate$", "re:.*self_attn.*",
                  "re:.*shared_expert.*"]
        oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=CT_SCHEMES[scheme],
                                                         ignore=ignore))
        out = work / "out"
        model.save_pretrained(out, save_compressed=True)
        qscheme = preset_name_to_scheme(CT_SCHEMES[scheme], ["Linear"])
        reference = {}
        files = sorted(out.glob("*.safetensors"))
        for f in files:
            with safe_open(f, "pt") as st:
                for key in st.keys():
                    if ".experts." in key and key.endswith(".weight_packed"):
                        mod = key[: -len(".weight_packed")]
                        sd = {"weight_packed": st.get_tensor(key),
                              "weight_scale": st.get_tensor(mod + ".weight_scale")}
                        reference[mod] = MXFP4PackedCompressor.decompress(sd, qscheme)["weight"]
        _finish(out, name, reference, {
            "exporter": f"llmcompressor {llmcompressor.__version__}, compressed-tensors "
                        f"{compressed_tensors.__version__}", "recipe_scheme": CT_SCHEMES[scheme],
            "dequantiser": "compressed_tensors MXFP4PackedCompressor.decompress"})


def make_quark(arch: str, scheme: str) -> None:
    """amd-quark ModelQuantizer (OCP MXFP4 weights; static per-tensor fp8 or no activations),
    calibrated on a few random token batches, exported with export_safetensors."""
    import quark
    from quark.torch import ModelQuantizer, export_safetensors
    from quark.torch.quantization.config.config import (
        FP8E4M3PerTensorSpec, OCP_MXFP4Spec, QConfig, QLayerConfig,
    )
    from quark.torch.utils.llm.model_preparation import preprocess_for_quantization
    from transformers import AutoModelForCausalLM

    name = f"quark_{arch}_{scheme}"
    w = OCP_MXFP4Spec(ch_axis=-1, is_dynamic=False).to_quantization_spec()
    a = {"w_mxfp4": None,
         "w_mxfp4_a_fp8": FP8E4M3PerTensorSpec(observer_method="min_max",
                                                is_dynamic=False).to_quantization_spec(),
         "w_mxfp4_a_mxfp4": OCP_MXFP4Spec(ch_axis=-1, is_dynamic=True).to_quantization_spec()}[scheme]
    # Quark's LLM template excludes for these models (lm_head, routers), attention kept in bf16.
    exclude = ["lm_head", "*router*", "*mlp.gate", "*self_attn*", "*shared_expert*"]
    config = QConfig(global_quant_config=QLayerConfig(weight=w, input_tensors=a), exclude=exclude)
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        model = AutoModelForCausalLM.from_pretrained(_base_model(arch, work), dtype=torch.bfloat16)
        model.eval()
        preprocess_for_quantization(model)  # fused 3-D experts -> per-expert nn.Linear, as Quark's CLI
        gen = torch.Generator().manual_seed(1)
        calib = [torch.randint(0, ARCHS[arch]["vocab_size"], (1, 16), generator=gen) for _ in range(4)]
        quantizer = ModelQuantizer(config)
        model = quantizer.quantize_model(model, calib)
        model = quantizer.freeze(model)
        reference = {}
        with torch.no_grad():
            for mod_name, mod in model.named_modules():
                if ".experts." in mod_name and hasattr(mod, "weight") and \
                        getattr(mod, "weight_quantizer", None) is not None:
                    reference[mod_name] = mod.weight_quantizer(mod.weight).to(torch.bfloat16)
                    if getattr(mod, "bias", None) is not None:
                        reference[mod_name + ".bias"] = mod.bias.detach().clone()
                    iq = getattr(mod, "input_quantizer", None)
                    if iq is not None and getattr(iq, "scale", None) is not None:
                        reference[mod_name + ".input_scale"] = iq.scale.detach().float().reshape(())
        out = work / "out"
        export_safetensors(model, out)
        _finish(out, name, reference, {
            "exporter": f"amd-quark {quark.__version__}", "scheme": scheme,
            "dequantiser": "quark weight_quantizer (frozen fake quantizer) on the quantised model"})


FIXTURES = {
    "quark_gpt_oss_w_mxfp4_a_fp8": (make_quark, "gpt_oss", "w_mxfp4_a_fp8"),
    "quark_qwen3_moe_w_mxfp4": (make_quark, "qwen3_moe", "w_mxfp4"),
    "quark_deepseek_v3_w_mxfp4_a_mxfp4": (make_quark, "deepseek_v3", "w_mxfp4_a_mxfp4"),
    **{f"ct_qwen3_moe_{s}": (make_compressed_tensors, "qwen3_moe", s) for s in CT_SCHEMES},
    "ct_deepseek_v3_w_mxfp4": (make_compressed_tensors, "deepseek_v3", "w_mxfp4"),
    "ct_kimi_linear_w_mxfp4": (make_compressed_tensors, "kimi_linear", "w_mxfp4"),
}


def main(names: list[str]) -> None:
    for name in names or FIXTURES:
        fn, *args = FIXTURES[name]
        fn(*args)


if __name__ == "__main__":
    main(sys.argv[1:])
