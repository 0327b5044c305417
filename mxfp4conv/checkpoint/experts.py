"""One routed expert's bytes, in canonical orientation, read without touching the others.

``read_expert_np`` reads into numpy (the converter and verify run on it, without torch);
``read_expert`` hands the same bytes out as torch tensors (the runtime and the tests).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from mxfp4conv.checkpoint.canonical import FusedExperts, GateUpExpertTensors, MoELayer, TensorRef
from mxfp4conv.errors import CheckpointError


@dataclass
class ExpertData:
    """uint8 MXFP4 bytes of one expert (numpy arrays, or torch tensors from ``read_expert``).
    w13 rows are [gate; up] (gpt-oss de-interleaved)."""

    w13: object  # [2I, H/2]
    w13_scale: object  # [2I, H/32]
    w2: object  # [H, I/2]
    w2_scale: object  # [H, I/32]
    w13_bias: object | None = None  # float32 [2I]
    w2_bias: object | None = None  # float32 [H]
    w13_input_scale: float | None = None  # Quark static fp8: max(gate, up)
    w2_input_scale: float | None = None


def float32_np(buf, dtype: str, name: str) -> np.ndarray:
    """Raw little-endian bytes of a float tensor as float32 (exact for BF16 / F16 / F32)."""
    raw = np.frombuffer(buf, dtype=np.uint8)
    if dtype == "BF16":  # bfloat16 is the upper half of a float32
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    if dtype in ("F16", "F32", "F64"):
        return raw.view({"F16": "<f2", "F32": "<f4", "F64": "<f8"}[dtype]).astype(np.float32)
    from mxfp4conv.checkpoint import safetensors_io as st  # other dtypes: torch's casts

    try:
        t = st.to_tensor(bytearray(buf), dtype, (raw.size * 8 // st.DTYPE_BITS[dtype],))
        return t.float().numpy()
    except ImportError:
        raise CheckpointError(f"{name}: a {dtype} bias or input scale needs torch to read; install "
                              f"torch (pip install torch) or the runtime extra.") from None


def _rows(source, r: TensorRef, rows_dim: int = 0, e: int | None = None) -> np.ndarray:
    """A packed weight or scale (or expert ``e``'s row of a fused one) as uint8 [rows, bytes per row]."""
    buf, shape = _raw(source, r, e)
    a = np.frombuffer(buf, dtype=np.uint8)
    return a.reshape(shape[0], -1) if shape else a


def _raw(source, r: TensorRef, e: int | None):
    info = source.tensor_info(r.name)
    if e is None:
        return source.read_range(info.shard, info.begin, info.nbytes), tuple(info.shape)
    num = info.shape[0]
    if not 0 <= e < num:
        raise CheckpointError(f"{r.name}: expert {e} out of range (the tensor holds {num}).")
    per = info.nbytes // num
    return source.read_range(info.shard, info.begin + e * per, per), tuple(info.shape[1:])


def _float(source, r: TensorRef | None, e: int | None = None) -> np.ndarray | None:
    if r is None:
        return None
    buf, _ = _raw(source, r, e)
    return float32_np(buf, source.tensor_info(r.name).dtype, r.name)


def _scalar(source, r: TensorRef | None) -> float | None:
    if r is None:
        return None
    t = _float(source, r)
    if t.size != 1:
        raise CheckpointError(f"{r.name}: an input scale must be a single number, found shape "
                              f"{list(r.shape)}. The export is malformed.")
    return float(t[0])


def _deinterleave(t: np.ndarray) -> np.ndarray:
    """gpt-oss rows g0, u0, g1, u1, ... -> [g0, g1, ...; u0, u1, ...]."""
    return np.concatenate([t[0::2], t[1::2]])


def read_expert_np(source, layer: MoELayer, e: int) -> ExpertData:
    """Expert ``e`` of ``layer`` as numpy arrays; reads only that expert's bytes."""
    if layer.fused is not None:
        return _read_fused(source, layer.fused, e)
    if layer.gate_up_experts is not None and 0 <= e < len(layer.gate_up_experts):
        return _read_gate_up(source, layer.gate_up_experts[e])
    if layer.experts is None or not 0 <= e < len(layer.experts):
        raise CheckpointError(f"MoE layer {layer.prefix}: no expert {e}.")
    ex = layer.experts[e]
    w13_in = [s for s in (_scalar(source, ex.gate_input_scale), _scalar(source, ex.up_input_scale))
              if s is not None]
    w13_bias = None
    if ex.gate_bias is not None and ex.up_bias is not None:
        w13_bias = np.concatenate([_float(source, ex.gate_bias), _float(source, ex.up_bias)])
    return ExpertData(
        w13=np.concatenate([_rows(source, ex.gate), _rows(source, ex.up)]),
        w13_scale=np.concatenate([_rows(source, ex.gate_scale), _rows(source, ex.up_scale)]),
        w2=_rows(source, ex.down),
        w2_scale=_rows(source, ex.down_scale),
        w13_bias=w13_bias,
        w2_bias=_float(source, ex.down_bias),
        w13_input_scale=max(w13_in) if w13_in else None,
        w2_input_scale=_scalar(source, ex.down_input_scale),
    )


def _read_gate_up(source, ex: GateUpExpertTensors) -> ExpertData:
    """A per-expert fused, row-interleaved gate_up (Quark gpt-oss), de-interleaved."""
    w13_bias = _float(source, ex.gate_up_bias)
    return ExpertData(
        w13=_deinterleave(_rows(source, ex.gate_up)),
        w13_scale=_deinterleave(_rows(source, ex.gate_up_scale)),
        w2=_rows(source, ex.down),
        w2_scale=_rows(source, ex.down_scale),
        w13_bias=None if w13_bias is None else _deinterleave(w13_bias),
        w2_bias=_float(source, ex.down_bias),
        w13_input_scale=_scalar(source, ex.gate_up_input_scale),
        w2_input_scale=_scalar(source, ex.down_input_scale),
    )


def _read_fused(source, f: FusedExperts, e: int) -> ExpertData:
    w13_bias = _float(source, f.gate_up_bias, e)
    return ExpertData(
        w13=_deinterleave(_rows(source, f.gate_up_blocks, e=e)),
        w13_scale=_deinterleave(_rows(source, f.gate_up_scales, e=e)),
        w2=_rows(source, f.down_blocks, e=e),
        w2_scale=_rows(source, f.down_scales, e=e),
        w13_bias=None if w13_bias is None else _deinterleave(w13_bias),
        w2_bias=_float(source, f.down_bias, e),
    )


def read_expert(source, layer: MoELayer, e: int) -> ExpertData:
    """``read_expert_np``'s bytes as torch tensors (uint8 weights and scales, float32 biases)."""
    import torch

    ex = read_expert_np(source, layer, e)
    for f in fields(ExpertData):
        v = getattr(ex, f.name)
        if isinstance(v, np.ndarray):
            setattr(ex, f.name, torch.from_numpy(np.array(v)))  # a writable copy
    return ex


def as_numpy(ex: ExpertData) -> ExpertData:
    """``ex`` with torch tensors as numpy arrays (numpy ones stay)."""
    out = ExpertData(**{f.name: getattr(ex, f.name) for f in fields(ExpertData)})
    for f in fields(ExpertData):
        v = getattr(out, f.name)
        if v is not None and not isinstance(v, (np.ndarray, float, int)):
            setattr(out, f.name, v.numpy())
    return out

