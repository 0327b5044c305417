"""Shared pieces of the runtime tests: random MXFP4 experts, a float64 oracle, and a writer of
converted-format directories built straight from the kernel-ready format spec."""

from __future__ import annotations

import json
import math
import os
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E2M1_LUT = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float64)


def dequant64(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Independent float64 MXFP4 decode: low nibble = even element, value * 2**(s - 127)."""
    p = packed.to(torch.int64)
    codes = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)
    vals = E2M1_LUT[codes]
    exp = torch.pow(torch.tensor(2.0, dtype=torch.float64), scales.to(torch.float64) - 127.0)
    return vals * exp.repeat_interleave(32, dim=-1)


def random_mxfp4(gen: torch.Generator, *shape_rows: int, k: int, lo: int = 122, hi: int = 128):
    """Random valid MXFP4 bytes ``[..., k/2]`` and e8m0 scales ``[..., k/32]`` (no 0xFF)."""
    packed = torch.randint(0, 256, (*shape_rows, k // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(lo, hi, (*shape_rows, k // 32), generator=gen, dtype=torch.int32).to(torch.uint8)
    return packed, scales


# ---- float64 activations, written out from the formulas (not through the runtime) ----------
def sig(x):
    return 1.0 / (1.0 + torch.exp(-x))


def act64(name: str, params: dict, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    if name == "situ":
        b, lb = params.get("beta", 1.0), params.get("linear_beta")
        up = lb * torch.tanh(u / lb) if lb is not None and lb > 0 else u
        return b * torch.tanh(g / b) * sig(g) * up
    if name == "silu":
        lim = params.get("swiglu_limit")
        if lim is not None:
            g, u = torch.minimum(g, torch.full_like(g, lim)), u.clamp(-lim, lim)
        return g * sig(g) * u
    if name == "swigluoai":
        a, lim = params.get("alpha", 1.702), params.get("limit", params.get("swiglu_limit", 7.0))
        g, u = torch.minimum(g, torch.full_like(g, lim)), u.clamp(-lim, lim)
        return (u + 1.0) * g * sig(a * g)
    raise AssertionError(name)


def mxfp4_qdq64(x):
    """float64 dynamic MXFP4 (scale rounding 'even'): independent of the codec."""
    b = x.reshape(*x.shape[:-1], -1, 32)
    amax = b.abs().amax(-1, keepdim=True).to(torch.float32)
    bits = (amax.view(torch.int32) + 0x200000) & 0x7F800000
    e = torch.floor(torch.log2(bits.view(torch.float32).double().clamp_min(2.0**-126))) - 2
    scale = torch.pow(2.0, e.clamp(-127, 127))
    scale = torch.where(amax == 0, torch.full_like(scale, 2.0**-127), scale)
    v = b / scale
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    a = v.abs().clamp(max=6.0)
    idx = (a.unsqueeze(-1) - grid).abs().argmin(-1)
    # ties go to the even code
    lo, hi = grid[idx], grid[(idx + 1).clamp(max=7)]
    tie = ((a - lo) == (hi - a)) & (idx % 2 == 1) & (idx < 7)
    q = torch.where(tie, hi, grid[idx]) * torch.sign(v)
    return (q * scale).reshape(x.shape)


def moe64(x, topk_weights, topk_ids, expert_fn) -> torch.Tensor:
    """``sum_k w_k * expert_fn(e, x_t)`` in float64, token by token (no batching tricks)."""
    x = x.to(torch.float64)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            y = expert_fn(int(topk_ids[t, j]), x[t : t + 1])
            if y is not None:
                out[t] += float(topk_weights[t, j]) * y[0]
    return out


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.to(torch.float64), want.to(torch.float64)
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


# ---- converted-format directory, written from the spec -------------------------------------
def manifest_for(*, arch="cpu", backend="EMULATION", tp=1, ep=False, act_quant="bf16", activation="silu",
                 activation_params=None, hidden, hidden_padded, intermediate, i_rank, i_rank_padded,
                 num_experts, top_k, layers, layout=None, gate_mode="separated", runtime_env=None) -> dict:
    layout = layout or {"w13": "identity", "w13_scale": "identity", "w2": "identity", "w2_scale": "identity"}
    return {
        "format": "mxfp4conv-kernel-layout",
        "version": 1,
        "tool_version": "test",
        "vllm": "0.33.0",
        "target": {"arch": arch, "backend": backend, "activation": activation,
                   "activation_params": dict(activation_params or {}), "act_quant": act_quant,
                   "tp": tp, "ep": ep, "gate_mode": gate_mode,
                   "is_shuffled": any(v.startswith("aiter_") for v in layout.values()), "options": {}},
        "layout": {**layout, "w13_bias": "identity", "w2_bias": "identity", "gate_up": "[gate; up]"},
        "moe": {"hidden": hidden, "hidden_padded": hidden_padded, "intermediate": intermediate,
                "intermediate_per_rank": i_rank, "intermediate_per_rank_padded": i_rank_padded,
                "num_experts": num_experts, "experts_per_rank": num_experts // tp if ep else num_experts,
                "top_k": top_k, "layers": list(layers)},
        "runtime_env": dict(runtime_env or {}),
        "source": {"path": "synthetic", "sha256": "0" * 64, "family": "test", "quant_scheme": "w_mxfp4"},
    }


def write_converted(root: Path, manifest: dict, tensors: dict[str, torch.Tensor], shards: int = 2) -> Path:
    """Write ``tensors`` (final names -> stored tensors) as a converted checkpoint directory."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    per = math.ceil(len(names) / shards)
    weight_map, total = {}, 0
    meta = {"format": "pt", "mxfp4conv": json.dumps(manifest, sort_keys=True)}
    for i in range(shards):
        part = names[i * per : (i + 1) * per]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in part}, str(root / fname), metadata=meta)
        for n in part:
            weight_map[n] = fname
            total += tensors[n].numel() * tensors[n].element_size()
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    # the crc32 of every expert tensor's bytes, as convert records them once the shards are written
    crcs = {n: zlib.crc32(t.contiguous().reshape(-1).view(torch.uint8).numpy()) for n, t in tensors.items()
            if ".experts.rank" in n}
    (root / "mxfp4conv.json").write_text(json.dumps({**manifest, "checksums": {"crc32": crcs}}, indent=2))
    return root


