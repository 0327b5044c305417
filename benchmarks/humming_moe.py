"""Humming's MXFP4 MoE (the ``humming-kernels`` package) over our MXFP4 bytes, driven the way
vLLM 0.33 / 0.34 drive it on sm90, for side-by-side timing in moe_bench.py. Humming is not a
dependency and is not shipped; vLLM pins ``humming-kernels[cu13]==0.1.19``. vLLM itself is not
needed: the calls below are the ones vLLM's code makes, written from reading it.

What vLLM does for an MXFP4 MoE layer whose oracle picked HUMMING (Kimi-K3 / DeepSeek-V4 on
sm90; ``fused_moe/oracle/mxfp4.py``, ``quantization/utils/humming/moe.py``,
``fused_moe/experts/fused_humming_moe.py``):

- load time: the canonical ``w13`` [E, 2I, H/2] (gate rows, then up rows) and ``w2``
  [E, H, I/2] codes with their e8m0 scales go through ``Mxfp4WeightSchema.convert_humming``
  (gate and up as two stacks of I rows) and ``prepare_and_transform_humming_tensors`` with N
  padded to a multiple of 256 and K to 128, bf16, the default input schema (bf16 activations,
  no input quantisation: ``VLLM_HUMMING_INPUT_QUANT_CONFIG`` unset);
- each call, ``HummingIndexedExperts`` (the gemm type without expert parallelism): the routing
  aligned to the block size of Humming's tuning for M = T * top_k (``moe_align_block_size``),
  GEMM1 indexed with top_k, the gated activation fused into Humming's input processing of GEMM2
  (``binary_split``: gate = the first I columns, up = the second), GEMM2 indexed with top_k 1
  (its own alignment where its tuning picks another block size), then the top-k weights and the
  sum over k (``moe_fused_mul_sum``).

Two of vLLM's own CUDA ops are not available without vLLM: ``moe_align_block_size`` is
replaced by ``align_block_size`` below (torch, same outputs; timing runs it outside the graph,
as triton_kernels' routing is in "tk_gemms"), and ``moe_fused_mul_sum`` by one batched
matmul. The activation is the same SiTU formula vLLM hands Humming (as a CUDA expression).
"""

from __future__ import annotations

import json

import torch

VLLM_PINNED = "0.1.19"  # humming-kernels version vLLM 0.33.0 and 0.34.0 require


def align_block_size(ids: torch.Tensor, block: int, num_experts: int):
    """(sorted_ids, expert_ids, num_tokens_padded) as vLLM's ``moe_align_block_size`` returns
    them without an expert map: each expert's (token, slot) pairs, as flat indices t * k + j in
    order, padded to a multiple of ``block`` with the index T * k; the expert of each block; the
    padded total as a one-element tensor. Blocks past the total keep expert 0 (never read).
    Sync-free (capturable)."""
    flat = ids.reshape(-1).long()
    n = flat.numel()
    cap = n + num_experts * (block - 1)
    if n < num_experts:
        cap = min(n * block, cap)
    dev = ids.device
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).index_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block - 1) // block * block
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    first = torch.cumsum(counts, 0) - counts  # where each expert's pairs begin in `order`
    pos = starts[sorted_e] + torch.arange(n, device=dev) - first[sorted_e]
    sorted_ids = torch.full((cap,), n, dtype=torch.int32, device=dev)
    sorted_ids[pos] = order.to(torch.int32)
    nblocks = (cap + block - 1) // block
    block_start = torch.arange(nblocks, device=dev) * block
    expert_ids = torch.searchsorted(ends, block_start, right=True).clamp_(max=num_experts - 1).to(torch.int32)
    return sorted_ids, expert_ids, ends[-1:].to(torch.int32)


def situ_expression(beta: float, linear_beta: float | None) -> str:
    """The SiTU gate as a CUDA expression of (a = gate, b = up), the form vLLM passes Humming:
    beta tanh(a / beta) sigmoid(a), times linear_beta tanh(b / linear_beta) (or b)."""
    up = "b" if not linear_beta or linear_beta <= 0 else f"(({float(linear_beta)}f) * tanhf(b / ({float(linear_beta)}f)))"
    return (f"[](float a, float b) {{ return (({float(beta)}f) * tanhf(a / ({float(beta)}f))) / (1.f + expf(-a)) "
            f"* {up}; }}(a, b)")


class Humming:
    """The imported humming package and the versions in use."""

    def __init__(self):
        import humming
        from humming import forward, transform
        from humming.config import GemmType
        from humming.schema import HummingInputSchema, Mxfp4WeightSchema
        from humming.tune import get_heuristics_config
        self.humming, self.forward, self.transform = humming, forward, transform
        self.GemmType, self.HummingInputSchema, self.Mxfp4WeightSchema = GemmType, HummingInputSchema, Mxfp4WeightSchema
        self.get_heuristics_config = get_heuristics_config
        self.version = getattr(humming, "__version__", "?")

    def describe(self) -> str:
        pinned = "" if self.version == VLLM_PINNED else f" (vLLM 0.33 / 0.34 pin {VLLM_PINNED})"
        return f"humming-kernels {self.version}{pinned}"


