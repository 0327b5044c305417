"""mxfp4conv's FlashInfer TRTLLM-Gen layouts (``shuffle/trtllm.py``): exact inverses, per-expert
streaming, where single bytes land, and the shapes vLLM's conversion cannot take. Their bytes
against vLLM's own converter running FlashInfer's functions: ``tests/conformance/test_vllm_trtllm.py``."""

from __future__ import annotations

import pytest
import torch

from mxfp4conv.errors import LayoutError
from mxfp4conv.shuffle.layouts import get_layout

SHAPES = {"trtllm_w13": (3, 64, 5), "trtllm_w2": (3, 96, 7), "trtllm_w13_scale": (2, 256, 8),
          "trtllm_w2_scale": (3, 128, 4)}


def rand_u8(*shape, seed=0):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_inverse_and_streaming(name):
    lay = get_layout(name)
    x = rand_u8(*SHAPES[name], seed=len(name))
    y = lay.forward(x)
    assert y.shape == x.shape and not torch.equal(y, x)
    assert torch.equal(lay.inverse(y, x.shape), x)
    chunks = [lay.forward_chunk(x[a:a + 1]) for a in range(x.shape[0])]
    assert torch.equal(torch.cat(chunks), y.reshape(-1))


def test_rows_up_first_then_epilogue_tile_order():
    # one byte per row: w13 row i of [gate; up] holds i
    e, n = 1, 64
    x = torch.arange(n, dtype=torch.uint8).reshape(e, n, 1)
    y = get_layout("trtllm_w13").forward(x).reshape(-1).tolist()
    inter = [32 + i // 2 if i % 2 == 0 else i // 2 for i in range(n)]  # [u0, g0, u1, g1, ...]
    assert y[:8] == [inter[4 * a] for a in range(8)]  # stored rows 0..7: source rows 0, 4, ..., 28
    assert y[8] == inter[1] and y[31] == inter[31] and y[32] == inter[32]


def test_scale_tile_position():
    # byte (row 32h + l, column c) of an expert's first 128 x 4 tile sits at 16l + 4h + c
    lay = get_layout("trtllm_w2_scale")
    x = torch.zeros(1, 128, 4, dtype=torch.uint8)
    rows = get_layout("trtllm_w2").forward(torch.arange(128, dtype=torch.uint8).reshape(1, 128, 1)).reshape(-1)
    x[0, int(rows[37]), 2] = 1  # the source row that the row shuffle puts at row 37 = 32 * 1 + 5
    assert int(lay.forward(x).reshape(-1).nonzero()) == 16 * 5 + 4 * 1 + 2


@pytest.mark.parametrize("name,shape,text", [
    ("trtllm_w13", (1, 48, 4), "multiple of 32"),
    ("trtllm_w13_scale", (1, 192, 8), "multiple of 128"),
    ("trtllm_w2_scale", (1, 128, 6), "not a multiple of 4"),
])
def test_shapes_vllm_cannot_convert_are_refused(name, shape, text):
    with pytest.raises(LayoutError, match=text):
        get_layout(name).forward(torch.zeros(shape, dtype=torch.uint8))
