"""The activation quantiser against AITER's Triton dynamic_mxfp4_quant (golden vectors made by
AITER's kernel in Triton's interpreter): what the SiTUv2 a4w4 emulation feeds both GEMMs."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from mxfp4conv.codec import ROUNDING_MODES, dequantize_mxfp4, quantize_mxfp4
from mxfp4conv.runtime.act_quant import qdq

VECTORS = Path(__file__).parent / "data" / "aiter_act_quant" / "vectors.safetensors"


@pytest.fixture(scope="module")
def vec():
    with safe_open(str(VECTORS), "pt") as f:
        meta = json.loads(f.metadata()["meta"])
        return {k: f.get_tensor(k) for k in f.keys()}, meta


def test_codec_even_is_aiters_activation_quantiser_byte_for_byte(vec):
    t, meta = vec
    assert "dynamic_mxfp4_quant" in meta["call"]
    packed, scales = quantize_mxfp4(t["x"].float(), rounding="even")
    assert torch.equal(scales, t["scale"])
    assert torch.equal(packed, t["fp4"])


@pytest.mark.parametrize("mode", [m for m in ROUNDING_MODES if m != "even"])
def test_vectors_tell_the_other_scale_rules_apart(vec, mode):
    t, _ = vec
    _, scales = quantize_mxfp4(t["x"].float(), rounding=mode)
    assert not torch.equal(scales, t["scale"])


def test_runtime_mxfp4_activations_are_aiters_values(vec):
    t, _ = vec
    want = dequantize_mxfp4(t["fp4"], t["scale"], dtype=torch.float32)
    assert torch.equal(qdq(t["x"].float(), "mxfp4"), want)
