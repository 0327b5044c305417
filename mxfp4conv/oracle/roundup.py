"""Padded geometry: tensor/expert parallel split, the Kimi-K3 model-level rule, and vLLM's
``mxfp4_round_up_hidden_size_and_intermediate_size``.

Order (as vLLM builds a layer): per-rank split of the real sizes, Kimi-K3's model rule on
the global intermediate size, then the backend's alignment rule on the per-rank size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mxfp4conv.errors import OracleError

MX_BLOCK = 32
K3_MIN_INTERMEDIATE_PER_PARTITION = 256


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def backend_alignment(backend: str, platform: str, activation: str | None,
                      cdna: int | None = None) -> tuple[int, int | None, str]:
    """(intermediate multiple, hidden multiple or None = unchanged, rule) in the order of
    vLLM 0.33.0's ``mxfp4_round_up_hidden_size_and_intermediate_size``.

    ``activation`` is what the quant method passes: only ``Mxfp4MoEMethod`` (Kimi-K3,
    DeepSeek-V4) passes it; gpt-oss and Quark call without it. ``cdna``: the ROCm CDNA version.
    """
    if backend.startswith(("B12X_", "FLASHINFER_MOE_EP_")):
        return 1, None, f"{backend}: the model's sizes (the kernel validates them)"
    if backend == "EMULATION":
        return 32, 32, "EMULATION: OCP-MX block size 32"
    if backend == "DEEPGEMM_MXFP4":
        return 128, 128, "DEEPGEMM_MXFP4: 128"
    if backend == "CUTLASS_MXFP4_MXFP4":
        return 128, 128, "CUTLASS_MXFP4_MXFP4: 128 (scale tiles of 128 rows x 128 elements)"
    if backend in ("MARLIN", "BATCHED_MARLIN"):
        return 128, (128 if platform == "xpu" else 256), "Marlin: intermediate 128, hidden 256"
    if backend in ("FLASHINFER_TRTLLM_MXFP4_BF16", "FLASHINFER_TRTLLM_MXFP4_MXFP8"):
        return 128, 256, "TRTLLM: intermediate 128, hidden 256"
    if backend in ("FLASHINFER_CUTLASS_MXFP4_BF16", "FLASHINFER_CUTLASS_MXFP4_MXFP8"):
        return 128, 128, "CUTLASS: 128"
    if platform == "rocm":
        if backend == "AITER_MXFP4_MXFP4":
            return 128, 256, "ROCm AITER_MXFP4_MXFP4 (W4A4): intermediate 128, hidden 256"
        situ_or_silu = activation in ("situ", "silu")
        if situ_or_silu and backend == "AITER_MXFP4_BF16":
            return 128, 128, f"ROCm AITER_MXFP4_BF16 with activation {activation}: 128"
        if situ_or_silu and backend == "TRITON_UNFUSED" and cdna != 4:
            return 128, 128, (f"ROCm TRITON_UNFUSED with activation {activation} off CDNA4 "
                              "(matmul_ogs block_k 128): 128")
        passed = "no activation passed" if activation is None else f"activation {activation}"
        return 256, 256, f"ROCm {backend} ({passed}): 256"
    if backend == "CPU":
        return 32, 32, "CPU: 32"
    return 64, None, f"{backend}: intermediate 64, hidden unchanged"


@dataclass(frozen=True)
class Geometry:
    hidden: int
    hidden_padded: int
    intermediate: int  # global, real
    intermediate_per_rank: int  # real
    intermediate_per_rank_padded: int
    num_experts: int
    experts_per_rank: int
    rule: str  # the alignment rule applied
    k3_rule: str | None  # the Kimi-K3 model rule, when it changed the size


def split(hidden: int, intermediate: int, num_experts: int, tp: int, ep: bool) -> tuple[int, int]:
    """Validated (per-rank real intermediate, experts per rank)."""
    if tp < 1:
        raise OracleError(f"--tp must be at least 1, got {tp}.")
    if hidden % MX_BLOCK:
        raise OracleError(
            f"The MoE hidden size {hidden} is not a multiple of the MXFP4 block size 32; "
            "this checkpoint cannot hold MXFP4 experts of that width.")
    if ep:
        if num_experts % tp:
            raise OracleError(
                f"Expert parallel over {tp} ranks needs the expert count ({num_experts}) to be "
                f"divisible by {tp}; choose a --tp that divides {num_experts}.")
        per_rank, experts = intermediate, num_experts // tp
    else:
        if intermediate % tp:
            raise OracleError(
                f"Tensor parallel {tp} cannot split the expert intermediate size {intermediate} "
                f"evenly (vLLM requires intermediate % tp == 0); choose a --tp that divides "
                f"{intermediate}, or use --ep.")
        per_rank, experts = intermediate // tp, num_experts
    if per_rank % MX_BLOCK:
        raise OracleError(
            f"The per-rank intermediate size {per_rank} (= {intermediate} / {tp}) is not a "
            "multiple of the MXFP4 block size 32, so the MXFP4 scales cannot be split between "
            "ranks; choose a smaller --tp, or --ep.")
    return per_rank, experts


def k3_min_per_rank(intermediate: int, tp: int, ep: bool, minimum: int,
                    platform: str = "cuda", attn_tp: int | None = None) -> int | None:
    """Kimi-K3's model rule, the per-rank size it hands to FusedMoE when ``I / attn_tp`` is below
    ``minimum`` at an attention tensor parallelism ``attn_tp`` > 1: the global size becomes
    ``minimum * attn_tp``, which the MoE layer splits over its ``tp`` ranks (vLLM flattens data
    parallelism into them; ``attn_tp`` None: the same as ``tp``). vLLM 0.33.0's AMD model
    (models/kimi_k3/amd/linear.py) applies it under expert parallel too (each rank then holds
    the whole padded size); the NVIDIA one (models/kimi_k3/nvidia/model.py) not under EP. Both
    read the attention group's size (get_tensor_model_parallel_world_size)."""
    attn = tp if attn_tp is None else attn_tp
    if attn > 1 and intermediate // attn < minimum and (platform == "rocm" or not ep):
        return minimum * attn if ep else minimum * attn // tp
    return None


