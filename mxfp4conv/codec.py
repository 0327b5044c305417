"""MXFP4 codec: e2m1 elements, e8m0 block scales, the per-32 quantiser and the dequantiser.

Bit conventions (OCP MX, and what AITER's ``fp4_utils`` and ``per_1x32_f4_quant`` produce):

- e2m1 code -> value: 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign (0x8 = -0).
- fp4x2 packing: byte ``b`` of a row holds element ``2b`` in the low nibble and ``2b+1`` in the
  high nibble.
- e8m0 code -> value: ``2**(code - 127)``; 0xFF is NaN. Code 0 decodes to 2**-127 (bits
  0x00400000) and 0xFF to the NaN with bits 0x7F800001, as AITER's ``e8m0_to_f32`` does.

Every function takes and returns raw ``uint8`` bytes; ``torch.float4_e2m1fn_x2`` and
``torch.float8_e8m0fnu`` tensors are accepted and read as their bytes.

NaN policy: AITER's ``f32_to_mxfp4`` has no NaN case and turns NaN into an arbitrary code (0x3
was observed). Here ``float_to_e2m1`` and ``quantize_mxfp4`` reject NaN input with a
``CodecError`` instead; the quantiser also rejects +-inf, since AITER would give that block the
NaN scale 0xFF. ``float_to_e2m1`` saturates +-inf to +-6 like AITER.
"""

from __future__ import annotations

import torch

from mxfp4conv.errors import Mxfp4convError

BLOCK = 32
E8M0_NAN = 0xFF

# Scale rounding modes of AITER's per_1x32_f4_quant. "round_down"/"round_up"/"even"/"ceil" are
# HEAD's MxScaleRoundMode 0/1/2/3 (HEAD's default is round_up); "legacy" is the half-up rule of
# AITER <= v0.1.13 (f32_to_e8m0(amax / 4)), which differs from round_up only when amax = 6 * 2**k.
ROUNDING_MODES = ("even", "round_up", "round_down", "ceil", "legacy")

_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

# Round-to-nearest-even boundaries between consecutive magnitudes. At the midpoints below
# the lower code is even, so a tie stays down (the magnitude must be strictly greater) ...
_TIE_DOWN = (0.25, 1.25, 2.5, 5.0)
# ... and at these the lower code is odd, so a tie goes up.
_TIE_UP = (0.75, 1.75, 3.5)

_EXP_MASK = -0x800000  # 0xFF800000 as int32: sign + exponent bits
_MANT_MASK = 0x7FFFFF


class CodecError(Mxfp4convError, ValueError):
    """Input the MXFP4 codec cannot encode or decode (NaN, wrong shape or dtype)."""


def _bytes(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.dtype in (torch.uint8, torch.float4_e2m1fn_x2, torch.float8_e8m0fnu):
        return t.view(torch.uint8)
    raise CodecError(
        f"{what} must be raw bytes (uint8, float4_e2m1fn_x2 or float8_e8m0fnu) but has dtype "
        f"{t.dtype}; pass the stored bytes, not a numeric cast."
    )


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """fp4x2 bytes ``[..., K/2]`` -> e2m1 codes ``[..., K]`` (uint8, one code per byte)."""
    p = _bytes(packed, "packed fp4")
    return torch.stack((p & 0x0F, p >> 4), dim=-1).flatten(-2)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes ``[..., K]`` (uint8 in 0..15) -> fp4x2 bytes ``[..., K/2]``."""
    c = _bytes(codes, "fp4 codes")
    if c.shape[-1] % 2:
        raise CodecError(f"cannot pack {c.shape[-1]} fp4 codes into bytes: the last dimension must be even.")
    pairs = c.unflatten(-1, (-1, 2))
    return (pairs[..., 0] & 0x0F) | (pairs[..., 1] << 4)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8, low 4 bits used) -> float32 values."""
    c = _bytes(codes, "fp4 codes")
    table = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=c.device)
    return table[(c & 0x0F).long()]


def _reject_nan(x: torch.Tensor, what: str) -> None:
    if torch.isnan(x).any():
        n = int(torch.isnan(x).sum())
        raise CodecError(
            f"{what} contains {n} NaN value(s); MXFP4 has no NaN element code (AITER would "
            f"silently encode it as garbage). Clean the input before quantising."
        )


