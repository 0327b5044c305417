"""The hopper_mma layouts: exact inverses, streaming, and the register contract the Triton
kernel relies on, checked from the stored bytes with the documented masks (not with the
layout's own code)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hopper_words import HOPPER_BITS, HOPPER_BITS_ROT, hopper_words, xor_words_solved

from mxfp4conv.codec import dequantize_mxfp4
from mxfp4conv.errors import LayoutError
from mxfp4conv.shuffle.layouts import get_layout

W, S = get_layout("hopper_mma_w"), get_layout("hopper_mma_s")
W_ROT = get_layout("hopper_mma_w_rot")  # the same words, bits in the rotation order (what convert wrote before xor)
PROPS = settings(max_examples=25, deadline=None)
E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
MASK = 0x81C081C0


def rand_u8(*shape, seed=0):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@st.composite
def weights(draw):
    e, nb, kb = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    cuts = sorted(set(draw(st.lists(st.integers(0, e), max_size=3))) | {0, e})
    return rand_u8(e, 16 * nb, 32 * kb, seed=draw(st.integers(0, 9999))), cuts


@pytest.mark.parametrize("lay", [W, W_ROT], ids=["w", "w_rot"])
@PROPS
@given(data=weights())
def test_weight_layout_round_trip_and_streaming(lay, data):
    W = lay
    x, cuts = data
    y = W.forward(x)
    assert y.shape == x.shape and y.dtype == torch.uint8
    assert torch.equal(W.inverse(y, x.shape), x)
    assert torch.equal(y.flatten(), torch.cat([W.forward_chunk(x[a:b]) for a, b in zip(cuts, cuts[1:])]))
    assert W.tail_bytes(x.shape) == 0
    # a permutation of bits inside each 16-row slab: the bit count of every slab is kept
    slabs = x.shape[0] * x.shape[1] // 16
    pop = lambda t: torch.stack([(t.reshape(slabs, -1) >> i) & 1 for i in range(8)]).sum((0, 2))  # noqa: E731
    assert torch.equal(pop(y), pop(x))


@PROPS
@given(e=st.integers(1, 3), nb=st.integers(1, 3), kb=st.integers(1, 3), seed=st.integers(0, 9999))
def test_scale_layout_round_trip(e, nb, kb, seed):
    s = rand_u8(e, 16 * nb, 2 * kb, seed=seed)
    y = S.forward(s)
    assert y.shape == s.shape and torch.equal(S.inverse(y, s.shape), s)
    assert torch.equal(torch.sort(y.flatten()).values, torch.sort(s.flatten()).values)


def _registers(y: torch.Tensor) -> list[torch.Tensor]:
    """The four bf16-pair registers of every stored word, as the kernel computes them."""
    w = y.reshape(-1).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return [w & MASK, (w << 3) & MASK, (w << 6) & MASK,
            ((w >> 4) & 0x00C000C0) | ((w >> 5) & 0x01000100) | ((w << 1) & 0x80008000)]


def _bf16_half(r: torch.Tensor, half: int) -> torch.Tensor:
    bits = ((r >> (16 * half)) & 0xFFFF).to(torch.int32) << 16
    return bits.view(torch.float32).double() * 2.0 ** 126


@pytest.mark.parametrize("shape", [(1, 16, 32), (2, 48, 96), (3, 32, 160)])
def test_stored_words_are_each_lanes_mma_fragment(shape):
    """Lane 4g+t of a 16x64 block holds rows g and g+8 at K 16kt + 2t (+1) and + 8 (+9): the
    masks give, for word kt, registers (h=0,c=0), (h=0,c=1), (h=1,c=0), (h=1,c=1), halves = kk."""
    e, n, kb = shape
    x = rand_u8(*shape, seed=sum(shape))
    x[0, 0, :16] = torch.arange(0, 256, 16, dtype=torch.uint8) + torch.arange(16, dtype=torch.uint8)  # every code
    ones = torch.full((e, n, 2 * kb // 32), 127, dtype=torch.uint8)
    want = dequantize_mxfp4(x, ones).double()  # [e, n, K]: the e2m1 values
    regs = _registers(W.forward(x))
    lanes = torch.arange(32)
    g, t = lanes // 4, lanes % 4
    blocks = e * (n // 16) * (2 * kb // 64)
    for kt in range(4):
        for r, (h, c) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
            for kk in range(2):
                got = _bf16_half(regs[r], kk).reshape(blocks, 32, 4)[:, :, kt]  # [block, lane]
                rows = 8 * h + g
                cols = 16 * kt + 8 * c + 2 * t + kk
                ref = want.reshape(e, n // 16, 16, 2 * kb // 64, 64).permute(0, 1, 3, 2, 4)
                ref = ref.reshape(blocks, 16, 64)[:, rows, cols]
                assert torch.equal(got, ref), (kt, r, kk)


def _rotl(w: torch.Tensor, k: int) -> torch.Tensor:
    return ((w << k) | (w >> (32 - k))) & 0xFFFFFFFF


def _rot_registers(z: torch.Tensor) -> list[torch.Tensor]:
    """The kernels' 9-instruction decode of hopper_mma_w_rot words, written out."""
    w = z.reshape(-1).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return [w & MASK, _rotl(w, 4) & MASK, _rotl(w, 10) & MASK,
            (_rotl(w, 6) & 0x00400040) | (_rotl(w, 14) & 0x81808180)]


