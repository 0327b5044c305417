"""Tiny synthetic checkpoints in the real on-disk format of each family.

Names, dtype strings, shapes, config nesting and sharding follow the real releases (see the
family adapters); only the sizes are small. Expert bytes are valid MXFP4 of random normal
values (e8m0 exponents near 127, never 0xFF). At least two shards are written and the first
MoE layer's experts straddle a shard boundary, as in real checkpoints.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mxfp4conv.convert.writer import TensorSpec, write_safetensors
from mxfp4conv.errors import CheckpointError

FAMILIES = ("kimi_k3", "deepseek_v4", "quark", "gpt_oss", "compressed_tensors", "quark_gpt_oss")
QUARK_SCHEMES = ("w_mxfp4", "w_mxfp4_a_mxfp4", "w_mxfp4_a_fp8")
# compressed-tensors presets of llmcompressor: MXFP4A16, MXFP4 (W4A4), MXFP4XFP8 (W4A8 dynamic)
CT_SCHEMES = ("w_mxfp4", "w_mxfp4_a_mxfp4", "w_mxfp4_a_fp8")
SCHEMES = {"quark": QUARK_SCHEMES, "quark_gpt_oss": QUARK_SCHEMES, "compressed_tensors": CT_SCHEMES}
_OPTIONS = ("weight_dtype", "scale_dtype", "num_shards", "quant_config_location", "text_config",
            "shared_input_scales")
_GEOMETRY = ("hidden", "intermediate", "num_experts", "top_k", "num_layers", "vocab")
DEFAULTS = {
    "kimi_k3": dict(hidden=256, intermediate=256, num_experts=8, top_k=2, num_layers=2),
    "deepseek_v4": dict(hidden=256, intermediate=256, num_experts=8, top_k=2, num_layers=2),
    "quark": dict(hidden=256, intermediate=256, num_experts=8, top_k=2, num_layers=2),
    "gpt_oss": dict(hidden=256, intermediate=256, num_experts=8, top_k=2, num_layers=2),
    "compressed_tensors": dict(hidden=256, intermediate=256, num_experts=8, top_k=2, num_layers=2),
    "quark_gpt_oss": dict(hidden=256, intermediate=256, num_experts=8, top_k=2, num_layers=2),
}


@dataclass(frozen=True)
class _Raw:
    """A tensor as safetensors stores it: dtype string, logical shape and the raw bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray  # any numpy array holding the bytes, in order


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounded to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _e4m3_values() -> np.ndarray:
    """The float value of every FP8 E4M3 (fn) code 0..127; 0x7F is NaN."""
    e, m = np.arange(128) >> 3, np.arange(128) & 7
    v = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))
    v[0x7F] = np.inf  # never the nearest
    return v


def _e4m3(x: np.ndarray) -> np.ndarray:
    """float -> FP8 E4M3 codes (uint8), nearest value, saturating at 448."""
    vals = _e4m3_values()
    mag = np.minimum(np.abs(x), 448.0)
    hi = np.clip(np.searchsorted(vals[:0x7F], mag), 1, 0x7E)
    code = np.where(np.abs(vals[hi - 1] - mag) <= np.abs(vals[hi] - mag), hi - 1, hi)
    return (code | np.where(x < 0, 0x80, 0)).astype(np.uint8)


