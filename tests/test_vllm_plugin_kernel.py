"""CUDA targets in mxfp4conv's format: vLLM's modular MoE kernel around mxfp4conv's Triton experts.

On vLLM 0.33.0's code (the ``tests/vllm_code`` harness, an emulated sm90), the plugin loads a
converted gpt-oss layer (identity and hopper_mma layouts), builds the layer's kernel with
``Mxfp4convTritonExperts`` in place of vLLM's pick, and the layer's ``apply`` (vLLM's routing
prepare / finalize, then our kernel, in the Triton CPU interpreter with fp16 activations) is
compared with mxfp4conv's torch reference on the same experts. No GPU runs vLLM here.
"""

from __future__ import annotations

import pytest

from checkpoint_fixtures import synth  # noqa: F401 (fixture)
from mxfp4conv.convert import convert
from mxfp4conv.oracle import Target
from mxfp4conv.runtime.loader import read_manifest

harness = pytest.importorskip("tests.vllm_code.harness", reason="needs the vLLM 0.33.0 harness (tests/vllm_code)")


LAYOUTS = ("identity", "hopper_mma")


@pytest.fixture(scope="module")
def results(synth, tmp_path_factory):  # noqa: F811
    """Both layouts in one worker: {layout: (manifest, probe result)}."""
    src_dir = harness.require_vllm()
    src = synth("gpt_oss")
    manifests, cases = {}, []
    for layout in LAYOUTS:
        out = tmp_path_factory.mktemp("sm90") / f"gpt-oss-sm90-{layout}"
        convert(src, out, Target("sm90", tp=1, layout=layout), force=True, progress="off")
        m = manifests[layout] = read_manifest(out)
        moe, params = m["moe"], m["target"]["activation_params"]
        cases.append({"method": "gpt_oss", "source": str(src), "converted": str(out), "prefix": moe["layers"][0],
                      "tp": 1, "rank": 0, "geometry": {k: moe[k] for k in ("hidden", "intermediate", "num_experts", "top_k")},
                      "activation": "swigluoai", "routing": moe["routing"], "has_bias": True,
                      "swiglu_limit": params["limit"], "model_type": "gpt_oss"})
    got = harness.run_probe("sm90", "tests/vllm_plugin_probe.py:probe_kernel", cases, src=src_dir, timeout=900)
    return {layout: (manifests[layout], r) for layout, r in zip(LAYOUTS, got)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layer_runs_mxfp4conv_triton_experts_inside_vllm(results, layout):
    m, r = results[layout]
    assert m["target"]["backend"] == "EMULATION"
    assert "raised" not in r, r
    assert (r["mode"], r["experts"], r["w13_layout"]) == ("mxfp4conv_kernel", "Mxfp4convTritonExperts",
                                                        m["layout"]["w13"])
    assert r["picked"] == m["target"]["options"]["vllm_backend"]
    assert r["ref_norm"] > 0 and r["rel_err"] < 2e-3
