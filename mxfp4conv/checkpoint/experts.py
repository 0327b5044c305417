"""One routed expert's bytes, in canonical orientation, read without touching the others."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mxfp4conv.checkpoint import safetensors_io as st
from mxfp4conv.checkpoint.canonical import FusedExperts, GateUpExpertTensors, MoELayer, TensorRef
from mxfp4conv.errors import CheckpointError


@dataclass
class ExpertData:
    """uint8 MXFP4 bytes of one expert. w13 rows are [gate; up] (gpt-oss de-interleaved)."""

    w13: torch.Tensor  # [2I, H/2]
    w13_scale: torch.Tensor  # [2I, H/32]
    w2: torch.Tensor  # [H, I/2]
    w2_scale: torch.Tensor  # [H, I/32]
    w13_bias: torch.Tensor | None = None  # float32 [2I]
    w2_bias: torch.Tensor | None = None  # float32 [H]
    w13_input_scale: float | None = None  # Quark static fp8: max(gate, up)
    w2_input_scale: float | None = None


def _rows_u8(t: torch.Tensor) -> torch.Tensor:
    """A packed weight or scale as raw uint8 [rows, bytes per row]."""
    t = t.view(torch.uint8) if t.dtype != torch.uint8 else t
    return t.reshape(t.shape[0], -1) if t.dim() >= 1 else t


def _bytes2d(source, r: TensorRef) -> torch.Tensor:
    return _rows_u8(source.read_tensor(r.name))


def _float(source, r: TensorRef | None) -> torch.Tensor | None:
    return None if r is None else source.read_tensor(r.name).to(torch.float32).reshape(-1)


def _scalar(source, r: TensorRef | None) -> float | None:
    if r is None:
        return None
    t = source.read_tensor(r.name).to(torch.float32)
    if t.numel() != 1:
        raise CheckpointError(f"{r.name}: an input scale must be a single number, found shape "
                              f"{list(r.shape)}. The export is malformed.")
    return float(t.reshape(()))


def read_expert(source, layer: MoELayer, e: int) -> ExpertData:
    """Expert ``e`` of ``layer``; reads only that expert's bytes."""
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
        w13_bias = torch.cat([_float(source, ex.gate_bias), _float(source, ex.up_bias)])
    return ExpertData(
        w13=torch.cat([_bytes2d(source, ex.gate), _bytes2d(source, ex.up)]),
        w13_scale=torch.cat([_bytes2d(source, ex.gate_scale), _bytes2d(source, ex.up_scale)]),
        w2=_bytes2d(source, ex.down),
        w2_scale=_bytes2d(source, ex.down_scale),
        w13_bias=w13_bias,
        w2_bias=_float(source, ex.down_bias),
        w13_input_scale=max(w13_in) if w13_in else None,
        w2_input_scale=_scalar(source, ex.down_input_scale),
    )


def read_expert_slice(source, r: TensorRef, e: int) -> torch.Tensor:
    """Row ``e`` (along dim 0) of a fused [E, ...] tensor, with one pread, in stored dtype."""
    info = source.tensor_info(r.name)
    num = info.shape[0]
    if not 0 <= e < num:
        raise CheckpointError(f"{r.name}: expert {e} out of range (the tensor holds {num}).")
    per = info.nbytes // num
    buf = source.read_range(info.shard, info.begin + e * per, per)
    return st.to_tensor(buf, info.dtype, tuple(info.shape[1:]))


def _deinterleave(t: torch.Tensor) -> torch.Tensor:
    """gpt-oss rows g0, u0, g1, u1, ... -> [g0, g1, ...; u0, u1, ...]."""
    return torch.cat([t[0::2], t[1::2]])


def _read_gate_up(source, ex: GateUpExpertTensors) -> ExpertData:
    """A per-expert fused, row-interleaved gate_up (Quark gpt-oss), de-interleaved."""
    w13_bias = _float(source, ex.gate_up_bias)
    return ExpertData(
        w13=_deinterleave(_bytes2d(source, ex.gate_up)),
        w13_scale=_deinterleave(_bytes2d(source, ex.gate_up_scale)),
        w2=_bytes2d(source, ex.down),
        w2_scale=_bytes2d(source, ex.down_scale),
        w13_bias=None if w13_bias is None else _deinterleave(w13_bias),
        w2_bias=_float(source, ex.down_bias),
        w13_input_scale=_scalar(source, ex.gate_up_input_scale),
        w2_input_scale=_scalar(source, ex.down_input_scale),
    )


def _read_fused(source, f: FusedExperts, e: int) -> ExpertData:
    def u8(r: TensorRef) -> torch.Tensor:
        return _rows_u8(read_expert_slice(source, r, e))

    def bias(r: TensorRef | None) -> torch.Tensor | None:
        return None if r is None else read_expert_slice(source, r, e).to(torch.float32).reshape(-1)

    w13_bias = bias(f.gate_up_bias)
    return ExpertData(
        w13=_deinterleave(u8(f.gate_up_blocks)),
        w13_scale=_deinterleave(u8(f.gate_up_scales)),
        w2=u8(f.down_blocks),
        w2_scale=u8(f.down_scales),
        w13_bias=None if w13_bias is None else _deinterleave(w13_bias),
        w2_bias=bias(f.down_bias),
    )