class _Tensors:
    """Tensors in emission order, with a marker for the first MoE layer's experts."""

    def __init__(self, seed: int, weight_dtype: str, scale_dtype: str):
        self.gen = np.random.default_rng(seed)
        self.items: list[tuple[str, _Raw]] = []
        self.split_at: int | None = None  # index in items where shard 2 starts
        self.weight_dtype, self.scale_dtype = weight_dtype, scale_dtype

    def add(self, name: str, t: _Raw) -> None:
        self.items.append((name, t))

    def randn(self, *shape: int) -> np.ndarray:
        return self.gen.standard_normal(shape, dtype=np.float32)

    def bf16(self, name: str, *shape: int) -> None:
        self.add(name, _Raw("BF16", shape, _bf16(self.randn(*shape) * 0.02)))

    def f32(self, name: str, *shape: int) -> None:
        self.add(name, _Raw("F32", shape, self.randn(*shape) * 0.02))

    def ones(self, name: str, n: int) -> None:
        self.add(name, _Raw("BF16", (n,), _bf16(np.ones(n, dtype=np.float32))))

    def input_scale(self, name: str, dtype: str = "F32", value: float | None = None) -> float:
        """A static fp8 input scale (a scalar); returns its value."""
        v = np.float32(self.gen.random() * 0.01 + 0.001 if value is None else value)
        self.add(name, _Raw(dtype, (), _bf16(np.array(v)) if dtype == "BF16" else np.array(v)))
        return float(v)

    def fp8_block(self, name: str, n: int, k: int, scale_suffix: str = "scale") -> None:
        """DeepSeek FP8: E4M3 weight + F8_E8M0 scale per 128x128 block."""
        self.add(name + ".weight", _Raw("F8_E4M3", (n, k), _e4m3(self.randn(n, k))))
        shape = (math.ceil(n / 128), math.ceil(k / 128))
        self.add(f"{name}.{scale_suffix}", _Raw("F8_E8M0", shape, self.gen.integers(118, 128, shape, dtype=np.uint8)))

    def mxfp4(self, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Packed uint8 [n, k/2] and e8m0 uint8 [n, k/32] of random normal values."""
        return _quantize(self.randn(n, k))

    def expert(self, name: str, scale_name: str, n: int, k: int) -> None:
        w, s = self.mxfp4(n, k)
        self.add(name, _as_dtype(w, self.weight_dtype))
        self.add(scale_name, _as_dtype(s, self.scale_dtype))

    def mark_split(self) -> None:
        if self.split_at is None:
            self.split_at = len(self.items)


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)


def _quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MXFP4 of ``x[..., K]``: per 32 values an e8m0 scale 2**(floor(log2(amax)) - 2) (AITER's
    rule) and the nearest e2m1 code of each value over it, saturating at 6."""
    b = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.maximum(np.abs(b).max(-1), np.float32(2.0 ** -120))
    code = np.clip(np.floor(np.log2(amax)) - 2 + 127, 1, 254)
    y = b / np.exp2(code - 127)[..., None]
    idx = np.abs(np.abs(y)[..., None] - E2M1).argmin(-1)
    nib = (idx + 8 * (y < 0)).astype(np.uint8).reshape(*x.shape)
    return nib[..., 0::2] | (nib[..., 1::2] << 4), code.astype(np.uint8)


def _as_dtype(t: np.ndarray, dtype: str) -> _Raw:
    """MXFP4 bytes stored under the dtype string ``dtype`` (same bytes, header differs; F4
    counts two elements per byte)."""
    if dtype not in ("U8", "I8", "F8_E8M0", "F4"):
        raise CheckpointError(f"synthetic checkpoints store MXFP4 bytes as U8, I8, F8_E8M0 or F4, "
                              f"not {dtype!r}.")
    shape = tuple(t.shape[:-1]) + (t.shape[-1] * 2,) if dtype == "F4" else tuple(t.shape)
    return _Raw(dtype, shape, t)


def make_checkpoint(family: str, out_dir: str | os.PathLike, *, scheme: str | None = None,
                    seed: int = 0, force: bool = False, **geometry) -> Path:
    """Write a tiny checkpoint of ``family`` into ``out_dir`` (new or empty) and return it.

    ``force`` replaces an existing checkpoint directory (one holding a config.json) instead of
    refusing it; the new checkpoint is complete before the old one is removed.

    Geometry keywords: hidden (the width routed experts see), intermediate, num_experts,
    top_k, num_layers (MoE layers), vocab. Options: weight_dtype / scale_dtype (the dtype
    strings of expert weights and scales, default the family's real ones), num_shards (>= 2),
    quant_config_location (Kimi-K3: "text_config" or "top"), text_config (DeepSeek-V4: the
    model dimensions nested under ``text_config``, as multimodal wrappers write them),
    shared_input_scales (Quark static fp8: gate_proj and up_proj of one MLP get one input
    scale, as calibration on their common input gives; default one scale per linear).
    """
    if family not in FAMILIES:
        raise CheckpointError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}.")
    unknown = set(geometry) - set(_GEOMETRY) - set(_OPTIONS)
    if unknown:
        raise CheckpointError(f"make_checkpoint: unknown option(s) {', '.join(sorted(unknown))}; "
                              f"known: {', '.join(_GEOMETRY + _OPTIONS)}.")
    if scheme is not None and scheme != "w_mxfp4" and scheme not in SCHEMES.get(family, ()):
        if family not in SCHEMES:
            raise CheckpointError(f"--scheme {scheme} applies to Quark and compressed-tensors "
                                  f"exports only; {family} checkpoints are weight-only MXFP4 "
                                  f"(w_mxfp4).")
        raise CheckpointError(f"unknown {family} scheme {scheme!r}; choose one of "
                              f"{', '.join(SCHEMES[family])}.")
    g = {**DEFAULTS[family], "vocab": 128}
    g.update({k: int(v) for k, v in geometry.items() if k in _GEOMETRY})
    opts = {k: geometry[k] for k in _OPTIONS if k in geometry}
    for k in ("hidden", "intermediate"):
        if g[k] <= 0 or g[k] % 32:
            raise CheckpointError(f"make_checkpoint: {k}={g[k]} must be a positive multiple of 32.")
    if not 0 < g["top_k"] <= g["num_experts"] or g["num_layers"] < 1:
        raise CheckpointError("make_checkpoint: need num_layers >= 1 and 0 < top_k <= num_experts.")
    out = Path(out_dir)
    replace = force and out.is_dir() and (out / "config.json").is_file()
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not replace:
        hint = ("--force replaces only a checkpoint directory (one with a config.json)" if force
                else "pass --force to replace an earlier example")
        raise CheckpointError(f"{out}: exists and is not an empty directory; choose a new output "
                              f"directory ({hint}).")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; the example is an ordinary folder
    except OSError as exc:
        raise CheckpointError(f"{out}: cannot create the example directory here ({exc.strerror}); "
                              f"choose a path inside a writable directory.") from None
    # the directory first: a bad output path fails before any weight is generated
    default_w, default_s = {"deepseek_v4": ("I8", "F8_E8M0")}.get(family, ("U8", "U8"))
    ts = _Tensors(seed, opts.get("weight_dtype", default_w), opts.get("scale_dtype", default_s))
    builder = {"kimi_k3": _kimi_k3, "deepseek_v4": _deepseek_v4, "quark": _quark,
               "gpt_oss": _gpt_oss, "compressed_tensors": _compressed_tensors,
               "quark_gpt_oss": _quark_gpt_oss}[family]
    try:
        config = builder(ts, g, scheme or "w_mxfp4", opts)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    sidecars = {"tokenizer_config.json": {"model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast",
                                          "bos_token": "<s>", "eos_token": "</s>"},
                "generation_config.json": {"do_sample": True, "temperature": 0.6,
                                           "bos_token_id": 0, "eos_token_id": 1}}

    try:
        _write_json(tmp / "config.json", config)
        for name, obj in sidecars.items():
            _write_json(tmp / name, obj)
        _write_shards(tmp, ts, int(opts.get("num_shards", 2)), zero_indexed=family == "gpt_oss")
        if replace:
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            out.rename(old / out.name)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            if out.exists():
                out.rmdir()
            tmp.rename(out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"{out}: writing the example failed ({exc.strerror or exc}); nothing "
                              f"was left behind. Free space or choose another directory.") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _write_shards(root: Path, ts: _Tensors, num_shards: int, *, zero_indexed: bool) -> None:
    if num_shards < 2:
        raise CheckpointError("make_checkpoint: num_shards must be at least 2.")
    items = ts.items
    cut = ts.split_at if ts.split_at else len(items) // 2
    rest = items[cut:]
    groups = [items[:cut]]
    per = math.ceil(len(rest) / (num_shards - 1))
    groups += [rest[i * per:(i + 1) * per] for i in range(num_shards - 1)]
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        # gpt-oss numbers its shards from 0 (model-00000-of-00014 for 15 files).
        fname = (f"model-{i:05d}-of-{num_shards - 1:05d}.safetensors" if zero_indexed
                 else f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors")
        write_safetensors(root / fname, [(TensorSpec(n, t.dtype, t.shape), [t.data]) for n, t in group],
                          metadata={"format": "pt"})
        for n, t in group:
            weight_map[n] = fname
            total += t.data.nbytes
    _write_json(root / "model.safetensors.index.json",
                {"metadata": {"total_size": total}, "weight_map": weight_map})


# ---- families --------------------------------------------------------------------------

def _kimi_k3(ts: _Tensors, g: dict, scheme: str, opts: dict) -> dict:
    H, I, E, L, V = g["hidden"], g["intermediate"], g["num_experts"], g["num_layers"], g["vocab"]
    D = 2 * H  # model width; routed experts run in the latent width H
    dense_i, shared = 2 * I, I
    P = "language_model.model"
    ts.bf16(f"{P}.embed_tokens.weight", V, D)
    for layer in range(L + 1):
        p = f"{P}.layers.{layer}"
        ts.ones(f"{p}.input_layernorm.weight", D)
        ts.ones(f"{p}.post_attention_layernorm.weight", D)
        ts.bf16(f"{p}.self_attn.q_a_proj.weight", 64, D)
        ts.bf16(f"{p}.self_attn.q_b_proj.weight", 128, 64)
        ts.bf16(f"{p}.self_attn.o_proj.weight", D, 128)
        if layer == 0:  # first_k_dense_replace = 1
            ts.bf16(f"{p}.mlp.gate_proj.weight", dense_i, D)
            ts.bf16(f"{p}.mlp.up_proj.weight", dense_i, D)
            ts.bf16(f"{p}.mlp.down_proj.weight", D, dense_i)
            continue
        m = f"{p}.block_sparse_moe"
        ts.bf16(f"{m}.gate.weight", E, D)
        ts.f32(f"{m}.gate.e_score_correction_bias", E)
        ts.bf16(f"{m}.routed_expert_down_proj.weight", H, D)
        ts.bf16(f"{m}.routed_expert_up_proj.weight", D, H)
        ts.ones(f"{m}.routed_expert_norm.weight", H)
        for proj, n, k in (("gate_proj", shared, D), ("up_proj", shared, D), ("down_proj", D, shared)):
            ts.bf16(f"{m}.shared_experts.{proj}.weight", n, k)
        for e in range(E):
            if layer == 1 and e == E // 2:
                ts.mark_split()
            for w, n, k in (("w1", I, H), ("w3", I, H), ("w2", H, I)):
                ts.expert(f"{m}.experts.{e}.{w}.weight_packed", f"{m}.experts.{e}.{w}.weight_scale", n, k)
    ts.ones(f"{P}.norm.weight", D)
    ts.bf16("language_model.lm_head.weight", V, D)
    ts.bf16("vision_tower.patch_embed.proj.weight", 64, 48)
    ts.bf16("mm_projector.linear_1.weight", D, 64)
    qc = {
        "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "format": "mxfp4-pack-quantized", "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32,
                        "symmetric": True, "dynamic": False, "scale_dtype": "torch.uint8",
                        "observer": "minmax"},
            "input_activations": None, "output_activations": None}},
        "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                   "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"],
    }
    text = {
        "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"],
        "auto_map": {"AutoModelForCausalLM": "modeling_kimi_linear.KimiLinearForCausalLM"},
        "hidden_size": D, "num_hidden_layers": L + 1, "first_k_dense_replace": 1,
        "moe_layer_freq": 1, "intermediate_size": dense_i, "num_experts": E,
        "num_experts_per_token": g["top_k"], "num_shared_experts": 1,
        "moe_intermediate_size": I, "routed_expert_hidden_size": H, "latent_moe_use_norm": True,
        "hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
        "moe_router_activation_func": "sigmoid", "topk_method": "noaux_tc",
        "use_grouped_topk": True, "num_expert_group": 1, "topk_group": 1, "moe_renormalize": True,
        "routed_scaling_factor": 1.0, "kv_lora_rank": 64, "q_lora_rank": 64,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": V,
        "tie_word_embeddings": False, "num_nextn_predict_layers": 0, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
    }
    config = {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"],
              "auto_map": {"AutoConfig": "configuration_kimi_k3.KimiK3Config"},
              "text_config": text, "vision_config": {"model_type": "moonvit", "hidden_size": 64}}
    if opts.get("quant_config_location", "text_config") == "top":
        config["quantization_config"] = qc
    else:
        text["quantization_config"] = qc
    return config


