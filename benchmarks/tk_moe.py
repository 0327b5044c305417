"""OpenAI's triton_kernels MoE (``matmul_ogs``, Hopper MX layouts) over our MXFP4 bytes, for
side-by-side timing in moe_bench.py. triton_kernels is not a dependency and is not shipped: it
is imported from a directory given on the command line (``--triton-kernels DIR``, DIR holding
the ``triton_kernels`` package, e.g. the copy that vLLM bundles as ``vllm/third_party``).

The call mirrors how vLLM serves MXFP4 MoE on sm90 through triton_kernels (the routing API of
its 3.5-era copy, ``routing_from_bitmatrix``): weights transposed to [E, K, N] and converted to
``HopperMXValueLayout`` / ``HopperMXScaleLayout`` (8 warps), ``split_k = 1``, the swiglu fused
into the first ``matmul_ogs`` (gate / up columns interleaved), the top-k weights and the sum
over k in the second one's scatter. Same bytes as ours: w13's gate and up rows are interleaved
(a permutation of rows), nothing else changes.
"""

from __future__ import annotations

import importlib
import sys

import torch

SWIGLU = (1.702, 7.0)  # gpt-oss alpha, limit: the activation triton_kernels fuses


class TritonKernels:
    """The imported triton_kernels modules (matmul_ogs API of the triton 3.5 / 3.6 line)."""

    def __init__(self, path: str):
        if path not in sys.path:
            sys.path.insert(0, path)
        self.tk = importlib.import_module("triton_kernels")
        self.mo = importlib.import_module("triton_kernels.matmul_ogs")
        self.routing = importlib.import_module("triton_kernels.routing")
        self.tensor = importlib.import_module("triton_kernels.tensor")
        self.layout = importlib.import_module("triton_kernels.tensor_details.layout")
        self.numerics = importlib.import_module("triton_kernels.numerics")
        self.swiglu = importlib.import_module("triton_kernels.swiglu")
        flags = importlib.import_module("triton_kernels.matmul_ogs_details.opt_flags")
        flags.update_opt_flags_constraints({"split_k": 1})  # as vLLM sets it on sm90
        self.act = self.mo.FusedActivation(
            self.mo.FnSpecs("swiglu", self.swiglu.swiglu_fn, ("alpha", "limit")), SWIGLU, 2)
        self.path = path


def _cat(parts):
    """Concatenate swizzled chunks along experts, keeping their strides (a layout may hand back
    the transpose of a contiguous tensor)."""
    if all(p.mT.is_contiguous() for p in parts) and not parts[0].is_contiguous():
        return torch.cat([p.mT for p in parts]).mT
    return torch.cat([p.contiguous() for p in parts])


def _convert(tk: TritonKernels, w: torch.Tensor, s: torch.Tensor, chunk: int = 16):
    """Canonical [E, N, K/2] codes and [E, N, K/32] scales -> triton_kernels Tensors ([E, K, N]
    logical) in the Hopper MX layouts, expert chunk by expert chunk (the conversion's temporaries
    are several times the bytes)."""
    T, L = tk.tensor, tk.layout
    vl, vopt = L.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    sl, sopt = L.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)
    out = []
    for src, dtype, lay, opt in ((w, T.FP4, vl, vopt), (s, None, sl, sopt)):
        parts = [T.convert_layout(T.wrap_torch_tensor(src[a:a + chunk].transpose(-2, -1), dtype=dtype), lay, **opt)
                 for a in range(0, src.shape[0], chunk)]
        first = parts[0]
        shape = list(first.shape)
        shape[0] = src.shape[0]
        out.append(T.Tensor(T.Storage(_cat([p.storage.data for p in parts]), first.storage.layout),
                            dtype=first.dtype, shape=shape))
    return out


class TkMoE:
    """One MoE layer through triton_kernels: __call__(x, ids, tw) -> y [T, H]; with
    ``prepare(ids, tw)`` first, ``run(x, route)`` skips the routing step."""

    def __init__(self, tk: TritonKernels, w13, s13, w2, s2):
        E, two_i, h2 = w13.shape
        I = two_i // 2
        inter = lambda t: t.view(E, 2, I, t.shape[-1]).transpose(1, 2).reshape(E, two_i, t.shape[-1])
        self.tk, self.E, self.I, self.H = tk, E, I, 2 * h2
        self.w1, s1 = _convert(tk, inter(w13), inter(s13))
        self.w2, s2t = _convert(tk, w2, s2)
        flex = tk.mo.FlexCtx(rhs_data=tk.numerics.InFlexData())
        self.pc1 = tk.mo.PrecisionConfig(weight_scale=s1, flex_ctx=flex)
        self.pc2 = tk.mo.PrecisionConfig(weight_scale=s2t, flex_ctx=flex)

    def prepare(self, ids: torch.Tensor, tw: torch.Tensor):
        """routing_from_bitmatrix over our top-k ids / weights (what vLLM's make_routing_data does)."""
        T, k = ids.shape
        words = (self.E + 31) // 32
        idx = ids.long()
        bits = torch.zeros(T, words, dtype=torch.int64, device=ids.device)
        bits.scatter_add_(1, idx // 32, torch.ones_like(idx) << (idx % 32))  # distinct experts: add = or
        bits = torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits).to(torch.int32).view(torch.uint32)
        bm = self.tk.tensor.Bitmatrix(bits, shape=[T, words * 32], shape_max=[T, None], scratchpad=None)
        return self.tk.routing.routing_from_bitmatrix(bm, tw.to(torch.bfloat16), ids.to(torch.int16), self.E, k)

    def run(self, x: torch.Tensor, route) -> torch.Tensor:
        rd, gi, si = route
        mo = self.tk.mo
        T = x.shape[0]
        k = rd.n_expts_act
        h = torch.empty(1, T * k, self.I, dtype=x.dtype, device=x.device)
        mo.matmul_ogs(x, self.w1, None, rd, gather_indx=gi, precision_config=self.pc1,
                      fused_activation=self.tk.act, y=h)
        y = torch.empty(1, T, self.H, dtype=x.dtype, device=x.device)
        mo.matmul_ogs(h.view(T * k, self.I), self.w2, None, rd, scatter_indx=si, precision_config=self.pc2,
                      gammas=rd.gate_scal, y=y)
        return y.view(T, self.H)

    def __call__(self, x, ids, tw):
        return self.run(x, self.prepare(ids, tw))
