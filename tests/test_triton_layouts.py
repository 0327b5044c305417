"""triton_kernels scale layouts (vLLM 0.33.0's _swizzle_mxfp4 on ROCm): golden vectors made by
vLLM's bundled triton_kernels and aiter's shuffle_scale_moe, exact inverses, streaming."""

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from mxfp4conv.errors import LayoutError
from mxfp4conv.shuffle import aiter as A
from mxfp4conv.shuffle.layouts import get_layout

VECTORS = Path(__file__).parent / "data" / "triton_kernels" / "vectors.safetensors"
PROPS = settings(max_examples=25, deadline=None)
# (rows multiple, K/32 multiple) per expert
GRID = {
    "triton_gu1": (2, 1),
    "triton_cdna4_scale": (32, 8),
    "triton_cdna4_scale_gu1": (32, 8),
    "triton_gfx1250_scale": (32, 4),
    "triton_gfx1250_scale_gu1": (32, 4),
}


def _vectors():
    with safe_open(str(VECTORS), "pt") as f:
        layouts = json.loads(f.metadata()["layouts"])
        return [(case, name, f.get_tensor(f"{case}.input"), f.get_tensor(f"{case}.output"))
                for case, name in sorted(layouts.items())]


CASES = _vectors()


def test_vectors_cover_every_triton_layout():
    assert {name for _, name, _, _ in CASES} >= set(GRID)


@pytest.mark.parametrize("case,name,x,y", CASES, ids=[c[0] for c in CASES])
def test_layout_reproduces_vllm_bytes(case, name, x, y):
    lay = get_layout(name)
    assert tuple(lay.out_shape(x.shape)) == tuple(y.shape)
    out = lay.forward(x)
    assert out.dtype == torch.uint8 and torch.equal(out, y)
    assert torch.equal(lay.inverse(y, x.shape), x)


def rand_u8(*shape, seed=0):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@st.composite
def case(draw, name):
    rn, kn = GRID[name]
    e = draw(st.integers(1, 4))
    n = rn * draw(st.integers(1, 3))
    k = kn * draw(st.integers(1, 3))
    cuts = sorted(set(draw(st.lists(st.integers(0, e), max_size=3))) | {0, e})
    return rand_u8(e, n, k, seed=draw(st.integers(0, 10_000))), cuts


@pytest.mark.parametrize("name", sorted(GRID))
@PROPS
@given(data=st.data())
def test_round_trip_and_streaming(name, data):
    lay = get_layout(name)
    x, cuts = data.draw(case(name))
    y = lay.forward(x)
    assert tuple(y.shape) == tuple(lay.out_shape(x.shape)) and lay.tail_bytes(x.shape) == 0
    assert torch.equal(y.flatten(), torch.cat([lay.forward_chunk(x[a:b]) for a, b in zip(cuts, cuts[1:])]))
    assert torch.equal(lay.inverse(y, x.shape), x)
    assert torch.equal(lay.inverse(y.flatten(), x.shape), x)


@PROPS
@given(data=st.data())
def test_cdna4_scale_is_aiters_32x8_tile_without_padding(data):
    # the same bytes in the same order as AITER's per-expert e8m0 tile when K/32 % 8 == 0
    x, _ = data.draw(case("triton_cdna4_scale"))
    e, n, ks = x.shape
    aiter = A.shuffle_scale_a16w4(x.reshape(e * n, ks), e, False)
    assert torch.equal(get_layout("triton_cdna4_scale").forward(x).flatten(), aiter.flatten())
    aiter_gu = A.shuffle_scale_a16w4(x.reshape(e * n, ks), e, True)
    # the 16-row (AITER) and 1-row (triton) gate/up interleaves differ
    assert not torch.equal(get_layout("triton_cdna4_scale_gu1").forward(x).flatten(), aiter_gu.flatten())


@pytest.mark.parametrize("name,shape,what", [
    ("triton_cdna4_scale", (2, 48, 8), "multiple of 32"),
    ("triton_cdna4_scale", (2, 64, 12), "K/32 = 12"),
    ("triton_cdna4_scale_gu1", (1, 32, 4), "K/32 = 4"),
    ("triton_gfx1250_scale", (2, 64, 6), "multiple of 4"),
    ("triton_gfx1250_scale_gu1", (2, 16, 4), "multiple of 32"),
    ("triton_gu1", (2, 63, 4), "even"),
])
def test_shapes_vllm_cannot_take_are_refused(name, shape, what):
    lay = get_layout(name)
    with pytest.raises(LayoutError, match=what):
        lay.forward(rand_u8(*shape))
    with pytest.raises(LayoutError, match=what):
        lay.check(shape)


def test_stored_size_mismatch_is_refused():
    lay = get_layout("triton_cdna4_scale")
    with pytest.raises(LayoutError, match="stored"):
        lay.inverse(rand_u8(2, 2, 200), (2, 64, 8))