def _deepseek_v4(ts: _Tensors, g: dict, scheme: str, opts: dict) -> dict:
    H, I, E, L, V, k = (g["hidden"], g["intermediate"], g["num_experts"], g["num_layers"],
                        g["vocab"], g["top_k"])
    ts.bf16("embed.weight", V, H)
    prefixes = [f"layers.{i}" for i in range(L)] + ["mtp.0"]
    for i, p in enumerate(prefixes):
        ts.ones(f"{p}.attn_norm.weight", H)
        ts.ones(f"{p}.ffn_norm.weight", H)
        ts.fp8_block(f"{p}.attn.wq_a", 128, H)
        ts.fp8_block(f"{p}.attn.wo_b", H, 128)
        ts.f32(f"{p}.attn.attn_sink", 4)
        for hc in ("hc_attn_fn", "hc_attn_base", "hc_ffn_fn", "hc_ffn_base"):
            ts.f32(f"{p}.{hc}", 4)
        if p == "mtp.0":
            ts.ones(f"{p}.enorm.weight", H)
            ts.ones(f"{p}.hnorm.weight", H)
            ts.fp8_block(f"{p}.e_proj", H, H)
        f = f"{p}.ffn"
        ts.bf16(f"{f}.gate.weight", E, H)
        if i == 0:  # num_hash_layers = 1: token-id hash routing instead of a bias
            ts.add(f"{f}.gate.tid2eid", _Raw("I64", (V, k), ts.gen.integers(0, E, (V, k), dtype=np.int64)))
        else:
            ts.f32(f"{f}.gate.bias", E)
        for w, n, kk in (("w1", I, H), ("w3", I, H), ("w2", H, I)):
            ts.fp8_block(f"{f}.shared_experts.{w}", n, kk)
        for e in range(E):
            if i == 0 and e == E // 2:
                ts.mark_split()
            for w, n, kk in (("w1", I, H), ("w3", I, H), ("w2", H, I)):
                ts.expert(f"{f}.experts.{e}.{w}.weight", f"{f}.experts.{e}.{w}.scale", n, kk)
    ts.ones("norm.weight", H)
    ts.bf16("head.weight", V, H)
    config = {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "expert_dtype": "fp4", "hidden_size": H, "num_hidden_layers": L, "n_routed_experts": E,
        "num_experts_per_tok": k, "n_shared_experts": 1, "moe_intermediate_size": I,
        "num_hash_layers": 1, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
        "norm_topk_prob": True, "routed_scaling_factor": 1.5, "hidden_act": "silu",
        "swiglu_limit": 10.0, "head_dim": 64, "num_attention_heads": 4, "num_key_value_heads": 1,
        "q_lora_rank": 128, "o_lora_rank": 128, "o_groups": 2, "index_topk": 64, "hc_mult": 4,
        "num_nextn_predict_layers": 1, "vocab_size": V, "tie_word_embeddings": False,
        "rope_theta": 10000, "torch_dtype": "bfloat16",
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                "quant_method": "fp8", "scale_fmt": "ue8m0",
                                "weight_block_size": [128, 128]},
    }
    if opts.get("text_config"):
        top = ("architectures", "model_type", "quantization_config")
        config = {**{k: config[k] for k in top},
                  "text_config": {k: v for k, v in config.items() if k not in top}}
    return config