def test_rotation_order_words_give_the_same_registers():
    """hopper_mma_w_rot words give, by rotations and masks, the registers the documented masks
    give from the hopper_mma_w word in the same place, for every code in every position."""
    x = rand_u8(2, 32, 96, seed=11)
    x[0, 0, :16] = torch.arange(0, 256, 16, dtype=torch.uint8) + torch.arange(16, dtype=torch.uint8)
    y = W.forward(x)
    want = _registers(y)
    z = W_ROT.forward(x)
    assert z.shape == y.shape and z.dtype == torch.uint8 and not torch.equal(z, y)
    got = _rot_registers(z)
    for r in range(4):  # the four registers hold all 32 bits between them: the re-encoding loses none
        assert torch.equal(got[r], want[r]), r


def _run_decode_ptx(text: str, w: torch.Tensor, outs: tuple[str, ...]) -> list[torch.Tensor]:
    """The decode's PTX (its and / or / shl / shf.l.wrap lines) evaluated on 32-bit words w (int64)."""
    regs = {"w": w}
    value = lambda op: regs[op] if op in regs else int(op, 0)  # noqa: E731
    for line in (x.strip().rstrip(";") for x in text.splitlines() if x.strip()):
        op, args = line.split(None, 1)
        d, *src = [a.strip() for a in args.split(",")]
        if op == "and.b32":
            regs[d] = value(src[0]) & value(src[1])
        elif op == "or.b32":
            regs[d] = value(src[0]) | value(src[1])
        elif op == "xor.b32":
            regs[d] = value(src[0]) ^ value(src[1])
        elif op == "shl.b32":
            regs[d] = (value(src[0]) << int(src[1])) & 0xFFFFFFFF
        elif op == "shr.b32":
            regs[d] = value(src[0]) >> int(src[1])
        elif op == "shf.l.wrap.b32":  # funnel shift of src[1]:src[0], upper word: a rotation when they are one
            assert src[0] == src[1], line
            regs[d] = _rotl(value(src[0]), int(src[2]))
        else:
            raise AssertionError(f"an instruction this evaluator does not know: {line}")
    return [regs[r] for r in outs]


def _xor_registers(z: torch.Tensor) -> list[torch.Tensor]:
    """The kernels' 8-instruction decode of hopper_mma_w_xor words, written out."""
    w = z.reshape(-1).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return [w & MASK, (w << 6) & MASK, _rotl(w, 12) & MASK, ((w << 2) ^ (w >> 6)) & MASK]


@pytest.mark.parametrize("layout,bits", [(W, HOPPER_BITS), (W_ROT, HOPPER_BITS_ROT)], ids=["plain", "rot"])
def test_words_hold_each_code_at_its_documented_bits(layout, bits):
    x = rand_u8(3, 48, 96, seed=14)
    assert torch.equal(layout.forward(x), hopper_words(x, bits))


def test_xor_order_words_are_the_ones_their_decode_defines():
    x = rand_u8(3, 48, 96, seed=13)
    assert torch.equal(get_layout("hopper_mma_w_xor").forward(x), xor_words_solved(hopper_words(x, HOPPER_BITS_ROT)))


