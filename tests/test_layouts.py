"""Named layouts: streaming identity, exact inverses, shape checks, equality with the AITER calls."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4conv.errors import LayoutError
from mxfp4conv.shuffle import aiter as A
from mxfp4conv.shuffle.layouts import LAYOUTS, Layout, get_layout, register_layout

PROPS = settings(max_examples=30, deadline=None)
NAMES = [
    "identity", "aiter_p16", "aiter_p16_gu16", "aiter_e8m0_shuffle", "aiter_scale_a16w4", "aiter_scale_a16w4_gu16",
    "aiter_gfx1250_gu1", "aiter_scale_n32k4", "aiter_scale_n32k4_gu1",
]

# (rows multiple, last-dim multiple) each layout needs, per expert
GRID = {
    "identity": (1, 1),
    "aiter_p16": (16, 32),
    "aiter_p16_gu16": (32, 64),
    "aiter_e8m0_shuffle": (32, 1),
    "aiter_scale_a16w4": (32, 1),
    "aiter_scale_a16w4_gu16": (32, 1),
    "aiter_gfx1250_gu1": (16, 32),
    "aiter_scale_n32k4": (32, 4),
    "aiter_scale_n32k4_gu1": (32, 4),
}


def rand_u8(*shape, seed=0):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@st.composite
def case(draw, name):
    rn, kn = GRID[name]
    e = draw(st.integers(1, 5))
    n = rn * draw(st.integers(1, 3))
    k = kn * draw(st.integers(1, 3 if kn > 1 else 20))
    cuts = sorted(set(draw(st.lists(st.integers(0, e), max_size=4))) | {0, e})
    return rand_u8(e, n, k, seed=draw(st.integers(0, 10_000))), cuts


def aiter_equivalent(name, x):
    """The AITER call each layout claims to equal, on canonical 3-D bytes."""
    e, n, k = x.shape
    s2d = x.reshape(e * n, k)
    return {
        "identity": lambda: x,
        "aiter_p16": lambda: A.shuffle_weight(x, (16, 16)),
        "aiter_p16_gu16": lambda: A.shuffle_weight_a16w4(x, 16, True),
        "aiter_e8m0_shuffle": lambda: A.e8m0_shuffle(s2d),
        "aiter_scale_a16w4": lambda: A.shuffle_scale_a16w4(s2d, e, False),
        "aiter_scale_a16w4_gu16": lambda: A.shuffle_scale_a16w4(s2d, e, True),
        "aiter_gfx1250_gu1": lambda: A.moe_shuffle_weight(x, e, True, True, arch="gfx1250"),
        "aiter_scale_n32k4": lambda: A.moe_shuffle_scale(s2d, e, False, False, arch="gfx1250"),
        "aiter_scale_n32k4_gu1": lambda: A.moe_shuffle_scale(s2d, e, True, True, arch="gfx1250"),
    }[name]()


def test_registry_holds_the_manifest_vocabulary():
    assert set(NAMES) <= set(LAYOUTS)
    for name in NAMES:
        lay = get_layout(name)
        assert isinstance(lay, Layout) and lay.name == name and lay.description
        assert lay.applies_to in ("weight", "scale", "any")
        assert (lay.aiter_call is None) == (name == "identity")
    with pytest.raises(TypeError):
        LAYOUTS["x"] = get_layout("identity")


def test_unknown_layout_names_the_known_ones():
    with pytest.raises(LayoutError, match="aiter_p16_gu16"):
        get_layout("aiter_p32")


@pytest.mark.parametrize("name", NAMES)
@PROPS
@given(data=st.data())
def test_streaming_identity_and_inverse(name, data):
    lay = get_layout(name)
    x, cuts = data.draw(case(name))
    y = lay.forward(x)
    assert tuple(y.shape) == tuple(lay.out_shape(x.shape)) and y.dtype == torch.uint8
    chunks = [lay.forward_chunk(x[a:b]) for a, b in zip(cuts, cuts[1:])]
    tail = torch.full((lay.tail_bytes(x.shape),), 0x7F, dtype=torch.uint8)
    assert torch.equal(y.flatten(), torch.cat(chunks + [tail]))
    back = lay.inverse(y, x.shape)
    assert back.shape == x.shape and torch.equal(back, x)
    assert torch.equal(y, aiter_equivalent(name, x))


@pytest.mark.parametrize("name", NAMES)
def test_layout_equals_aiter_call_on_golden_shapes(name):
    rn, kn = GRID[name]
    x = rand_u8(4, 256, 12 if kn in (1, 4) else 128, seed=7)  # K/32 = 12: the TP8 shard (column padding for 32x8 tiles)
    assert torch.equal(get_layout(name).forward(x), aiter_equivalent(name, x))
    assert name == "identity" or not torch.equal(get_layout(name).forward(x).flatten()[: x.numel()], x.flatten())


def test_e8m0_tail_is_the_row_padding():
    lay = get_layout("aiter_e8m0_shuffle")
    assert lay.out_shape((3, 32, 12)) == (256, 16)
    assert lay.tail_bytes((3, 32, 12)) == (256 - 96) * 16
    assert lay.tail_bytes((2, 128, 8)) == 0
    assert get_layout("aiter_scale_a16w4").tail_bytes((3, 32, 12)) == 0
    x = rand_u8(3, 32, 12)
    y = lay.forward(x)
    assert (y[96:] == 0x7F).all() and torch.equal(y[:96].flatten(), lay.forward_chunk(x))


def test_fp4_and_e8m0_views_accepted():
    w = rand_u8(2, 32, 64)
    lay = get_layout("aiter_p16_gu16")
    assert torch.equal(lay.forward(w.view(torch.float4_e2m1fn_x2)), lay.forward(w))
    s = rand_u8(2, 32, 4)
    sl = get_layout("aiter_scale_a16w4")
    assert torch.equal(sl.forward(s.view(torch.float8_e8m0fnu)), sl.forward(s))
    assert torch.equal(sl.inverse(sl.forward(s).view(torch.float8_e8m0fnu), s.shape), s)
    with pytest.raises(LayoutError, match="raw bytes"):
        lay.forward(w.float())


REJECT = {
    # shapes AITER itself rejects
    "aiter_p16": [(4, 40, 64), (4, 64, 176), (2, 16, 16)],
    "aiter_p16_gu16": [(1, 16, 64), (4, 512, 160), (2, 48, 64)],
    "aiter_scale_a16w4": [(4, 48, 16), (1, 16, 8)],
    "aiter_scale_a16w4_gu16": [(4, 48, 16), (2, 16, 4)],
    # AITER's e8m0_shuffle pads any size, but 32-row tiles straddling experts would break
    # per-expert streaming; we require N % 32 (true for every real model)
    "aiter_e8m0_shuffle": [(4, 48, 16)],
    # gfx1250: the weight is the 16x16 tile transpose after a 1-row interleave; n32k4 needs N % 32, K/32 % 4
    "aiter_gfx1250_gu1": [(4, 40, 64), (4, 64, 176), (1, 15, 32)],
    "aiter_scale_n32k4": [(4, 48, 16), (2, 64, 6), (1, 32, 12 + 1)],
    "aiter_scale_n32k4_gu1": [(4, 48, 16), (2, 64, 6)],
}


@pytest.mark.parametrize("name,shape", [(n, s) for n, shapes in REJECT.items() for s in shapes])
def test_check_rejects_what_aiter_rejects(name, shape):
    lay = get_layout(name)
    with pytest.raises(LayoutError) as err:
        lay.check(shape)
    assert "view" not in str(err.value)
    with pytest.raises(LayoutError):
        lay.forward(rand_u8(*shape))
    with pytest.raises(LayoutError):
        lay.forward_chunk(rand_u8(*shape))


@pytest.mark.parametrize("name", NAMES)
def test_check_rejects_non_3d_and_empty(name):
    lay = get_layout(name)
    for bad in [(512, 128), (2, 0, 64), (1, 2, 32, 64)]:
        with pytest.raises(LayoutError, match="3-D"):
            lay.check(bad)


def test_aiter_accepts_kpk_160_and_so_does_p16():
    get_layout("aiter_p16").check((4, 512, 160))
    with pytest.raises(LayoutError, match="64"):
        get_layout("aiter_p16_gu16").check((4, 512, 160))


def test_inverse_rejects_wrong_stored_size():
    lay = get_layout("aiter_e8m0_shuffle")
    with pytest.raises(LayoutError, match="stored"):
        lay.inverse(rand_u8(96, 12), (3, 32, 12))  # missing the padding
    # the stored tensor may come back flat or 2-D; only its byte count matters
    x = rand_u8(3, 32, 12)
    assert torch.equal(lay.inverse(lay.forward(x).flatten(), x.shape), x)


def test_register_layout():
    rev = Layout(
        name="test_reversed_rows",
        description="rows reversed per expert (test only)",
        aiter_call=None,
        applies_to="weight",
        check=lambda s: None,
        out_shape=lambda s: tuple(s),
        forward=lambda x: x.flip(1),
        inverse=lambda y, s: y.reshape(s).flip(1),
    )
    try:
        assert register_layout(rev) is rev and get_layout("test_reversed_rows") is rev
        x = rand_u8(3, 4, 8)
        assert torch.equal(rev.forward_chunk(x), x.flip(1).flatten()) and rev.tail_bytes(x.shape) == 0
        with pytest.raises(LayoutError, match="already registered"):
            register_layout(Layout(**{**rev.__dict__, "description": "other"}))
        with pytest.raises(LayoutError, match="already registered"):
            register_layout(Layout(**{**rev.__dict__, "name": "aiter_p16"}))
    finally:
        from mxfp4conv.shuffle import layouts

        layouts._REGISTRY.pop("test_reversed_rows", None)


def test_zero_experts_chunk_is_empty():
    for name in NAMES:
        rn, kn = GRID[name]
        lay = get_layout(name)
        assert lay.forward_chunk(rand_u8(0, rn * 2, kn * 2)).numel() == 0


def test_gfx1250_layouts_differ_from_the_gfx950_ones():
    w = rand_u8(2, 64, 64, seed=5)
    gu1, gu16 = get_layout("aiter_gfx1250_gu1").forward(w), get_layout("aiter_p16_gu16").forward(w)
    assert not torch.equal(gu1, gu16)
    # un-interleaving the 1-row GUGU after undoing the tiles gives back [gate; up]
    assert torch.equal(A.deinterleave_gate_up_rows(A.unshuffle_weight(gu1)), w)
    s = rand_u8(2, 64, 8, seed=6)
    lay = get_layout("aiter_scale_n32k4")
    assert lay.out_shape(s.shape) == (2, 2, 256) and lay.tail_bytes(s.shape) == 0
    assert torch.equal(lay.forward(s)[1, 1, :128], s[1, 32:64, :4].flatten())
    gl = get_layout("aiter_scale_n32k4_gu1")
    # first dword pair of expert 0: gate row 0 then up row 0 (row 32 of [gate; up])
    assert torch.equal(gl.forward(s)[0, 0, :8], torch.cat([s[0, 0, :4], s[0, 32, :4]]))


NUMPY_GRID = {**GRID, "hopper_mma_w": (16, 32), "hopper_mma_w_rot": (16, 32), "hopper_mma_w_xor": (16, 32),
              "hopper_mma_s": (16, 2), "triton_gu1": (2, 1), "triton_cdna4_scale": (32, 8),
              "triton_cdna4_scale_gu1": (32, 8), "triton_gfx1250_scale": (32, 4),
              "triton_gfx1250_scale_gu1": (32, 4), "trtllm_w13": (32, 1), "trtllm_w13_scale": (128, 4),
              "trtllm_w2": (32, 1), "trtllm_w2_scale": (128, 4)}


def test_every_layout_has_a_numpy_path():
    # convert runs without torch (the base install has none): every layout it writes needs one
    assert [name for name, lay in LAYOUTS.items() if lay.forward_np is None] == []


@pytest.mark.parametrize("name", [n for n, lay in LAYOUTS.items() if lay.forward_np is not None])
@PROPS
@given(data=st.data())
def test_numpy_path_writes_the_torch_paths_bytes(name, data):
    lay = get_layout(name)
    rn, kn = NUMPY_GRID[name]
    e = data.draw(st.integers(1, 5))
    x = rand_u8(e, rn * data.draw(st.integers(1, 3)), kn * data.draw(st.integers(1, 3 if kn > 2 else 20)),
                seed=data.draw(st.integers(0, 10_000)))
    got = lay.forward_np(x.numpy())
    assert got.dtype.name == "uint8" and got.ndim == 1
    assert torch.equal(torch.from_numpy(got), lay.forward_chunk(x))
    # a non-contiguous input is read as its values
    wide = torch.cat([x, x], dim=2)[:, :, : x.shape[2]]
    assert torch.equal(torch.from_numpy(lay.forward_np(wide.numpy())), lay.forward_chunk(x))


@pytest.mark.parametrize("name", [n for n, lay in LAYOUTS.items() if lay.forward_np is not None])
def test_numpy_path_checks_shapes_like_the_torch_path(name):
    import numpy as np

    lay = get_layout(name)
    with pytest.raises(LayoutError):
        lay.forward_np(np.zeros((2, 3), dtype=np.uint8))
    rn, kn = NUMPY_GRID[name]
    if rn > 1:
        with pytest.raises(LayoutError):
            lay.forward_np(np.zeros((1, rn + 1, kn), dtype=np.uint8))
    assert lay.forward_np(np.zeros((0, rn, kn), dtype=np.uint8)).size == 0