def float_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Float values -> e2m1 codes (uint8), round to nearest, ties to even, saturating at +-6.

    Computed in float32 like AITER's ``f32_to_mxfp4``; the sign is kept (-0.25 -> 0x8) and
    +-inf saturates to +-6. NaN raises ``CodecError``.
    """
    if not x.is_floating_point():
        raise CodecError(f"float_to_e2m1 needs a floating-point tensor, got {x.dtype}.")
    x = x.float()
    _reject_nan(x, "float_to_e2m1 input")
    a = x.abs()
    down = torch.tensor(_TIE_DOWN, dtype=torch.float32, device=x.device)
    up = torch.tensor(_TIE_UP, dtype=torch.float32, device=x.device)
    # bucketize(right=False) counts boundaries strictly below a; right=True counts those <= a.
    mag = torch.bucketize(a, down, right=False) + torch.bucketize(a, up, right=True)
    return (mag.to(torch.uint8) | (torch.signbit(x).to(torch.uint8) << 3))


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """e8m0 bytes -> float32 ``2**(b - 127)``; 0xFF -> NaN (bit-identical to AITER)."""
    b = _bytes(scales, "e8m0 scales").to(torch.int32)
    bits = b << 23
    bits = torch.where(b == 0, torch.full_like(bits, 0x00400000), bits)
    bits = torch.where(b == E8M0_NAN, torch.full_like(bits, 0x7F800001), bits)
    return bits.view(torch.float32)


def _floor_pow2_code(v: torch.Tensor) -> torch.Tensor:
    """Biased exponent field of float32 ``v`` (floor to a power of two); NaN/inf -> 0xFF."""
    return ((v.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


def _ceil_pow2_code(v: torch.Tensor) -> torch.Tensor:
    """Exponent field plus one when any mantissa bit is set, never past 0xFF."""
    bits = v.view(torch.int32)
    exp = (bits >> 23) & 0xFF
    bump = ((bits & _MANT_MASK) != 0) & (exp < 0xFF)
    return (exp + bump.to(torch.int32)).to(torch.uint8)


def e8m0_scale_for_amax(amax: torch.Tensor, rounding: str = "even") -> torch.Tensor:
    """Block maxima (float32, >= 0) -> e8m0 scale codes (uint8), AITER's formulas bit for bit.

    round_up: ceil_pow2(amax / 6); round_down: floor_pow2(amax / 4); ceil: ceil_pow2(amax / 4);
    even: floor_pow2(round_mantissa_half_up(amax) / 4); legacy: AITER v0.1.7 ``f32_to_e8m0(amax/4)``.
    NaN / inf maxima give 0xFF, as in AITER.
    """
    amax = amax.float().contiguous()
    if rounding == "round_up":
        return _ceil_pow2_code(amax / 6.0)
    if rounding == "round_down":
        return _floor_pow2_code(amax / 4.0)
    if rounding == "ceil":
        return _ceil_pow2_code(amax / 4.0)
    if rounding == "even":
        rounded = ((amax.view(torch.int32) + 0x200000) & _EXP_MASK).view(torch.float32)
        return _floor_pow2_code(rounded / 4.0)
    if rounding == "legacy":
        bits = (amax / 4.0).view(torch.int32)
        exp = (bits >> 23) & 0xFF
        up = ((bits & 0x400000) != 0) & (((bits & 0x200000) != 0) | ((bits & 0x1FFFFF) != 0) | (exp > 0))
        exp = torch.where(exp == 0xFF, exp, exp + up.to(torch.int32))
        return exp.clamp(max=0xFF).to(torch.uint8)
    raise CodecError(f"unknown MXFP4 scale rounding mode {rounding!r}; choose one of {', '.join(ROUNDING_MODES)}.")


def quantize_mxfp4(x: torch.Tensor, rounding: str = "even") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``x[..., K]`` (K % 32 == 0) to MXFP4 like AITER's ``per_1x32_f4_quant``.

    Returns ``(packed uint8 [..., K/2], scales uint8 [..., K/32])``. ``rounding`` picks the
    scale rule (``ROUNDING_MODES``). Per 32-block: amax -> e8m0 code -> x / 2**(code-127) ->
    e2m1 (nearest, ties to even, saturating). An all-zero block gets scale code 0. NaN or
    infinite input raises ``CodecError``.
    """
    if rounding not in ROUNDING_MODES:
        raise CodecError(f"unknown MXFP4 scale rounding mode {rounding!r}; choose one of {', '.join(ROUNDING_MODES)}.")
    if not x.is_floating_point():
        raise CodecError(f"quantize_mxfp4 needs a floating-point tensor, got {x.dtype}.")
    if x.dim() == 0 or x.shape[-1] % BLOCK:
        raise CodecError(
            f"quantize_mxfp4 needs the last dimension to be a multiple of {BLOCK} (one e8m0 scale "
            f"per {BLOCK} elements); got shape {tuple(x.shape)}. Pad the reduction dimension first."
        )
    xf = x.float()
    _reject_nan(xf, "quantize_mxfp4 input")
    if torch.isinf(xf).any():
        raise CodecError(
            "quantize_mxfp4 input contains infinite values; an MXFP4 block holding inf would get the "
            "NaN scale 0xFF. Clamp or clean the input before quantising."
        )
    blocks = xf.unflatten(-1, (-1, BLOCK))
    codes = e8m0_scale_for_amax(blocks.abs().amax(dim=-1), rounding)
    y = blocks / e8m0_to_float(codes).unsqueeze(-1)
    return pack_fp4(float_to_e2m1(y).flatten(-2)), codes


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """MXFP4 ``packed [..., K/2]`` + e8m0 ``scales [..., K/32]`` -> values ``[..., K]`` in ``dtype``.

    Exact in float32 (every e2m1 value times a power of two is representable); a 0xFF scale
    gives NaN for its block.
    """
    p = _bytes(packed, "packed fp4")
    s = _bytes(scales, "e8m0 scales")
    k = 2 * p.shape[-1]
    if k % BLOCK or p.shape[:-1] != s.shape[:-1] or s.shape[-1] != k // BLOCK:
        raise CodecError(
            f"MXFP4 weight of shape {tuple(p.shape)} (K = {k}) needs scales of shape "
            f"{tuple(p.shape[:-1]) + (k // BLOCK,)} with K a multiple of {BLOCK}; got scales "
            f"{tuple(s.shape)}."
        )
    values = e2m1_to_float(unpack_fp4(p)).unflatten(-1, (-1, BLOCK))
    return (values * e8m0_to_float(s).unsqueeze(-1)).flatten(-2).to(dtype)
