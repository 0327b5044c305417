"""Kimi-K3 SiTUv2 on AITER: which activation precision the served kernels run, from the manifest.

vLLM 0.33.0 reads ``VLLM_ROCM_USE_AITER_MOE_SITUV2`` (``envs.py``; ``_resolve_situv2_activation``
in ``_aiter_ops.py``): ``auto`` (the default) and the legacy ``1`` mean a4w4, ``0`` means a16w4,
otherwise the value (``a4w4`` | ``a8w4`` | ``a16w4``). It mirrors the mode into aiter's own
``AITER_SITUV2_A4W4`` / ``AITER_SITUV2_A8W4`` (``_sync_aiter_situv2_moe_env``). The a8w4 FlyDSL
kernels read w13 with the 16-row gate/up interleave; a16w4 and a4w4 read it separated
(``is_fused_moe_situv2_gate_up_interleaved``). a4w4 quantises both GEMM inputs to MXFP4
per 32 along K at run time; a8w4 to fp8; a16w4 keeps bf16.

The mode applies to the SiTU layers vLLM sends to AITER (``AITER_MXFP4_BF16`` off gfx1250).
Older manifests pinned a8w4 with ``VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4=1`` and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from mxfp4conv.errors import CheckpointError

ENV = "VLLM_ROCM_USE_AITER_MOE_SITUV2"
LEGACY_A8W4_ENV = "VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4"
MODES = ("a4w4", "a8w4", "a16w4")
ACT_QUANT = {"a4w4": "mxfp4", "a8w4": "fp8", "a16w4": "none"}  # what each mode feeds both GEMMs
_FROM_ACT = {"mxfp4": "a4w4", "fp8": "a8w4", "none": "a16w4"}
AITER_ENV = {"a4w4": "AITER_SITUV2_A4W4", "a8w4": "AITER_SITUV2_A8W4"}
INTERLEAVED_W13 = "aiter_p16_gu16"
SEPARATED_W13 = "aiter_p16"


def applies(target: Mapping) -> bool:
    """Whether the target's experts run AITER's SiTUv2 kernels."""
    arch = str(target.get("arch", "")).lower()
    return str(target.get("activation")) == "situ" and target.get("backend") == "AITER_MXFP4_BF16" \
        and arch != "gfx1250"


def env_mode(runtime_env: Mapping[str, str], where: str) -> str | None:
    """The mode the manifest's ``runtime_env`` pins (vLLM 0.33.0's rules), or None when it pins none."""
    value = runtime_env.get(ENV)
    if value is None:
        return "a8w4" if str(runtime_env.get(LEGACY_A8W4_ENV, "0")) == "1" else None
    v = str(value).strip().lower()
    if v in ("auto", "1"):
        return "a4w4"
    if v == "0":
        return "a16w4"
    if v not in MODES:
        raise CheckpointError(
            f"{where}: runtime_env sets {ENV}={value!r}, which vLLM 0.33.0 does not accept (auto, a4w4, "
            "a8w4 or a16w4). The manifest is damaged; convert the source again."
        )
    return v


def resolve(target: Mapping, runtime_env: Mapping[str, str], layout: Mapping[str, str], declared: str,
            kernel: str | None, where: str) -> str | None:
    """The SiTUv2 mode of these experts, or None when they do not run SiTUv2 on AITER.

    The pinned environment wins; without one the manifest's ``options.kernel_act`` (``kernel``: none | fp8 |
    mxfp4, or None where it names none) or, failing that, its resolved act_quant (``declared``) names the mode. A
    mode that contradicts ``kernel_act`` or the stored w13 layout is an error.
    """
    if not applies(target):
        return None
    pinned = env_mode(runtime_env, where)
    mode = pinned or _FROM_ACT[kernel or declared]
    if kernel is not None and _FROM_ACT[kernel] != mode:
        raise CheckpointError(
            f"{where}: the manifest pins SiTUv2 {mode} ({ENV} in runtime_env) but says the kernel feeds "
            f"{kernel} activations (target.options.kernel_act); the two contradict each other. Convert the "
            "source again."
        )
    w13 = str(layout.get("w13", "identity"))
    want = INTERLEAVED_W13 if mode == "a8w4" else SEPARATED_W13
    if w13 in (INTERLEAVED_W13, SEPARATED_W13) and w13 != want:
        how = "with" if mode == "a8w4" else "without"
        raise CheckpointError(
            f"{where}: SiTUv2 {mode} runs kernels that read w13 {how} the 16-row gate/up interleave "
            f"({want}), but the checkpoint stores w13 as {w13}; the server would compute wrong answers over "
            f"these bytes. Convert the source again for SiTUv2 {mode}."
        )
    return mode


def sync_aiter_env(mode: str) -> dict[str, str]:
    """Set aiter's own SiTUv2 switch for ``mode`` as vLLM does (exactly one, or none for a16w4)."""
    selected = AITER_ENV.get(mode)
    applied = {}
    for name in AITER_ENV.values():
        if name == selected:
            os.environ[name] = "1"
            applied[name] = "1"
        else:
            os.environ.pop(name, None)
    return applied
