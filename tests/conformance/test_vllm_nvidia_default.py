"""NVIDIA targets other than sm90 keep vLLM's own backend by default: checked against vLLM's code.

For every family on an emulated sm100 and sm120 (tp 1, 2 and 8 with EP), for each release the
suite runs against that the oracle models, vLLM's own MoE method is built (``probe_moe``) and:

- where vLLM raises, ``plan`` refuses (``--layout`` would be the explicit request for mxfp4conv's
  own format);
- otherwise the decision writes vLLM's pick (``backend`` == vLLM's backend), its padding is vLLM's
  ``maybe_roundup_sizes`` result, the plugin runs vLLM's kernel (``serving_kernel`` ``vllm``), and
  the layout is the canonical one unless it is one of vLLM's converted layouts mxfp4conv writes
  (TRTLLM-Gen for Kimi-K3, DeepSeek-V4 and gpt-oss on sm100, proven in ``test_vllm_trtllm``);
- ``--layout identity`` writes mxfp4conv's own format and says that its kernel replaces vLLM's.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from conformance.matrix import MODELS, Case, vllm_case
from mxfp4conv.errors import OracleError
from mxfp4conv.oracle import Target, decide
from mxfp4conv.oracle.formats import TRTLLM_LAYOUT
from mxfp4conv.oracle.releases import RELEASES
from vllm_code.harness import require_vllm, run_probe, versions

PROBE = "tests/vllm_code/probe_moe.py:probe"
ARCHS = ("sm100", "sm120")
PARALLEL = ((1, False), (2, False), (8, True))
CASES = [Case(f"{name}-{arch}-tp{tp}{'-ep' if ep else ''}", name, Target(arch, tp=tp, ep=ep))
         for name in MODELS for arch in ARCHS for tp, ep in PARALLEL
         if not (not ep and (MODELS[name].geometry.intermediate // tp) % 32)]
IDENTITY = {"w13": "identity", "w13_scale": "identity", "w2": "identity", "w2_scale": "identity"}


@pytest.fixture(scope="module", params=versions())
def vllm_results(request) -> tuple[str, dict]:
    release = ".".join(request.param.split(".")[:2])
    if release not in RELEASES:
        pytest.skip(f"the oracle on this tree does not model vLLM {release}")
    src = require_vllm(request.param)
    out = {}
    for arch in ARCHS:
        group = [c for c in CASES if c.target.arch == arch]
        found = run_probe(arch, PROBE, [vllm_case(c) for c in group], src=src)
        out.update({c.id: r for c, r in zip(group, found)})
    return release, out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_default_keeps_vllm_backend(case, vllm_results):
    release, results = vllm_results
    got = results[case.id]
    assert "traceback" not in got, got
    target = replace(case.target, vllm=release)
    try:
        d = decide(case.model, target)
    except OracleError as e:
        assert "raised" in got or "raises" in str(e), (release, got, str(e))
        return
    assert "raised" not in got, (release, got)
    o = d.options
    assert d.backend == o["vllm_backend"] == got["backend"], (release, d.backend, got["backend"])
    assert (d.hidden_padded, d.intermediate_per_rank_padded) == (got["hidden_padded"], got["intermediate_padded"])
    assert o["serving_kernel"] == "vllm"
    layout = {k: v for k, v in d.layout.as_dict().items() if k in IDENTITY}
    if case.target.arch == "sm100" and case.model.moe_method in ("mxfp4", "gpt_oss_mxfp4"):
        assert d.layout == TRTLLM_LAYOUT
    else:
        assert layout == IDENTITY, layout
    own = decide(case.model, replace(target, layout="identity"))
    assert own.backend == "EMULATION" and own.options["vllm_backend"] == got["backend"]
    if own.options["kernel_act"] == "bf16":  # mxfp4conv's W4A16 kernel replaces vLLM's: said so
        assert own.options["serving_kernel"] == "mxfp4conv"
        assert any("replaces vLLM's pick" in n and f"not measured on {case.target.arch}" in n for n in own.notes)
