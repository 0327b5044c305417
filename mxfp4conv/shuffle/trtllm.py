"""FlashInfer TRTLLM-Gen's MXFP4 MoE layout, as vLLM's converter S leaves it for
``FLASHINFER_TRTLLM_MXFP4_MXFP8`` (Kimi-K3 and DeepSeek-V4 on sm100).

``convert_weight_to_mxfp4_moe_kernel_format`` (``fused_moe/oracle/mxfp4.py``, vLLM 0.33.0 and
0.34.0, identical there) does, per expert, from the loaded ``[gate; up]`` rows:

1. w13 and its scale: rows interleaved up first, ``[u0, g0, u1, g1, ...]`` (TRTLLM's SwiGLU
   reads the up row before the gate row).
2. Every tensor: rows permuted in blocks of 32 by FlashInfer's ``get_w2_permute_indices_with_cache``
   with ``epilogue_tile_m = 128`` (``get_shuffle_matrix_a_row_indices``: the transposed-MMA
   output order). Within a block, source row ``4a + b`` (a < 8, b < 4) lands at row ``8b + a``:
   the block's rows, seen as an 8 x 4 grid, are transposed.
3. Scales only: FlashInfer's ``block_scale_interleave`` (the 128 x 4 swizzle of TRTLLM's
   ``SWIZZLED_128x4`` scale-factor layout) on the 2-D ``[E * rows, K/32]`` bytes. Each
   128-row x 4-column tile is stored contiguously, tiles ordered by row block then column block;
   inside a tile, byte ``(r, c)`` sits at ``(r % 32) * 16 + (r // 32) * 4 + c``. vLLM reshapes the
   result back to ``[E, rows, K/32]``, so rows must be a multiple of 128 and K/32 of 4 (no
   padding); then each expert's bytes stay inside its own range.

vLLM keeps the weights as uint8 and views the scales as ``float8_e4m3fn`` (the e8m0 bytes
unchanged). Every step is a permutation of bytes, so each layout here is exactly invertible and
independent per expert. Constraints are those vLLM's conversion asserts or needs: rows a
multiple of 32 (weights; FlashInfer's shuffle) or 128 (scales), K/32 a multiple of 4 (scales).
"""

from __future__ import annotations

import numpy as np

from mxfp4conv.errors import LayoutError
from mxfp4conv.lazy_torch import torch
from mxfp4conv.shuffle.layout_base import Shape3, make_layout

ROW_BLOCK = 32  # get_shuffle_block_size(epilogue_tile_m=128)
SF_ROWS, SF_COLS = 128, 4  # the block-scale interleave's tile
VLLM_CALL = "convert_weight_to_mxfp4_moe_kernel_format, FLASHINFER_TRTLLM_MXFP4_MXFP8 (vLLM 0.33.0 / 0.34.0)"


def _check(s: Shape3, label: str, rows: int, gate_up: bool, scale: bool) -> None:
    if s[1] % rows:
        raise LayoutError(
            f"{label}: a tensor of shape {s} has N = {s[1]} rows per expert, not a multiple of {rows} "
            f"(FlashInfer's TRTLLM {'scale' if scale else 'row'} shuffle); vLLM pads the sizes for "
            "FLASHINFER_TRTLLM_MXFP4_MXFP8 so that they are.")
    if gate_up and s[1] % 2:
        raise LayoutError(f"{label}: w13 of shape {s} has an odd number of rows; it must be [gate; up].")
    if scale and s[2] % SF_COLS:
        raise LayoutError(
            f"{label}: scales of shape {s} have K/32 = {s[2]} columns, not a multiple of {SF_COLS}; "
            "FlashInfer's block-scale interleave would pad them and vLLM's reshape would fail.")


