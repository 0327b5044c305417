"""AITER layout parity: golden vectors, AITER's equivalence checks, shape probes, inverses."""

import json
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from mxfp4conv.errors import LayoutError
from mxfp4conv.shuffle import aiter as A

DATA = Path(__file__).parent / "data" / "aiter"
CODEC_FILES = {"fp4_e8m0_encoding", "per_1x32_f4_quant"}
VECTORS = sorted(p.stem for p in DATA.glob("*.safetensors") if p.stem not in CODEC_FILES)
PROPS = settings(max_examples=40, deadline=None)


def load(stem):
    with safe_open(DATA / f"{stem}.safetensors", "pt") as h:
        return json.loads(h.metadata()["meta"]), {k: h.get_tensor(k) for k in h.keys()}


def rand_u8(*shape, seed=0):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def gu16_rows(n, block=16):
    """Row order of the 16-row gate/up interleave, written out by hand: g0..g15, u0..u15, g16.."""
    half = n // 2
    order = []
    for blk in range(half // block):
        order += [blk * block + i for i in range(block)]
        order += [half + blk * block + i for i in range(block)]
    return torch.tensor(order)


def gu16(w):  # w [E, N, K]
    return w[:, gu16_rows(w.shape[1])]


def gu1(w):  # 1-row gate/up interleave, by hand: g0, u0, g1, u1, ...
    half = w.shape[1] // 2
    return w[:, [h * half + j for j in range(half) for h in (0, 1)]]


def call_vector(meta, x):
    """(forward, inverse) for the AITER call a vector's meta records."""
    fn, a = meta["function"], meta.get("args", {})
    if fn == "shuffle_weight" and a.get("pad_k_to"):
        k = a["pad_k_to"]
        return A.shuffle_weight(x, pad_k_to=k), lambda y: A.unshuffle_weight(y, pad_k_to=k, shape=x.shape)
    if fn == "shuffle_weight":
        args = (tuple(a["layout"]), a["use_int4"], a["is_guinterleave"], a["gate_up"])
        return A.shuffle_weight(x, *args), lambda y: A.unshuffle_weight(y, *args)
    if fn == "shuffle_weight_a16w4":
        args = (a["NLane"], a["gate_up"])
        return A.shuffle_weight_a16w4(x, *args), lambda y: A.unshuffle_weight_a16w4(y, *args)
    if fn == "shuffle_scale":
        args = (a["experts_cnt"], a["is_guinterleave"], a["gate_up"])
        return A.shuffle_scale(x, *args), lambda y: A.unshuffle_scale(y, *args, shape=x.shape)
    if fn == "shuffle_scale_a16w4":
        args = (a["experts_cnt"], a["gate_up"])
        return A.shuffle_scale_a16w4(x, *args), lambda y: A.unshuffle_scale_a16w4(y, *args, shape=x.shape)
    if fn == "e8m0_shuffle":
        return A.e8m0_shuffle(x), lambda y: A.e8m0_unshuffle(y, shape=x.shape)
    raise AssertionError(f"vector for unhandled function {fn}")


def test_every_shipped_vector_is_collected():
    assert len(VECTORS) >= 24


@pytest.mark.parametrize("stem", VECTORS)
def test_golden_vector_byte_exact(stem):
    meta, t = load(stem)
    x, expected = t["input"], t["output"]
    got, inverse = call_vector(meta, x)
    assert got.dtype == torch.uint8 and tuple(got.shape) == tuple(meta["output_shape"])
    assert got.is_shuffled is True
    if "pad_mask" in t:
        real = t["pad_mask"] == 0
        assert meta["padding_bytes"] == int((~real).sum()) > 0
        assert torch.equal(got[real], expected[real])
        assert (got[~real] == A.SCALE_PAD).all()  # ours is always 0x7F, AITER's may be garbage
    else:
        assert torch.equal(got, expected)
    assert torch.equal(inverse(got), x)


@pytest.mark.parametrize("stem", [s for s in VECTORS if "src_index" in load(s)[1]])
def test_golden_index_map(stem):
    meta, t = load(stem)
    x = t["input"]
    index = torch.arange(x.numel(), dtype=torch.int32).view(x.shape)
    got, _ = call_vector(meta, index)  # an int32 tensor of source positions goes through the same permutation
    pad = t["pad_mask"] == 1
    assert torch.equal(got[~pad], t["src_index"][~pad])
    assert (t["src_index"][pad] == -1).all()


@pytest.mark.parametrize("stem", VECTORS)
def test_torch_fp4_and_e8m0_dtypes_roundtrip(stem):
    meta, t = load(stem)
    x = t["input"]
    view = torch.float4_e2m1fn_x2 if meta["function"].startswith("shuffle_weight") else torch.float8_e8m0fnu
    got, inverse = call_vector(meta, x.view(view))
    assert got.dtype == view
    ref, _ = call_vector(meta, x)
    assert torch.equal(got.view(torch.uint8), ref)
    back = inverse(got)
    assert back.dtype == view and torch.equal(back.view(torch.uint8), x)


# ---- AITER's own equivalence checks -------------------------------------------------------------

EQUIV = json.loads((DATA / "equivalence_checks.json").read_text())["results"]


def check_equivalence(key):
    tag, what = key.split(": ", 1)
    kind, e, n, k = re.fullmatch(r"([ws])(\d+)x(\d+)x(\d+)", tag).groups()
    e, n, k = int(e), int(n), int(k)
    if kind == "w":
        w = rand_u8(e, n, k, seed=e * n + k)
        default = A.shuffle_weight(w)
        if what == "default==gui(gate_up=False)==a16w4(False)":
            gui = A.shuffle_weight(w, (16, 16), is_guinterleave=True, gate_up=False)
            return torch.equal(default, gui) and torch.equal(gui, A.shuffle_weight_a16w4(w, 16, False))
        if what == "gui(gate_up=True)==default(interleave16 rows)":
            gui = A.shuffle_weight(w, (16, 16), is_guinterleave=True, gate_up=True)
            return torch.equal(gui, A.shuffle_weight(gu16(w)))
        if what == "per-expert independent":
            per = torch.stack([A.shuffle_weight(w[i : i + 1])[0] for i in range(e)])
            gu = A.shuffle_weight_a16w4(w, 16, True)
            per_gu = torch.stack([A.shuffle_weight_a16w4(w[i : i + 1], 16, True)[0] for i in range(e)])
            return torch.equal(default, per) and torch.equal(gu, per_gu)
        if what == "moe_shuffle_weight gfx1250 == shuffle_weight(interleave_gate_up_rows)":
            got = A.moe_shuffle_weight(w, e, True, True, arch="gfx1250")
            return torch.equal(got, A.shuffle_weight(A.interleave_gate_up_rows(w))) and torch.equal(got, A.shuffle_weight(gu1(w)))
        if what == "moe_shuffle_weight gfx950 == shuffle_weight(gui,gate_up)":
            got = A.moe_shuffle_weight(w, e, True, True, arch="gfx950")
            return torch.equal(got, A.shuffle_weight(w, (16, 16), is_guinterleave=True, gate_up=True))
        if what == "shuffle_weight == shuffle_weight_f4 (gfx1250 16x16 tile) per expert":
            return torch.equal(default, torch.stack([A.shuffle_weight_f4(w[i]) for i in range(e)]))
    else:
        s = rand_u8(e * n, k, seed=e * n + k)
        index = torch.arange(s.numel(), dtype=torch.int32).view(s.shape)
        if what == "e8m0_shuffle index map == shuffle_scale(E,gui,gate_up=False) index map (real positions)":
            a, b = A.e8m0_shuffle(index), A.shuffle_scale(index, e, True, False)
            bytes_equal = torch.equal(A.e8m0_shuffle(s), A.shuffle_scale(s, e, True, False))
            return a.shape == b.shape and torch.equal(a, b) and bytes_equal  # no row padding: E*N % 256 == 0
        if what == "shuffle_scale(E,gui,gate_up=True) == e8m0_shuffle(interleave16 rows) (real positions)":
            inter = gu16(s.view(e, n, k)).reshape(e * n, k)
            return torch.equal(A.shuffle_scale(s, e, True, True), A.e8m0_shuffle(inter))
    raise AssertionError(f"unrecognised equivalence {key!r}")


@pytest.mark.parametrize("key", list(EQUIV))
def test_aiter_equivalence(key):
    assert EQUIV[key] is True
    assert check_equivalence(key)


def test_every_equivalence_is_asserted():
    assert len(EQUIV) == 32  # all of them, the 12 gfx1250 / moe_shuffle_weight ones included


# ---- shape probes ---------------------------------------------------------------------------------

PROBES = json.loads((DATA / "shape_probes.json").read_text())["results"]
u8 = rand_u8
PROBE_CALLS = {
    "shuffle_weight default, N%16!=0": lambda: A.shuffle_weight(u8(4, 40, 64)),
    "shuffle_weight default, Kpk%32!=0 (K=320)": lambda: A.shuffle_weight(u8(4, 64, 176)),
    "shuffle_weight guinterleave w2, I=320 (Kpk=160, %64!=0)": lambda: A.shuffle_weight(u8(4, 512, 160), is_guinterleave=True),
    "shuffle_weight default w2, I=320 (Kpk=160)": lambda: A.shuffle_weight(u8(4, 512, 160)),
    "shuffle_weight_a16w4 gate_up, I=8 (N/2 % 16 != 0)": lambda: A.shuffle_weight_a16w4(u8(1, 16, 64), 16, True),
    "shuffle_weight_a16w4 2-D input": lambda: A.shuffle_weight_a16w4(u8(512, 128), 16, False),
    "shuffle_weight pad_k_to + is_guinterleave": lambda: A.shuffle_weight(u8(2, 32, 192), is_guinterleave=True, pad_k_to=128),
    "shuffle_scale guinterleave without experts_cnt": lambda: A.shuffle_scale(u8(64, 8), None, True, False),
    "shuffle_scale_a16w4 rows/expert % 32 != 0 (N=48)": lambda: A.shuffle_scale_a16w4(u8(192, 16), 4, False),
    "shuffle_scale_a16w4 K<256 (k_scale=4 -> padded to 8 at HEAD)": lambda: A.shuffle_scale_a16w4(u8(512, 4), 4, False),
    "e8m0_shuffle 3-D input": lambda: A.e8m0_shuffle(u8(4, 64, 8)),
    "shuffle_scale float32 input returned unchanged": lambda: A.shuffle_scale(torch.ones(64, 8)),
    # v0.1.7.post2 rejected K/32 % 8 != 0; we follow HEAD, which pads the columns with 0x7F.
    "v0.1.7.post2 shuffle_scale_a16w4 k_scale=12 (I=384 w2)": lambda: A.shuffle_scale_a16w4(u8(2048, 12), 4, False),
    "v0.1.7.post2 shuffle_scale_a16w4 k_scale=4": lambda: A.shuffle_scale_a16w4(u8(512, 4), 1, False),
    "shuffle_scale_n32k4 k_scale=12 (K=384, K%128==0)": lambda: A.shuffle_scale_n32k4(u8(4, 512, 12)),
}
FOLLOW_HEAD = {
    "v0.1.7.post2 shuffle_scale_a16w4 k_scale=12 (I=384 w2)": [2048, 16],
    "v0.1.7.post2 shuffle_scale_a16w4 k_scale=4": [512, 8],
}


def test_every_probe_is_covered():
    assert {d for d, _ in PROBES} == set(PROBE_CALLS)


@pytest.mark.parametrize("desc,result", PROBES)
def test_shape_probe(desc, result):
    call = PROBE_CALLS[desc]
    if desc in FOLLOW_HEAD:
        assert result.startswith("REJECTED")
        assert list(call().shape) == FOLLOW_HEAD[desc]
        return
    if result.startswith("REJECTED"):
        with pytest.raises(LayoutError) as err:
            call()
        assert "view" not in str(err.value) and len(str(err.value)) > 40
        return
    out = call()
    want = re.search(r"\[(.*)\]|Size\(\[(.*)\]\)", result)
    assert [int(v) for v in (want.group(1) or want.group(2)).split(",")] == list(out.shape)


def test_float32_scale_is_returned_as_is():
    s = torch.ones(64, 8)
    assert A.shuffle_scale(s) is s and A.shuffle_scale(None) is None


def test_unshuffle_needs_original_shape_after_padding():
    s = rand_u8(64, 12)
    y = A.e8m0_shuffle(s)
    assert y.shape == (256, 16)
    # without a shape the padded scale is taken as the original: rows/columns of padding stay
    full = A.e8m0_unshuffle(y)
    assert full.shape == (256, 16) and torch.equal(full[:64, :12], s) and (full[64:] == 0x7F).all()
    assert torch.equal(A.e8m0_unshuffle(y, shape=s.shape), s)
    with pytest.raises(LayoutError, match="original shape"):
        A.e8m0_unshuffle(y, shape=(300, 12))
    w = rand_u8(2, 32, 48)
    yw = A.shuffle_weight(w, pad_k_to=64)
    assert yw.aiter_original_k == 48 and yw.aiter_padded_k == 64
    assert torch.equal(A.unshuffle_weight(yw, pad_k_to=64), w)  # from the tensor's attribute
    with pytest.raises(LayoutError, match="original shape"):
        A.unshuffle_weight(yw.clone(), pad_k_to=64)


# ---- closed forms and round trips on random valid shapes ------------------------------------------

dims = st.integers(1, 3)


@PROPS
@given(dims, st.integers(1, 4), st.integers(1, 4), st.integers(0, 1000))
def test_shuffle_weight_matches_closed_form(e, nb, kb, seed):
    n, k = 16 * nb, 32 * kb
    w = rand_u8(e, n, k, seed=seed)
    y = A.shuffle_weight(w).reshape(e, -1)
    r, c = torch.meshgrid(torch.arange(n), torch.arange(k), indexing="ij")
    offset = (r // 16) * (16 * k) + (c // 16) * 256 + (r % 16) * 16 + (c % 16)
    for i in range(e):
        assert torch.equal(y[i, offset.flatten()], w[i].flatten())
    assert torch.equal(A.unshuffle_weight(A.shuffle_weight(w)), w)


@PROPS
@given(st.integers(1, 70), st.integers(1, 20), st.integers(0, 1000))
def test_e8m0_shuffle_matches_closed_form(m, ks, seed):
    s = rand_u8(m, ks, seed=seed)
    y = A.e8m0_shuffle(s)
    mp, kp = -(-m // 256) * 256, -(-ks // 8) * 8
    assert y.shape == (mp, kp)
    r, c = torch.meshgrid(torch.arange(m), torch.arange(ks), indexing="ij")
    a, n, l = r // 32, (r % 32) // 16, r % 16
    b, q, j = c // 8, (c % 8) // 4, c % 4
    offset = a * (32 * kp) + b * 256 + j * 64 + l * 4 + q * 2 + n
    flat = y.flatten()
    assert torch.equal(flat[offset.flatten()], s.flatten())
    pad = torch.ones(mp * kp, dtype=torch.bool)
    pad[offset.flatten()] = False
    assert (flat[pad] == 0x7F).all()
    assert torch.equal(A.e8m0_unshuffle(y, shape=s.shape), s)


@PROPS
@given(dims, st.integers(1, 3), st.integers(1, 3), st.sampled_from([16, 32]), st.booleans(), st.integers(0, 1000))
def test_a16w4_weight_roundtrip(e, nb, kb, nlane, gate_up, seed):
    n = nlane * nb * (2 if gate_up else 1)
    w = rand_u8(e, n, 64 * kb, seed=seed)
    y = A.shuffle_weight_a16w4(w, nlane, gate_up)
    assert y.shape == w.shape and y.dtype == torch.uint8
    assert torch.equal(A.unshuffle_weight_a16w4(y, nlane, gate_up), w)
    if nlane == 16:
        assert torch.equal(y, A.shuffle_weight(gu16(w) if gate_up else w))


@PROPS
@given(dims, st.integers(1, 3), st.integers(1, 20), st.booleans(), st.integers(0, 1000))
def test_a16w4_scale_roundtrip(e, nb, ks, gate_up, seed):
    n = 32 * nb
    s = rand_u8(e * n, ks, seed=seed)
    y = A.shuffle_scale_a16w4(s, e, gate_up)
    assert y.shape == (e * n, -(-ks // 8) * 8)
    assert torch.equal(A.unshuffle_scale_a16w4(y, e, gate_up, shape=s.shape), s)
    ref = A.e8m0_shuffle(gu16(s.view(e, n, ks)).reshape(e * n, ks) if gate_up else s)
    assert torch.equal(y, ref[: e * n])  # same bytes, e8m0_shuffle only adds trailing rows


@PROPS
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 100), st.sampled_from([32, 64, 128]), st.integers(0, 1000))
def test_pad_k_to_roundtrip(e, nb, k, pad, seed):
    w = rand_u8(e, 16 * nb, k, seed=seed)
    y = A.shuffle_weight(w, pad_k_to=pad)
    kp = -(-k // pad) * pad
    assert y.shape == (e, 16 * nb, kp)
    padded = torch.cat([w, torch.zeros(e, 16 * nb, kp - k, dtype=torch.uint8)], -1)
    assert torch.equal(y, A.shuffle_weight(padded))
    assert torch.equal(A.unshuffle_weight(y, pad_k_to=pad, shape=w.shape), w)


def tile_offsets(n, k, rows, width):
    """Closed form of a tile transpose: tiles of rows x width bytes, row-major inside and across tiles."""
    r, c = torch.meshgrid(torch.arange(n), torch.arange(k), indexing="ij")
    return ((r // rows) * (rows * k) + (c // width) * (rows * width) + (r % rows) * width + (c % width)).flatten()


@PROPS
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(0, 1000))
def test_other_tile_shapes_match_closed_form(e, nb, kb, seed):
    w = rand_u8(e, 32 * nb, 64 * kb, seed=seed)
    n, k = w.shape[1:]
    cases = {
        (32, 16): A.shuffle_weight(w, (32, 16)),  # ASM GEMM layout: 32 rows x 16 bytes
        (16, 32): A.shuffle_weight(w, use_int4=True),  # int4 one-per-byte: 16 rows x 32 bytes
    }
    for (rows, width), y in cases.items():
        off = tile_offsets(n, k, rows, width)
        for i in range(e):
            assert torch.equal(y[i].flatten()[off], w[i].flatten())
    # NLane = 32 a16w4 is the same 32-row tile transpose
    assert torch.equal(A.shuffle_weight_a16w4(w, 32, False), cases[(32, 16)])
    assert torch.equal(A.unshuffle_weight(cases[(16, 32)], use_int4=True), w)
    # 2-byte elements: tiles of 16 rows x 8 elements, i.e. the same 16 x 16-byte tiles
    bf = w.view(torch.bfloat16)
    y = A.shuffle_weight(bf)
    assert y.dtype == torch.bfloat16 and torch.equal(y.view(torch.uint8), A.shuffle_weight(w))
    assert torch.equal(A.unshuffle_weight(y).view(torch.uint8), w)  # bytes: random bf16 holds NaNs


# ---- gfx1250: 1-row gate/up interleave, shuffle_weight_f4, n32k4 scales, arch dispatch -------------


def n32k4_offsets(n, ks):
    """Closed form of the n32k4 scale layout (per expert): (32a + r, 4c + q) -> a*32*ks + 128c + 4r + q."""
    r, c = torch.meshgrid(torch.arange(n), torch.arange(ks), indexing="ij")
    return ((r // 32) * (32 * ks) + (c // 4) * 128 + (r % 32) * 4 + (c % 4)).flatten()


@PROPS
@given(dims, st.integers(1, 40), st.integers(0, 3), st.integers(0, 1000))
def test_interleave_gate_up_rows_roundtrip(e, half, extra, seed):
    shape = (e, 2 * half) + ((3,) * extra)  # any trailing dims, as in AITER
    w = rand_u8(*shape, seed=seed)
    y = A.interleave_gate_up_rows(w)
    assert torch.equal(y, gu1(w))
    assert torch.equal(y[:, 0::2], w[:, :half]) and torch.equal(y[:, 1::2], w[:, half:])
    assert torch.equal(A.deinterleave_gate_up_rows(y), w)


@PROPS
@given(st.integers(0, 3), st.integers(1, 3), st.integers(1, 5), st.integers(0, 1000))
def test_shuffle_weight_f4_matches_closed_form(e, nb, kb, seed):
    n, k = 16 * nb, 16 * kb  # K/2 % 16 is enough here (shuffle_weight needs % 32)
    w = rand_u8(max(e, 1), n, k, seed=seed)
    off = tile_offsets(n, k, 16, 16)
    for i in range(w.shape[0]):
        y = A.shuffle_weight_f4(w[i])
        assert y.shape == (n, k) and torch.equal(y.flatten()[off], w[i].flatten())
        assert torch.equal(A.unshuffle_weight_f4(y), w[i])
    w3 = w[:e] if e else w
    y3 = A.shuffle_weight_f4(w3)
    assert torch.equal(y3, torch.stack([A.shuffle_weight_f4(x) for x in w3]))
    assert torch.equal(A.unshuffle_weight_f4(y3), w3)
    if k % 32 == 0:
        assert torch.equal(y3, A.shuffle_weight(w3))
    fp4 = A.shuffle_weight_f4(w3.view(torch.float4_e2m1fn_x2))
    assert fp4.dtype == torch.float4_e2m1fn_x2 and torch.equal(fp4.view(torch.uint8), y3)


@PROPS
@given(dims, st.integers(1, 3), st.integers(1, 2), st.booleans(), st.booleans(), st.sampled_from(["gfx950", "gfx1250"]), st.integers(0, 1000))
def test_moe_shuffle_weight_dispatch_and_roundtrip(e, nb, kb, gui, gate_up, arch, seed):
    w = rand_u8(e, 32 * nb, 64 * kb, seed=seed)
    y = A.moe_shuffle_weight(w, e, gui, gate_up, arch=arch)
    if arch == "gfx1250":
        ref = A.shuffle_weight(gu1(w) if gui and gate_up else w)
    else:
        ref = A.shuffle_weight(w, (16, 16), is_guinterleave=gui, gate_up=gate_up)
    assert torch.equal(y, ref) and y.is_shuffled is True
    assert torch.equal(A.moe_unshuffle_weight(y, e, gui, gate_up, arch=arch), w)


def test_gate_up_granularity_differs_by_arch():
    w = rand_u8(2, 64, 64, seed=3)
    gfx1250 = A.moe_shuffle_weight(w, 2, True, True, arch="gfx1250")
    gfx950 = A.moe_shuffle_weight(w, 2, True, True)  # default arch
    assert torch.equal(gfx950, A.shuffle_weight_a16w4(w, 16, True))
    assert not torch.equal(gfx1250, gfx950)
    # first 16-byte run of the first tile: row 1 is up row 0 on gfx1250, gate row 1 elsewhere
    assert torch.equal(gfx1250[0, 0, 16:32], w[0, 32, :16]) and torch.equal(gfx950[0, 0, 16:32], w[0, 1, :16])
    # without both flags gfx1250 is the plain tile transpose
    for gui, gate_up in [(False, False), (True, False), (False, True)]:
        assert torch.equal(A.moe_shuffle_weight(w, 2, gui, gate_up, arch="gfx1250"), A.shuffle_weight(w))


@PROPS
@given(dims, st.integers(1, 3), st.integers(1, 6), st.booleans(), st.booleans(), st.integers(0, 1000))
def test_shuffle_scale_n32k4_matches_closed_form(e, nb, cb, gui, gate_up, seed):
    n, ks = 32 * nb, 4 * cb
    s = rand_u8(e, n, ks, seed=seed)
    y = A.shuffle_scale_n32k4(s, None, gui, gate_up)
    assert y.dtype == torch.uint8 and y.shape == (e, n // 32, ks * 32)
    src = gu1(s) if gui and gate_up else s  # the interleave only with both flags
    off = n32k4_offsets(n, ks)
    for i in range(e):
        assert torch.equal(y[i].flatten()[off], src[i].flatten())
    assert torch.equal(A.unshuffle_scale_n32k4(y, None, gui, gate_up), s)
    # 2-D input with experts_cnt, e8m0 dtype in: same bytes (uint8 out, as AITER), inverse to 2-D
    s2 = s.reshape(e * n, ks)
    y2 = A.shuffle_scale_n32k4(s2.view(torch.float8_e8m0fnu), e, gui, gate_up)
    assert y2.dtype == torch.uint8 and torch.equal(y2, y)
    assert torch.equal(A.unshuffle_scale_n32k4(y2, e, gui, gate_up, shape=s2.shape), s2)


@PROPS
@given(dims, st.integers(1, 2), st.integers(1, 12), st.booleans(), st.sampled_from(["gfx950", "gfx1250"]), st.integers(0, 1000))
def test_moe_shuffle_scale_dispatch_and_roundtrip(e, nb, ks, gate_up, arch, seed):
    if arch == "gfx1250":
        ks = 4 * -(-ks // 4)
    s = rand_u8(e * 32 * nb, ks, seed=seed)
    y = A.moe_shuffle_scale(s, e, True, gate_up, arch=arch)
    ref = A.shuffle_scale_n32k4(s, e, True, gate_up) if arch == "gfx1250" else A.shuffle_scale(s, e, True, gate_up)
    assert torch.equal(y, ref)
    assert torch.equal(A.moe_unshuffle_scale(y, e, True, gate_up, arch=arch, shape=s.shape), s)


GFX1250_REJECT = {
    "n32k4 N % 32 (N=48)": (lambda: A.shuffle_scale_n32k4(u8(2, 48, 8)), "multiple of 32"),
    "n32k4 K/32 % 4 (K/32=6)": (lambda: A.shuffle_scale_n32k4(u8(2, 64, 6)), "multiple of 128"),
    "n32k4 2-D without experts_cnt": (lambda: A.shuffle_scale_n32k4(u8(128, 8)), "experts_cnt"),
    "n32k4 rows not split by experts": (lambda: A.shuffle_scale_n32k4(u8(100, 8), 3), "experts_cnt=3"),
    "n32k4 4-D": (lambda: A.shuffle_scale_n32k4(u8(1, 2, 32, 8)), "3-D"),
    "n32k4 wide dtype": (lambda: A.shuffle_scale_n32k4(torch.ones(2, 32, 8)), "e8m0"),
    "n32k4 via moe_shuffle_scale gfx1250": (lambda: A.moe_shuffle_scale(u8(64, 12 + 2), 1, arch="gfx1250"), "multiple of 4"),
    "f4 rows % 16": (lambda: A.shuffle_weight_f4(u8(40, 32)), "multiple of 16"),
    "f4 K/2 % 16": (lambda: A.shuffle_weight_f4(u8(32, 40)), "multiple of 16"),
    "f4 4-D": (lambda: A.shuffle_weight_f4(u8(1, 1, 16, 16)), "rows, K/2"),
    "interleave odd rows": (lambda: A.interleave_gate_up_rows(u8(2, 33, 16)), "even"),
    "interleave 1-D": (lambda: A.interleave_gate_up_rows(u8(32)), "dim 1"),
    "moe_shuffle_weight gfx1250 gate/up 2-D": (lambda: A.moe_shuffle_weight(u8(64, 64), 1, True, True, arch="gfx1250"), "3-D"),
    "moe_shuffle_weight gfx1250 N % 16": (lambda: A.moe_shuffle_weight(u8(1, 40, 64), 1, True, True, arch="gfx1250"), "multiple of the tile"),
    "moe_shuffle_weight bad arch": (lambda: A.moe_shuffle_weight(u8(1, 32, 64), arch=None), "gfx"),
    "unshuffle n32k4 wrong shape": (lambda: A.unshuffle_scale_n32k4(u8(2, 2, 128), shape=(64, 4)), "original shape"),
}


@pytest.mark.parametrize("case", list(GFX1250_REJECT))
def test_gfx1250_rejections_are_layout_errors(case):
    call, words = GFX1250_REJECT[case]
    with pytest.raises(LayoutError) as err:
        call()
    msg = str(err.value)
    assert words in msg and "view" not in msg and len(msg) > 40


def test_n32k4_is_the_golden_probe_shape_and_moves_real_bytes():
    s = rand_u8(4, 512, 12, seed=11)  # K = 384: the tensor-parallel-8 shard, K % 128 == 0
    y = A.shuffle_scale_n32k4(s)
    assert list(y.shape) == [4, 16, 384]
    # block (rows 0..31, cols 0..3) of expert 0 is the first 128 bytes, row-major
    assert torch.equal(y[0, 0, :128], s[0, :32, :4].flatten())
    assert torch.equal(y[3, 15, 128:256], s[3, 480:512, 4:8].flatten())
