"""The fused MXFP4 MoE in Triton and Gluon (W4A16): the ``triton`` backend of ``fused_moe``.

Entry point: ``fused_moe_triton``. With it: ``MoEConfig`` (every tile size and switch) and ``select_config`` (the
default for a call), ``layout_of`` and the layout names the kernels read, and ``_big_scales``, which the loader runs
once at load time so that no call inside a CUDA graph capture computes it first.

Steps (four launches): align (sort the (token, k) pairs by expert into padded blocks), GEMM1 (gate and up rows of
w13 dequantised in registers, activation in the epilogue, intermediate written once in the activation dtype), GEMM2
(w2, top-k weight and bias applied, one row per (token, k) pair) and a deterministic sum over k. No float atomics.
When few tokens leave SMs idle, both GEMMs split K: GEMM1 then writes fp32 partials and a fifth small kernel sums them
and applies the activation; GEMM2's partials are summed by the final k-sum.
On the Hopper layouts one token takes two kernels and a memset instead: no align (one block per pair), the split-K
activation and the k-sum in the GEMMs' tails (``hopper_forward.hopper_options``); and on hopper_mma_xor and
hopper_mma_rot, 1 to 11 bf16 tokens on an sm_90 GPU go to the Gluon kernels of ``gluon_few_tokens``
(``gluon_choice.gluon_plan``), a program per (token, expert) pair, while their pairs number under a fifth of the
experts, and past that, at up to 5.5 pairs an expert, to those of ``gluon_grouped`` (``gluon_choice.grouped_plan``) on
8-pair expert blocks.

The modules, by job:

- ``forward``: the entry point and the path choice; the identity-layout MMA path and the decode path without tensor
  cores (``moe_gemv*_kernel``, for decode batches where each touched expert sees about one pair).
- ``config``, ``tiles``, ``gluon_choice``: the knobs, the default tiles of the Triton paths (one table, walked by
  ``select_config``), the Gluon paths' plans.
- ``launch``: what every path does around its GEMMs (checks, align, activation over K splits, sum over k).
- ``hopper_forward``, ``gluon_forward``, ``gluon_load``: the hopper_mma path, the Gluon paths, Gluon's guarded import.
- kernels: ``mma_kernels`` (identity layout, align, sums), ``gemv_kernels``, ``hopper_kernels`` (the hopper_mma
  layouts), ``gluon_few_tokens``, ``gluon_grouped``, ``gluon_wgmma`` (Gluon), ``counters``.
"""

from mxfp4conv.kernels.triton_moe.config import MoEConfig
from mxfp4conv.kernels.triton_moe.forward import fused_moe_triton
from mxfp4conv.kernels.triton_moe.launch import _big_scales
from mxfp4conv.kernels.triton_moe.layouts import GLUON_SETS, HOPPER_ORDERS, HOPPER_SETS, LAYOUT_SETS, layout_of
from mxfp4conv.kernels.triton_moe.tiles import select_config, uses_gemv

__all__ = ["GLUON_SETS", "HOPPER_ORDERS", "HOPPER_SETS", "LAYOUT_SETS", "MoEConfig", "_big_scales",
           "fused_moe_triton", "layout_of", "select_config", "uses_gemv"]