def _up_first(x: torch.Tensor) -> torch.Tensor:
    """[gate; up] rows -> [u0, g0, u1, g1, ...]."""
    e, n, k = x.shape
    return x.reshape(e, 2, n // 2, k).flip(1).transpose(1, 2).reshape(e, n, k)


def _gate_up(y: torch.Tensor) -> torch.Tensor:
    e, n, k = y.shape
    return y.reshape(e, n // 2, 2, k).transpose(1, 2).flip(1).reshape(e, n, k)


def _rows_forward(x: torch.Tensor) -> torch.Tensor:
    """Within each 32-row block, the 8 x 4 grid of rows (source 4a + b) transposed (to 8b + a)."""
    e, n, k = x.shape
    return x.reshape(e, n // ROW_BLOCK, 8, 4, k).transpose(2, 3).reshape(e, n, k)


def _rows_inverse(y: torch.Tensor) -> torch.Tensor:
    e, n, k = y.shape
    return y.reshape(e, n // ROW_BLOCK, 4, 8, k).transpose(2, 3).reshape(e, n, k)


def _sf_forward(x: torch.Tensor) -> torch.Tensor:
    """128 x 4 tiles, tile-major; inside a tile row r = 32 * hi + lo, column c at lo * 16 + hi * 4 + c."""
    e, n, k = x.shape
    t = x.reshape(e, n // SF_ROWS, 4, 32, k // SF_COLS, SF_COLS)  # (e, tile row, hi, lo, tile col, c)
    return t.permute(0, 1, 4, 3, 2, 5).reshape(e, n, k)


def _sf_inverse(y: torch.Tensor) -> torch.Tensor:
    e, n, k = y.shape
    t = y.reshape(e, n // SF_ROWS, k // SF_COLS, 32, 4, SF_COLS)  # (e, tile row, tile col, lo, hi, c)
    return t.permute(0, 1, 4, 3, 2, 5).reshape(e, n, k)


def _forward_np(x: np.ndarray, gate_up: bool, scale: bool) -> np.ndarray:
    """The same forward on a uint8 numpy array (convert's path without torch)."""
    e, n, k = x.shape
    if gate_up:
        x = x.reshape(e, 2, n // 2, k)[:, ::-1].transpose(0, 2, 1, 3).reshape(e, n, k)
    x = x.reshape(e, n // ROW_BLOCK, 8, 4, k).transpose(0, 1, 3, 2, 4).reshape(e, n, k)
    if scale:
        x = x.reshape(e, n // SF_ROWS, 4, 32, k // SF_COLS, SF_COLS).transpose(0, 1, 4, 3, 2, 5)
    return np.ascontiguousarray(x).reshape(e, n, k)


def bias_rows(t: torch.Tensor, gate_up: bool) -> torch.Tensor:
    """A bias ``[E, N]`` (any dtype) in the row order of ``trtllm_w13`` (``gate_up``: ``[gate; up]``
    rows) or ``trtllm_w2``: what vLLM's converter G does to gpt-oss's biases for TRTLLM-Gen."""
    x = t.unsqueeze(-1)
    if gate_up:
        x = _up_first(x)
    return _rows_forward(x).reshape(t.shape).contiguous()


def _layout(name: str, description: str, gate_up: bool, scale: bool):
    rows = SF_ROWS if scale else ROW_BLOCK

    def forward(x, s):
        if gate_up:
            x = _up_first(x)
        x = _rows_forward(x)
        return _sf_forward(x) if scale else x.contiguous()

    def inverse(y, s):
        y = y.reshape(s)
        if scale:
            y = _sf_inverse(y)
        y = _rows_inverse(y)
        return (_gate_up(y) if gate_up else y).contiguous()

    return make_layout(
        name, description, None, "scale" if scale else "weight",
        lambda s: _check(s, name, rows, gate_up, scale),
        lambda s: s, forward, inverse, vllm_call=VLLM_CALL,
        np_chunk=lambda x, s: _forward_np(x, gate_up, scale))


TRTLLM_W13 = _layout(
    "trtllm_w13", "w13 rows up first ([u0, g0, u1, g1, ...]), then FlashInfer's 32-row epilogue-tile "
    "shuffle (8 x 4 row grid transposed)", gate_up=True, scale=False)
TRTLLM_W13_SCALE = _layout(
    "trtllm_w13_scale", "w13 scale rows as trtllm_w13, then the 128 x 4 block-scale interleave",
    gate_up=True, scale=True)
TRTLLM_W2 = _layout(
    "trtllm_w2", "w2 rows through FlashInfer's 32-row epilogue-tile shuffle", gate_up=False, scale=False)
TRTLLM_W2_SCALE = _layout(
    "trtllm_w2_scale", "w2 scale rows as trtllm_w2, then the 128 x 4 block-scale interleave",
    gate_up=False, scale=True)
TRTLLM_LAYOUTS = (TRTLLM_W13, TRTLLM_W13_SCALE, TRTLLM_W2, TRTLLM_W2_SCALE)