class HummingMoE:
    """One MoE layer through Humming: ``prepare(ids)`` then ``run(x, ids, tw, route)`` -> y [T, H]."""

    def __init__(self, hm: Humming, w13, s13, w2, s2, beta: float, linear_beta: float | None):
        E, two_i, h2 = w13.shape
        self.hm, self.E, self.I, self.H = hm, E, two_i // 2, 2 * h2
        self.configs, self.tensors = {}, {}
        for name, w, s, n, k, stacks in (("w13", w13, s13, two_i, self.H, [self.I, self.I]),
                                         ("w2", w2, s2, self.H, self.I, [self.H])):
            self.configs[name], self.tensors[name] = self._repack(w, s, n, k, stacks)
        self.activation = {"activation_type": "binary_split", "activation_impl": situ_expression(beta, linear_beta)}
        sms = torch.cuda.get_device_properties(w13.device).multi_processor_count
        self.locks = torch.zeros(sms * 8, dtype=torch.int32, device=w13.device)
        gemm = hm.GemmType.INDEXED
        self.compute = json.dumps({"use_batch_invariant": False, "use_f16_accum": False, "gemm_type": gemm.value})
        self.tuning = {n: hm.get_heuristics_config(layer_config=c, use_f16_accum=False, use_batch_invariant=False,
                                                   gemm_type=gemm) for n, c in self.configs.items()}
        self.tuning_str = {n: json.dumps(t) for n, t in self.tuning.items()}

    def _repack(self, w, s, n, k, stacks):
        """vLLM's load-time path for one sublayer: convert_humming, then the transform (padded N 256, K 128)."""
        hm = self.hm
        ws, tensors = hm.Mxfp4WeightSchema().convert_humming(
            tensors={"weight": w, "weight_scale": s}, shape_n_stacks=stacks, shape_k_stacks=[k],
            param_dtype=torch.bfloat16, num_experts=self.E)
        ins, _ = hm.HummingInputSchema().convert_humming(
            tensors={}, shape_n_stacks=stacks, shape_k_stacks=[k], param_dtype=torch.bfloat16, num_experts=self.E)
        ins = ins.to_humming_schema(torch.bfloat16)
        config, out = hm.transform.prepare_and_transform_humming_tensors(
            tensors=tensors, shape_n=n, shape_k=k, pad_n_to_multiple=256, pad_k_to_multiple=128,
            input_schema=ins, weight_schema=ws, has_bias=False, num_experts=self.E, torch_dtype=torch.bfloat16,
            device=w.device)
        return config, out

    def block_size(self, name: str, m: int) -> int:
        for lo, hi, cfg in self.tuning[name]:
            if lo < m <= hi:
                return cfg["block_shape"][0]
        return 64

    def prepare(self, ids: torch.Tensor):
        """The routing as vLLM aligns it for each GEMM's block size, and the buffers of one call."""
        T, k = ids.shape
        m = T * k
        b1, b2 = self.block_size("w13", m), self.block_size("w2", m)
        a1 = align_block_size(ids, b1, self.E)
        a2 = a1 if b2 == b1 else align_block_size(ids, b2, self.E)
        dev = ids.device
        bufs = dict(gate_up=torch.empty(m, 2 * self.I, dtype=torch.bfloat16, device=dev),
                    act=torch.empty(m, self.I, dtype=torch.bfloat16, device=dev),
                    down=torch.empty(m, self.H, dtype=torch.bfloat16, device=dev))
        return a1, a2, m, bufs

    def _gemm(self, name, inputs, outputs, align, top_k, m):
        t = self.tensors[name]
        sorted_ids, expert_ids, padded = align
        return self.hm.forward.humming_forward(
            self.configs[name], inputs=inputs, weight=t["weight"], weight_scale=t.get("weight_scale"),
            zero_point=t.get("zero_point"), bias=t.get("bias"), weight_scale_2=t.get("weight_scale_2"),
            input_scale=None, input_scale_2=None, outputs=outputs, locks=self.locks, sorted_ids=sorted_ids,
            expert_ids=expert_ids, num_tokens_padded=padded, compute_config=self.compute, valid_shape_m=m,
            top_k=top_k, tuning_config=self.tuning_str[name])

    def run(self, x: torch.Tensor, tw: torch.Tensor, route) -> torch.Tensor:
        a1, a2, m, bufs = route
        T, k = tw.shape
        self._gemm("w13", x, bufs["gate_up"], a1, k, m)
        act, _, _ = self.hm.forward.may_process_input(
            self.configs["w2"], inputs=bufs["gate_up"], outputs=bufs["act"], token_scales=None,
            hadamard_block_size=0, layout="normal", **self.activation)
        self._gemm("w2", act, bufs["down"], a2, 1, m)
        # moe_fused_mul_sum: y[t] = sum_j tw[t, j] * down[t * k + j]
        return torch.bmm(tw.to(torch.bfloat16).unsqueeze(1), bufs["down"].view(T, k, self.H)).squeeze(1)

    def __call__(self, x, ids, tw):
        return self.run(x, tw, self.prepare(ids))
