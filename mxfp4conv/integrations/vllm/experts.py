"""mxfp4conv's Triton MoE kernel as a vLLM experts class, for CUDA targets in mxfp4conv's format.

A checkpoint converted for an NVIDIA arch holds the ``EMULATION`` format (identity bytes, or the
``hopper_mma`` layouts on sm90) that vLLM's own backends there (Marlin, FlashInfer, triton_kernels)
do not read. The plugin loads such a layer with ``mxfp4conv.runtime.load_moe_layers``, replaces
vLLM's expert parameters with these tensors, and builds vLLM's modular MoE kernel (vLLM's
prepare / finalize, its routing, its all-reduce) around ``Mxfp4convTritonExperts``, whose
``apply`` runs ``mxfp4conv.runtime.fused_moe`` (Triton, W4A16).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from mxfp4conv.runtime.experts import MoEExperts

ACTIVATIONS = ("silu", "situ", "swigluoai", "swigluoai_uninterleave")
EXPERT_PARAMS = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_bias", "w2_bias")


@functools.cache
def experts_class():
    """The experts class (defined on first use: importing this module needs no vLLM)."""
    from vllm.model_executor.layers.fused_moe import modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import TopKWeightAndReduceNoOP
    from vllm.model_executor.layers.quantization.utils.quant_utils import kMxfp4Static
    from vllm.platforms import current_platform

    class Mxfp4convTritonExperts(mk.FusedMoEExpertsModular):
        """Routed experts of one layer run by mxfp4conv's Triton kernel (bf16 activations)."""

        mxfp4conv_experts: MoEExperts | None = None  # set once the kernel is built

        @property
        def expects_unquantized_inputs(self) -> bool:
            return True

        @staticmethod
        def activation_format():
            return mk.FusedMoEActivationFormat.Standard

        @staticmethod
        def _supports_current_device() -> bool:
            return current_platform.is_cuda()

        @staticmethod
        def _supports_no_act_and_mul() -> bool:
            return False

        @staticmethod
        def _supports_quant_scheme(weight_key, activation_key) -> bool:
            return weight_key == kMxfp4Static and activation_key is None

        @staticmethod
        def _supports_activation(activation) -> bool:
            return getattr(activation, "value", activation) in ACTIVATIONS

        @staticmethod
        def _supports_parallel_config(moe_parallel_config) -> bool:
            return not moe_parallel_config.use_all2all_kernels

        def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts,
                             expert_tokens_meta, activation):
            return (0,), (0,), (M, K)

        def finalize_weight_and_reduce_impl(self):
            return TopKWeightAndReduceNoOP()  # the kernel weights and sums the top-k itself

        def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation,
                  global_num_experts, expert_map, a1q_scale, a2_scale, workspace13, workspace2,
                  expert_tokens_meta, apply_router_weight_on_input):
            from mxfp4conv.runtime import fused_moe

            ex = self.mxfp4conv_experts
            x = hidden_states[:, : ex.hidden]  # vLLM may pad the hidden states for its own pick
            y = fused_moe(x.contiguous(), ex, topk_weights, topk_ids, backend="triton", act_quant="none")
            output[:, : ex.hidden].copy_(y)
            if output.shape[1] > ex.hidden:
                output[:, ex.hidden:].zero_()

    return Mxfp4convTritonExperts


def free_vllm_experts(layer) -> torch.device:
    """Release the expert parameters vLLM allocated for its own pick; returns their device."""
    device = layer.w13_weight.device
    for name in EXPERT_PARAMS:
        p = getattr(layer, name, None)
        if isinstance(p, torch.nn.Parameter):
            p.data = torch.empty(0, dtype=p.dtype, device=device)
    return device


def install_mxfp4conv_kernel(layer, ex: MoEExperts) -> None:
    """Give ``layer`` the tensors of ``ex`` and have its ``process_weights_after_loading`` build
    vLLM's modular kernel around ``Mxfp4convTritonExperts``."""
    from vllm.model_executor.layers.fused_moe.config import mxfp4_w4a16_moe_quant_config
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import make_mxfp4_moe_kernel

    for name in EXPERT_PARAMS:
        t = getattr(ex, name)
        if t is not None:
            setattr(layer, name, torch.nn.Parameter(t, requires_grad=False))
        elif isinstance(getattr(layer, name, None), torch.nn.Parameter):
            setattr(layer, name, None)
    qm = layer.quant_method
    cls = experts_class()

    def process_weights_after_loading(layer_: Any) -> None:
        qm.moe_quant_config = mxfp4_w4a16_moe_quant_config(
            w1_scale=layer_.w13_weight_scale, w2_scale=layer_.w2_weight_scale,
            w1_bias=ex.w13_bias, w2_bias=ex.w2_bias)
        qm.experts_cls = cls
        qm.moe_kernel = make_mxfp4_moe_kernel(
            moe_quant_config=qm.moe_quant_config, moe_config=qm.moe, experts_cls=cls,
            mxfp4_backend=qm.mxfp4_backend, routing_tables=layer_._expert_routing_tables())
        qm.moe_kernel.fused_experts.mxfp4conv_experts = ex

    qm.process_weights_after_loading = process_weights_after_loading
