"""Plugin load == vLLM's own load, byte for byte, on vLLM 0.33.0's code (gfx950, AITER, tp 2).

Per family, per rank, ``tests/vllm_plugin_probe.py`` runs in the vLLM 0.33.0 harness
(``tests/vllm_code``: the wheel's Python code on an emulated ROCm gfx950, ``aiter``'s shuffles
answered by mxfp4conv's pure-torch ones) and builds the layer twice: from the source checkpoint
through vLLM's weight loader and conversion, and from the converted checkpoint through the plugin.
Every parameter (dtype, shape, bytes, ``is_shuffled``), the experts class vLLM's kernel is built
with and the environment afterwards must be equal. AITER's kernels themselves never run here.

Equality is expected of checkpoints converted for vLLM 0.33 (the manifest's ``vllm`` release).
Quark ``w_mxfp4`` on AITER_MXFP4_BF16 is the one designed difference: vLLM's converter
de-interleaves its ``[gate; up]`` w13 rows as if they were gpt-oss's interleaved ones, and
mxfp4conv writes the correct rows (`mxfp4conv plan` says so); there only w2 must be equal.
Quark ``w_mxfp4_a_fp8``: per expert vLLM keeps whichever of the gate / up static input scales it
loads last (``_load_single_value``), then the max over experts; the format keeps the max of all, so
the fp8 quantisation of the shared input clips for neither projection. Real exports calibrate
gate and up on the same input, so their scales are equal and so is everything (the
``shared_input_scales`` case); with scales that differ, mxfp4conv's is the larger one.
Kimi-K3's layer is built as its AMD model builds it: below ``min_moe_intermediate_per_partition``
per rank the model hands FusedMoE ``min * tp`` and zeroes the padded weights.
"""

from __future__ import annotations

import json

import pytest

from checkpoint_fixtures import CASES, synth  # noqa: F401 (fixture)
from mxfp4conv.convert import convert
from mxfp4conv.integrations.vllm.checks import manifest_release
from mxfp4conv.oracle import Target
from mxfp4conv.runtime.loader import read_manifest

harness = pytest.importorskip("tests.vllm_code.harness", reason="needs the vLLM 0.33.0 harness (tests/vllm_code)")

METHOD = {"mxfp4": "mxfp4", "gpt_oss_mxfp4": "gpt_oss", "quark": "quark"}
QUARK_INPUT = {"w_mxfp4": None, "w_mxfp4_a_mxfp4": "mxfp4", "w_mxfp4_a_fp8": "fp8"}
TP = 2
PLUGIN_CASES = [(f, s, {}) for f, s in CASES] + [("quark", "w_mxfp4_a_fp8", {"shared_input_scales": True})]
IDS = [f"{f}-{s}" + "".join(f"-{k}" for k in kw) for f, s, kw in PLUGIN_CASES]


def probe_cases(src, out) -> list[dict]:
    m = read_manifest(out)
    t, moe = m["target"], m["moe"]
    p = t["activation_params"]
    server_env = {"VLLM_ROCM_USE_AITER": "1"}  # what a ROCm server of the source sets to use AITER
    server_env.update({k: v for k, v in m["runtime_env"].items() if k == "VLLM_ROCM_USE_AITER_MOE_SITUV2"})
    return [{
        "method": METHOD[moe["moe_method"]], "source": str(src), "converted": str(out),
        "prefix": moe["layers"][0], "tp": TP, "rank": rank,
        "geometry": {k: moe[k] for k in ("hidden", "intermediate", "num_experts", "top_k")},
        "activation": t["activation"], "routing": moe["routing"], "has_bias": moe["has_bias"],
        "situ_beta": p.get("beta"), "situ_linear_beta": p.get("linear_beta"),
        "swiglu_limit": p.get("swiglu_limit", p.get("limit")),
        "quark_input": QUARK_INPUT.get(m["source"]["quant_scheme"]) if moe["moe_method"] == "quark" else None,
        "model_type": "gpt_oss" if moe["moe_method"] == "gpt_oss_mxfp4" else None,
        "server_env": server_env,
        "k3_min_per_partition": _k3_min_per_partition(src) if m["source"]["family"] == "kimi_k3" else None,
    } for rank in range(TP)]


def _k3_min_per_partition(src) -> int:
    """What vLLM's Kimi-K3 model reads: ``getattr(config, "min_moe_intermediate_per_partition", 256)``
    on the text config."""
    config = json.loads((src / "config.json").read_text())
    return config.get("text_config", config).get("min_moe_intermediate_per_partition", 256)


@pytest.fixture(scope="module")
def results(synth, tmp_path_factory):  # noqa: F811
    src_dir = harness.require_vllm()
    cases, names = [], []
    for (family, scheme, kw), name in zip(PLUGIN_CASES, IDS):
        src = synth(family, scheme, **kw)
        out = tmp_path_factory.mktemp("converted") / name
        convert(src, out, Target("gfx950", tp=TP), force=True, progress="off")
        for case in probe_cases(src, out):
            cases.append(case)
            names.append((name, case["rank"]))
    if manifest_release(read_manifest(out)) != "0.33":
        pytest.skip("the oracle on this tree does not record vLLM 0.33 in the manifest")
    got = harness.run_probe("gfx950", "tests/vllm_plugin_probe.py:probe", cases, src=src_dir, timeout=900)
    return dict(zip(names, got))


@pytest.mark.parametrize("family,scheme,kw", PLUGIN_CASES, ids=IDS)
def test_plugin_load_equals_vllm_load(results, family, scheme, kw):
    for rank in range(TP):
        r = results[(IDS[PLUGIN_CASES.index((family, scheme, kw))], rank)]
        assert "raised" not in r, r
        normal, plugin = r["normal"], r["plugin"]
        assert normal["loaded"], "the source's experts did not reach vLLM's parameters"
        if (family, scheme) == ("quark", "w_mxfp4") and normal["backend"] == "AITER_MXFP4_BF16":
            w2 = {k: v for k, v in normal["params"].items() if k.startswith("w2_")}
            assert {k: plugin["params"][k] for k in w2} == w2
            assert plugin["params"]["w13_weight"] != normal["params"]["w13_weight"]
            continue
        if (family, scheme) == ("quark", "w_mxfp4_a_fp8") and not kw:
            rest = {k: v for k, v in normal["params"].items() if k != "w13_input_scale"}
            assert {k: plugin["params"][k] for k in rest} == rest and "w2_input_scale" in rest
            (ours,), (vllms,) = plugin["params"]["w13_input_scale"][-1], normal["params"]["w13_input_scale"][-1]
            assert ours > vllms, "the synthetic gate / up scales differ: the max is the larger"
            continue
        assert plugin["params"] == normal["params"], (rank, plugin["mode"])
        env = dict(normal["env"])
        if not normal["backend"].startswith("AITER"):  # set by hand on the source's server, unused there
            env.pop("VLLM_ROCM_USE_AITER", None)
        assert (plugin["backend"], plugin["experts"], plugin["env"]) == (normal["backend"], normal["experts"], env)
        if normal["backend"].startswith("AITER"):
            assert plugin["mode"] == "kernel_ready" and normal["params"]["w13_weight"][3] is True
