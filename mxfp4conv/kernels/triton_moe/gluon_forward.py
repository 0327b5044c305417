"""The layer in the Gluon kernels: a program per (token, expert) pair, or expert blocks of 8 pairs.
"""

from __future__ import annotations


from mxfp4conv.kernels.triton_moe import hopper_kernels as HK
from mxfp4conv.kernels.triton_moe.gluon_load import _compiled_or_none, _gluon_grouped_module, _gluon_module
from mxfp4conv.kernels.triton_moe.gluon_choice import (GROUPED_BLOCK_T, device_sms, gluon_rows2, grouped_masks,
                                                     grouped_programs1, loop_tuning)
from mxfp4conv.kernels.triton_moe.launch import _contiguous, _sum_launch, moe_align


def _gluon_forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, act, out, plan,
                   required, by_kernel=False, rows2=64, tune=None, reuse_counters=True, *, order):
    """The layer in the few-token Gluon kernels; None (the caller runs the hopper_mma kernels) where
    they fail to compile and were not required: a Triton whose Gluon differs from the one they were
    written for. The failure is warned about once. by_kernel: the sum over k in the k-sum kernel; rows2: GEMM2's rows
    a program; tune: loop_tuning's unroll and maxnreg; reuse_counters: the arrival counters from the device's buffer
    (counters.zeroed_counters); order: the weight words' bit order (GLUON_SETS'). GEMM2 and the k-sum kernel run as
    programmatic dependents of the kernel before them where Triton has it (HK.HAS_GDC)."""
    k1, k2, s1, s2 = plan
    tensors = _contiguous(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias)

    def k_sum(part2):
        _sum_launch(part2, tensors[6], out, x.shape[1], topk_ids.shape[1], w13.shape[0], s2, HK.HAS_GDC)
        return out

    return _compiled_or_none(lambda: _gluon_module().forward(*tensors, act, out, k1=k1, k2=k2, splits1=s1, splits2=s2,
                                                             pdl=HK.HAS_GDC, k_sum=k_sum if by_kernel else None,
                                                             rows2=rows2, reuse_counters=reuse_counters,
                                                             release2=HK.HAS_GDC, order=order,
                                                             **(tune or {})), required)


def _gluon_grouped_forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, act, out,
                           cfg, plan, order):
    """The layer in the Gluon kernels on expert blocks with grouped_plan's (k1, k2, splits1, blocks2): the align
    and the k-sum are the Triton path's; None as _gluon_forward; order: the weight words' bit order."""
    H, E, top_k = x.shape[1], w13.shape[0], topk_ids.shape[1]
    k1, k2, splits1, blocks2 = plan
    rows2 = gluon_rows2(cfg, H, w13.shape[1] // 2, k2)

    tensors = _contiguous(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias)

    def k_sum(pair_out):  # (nothing launched between GEMM2 and it: the ids are made contiguous before)
        _sum_launch(pair_out, tensors[6], out, H, top_k, E, 1, HK.HAS_GDC)
        return out

    return _compiled_or_none(lambda: _gluon_grouped_module().forward(
        *tensors, act, lambda bt: moe_align(topk_ids, E, bt, cfg.align, HK.HAS_GDC), k_sum, k1=k1, k2=k2,
        block_t=GROUPED_BLOCK_T, splits1=splits1, blocks2=blocks2, masked=bool(grouped_masks(cfg, w13.shape[1] // 2)),
        rows2=rows2, pdl=HK.HAS_GDC, release2=HK.HAS_GDC, order=order,
        **loop_tuning(cfg, True, k1, rows2 if blocks2 == 1 else 64,
                      grouped_programs1(x.shape[0], top_k, E, w13.shape[1] // 2, splits1), device_sms(x.device),
                      order)),
        cfg.gluon_grouped == 1 and cfg.gluon == 1)
