"""MXFP4 codec against AITER's own outputs (golden vectors) plus round-trip properties."""

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from mxfp4conv.codec import (
    ROUNDING_MODES,
    CodecError,
    dequantize_mxfp4,
    e2m1_to_float,
    e8m0_scale_for_amax,
    e8m0_to_float,
    float_to_e2m1,
    pack_fp4,
    quantize_mxfp4,
    unpack_fp4,
)
from mxfp4conv.errors import Mxfp4convError

DATA = Path(__file__).parent / "data" / "aiter"
ENC = load_file(DATA / "fp4_e8m0_encoding.safetensors")
QUANT = load_file(DATA / "per_1x32_f4_quant.safetensors")

PROPS = settings(max_examples=60, deadline=None)


# ---- golden vectors ---------------------------------------------------------------------


def test_all_256_bytes_decode_like_aiter():
    b = ENC["all_bytes"]
    assert torch.equal(b, torch.arange(256, dtype=torch.uint8))
    got = e2m1_to_float(unpack_fp4(b)).view(256, 2)
    # compare raw bits so -0.0 vs 0.0 is checked too
    assert torch.equal(got.view(torch.int32), ENC["mxfp4_to_f32_of_all_bytes"].view(torch.int32))


def test_all_256_e8m0_codes_decode_bit_exact():
    got = e8m0_to_float(torch.arange(256, dtype=torch.uint8))
    assert torch.equal(got.view(torch.int32), ENC["e8m0_to_f32_bits_of_all_codes"])
    assert torch.isnan(got[255]) and got[127] == 1.0 and got[128] == 2.0


@pytest.mark.parametrize(
    "mode,key",
    [
        ("round_down", "e8m0_head_mode0_RoundDown"),
        ("round_up", "e8m0_head_mode1_RoundUp"),
        ("even", "e8m0_head_mode2_Even"),
        ("ceil", "e8m0_head_mode3_Ceil"),
        ("legacy", "e8m0_v0_1_7_post2_f32_to_e8m0_of_amax_div_4"),
    ],
)
def test_e8m0_scale_rounding_sweep(mode, key):
    assert torch.equal(e8m0_scale_for_amax(ENC["amax_sweep"], mode), ENC[key])


def test_f32_rounding_sweep_matches_aiter_except_nan():
    sweep = ENC["f32_sweep"]
    nan = torch.isnan(sweep)
    assert nan.sum() == 1  # the vector holds exactly one NaN; AITER encodes it as garbage
    expected = unpack_fp4(ENC["f32_to_mxfp4_head"])
    assert torch.equal(expected, unpack_fp4(ENC["f32_to_mxfp4_v0_1_7_post2"]))
    got = float_to_e2m1(torch.where(nan, torch.zeros_like(sweep), sweep))
    assert torch.equal(got[~nan], expected[~nan])
    # the packed form (pairs) too, for every byte that holds no NaN
    pair_ok = ~nan.view(-1, 2).any(-1)
    assert torch.equal(pack_fp4(got)[pair_ok], ENC["f32_to_mxfp4_head"][pair_ok])


def test_nan_is_rejected_not_encoded():
    with pytest.raises(CodecError, match="NaN"):
        float_to_e2m1(ENC["f32_sweep"])
    x = torch.zeros(2, 64)
    x[1, 40] = float("nan")
    with pytest.raises(Mxfp4convError, match="NaN"):
        quantize_mxfp4(x)


def test_inf_saturates_in_encoder_but_is_rejected_by_quantiser():
    assert float_to_e2m1(torch.tensor([float("inf"), -float("inf")])).tolist() == [0x7, 0xF]
    x = torch.ones(1, 32)
    x[0, 3] = float("inf")
    with pytest.raises(CodecError, match="infinite"):
        quantize_mxfp4(x)


@pytest.mark.parametrize(
    "mode,suffix",
    [("round_down", "head_RoundDown"), ("round_up", "head_RoundUp_default"), ("even", "head_Even"),
     ("ceil", "head_Ceil"), ("legacy", "v0_1_7_post2")],
)
def test_per_1x32_f4_quant_byte_exact(mode, suffix):
    x = QUANT["x_bf16"]
    packed, scales = quantize_mxfp4(x, rounding=mode)
    assert packed.dtype == torch.uint8 and scales.dtype == torch.uint8
    assert packed.shape == (2, 64, 128) and scales.shape == (2, 64, 8)
    assert torch.equal(packed, QUANT[f"fp4_{suffix}"])
    # AITER returns the scale 2-D [rows, K/32]; ours keeps the leading dims
    assert torch.equal(scales.reshape(128, 8), QUANT[f"scale_{suffix}"])


def test_modes_really_differ_on_the_vector():
    scales = {m: quantize_mxfp4(QUANT["x_bf16"], m)[1] for m in ROUNDING_MODES}
    assert len({s.numpy().tobytes() for s in scales.values()}) == len(ROUNDING_MODES)