@pytest.mark.parametrize("order", ["rot", "xor"])
def test_decode_ptx_gives_the_registers(order):
    """The PTX the kernels inline for hopper_mma_w_rot words (its shifts where no bit wraps: ptxas issues those
    as IMAD.SHL on the FMA pipe) and hopper_mma_w_xor words computes the registers the hopper_mma_w decode gives in
    the same place, each code in each position, and the documented decode of any word."""
    HK = pytest.importorskip("mxfp4conv.kernels.triton_moe.hopper_kernels")
    x = rand_u8(2, 32, 96, seed=12)
    x[0, 0, :16] = torch.arange(0, 256, 16, dtype=torch.uint8) + torch.arange(16, dtype=torch.uint8)
    z = get_layout(f"hopper_mma_w_{order}").forward(x)
    w = z.reshape(-1).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    w = torch.cat([w, torch.tensor([0, 0xFFFFFFFF, 0x80000001, 0x7FFFFFFE])])  # every bit set, and the wrap bits
    outs = ("r0", "r1", "r2", "r3")
    got = _run_decode_ptx(HK._decode_ptx(order, outs, "w"), w, outs)
    want = _registers(W.forward(x))
    ref = (_rot_registers if order == "rot" else _xor_registers)(w.to(torch.int32))
    for r in range(4):
        assert torch.equal(got[r][:-4], want[r]) and torch.equal(got[r], ref[r]), r


def test_scale_words_hold_rows_g_and_g_plus_8():
    s = rand_u8(2, 32, 6, seed=3)
    y = S.forward(s).reshape(2, 2, 3, 8, 2, 2)  # e, slab, 64-code block, g, h, j
    for h in range(2):
        for j in range(2):
            ref = s.reshape(2, 2, 2, 8, 3, 2)[:, :, h, :, :, j].permute(0, 1, 3, 2)  # e slab b g
            assert torch.equal(y[..., h, j], ref)


@pytest.mark.parametrize("layout,shape", [(W, (1, 24, 32)), (W, (1, 16, 48)), (W_ROT, (1, 24, 32)),
                                          (W_ROT, (1, 16, 48)), (S, (1, 8, 2)), (S, (2, 16, 3))])
def test_shapes_off_the_blocks_are_refused(layout, shape):
    with pytest.raises(LayoutError, match="multiple of"):
        layout.forward(torch.zeros(shape, dtype=torch.uint8))


@pytest.mark.parametrize("order", ["plain", "rot", "xor"])
@PROPS
@given(data=weights())
def test_cpu_tables_and_device_path_agree(order, data):
    # the numpy path (CPU) and the torch-only path (used on GPU tensors) write the same bytes
    from mxfp4conv.shuffle import hopper

    x, _ = data
    y = hopper._forward_cpu(x, order)
    assert torch.equal(hopper._forward_torch(x, order), y)
    assert torch.equal(hopper._inverse_torch(y, x.shape, order), x)
    assert torch.equal(hopper._inverse_cpu(y, x.shape, order), x)


@pytest.mark.parametrize("order", ["plain", "rot", "xor"])
@PROPS
@given(data=weights(), step=st.sampled_from([1, 512, 1 << 20]))
def test_cpu_weight_path_in_steps_agrees_with_device_path(order, data, step):
    # the numpy path gathers a few slabs at a time; any step size writes the same bytes
    from mxfp4conv.shuffle import hopper, hopper_np

    x, _ = data
    saved = hopper_np.STEP_BYTES
    hopper_np.STEP_BYTES = step
    try:
        want = hopper._forward_torch(x, order)
        assert torch.equal(torch.from_numpy(hopper_np.weight_forward(x.numpy(), order)), want)
    finally:
        hopper_np.STEP_BYTES = saved


@PROPS
@given(e=st.integers(1, 3), nb=st.integers(1, 3), kb=st.integers(1, 3), seed=st.integers(0, 9999))
def test_cpu_scale_path_agrees_with_device_path(e, nb, kb, seed):
    from mxfp4conv.shuffle import hopper

    s = rand_u8(e, 16 * nb, 2 * kb, seed=seed)
    assert torch.equal(S.forward(s), hopper._scale_forward_torch(s))