def _quark_spec(dtype: str) -> dict:
    """An OCP-MX tensor spec as amd-quark 0.13 exports it."""
    return {"block_size": None, "ch_axis": -1, "dtype": dtype, "enable_buffer_reuse": False,
            "group_size": 32, "is_dynamic": False, "is_scale_quant": False,
            "max_input_numel": 4194304, "mx_element_dtype": None,
            "observer_cls": "PerBlockMXObserver", "qscheme": "per_group",
            "round_method": "half_even", "scale_calculation_mode": "even", "scale_format": "e8m0",
            "scale_type": "float", "symmetric": None, "zero_point_type": "int32"}


def _quark_config(scheme: str) -> dict:
    """A Quark ``quantization_config`` as amd-quark 0.13's export_safetensors writes it."""
    w_part, _, a_part = scheme.partition("_a_")
    mx = {"w_mxfp4": "fp4", "w_mxfp6_e3m2": "fp6_e3m2", "w_mxfp6_e2m3": "fp6_e2m3"}
    if w_part not in mx or a_part not in ("", "mxfp4", "fp8", "mxfp6_e3m2", "mxfp6_e2m3"):
        raise CheckpointError(f"unknown Quark scheme {scheme!r}; choose one of "
                              f"{', '.join(QUARK_SCHEMES)}.")
    if not a_part:
        inputs = None
    elif a_part == "fp8":
        inputs = {"block_size": None, "ch_axis": None, "dtype": "fp8_e4m3",
                  "enable_buffer_reuse": False, "group_size": None, "is_dynamic": False,
                  "is_scale_quant": False, "max_input_numel": 4194304, "mx_element_dtype": None,
                  "observer_cls": "PerTensorMinMaxObserver", "qscheme": "per_tensor",
                  "round_method": "half_even", "scale_calculation_mode": None,
                  "scale_format": None, "scale_type": None, "symmetric": True,
                  "zero_point_type": "int32"}
    else:
        inputs = {**_quark_spec(a_part.replace("mx", "")), "is_dynamic": True}
    return {
        "algo_config": None, "exclude": ["*self_attn*", "*mlp.gate", "lm_head"],
        "export": {"kv_cache_group": [], "min_kv_scale": 0.0, "pack_method": "reorder",
                   "weight_format": "real_quantized", "weight_merge_groups": None},
        "global_quant_config": {"bias": None, "input_tensors": inputs, "output_tensors": None,
                                "target_device": None, "weight": _quark_spec(mx[w_part])},
        "kv_cache_post_rope": False, "kv_cache_quant_config": {}, "layer_quant_config": {},
        "layer_type_quant_config": {}, "quant_method": "quark", "quant_mode": "eager_mode",
        "softmax_quant_spec": None, "version": "0.13",
    }