def padded_geometry(*, backend: str, platform: str, activation: str | None, hidden: int,
                    intermediate: int, num_experts: int, tp: int, ep: bool,
                    k3_minimum: int | None = None, align: int = 1, align_rule: str = "",
                    cdna: int | None = None, attn_tp: int | None = None) -> Geometry:
    """``align``: a further multiple both padded sizes must have (a layout's block size).
    ``tp``: the MoE layer's ranks (tensor x data parallel); ``attn_tp``: the server's tensor
    parallel size (None: ``tp``), which Kimi-K3's model rule reads."""
    per_rank, experts = split(hidden, intermediate, num_experts, tp, ep)
    start, k3_rule = per_rank, None
    if k3_minimum is not None:
        attn = tp if attn_tp is None else attn_tp
        bumped = k3_min_per_rank(intermediate, tp, ep, k3_minimum, platform, attn)
        if bumped is not None:
            start = bumped
            k3_rule = (f"Kimi-K3 model rule: intermediate / tp = {intermediate // attn} < "
                       f"{k3_minimum} at tp {attn}, so the model pads the global size to "
                       f"{k3_minimum * attn}{' (the AMD model also under EP)' if ep else ''}; "
                       f"per rank {bumped}")
    i_mult, h_mult, rule = backend_alignment(backend, platform, activation, cdna)
    if align > 1:
        i_mult = i_mult * align // math.gcd(i_mult, align)
        h_mult = (h_mult or 1) * align // math.gcd(h_mult or 1, align)
        rule = f"{rule}; {align_rule or f'layout block {align}'}"
    return Geometry(
        hidden=hidden,
        hidden_padded=round_up(hidden, h_mult) if h_mult else hidden,
        intermediate=intermediate,
        intermediate_per_rank=per_rank,
        intermediate_per_rank_padded=round_up(start, i_mult),
        num_experts=num_experts,
        experts_per_rank=experts,
        rule=rule,
        k3_rule=k3_rule,
    )