# sha256 (first 32 hex digits) of the stored bytes, fixed when each layout was first written (the
# W_ROT ones from the torch path, whose registers test_rotation_order_words_give_the_same_registers
# checks): any rewrite of the transforms must keep them
GOLDEN = [
    (W, (1, 16, 32), "267d874fddcea10ea1fd2e8acbd045fa"),
    (W, (3, 48, 96), "96aebe850774a89c6061090b978bf24d"),
    (W, (2, 64, 1024), "09f6a9252e4e5ccbfb039d639a0a5e3e"),
    (W, (1, 1120, 1024), "a5746774834cd3a310b9eb9582d09731"),  # more than one CPU step
    (W_ROT, (1, 16, 32), "feeb8d9d04f72875daa47861623d22f4"),
    (W_ROT, (3, 48, 96), "6cc06ada62552ba7f9163c5ea4ef09b0"),
    (W_ROT, (2, 64, 1024), "8cd5f8555ed94751af38a0f20f393224"),
    (W_ROT, (1, 1120, 1024), "efca4215309db5c4825cad125c9acb77"),
    (S, (1, 16, 2), "4db17b63e555aba5c2059fafa7a06c0d"),
    (S, (3, 48, 6), "b76eb769ffac8ddd313deada166120f9"),
    (S, (2, 64, 64), "755bf36f174b1f7a9e8e097026c07bc1"),
    (S, (1, 1120, 224), "10b7ca4e50fa33cb592853def7e51c2b"),
]


@pytest.mark.parametrize("native", [False, True], ids=["numpy", "native"])
@pytest.mark.parametrize("layout,shape,digest", GOLDEN)
def test_golden_digests(layout, shape, digest, native, monkeypatch):
    # with the compiled weight transform (when built) and without it
    import hashlib

    from mxfp4conv.shuffle import hopper_native

    if native and not hopper_native.built():
        pytest.skip("the compiled extension mxfp4conv.shuffle._hopper_native is not built")
    if native:
        monkeypatch.delenv(hopper_native.ENV_OFF, raising=False)
    else:
        monkeypatch.setenv(hopper_native.ENV_OFF, "1")
    x = rand_u8(*shape, seed=sum(shape))
    assert layout.forward_np(x.numpy()).tobytes() == layout.forward(x).numpy().tobytes()
    y = layout.forward(x)
    assert hashlib.sha256(y.numpy().tobytes()).hexdigest()[:32] == digest
    assert torch.equal(layout.inverse(y, shape), x)


def _weight_forward_by_byte_gather(x):
    """The CPU weight path as first written (one byte gather per slab, then the two 16-bit
    lookups), kept here as the reference for the lane-swap path."""
    import numpy as np

    from mxfp4conv.shuffle import hopper_np

    e, n, kb = x.shape
    h, b, g, t, kt, c = np.meshgrid(np.arange(2), np.arange(kb // 32), np.arange(8), np.arange(4), np.arange(4),
                                    np.arange(2), indexing="ij")
    order = ((8 * h + g) * kb + 32 * b + 8 * kt + 4 * c + t).reshape(-1)
    pairs = np.take(x.reshape(-1, 16 * kb), order, axis=1).view(np.uint16)
    half = 4 * kb
    fwd16 = hopper_np.lut16("plain")[0]
    words = fwd16[0][pairs[:, :half]] | fwd16[1][pairs[:, half:]]
    return words.view(np.uint8).reshape(x.shape)


@PROPS
@given(data=weights(), step=st.sampled_from([1, 512, 4096, 1 << 18]), offset=st.integers(0, 7))
def test_cpu_weight_lane_swap_path_agrees_with_byte_gather(data, step, offset):
    # any step size, and input bytes at any alignment, give the bytes of the byte-gather path
    import numpy as np

    from mxfp4conv.shuffle import hopper_np

    x = data[0].numpy()
    buf = np.empty(x.size + offset, dtype=np.uint8)
    xa = buf[offset:].reshape(x.shape)
    xa[...] = x
    saved = hopper_np.STEP_BYTES
    hopper_np.STEP_BYTES = step
    try:
        y = hopper_np.weight_forward(xa)
    finally:
        hopper_np.STEP_BYTES = saved
    assert y.dtype == np.uint8 and y.shape == x.shape
    assert np.array_equal(y, _weight_forward_by_byte_gather(x))
    assert np.array_equal(xa, x)  # the input is left as it was