# ---- API edges ----------------------------------------------------------------------------


def test_accepts_torch_fp4_and_e8m0_views():
    packed, scales = quantize_mxfp4(QUANT["x_bf16"][0, :4])
    ref = dequantize_mxfp4(packed, scales)
    alt = dequantize_mxfp4(packed.view(torch.float4_e2m1fn_x2), scales.view(torch.float8_e8m0fnu))
    assert torch.equal(ref, alt)
    assert torch.equal(unpack_fp4(packed.view(torch.float4_e2m1fn_x2)), unpack_fp4(packed))


def test_dequantize_matches_bf16_source_closely_and_casts():
    x = QUANT["x_bf16"].float()
    packed, scales = quantize_mxfp4(x, "round_up")
    y = dequantize_mxfp4(packed, scales, dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert (y.float() - x).abs().max() <= x.abs().max() / 6 + 1e-6


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(CodecError, match="multiple of 32"):
        quantize_mxfp4(torch.ones(3, 48))
    with pytest.raises(CodecError, match="rounding"):
        quantize_mxfp4(torch.ones(1, 32), rounding="nearest")
    with pytest.raises(CodecError, match="raw bytes"):
        unpack_fp4(torch.ones(4, dtype=torch.float32))
    with pytest.raises(CodecError, match="scales of shape"):
        dequantize_mxfp4(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8))
    with pytest.raises(CodecError, match="even"):
        pack_fp4(torch.zeros(3, dtype=torch.uint8))


def test_low_nibble_is_even_element():
    assert pack_fp4(torch.tensor([0x1, 0xA], dtype=torch.uint8)).item() == 0xA1
    assert unpack_fp4(torch.tensor([0xA1], dtype=torch.uint8)).tolist() == [0x1, 0xA]


# ---- properties -----------------------------------------------------------------------------

byte_arrays = st.lists(st.integers(0, 255), min_size=1, max_size=64)


@PROPS
@given(byte_arrays)
def test_unpack_then_pack_is_identity(bs):
    b = torch.tensor(bs, dtype=torch.uint8)
    codes = unpack_fp4(b)
    assert codes.shape == (2 * len(bs),) and int(codes.max()) <= 15
    assert torch.equal(pack_fp4(codes), b)


@PROPS
@given(st.lists(st.integers(0, 15), min_size=1, max_size=32).map(lambda c: c + c[:1] if len(c) % 2 else c))
def test_pack_then_unpack_is_identity(cs):
    c = torch.tensor(cs, dtype=torch.uint8)
    assert torch.equal(unpack_fp4(pack_fp4(c)), c)


def test_encode_decode_every_code():
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(float_to_e2m1(e2m1_to_float(codes)), codes)


@PROPS
@given(st.lists(st.integers(0, 15), min_size=1, max_size=64), st.integers(-20, 20))
def test_representable_times_pow2_roundtrips(cs, k):
    codes = torch.tensor(cs, dtype=torch.uint8)
    # value * 2**k decodes back to the same code once divided by 2**k again (exact in f32)
    vals = e2m1_to_float(codes) * 2.0**k
    assert torch.equal(float_to_e2m1(vals / 2.0**k), codes)


@PROPS
@given(st.integers(0, 2**31 - 1), st.integers(1, 3), st.integers(110, 145), st.sampled_from(["round_up", "round_down"]))
def test_requantising_mxfp4_values_is_lossless(seed, rows, scale_code, mode):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (rows, 32), dtype=torch.uint8, generator=g)
    scales = torch.randint(scale_code - 3, scale_code + 4, (rows, 2), dtype=torch.uint8, generator=g)
    x = dequantize_mxfp4(packed, scales)
    p2, s2 = quantize_mxfp4(x, mode)
    assert torch.equal(dequantize_mxfp4(p2, s2), x)


finite = st.floats(min_value=-2.0**100, max_value=2.0**100, allow_nan=False, allow_infinity=False, width=32)


@PROPS
@given(st.lists(finite, min_size=32, max_size=32), st.lists(finite, min_size=32, max_size=32),
       st.sampled_from(ROUNDING_MODES))
def test_quantisation_error_bound_per_block(a, b, mode):
    x = torch.tensor([a, b], dtype=torch.float32)
    packed, scales = quantize_mxfp4(x, mode)
    y = dequantize_mxfp4(packed, scales)
    s = e8m0_to_float(scales)  # [2, 1]: one block per row
    amax = x.abs().amax(-1, keepdim=True)
    # half the widest e2m1 spacing (2 between 4 and 6) is one scale step; round_down may also
    # saturate values up to 8 scale steps down to 6 (two steps)
    bound = s * (2.0 if mode == "round_down" else 1.0)
    assert ((y - x).abs() <= bound).all()
    assert (y.abs() <= torch.maximum(amax, 6 * s)).all()
    assert torch.equal(torch.signbit(y) | (y == 0), torch.signbit(x) | (y == 0))