# ---- a global expert set and its per-rank canonical tensors (the spec's TP/EP/padding rules) --
def global_experts(seed: int, E: int, H: int, I: int, bias: bool = False, input_scales: bool = False) -> dict:
    g = torch.Generator().manual_seed(seed)
    w1, s1 = random_mxfp4(g, E, I, k=H)
    w3, s3 = random_mxfp4(g, E, I, k=H)
    w2, s2 = random_mxfp4(g, E, H, k=I)
    d = {"w1": w1, "s1": s1, "w3": w3, "s3": s3, "w2": w2, "s2": s2, "E": E, "H": H, "I": I}
    if bias:
        d["b13"] = torch.randn(E, 2 * I, generator=g)
        d["b2"] = torch.randn(E, H, generator=g)
    if input_scales:
        d["is13"] = torch.rand(E, generator=g) * 0.02 + 0.01
        d["is2"] = torch.rand(E, generator=g) * 0.02 + 0.01
    return d


def rank_tensors(d: dict, *, tp: int, ep: bool, rank: int, H_pad: int, I_pad: int, scale_pad: int = 0) -> dict:
    """Canonical (identity-layout) per-rank tensors exactly as kernel-ready-format.md describes."""
    E, H, I = d["E"], d["H"], d["I"]
    experts = range(rank * E // tp, (rank + 1) * E // tp) if ep else range(E)
    Ir = I if ep else I // tp
    c0 = 0 if ep else rank * Ir
    n = len(experts)
    sl = slice(experts.start, experts.stop)
    w13 = torch.zeros(n, 2 * I_pad, H_pad // 2, dtype=torch.uint8)
    s13 = torch.full((n, 2 * I_pad, H_pad // 32), scale_pad, dtype=torch.uint8)
    w13[:, :Ir, : H // 2] = d["w1"][sl, c0 : c0 + Ir]
    w13[:, I_pad : I_pad + Ir, : H // 2] = d["w3"][sl, c0 : c0 + Ir]
    s13[:, :Ir, : H // 32] = d["s1"][sl, c0 : c0 + Ir]
    s13[:, I_pad : I_pad + Ir, : H // 32] = d["s3"][sl, c0 : c0 + Ir]
    w2 = torch.zeros(n, H_pad, I_pad // 2, dtype=torch.uint8)
    s2 = torch.full((n, H_pad, I_pad // 32), scale_pad, dtype=torch.uint8)
    w2[:, :H, : Ir // 2] = d["w2"][sl, :, c0 // 2 : (c0 + Ir) // 2]
    s2[:, :H, : Ir // 32] = d["s2"][sl, :, c0 // 32 : (c0 + Ir) // 32]
    out = {"w13_weight": w13, "w13_weight_scale": s13, "w2_weight": w2, "w2_weight_scale": s2}
    if "b13" in d:
        b13 = torch.zeros(n, 2 * I_pad)
        b13[:, :Ir] = d["b13"][sl, c0 : c0 + Ir]
        b13[:, I_pad : I_pad + Ir] = d["b13"][sl, I + c0 : I + c0 + Ir]
        b2 = torch.zeros(n, H_pad)
        if ep or rank == 0:
            b2[:, :H] = d["b2"][sl]
        out.update(w13_bias=b13, w2_bias=b2)
    if "is13" in d:
        out.update(w13_input_scale=d["is13"][sl].clone(), w2_input_scale=d["is2"][sl].clone())
    return out


def expert64(d: dict, activation: str, params: dict, act_q=None):
    """float64 ``expert_fn(e, x)`` on the global (unsplit, unpadded) experts of ``d``."""
    I = d["I"]

    def fn(e, x):
        a = act_q(x, "w13") if act_q else x
        gate = a @ dequant64(d["w1"][e], d["s1"][e]).T
        up = a @ dequant64(d["w3"][e], d["s3"][e]).T
        if "b13" in d:
            gate = gate + d["b13"][e, :I].double()
            up = up + d["b13"][e, I:].double()
        h = act64(activation, params, gate, up)
        h = act_q(h, "w2") if act_q else h
        y = h @ dequant64(d["w2"][e], d["s2"][e]).T
        if "b2" in d:
            y = y + d["b2"][e].double()
        return y

    return fn


def make_experts(d: dict, *, tp=1, ep=False, rank=0, H_pad=None, I_pad=None, activation="silu",
                 params=None, act_quant="bf16", scale_pad=0):
    from mxfp4conv.runtime import MoEExperts

    E, H, I = d["E"], d["H"], d["I"]
    H_pad = H_pad or H
    Ir = I if ep else I // tp
    I_pad = I_pad or Ir
    t = rank_tensors(d, tp=tp, ep=ep, rank=rank, H_pad=H_pad, I_pad=I_pad, scale_pad=scale_pad)
    epr = E // tp if ep else E
    return MoEExperts(
        prefix="model.layers.0.mlp", arch="cpu", backend="EMULATION", tp=tp, ep=ep, rank=rank,
        act_quant=act_quant, hidden=H, hidden_padded=H_pad, intermediate=I, intermediate_per_rank=Ir,
        intermediate_per_rank_padded=I_pad, num_experts=E, experts_per_rank=epr,
        expert_offset=rank * epr if ep else 0, top_k=2, activation=activation,
        activation_params=dict(params or {}), **t,
    )


def triton_ready() -> bool:
    """mxfp4conv's Triton kernels can run here: a GPU, or the interpreter (TRITON_INTERPRET=1)."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        return False
    try:
        from mxfp4conv.kernels import triton_moe  # noqa: F401
    except Exception:
        return False
    return True
