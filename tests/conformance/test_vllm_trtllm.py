"""sm100: what mxfp4conv writes for vLLM's FlashInfer TRTLLM-Gen backend, against vLLM's own
converter running FlashInfer's own functions on CPU, for vLLM 0.33.0 and 0.34.0.

For every family on an emulated sm100 (tp 1, 2 and 8 with EP), the decision is either

- the TRTLLM layout (``mxfp4conv.shuffle.trtllm``: Kimi-K3 and DeepSeek-V4 on
  ``FLASHINFER_TRTLLM_MXFP4_MXFP8`` through converter S, gpt-oss on ``FLASHINFER_TRTLLM_MXFP4_BF16``
  through converter G, from its interleaved rows): then ``probe_convert`` runs vLLM's
  ``process_weights_after_loading`` on a tiny layer (two experts, H = I = 256, seeded bytes) with
  FlashInfer's ``get_w2_permute_indices_with_cache`` for real and, for the one compiled step
  (``block_scale_interleave``), FlashInfer's own pure-torch 128 x 4 swizzle
  (``vllm_code/flashinfer_cpu.py`` lists it), and every tensor vLLM keeps must equal mxfp4conv's
  layout of the same canonical bytes, byte for byte and in vLLM's dtype; or
- the safe default: vLLM's pick with canonical (identity) bytes that vLLM converts itself,
  ``serving_kernel`` ``vllm``, and a note saying why its layout is not written; or a refusal
  because vLLM itself raises.

Skipped when a vLLM wheel or FlashInfer's wheel cannot be had (each skip says why).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conformance.matrix import MODELS, Case, vllm_case
from mxfp4conv.errors import OracleError
from mxfp4conv.oracle import Target, decide
from mxfp4conv.oracle.formats import TRTLLM_LAYOUT as TRTLLM
from mxfp4conv.oracle.releases import RELEASES
from mxfp4conv.shuffle.layouts import get_layout
from vllm_code import tiny_layer as T
from vllm_code.harness import require_flashinfer, require_vllm, run_probe, versions

PROBE = "tests/vllm_code/probe_convert.py:probe"
SEED = 20261
FAMILIES = ("k3", "dsv4", "gpt_oss", "quark_w4a16", "quark_w4a4", "quark_w4a8")  # biases: the plugin test
PARALLEL = ((1, False), (2, False), (8, True))
VLLM_DTYPE = {"w13": torch.uint8, "w2": torch.uint8,
              "w13_scale": torch.float8_e4m3fn, "w2_scale": torch.float8_e4m3fn}


def _cases() -> list[tuple[Case, object, str | None]]:
    out = []
    for name in FAMILIES:
        for tp, ep in PARALLEL:
            case = Case(f"{name}-sm100-tp{tp}{'-ep' if ep else ''}", name, Target("sm100", tp=tp, ep=ep))
            try:
                out.append((case, decide(case.model, case.target), None))
            except OracleError as e:
                out.append((case, None, str(e)))
    return out


CASES = _cases()
NATIVE = [(c, d) for c, d, _ in CASES if d is not None and d.layout == TRTLLM]


def test_native_layout_is_written_for_mxfp4moemethod():
    assert {c.model_name for c, _ in NATIVE} == {"k3", "dsv4", "gpt_oss"}
    assert all(d.backend == ("FLASHINFER_TRTLLM_MXFP4_BF16" if c.model_name == "gpt_oss"
                             else "FLASHINFER_TRTLLM_MXFP4_MXFP8") for c, d in NATIVE)


@pytest.mark.parametrize("case,d,refused", [c for c in CASES if c[1] is None or c[1].layout != TRTLLM],
                         ids=[c.id for c, d, _ in CASES if d is None or d.layout != TRTLLM])
def test_other_families_keep_vllm_backend(case, d, refused):
    """Where mxfp4conv does not write the converted layout, the output is the safe default."""
    if d is None:  # vLLM's own converter raises for this deployment: nothing to serve
        assert "raises" in refused, refused
        return
    assert d.options["serving_kernel"] == "vllm", case.id
    assert d.backend == d.options["vllm_backend"], case.id
    assert set(d.layout.as_dict().values()) == {"identity", "[gate; up]"}, d.layout
    if d.backend != "EMULATION":  # vLLM's own EMULATION keeps the loaded bytes: nothing to say
        assert any("mxfp4conv does not write" in n and "converts them at start-up" in n for n in d.notes), d.notes
    assert (d.hidden_padded, d.intermediate_per_rank_padded) == (
        d.options["vllm_hidden_padded"], d.options["vllm_intermediate_padded"]), case.id


RAISES = [(c, r) for c, d, r in CASES if d is None and "weight converter raises" in r]


@pytest.fixture(scope="module", params=versions())
def vllm_converted(request) -> tuple[str, dict]:
    src = require_vllm(request.param)
    fi = require_flashinfer()
    probed = [c for c, _ in NATIVE] + [c for c, _ in RAISES]
    cases = [{**vllm_case(c), "seed": SEED, "flashinfer": str(fi),
              "w13_rows": "interleaved" if c.model.family == "gpt_oss" else "gate_up"} for c in probed]
    found = run_probe("sm100", PROBE, cases, src=src)
    return request.param, {c.id: r for c, r in zip(probed, found)}


@pytest.mark.parametrize("case,refused", RAISES, ids=[c.id for c, _ in RAISES])
def test_refused_where_vllm_conversion_raises(case, refused, vllm_converted):
    """Quark on sm100 where vLLM 0.33's own conversion raises: plan refuses (what it names must
    happen), for each release as that release's oracle decides."""
    version, results = vllm_converted
    release = ".".join(version.split(".")[:2])
    if release not in RELEASES:
        pytest.skip(f"the oracle on this tree does not model vLLM {release}")
    got = results[case.id]
    assert "traceback" not in got, got
    try:
        d = decide(case.model, replace(case.target, vllm=release))
    except OracleError as e:
        assert "raised" in got and got["raised"] in str(e), (version, got, str(e))
    else:  # this release's oracle serves it (vLLM 0.34 has a CUTLASS W4A4 branch): vLLM must not raise
        assert "raised" not in got and got["backend"] == d.options["vllm_backend"], (version, got)


@pytest.mark.parametrize("case,d", NATIVE, ids=[c.id for c, _ in NATIVE])
def test_trtllm_bytes_equal_vllm_conversion(case, d, vllm_converted):
    version, results = vllm_converted
    got = results[case.id]
    assert "traceback" not in got and "raised" not in got, (version, got)
    assert got["backend"] == d.backend, (version, got["backend"])
    assert set(got["flashinfer"]) == {"get_w2_permute_indices_with_cache", "nvfp4_block_scale_interleave",
                                      "flashinfer-python"}, got["flashinfer"]
    x = T.canonical(SEED)
    for name, layout_name in d.layout.as_dict().items():
        if name not in x:
            continue
        have = got["tensors"][name]
        want = get_layout(layout_name).forward(x[name])
        assert have["kind"] == "torch" and have["shape"] == list(want.shape), (version, name, have["shape"])
        assert torch.equal(T.decode(have["bytes"]), want.reshape(-1)), \
            f"vLLM {version} {case.id}: {name} differs from mxfp4conv's {layout_name}"
        assert have["dtype"] == str(VLLM_DTYPE[name]).replace("torch.", ""), (version, name, have)
        # and back: verify / the plugin's canary read the canonical bytes from the stored ones
        assert torch.equal(get_layout(layout_name).inverse(want, tuple(x[name].shape)), x[name])