def _quark(ts: _Tensors, g: dict, scheme: str, opts: dict) -> dict:
    H, I, E, L, V = g["hidden"], g["intermediate"], g["num_experts"], g["num_layers"], g["vocab"]
    static_fp8 = scheme.endswith("_a_fp8")
    dense_i = 2 * I

    shared: dict[str, float] = {}

    def linear(p: str, n: int, k: int) -> None:
        ts.expert(f"{p}.weight", f"{p}.weight_scale", n, k)
        if static_fp8:
            mlp, proj = p.rsplit(".", 1)
            value = shared.get(mlp) if opts.get("shared_input_scales") and proj in ("gate_proj", "up_proj") else None
            v = ts.input_scale(f"{p}.input_scale", "F32", value)
            if opts.get("shared_input_scales") and proj in ("gate_proj", "up_proj"):
                shared.setdefault(mlp, v)

    ts.bf16("model.embed_tokens.weight", V, H)
    for layer in range(L + 1):
        p = f"model.layers.{layer}"
        ts.ones(f"{p}.input_layernorm.weight", H)
        ts.ones(f"{p}.post_attention_layernorm.weight", H)
        ts.bf16(f"{p}.self_attn.q_a_proj.weight", 64, H)
        ts.bf16(f"{p}.self_attn.kv_a_proj_with_mqa.weight", 96, H)
        ts.bf16(f"{p}.self_attn.o_proj.weight", H, 128)
        if layer == 0:  # first_k_dense_replace = 1: a quantized dense MLP
            for proj, n, k in (("gate_proj", dense_i, H), ("up_proj", dense_i, H), ("down_proj", H, dense_i)):
                linear(f"{p}.mlp.{proj}", n, k)
            continue
        ts.bf16(f"{p}.mlp.gate.weight", E, H)
        ts.f32(f"{p}.mlp.gate.e_score_correction_bias", E)
        for proj, n, k in (("gate_proj", I, H), ("up_proj", I, H), ("down_proj", H, I)):
            linear(f"{p}.mlp.shared_experts.{proj}", n, k)
        for e in range(E):
            if layer == 1 and e == E // 2:
                ts.mark_split()
            for proj, n, k in (("gate_proj", I, H), ("up_proj", I, H), ("down_proj", H, I)):
                linear(f"{p}.mlp.experts.{e}.{proj}", n, k)
    ts.ones("model.norm.weight", H)
    ts.bf16("lm_head.weight", V, H)
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": H, "intermediate_size": dense_i, "moe_intermediate_size": I,
        "num_hidden_layers": L + 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "n_routed_experts": E, "num_experts_per_tok": g["top_k"], "n_shared_experts": 1,
        "n_group": 2 if E % 2 == 0 else 1, "topk_group": 1, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "hidden_act": "silu", "kv_lora_rank": 64, "q_lora_rank": 64, "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16, "v_head_dim": 32, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": V, "num_nextn_predict_layers": 0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "quantization_config": _quark_config(scheme),
    }


def _gpt_oss(ts: _Tensors, g: dict, scheme: str, opts: dict) -> dict:
    H, I, E, L, V = g["hidden"], g["intermediate"], g["num_experts"], g["num_layers"], g["vocab"]
    heads, kv, hd = 4, 2, 64
    ts.bf16("model.embed_tokens.weight", V, H)
    for layer in range(L):
        p = f"model.layers.{layer}"
        ts.ones(f"{p}.input_layernorm.weight", H)
        ts.ones(f"{p}.post_attention_layernorm.weight", H)
        for proj, n, k in (("q_proj", heads * hd, H), ("k_proj", kv * hd, H), ("v_proj", kv * hd, H),
                           ("o_proj", H, heads * hd)):
            ts.bf16(f"{p}.self_attn.{proj}.weight", n, k)
            ts.bf16(f"{p}.self_attn.{proj}.bias", n)
        ts.bf16(f"{p}.self_attn.sinks", heads)
        ts.bf16(f"{p}.mlp.router.weight", E, H)
        ts.bf16(f"{p}.mlp.router.bias", E)
        gu_w, gu_s, d_w, d_s = [], [], [], []
        for _ in range(E):
            gw, gs = ts.mxfp4(I, H)
            uw, us = ts.mxfp4(I, H)
            # Rows interleaved: 2i = gate channel i, 2i+1 = up channel i.
            gu_w.append(np.stack([gw, uw], 1).reshape(2 * I, H // 2))
            gu_s.append(np.stack([gs, us], 1).reshape(2 * I, H // 32))
            dw, ds = ts.mxfp4(H, I)
            d_w.append(dw)
            d_s.append(ds)
        x = f"{p}.mlp.experts"
        ts.add(f"{x}.gate_up_proj_blocks", _as_dtype(np.stack(gu_w).reshape(E, 2 * I, H // 32, 16), ts.weight_dtype))
        ts.add(f"{x}.gate_up_proj_scales", _as_dtype(np.stack(gu_s), ts.scale_dtype))
        ts.bf16(f"{x}.gate_up_proj_bias", E, 2 * I)
        if layer == 0:
            ts.mark_split()
        ts.add(f"{x}.down_proj_blocks", _as_dtype(np.stack(d_w).reshape(E, H, I // 32, 16), ts.weight_dtype))
        ts.add(f"{x}.down_proj_scales", _as_dtype(np.stack(d_s), ts.scale_dtype))
        ts.bf16(f"{x}.down_proj_bias", E, H)
    ts.ones("model.norm.weight", H)
    ts.bf16("lm_head.weight", V, H)
    return {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": H,
        "intermediate_size": I, "num_hidden_layers": L, "num_local_experts": E,
        "num_experts_per_tok": g["top_k"], "experts_per_token": g["top_k"], "swiglu_limit": 7.0,
        "head_dim": hd, "num_attention_heads": heads, "num_key_value_heads": kv,
        "sliding_window": 128, "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                                               for i in range(L)],
        "vocab_size": V, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "original_max_position_embeddings": 4096},
        "torch_dtype": "bfloat16",
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
                                                           "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"],
                                "quant_method": "mxfp4"},
    }


def _qwen3_moe_body(ts: _Tensors, g: dict, expert) -> dict:
    """transformers' Qwen3-MoE tensors (attention kept in bf16), experts written by ``expert``."""
    H, I, E, L, V = g["hidden"], g["intermediate"], g["num_experts"], g["num_layers"], g["vocab"]
    heads, kv, hd = 2, 1, 32
    ts.bf16("lm_head.weight", V, H)
    ts.bf16("model.embed_tokens.weight", V, H)
    for layer in range(L):
        p = f"model.layers.{layer}"
        ts.ones(f"{p}.input_layernorm.weight", H)
        ts.bf16(f"{p}.mlp.gate.weight", E, H)
        for e in range(E):
            if layer == 0 and e == E // 2:
                ts.mark_split()
            for proj, n, k in (("down_proj", H, I), ("gate_proj", I, H), ("up_proj", I, H)):
                expert(f"{p}.mlp.experts.{e}.{proj}", n, k)
        ts.ones(f"{p}.post_attention_layernorm.weight", H)
        ts.ones(f"{p}.self_attn.k_norm.weight", hd)
        ts.bf16(f"{p}.self_attn.k_proj.weight", kv * hd, H)
        ts.bf16(f"{p}.self_attn.o_proj.weight", H, heads * hd)
        ts.ones(f"{p}.self_attn.q_norm.weight", hd)
        ts.bf16(f"{p}.self_attn.q_proj.weight", heads * hd, H)
        ts.bf16(f"{p}.self_attn.v_proj.weight", kv * hd, H)
    ts.ones("model.norm.weight", H)
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "decoder_sparse_step": 1, "dtype": "bfloat16", "eos_token_id": 2,
        "head_dim": hd, "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02,
        "intermediate_size": 2 * I, "max_position_embeddings": 4096, "mlp_only_layers": [],
        "model_type": "qwen3_moe", "moe_intermediate_size": I, "norm_topk_prob": True,
        "num_attention_heads": heads, "num_experts_per_tok": g["top_k"], "num_hidden_layers": L,
        "num_key_value_heads": kv, "num_local_experts": E, "output_router_logits": False,
        "pad_token_id": 0, "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
        "transformers_version": "5.23.0", "use_cache": True, "use_sliding_window": False,
        "vocab_size": V,
    }


def _ct_config(scheme: str, num_layers: int) -> dict:
    """What llmcompressor 0.14 / compressed-tensors 0.20 write for its MXFP4 presets."""
    weights = {"dynamic": False, "group_size": 32, "num_bits": 4, "observer": "memoryless_minmax",
               "scale_dtype": "torch.uint8", "strategy": "group", "symmetric": True, "type": "float"}
    inputs = {
        "w_mxfp4": None,
        "w_mxfp4_a_mxfp4": {"dynamic": True, "group_size": 32, "num_bits": 4,
                            "scale_dtype": "torch.uint8", "strategy": "group", "symmetric": True,
                            "type": "float"},
        "w_mxfp4_a_fp8": {"dynamic": True, "group_size": 128, "num_bits": 8, "strategy": "group",
                          "symmetric": True, "type": "float"},
    }[scheme]
    ignore = [f"model.layers.{i}.{m}" for i in range(num_layers)
              for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                        "self_attn.o_proj", "mlp.gate")] + ["lm_head"]
    return {
        "config_groups": {"group_0": {"format": "mxfp4-pack-quantized", "input_activations": inputs,
                                      "output_activations": None, "targets": ["Linear"],
                                      "weights": weights}},
        "format": "mxfp4-pack-quantized", "global_compression_ratio": None, "ignore": ignore,
        "kv_cache_scheme": None, "moe_sparsity_config": None, "quant_method": "compressed-tensors",
        "quantization_status": "compressed", "sparsity_config": {}, "transform_config": {},
        "version": "0.20.0",
    }


def _compressed_tensors(ts: _Tensors, g: dict, scheme: str, opts: dict) -> dict:
    """llmcompressor's MXFP4 export of a Qwen3-MoE: per-expert weight_packed / weight_scale."""
    def expert(p: str, n: int, k: int) -> None:
        ts.expert(f"{p}.weight_packed", f"{p}.weight_scale", n, k)

    config = _qwen3_moe_body(ts, g, expert)
    config["quantization_config"] = _ct_config(scheme, g["num_layers"])
    return config


def _quark_gpt_oss(ts: _Tensors, g: dict, scheme: str, opts: dict) -> dict:
    """amd-quark 0.13's export of gpt-oss: per-expert nn.Linear, gate_up rows interleaved."""
    H, I, E, L, V = g["hidden"], g["intermediate"], g["num_experts"], g["num_layers"], g["vocab"]
    heads, kv, hd = 2, 1, 32
    static_fp8 = scheme.endswith("_a_fp8")
    ts.bf16("lm_head.weight", V, H)
    ts.bf16("model.embed_tokens.weight", V, H)
    for layer in range(L):
        p = f"model.layers.{layer}"
        ts.ones(f"{p}.input_layernorm.weight", H)
        for e in range(E):
            if layer == 0 and e == E // 2:
                ts.mark_split()
            x = f"{p}.mlp.experts.{e}"
            ts.bf16(f"{x}.down_proj.bias", H)
            if static_fp8:
                ts.input_scale(f"{x}.down_proj.input_scale", "BF16")
            ts.expert(f"{x}.down_proj.weight", f"{x}.down_proj.weight_scale", H, I)
            ts.bf16(f"{x}.gate_up_proj.bias", 2 * I)
            if static_fp8:
                ts.input_scale(f"{x}.gate_up_proj.input_scale", "BF16")
            gw, gs = ts.mxfp4(I, H)
            uw, us = ts.mxfp4(I, H)
            # Rows interleaved: 2i = gate channel i, 2i+1 = up channel i.
            ts.add(f"{x}.gate_up_proj.weight",
                   _as_dtype(np.stack([gw, uw], 1).reshape(2 * I, H // 2), ts.weight_dtype))
            ts.add(f"{x}.gate_up_proj.weight_scale",
                   _as_dtype(np.stack([gs, us], 1).reshape(2 * I, H // 32), ts.scale_dtype))
        ts.bf16(f"{p}.mlp.router.bias", E)
        ts.bf16(f"{p}.mlp.router.weight", E, H)
        ts.ones(f"{p}.post_attention_layernorm.weight", H)
        for proj, n, k in (("k_proj", kv * hd, H), ("o_proj", H, heads * hd),
                           ("q_proj", heads * hd, H), ("v_proj", kv * hd, H)):
            ts.bf16(f"{p}.self_attn.{proj}.bias", n)
            ts.bf16(f"{p}.self_attn.{proj}.weight", n, k)
        ts.bf16(f"{p}.self_attn.sinks", heads)
    ts.ones("model.norm.weight", H)
    qc = _quark_config(scheme)
    qc["exclude"] = [f"model.layers.{i}.{m}" for i in range(L)
                     for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                               "self_attn.o_proj", "mlp.router")] + ["lm_head"]
    return {
        "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "bos_token_id": 1, "dtype": "bfloat16", "eos_token_id": 2, "head_dim": hd,
        "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02,
        "intermediate_size": I, "layer_types": ["full_attention"] * L,
        "max_position_embeddings": 4096, "model_type": "gpt_oss", "num_attention_heads": heads,
        "num_experts_per_tok": g["top_k"], "num_hidden_layers": L, "num_key_value_heads": kv,
        "num_local_experts": E, "output_router_logits": False, "pad_token_id": 0,
        "rms_norm_eps": 1e-05,
        "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                            "original_max_position_embeddings": 4096, "rope_theta": 150000.0,
                            "rope_type": "yarn", "truncate": False},
        "router_aux_loss_coef": 0.001, "sliding_window": 128, "swiglu_alpha": 1.702,
        "swiglu_limit": 7.0, "tie_word_embeddings": False, "transformers_version": "5.23.0",
        "use_cache": True, "vocab_size": V, "quantization_config": qc,
    }
