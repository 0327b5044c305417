"""Plugin load == vLLM's own load, byte for byte, on vLLM's own code (gfx950, AITER, tp 2), for
each release the suite runs against and for checkpoints written for each modelled release.

Per family, per rank, ``tests/vllm_plugin_probe.py`` runs in the vLLM harness (``tests/vllm_code``:
the wheel's Python code on an emulated ROCm gfx950, ``aiter``'s shuffles answered by mxfp4conv's
pure-torch ones) and builds the layer three times: from the source checkpoint through vLLM's
weight loader and conversion ("normal"), and twice from the converted checkpoint through the
plugin, as two layers of one load: the engine's canary (vLLM converts the canonical bytes; the
result must equal the stored bytes) and a layer on the fast path (the stored bytes skip vLLM's
conversion and are checked equal afterwards). Every parameter (dtype, shape, bytes,
``is_shuffled``), the experts class vLLM's kernel is built with and the environment afterwards
must equal the normal load's, whatever the verdict. AITER's kernels themselves never run here.

The verdict says whether the start-up saving is kept: ``ready`` (the canary agreed, the fast path
served the stored bytes) or ``convert`` (the engine disagreed with the bytes; vLLM converted the
canonical bytes of every layer itself). ``convert`` is expected exactly where the checkpoint's
release and the engine's differ in that family's conversion: Quark ``w_mxfp4`` written for 0.33
(mxfp4conv writes the [gate; up] rows the kernel needs, vLLM 0.33's converter de-interleaves them
as if they were gpt-oss's) loaded on vLLM 0.33.
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
from pathlib import Path

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


def modelled(release: str) -> bool:
    from mxfp4conv.errors import OracleError
    from mxfp4conv.oracle.releases import resolve_release

    try:
        return resolve_release(release) == release
    except OracleError:
        return False


def newest_modelled() -> str:
    from mxfp4conv.oracle.releases import RELEASES

    return max(RELEASES, key=lambda r: tuple(int(x) for x in r.split(".")))


def engine_release(version: str) -> str:
    """'0.34.0' or a wheel path 'vllm-0.35.0-...whl' -> '0.34' / '0.35'."""
    name = harness.wheel_version(Path(version)) if version.endswith(".whl") else version
    return ".".join(name.split(".")[:2])


def load_pairs() -> list[tuple[str, str]]:
    """(checkpoint written for, engine) pairs: each engine of the run with its own release's
    checkpoint (the newest modelled one for a release not modelled yet), and a 0.33 checkpoint on
    0.34 (the canary judges bytes written for another release)."""
    pairs = []
    for v in harness.versions():
        release = engine_release(v)
        pairs.append((release if modelled(release) else newest_modelled(), v))
    if "0.34.0" in harness.versions():
        pairs.append(("0.33", "0.34.0"))
    return pairs


LOADS = load_pairs()
# (family, scheme, written for, engine) -> "convert" where the verdict is not "ready"; engines not
# listed in harness.VERSIONS have no expected verdict (the bytes served must still equal vLLM's)
CONVERT = {("quark", "w_mxfp4", "0.33", "0.33.0")}


@pytest.fixture(scope="module")
def converted(synth, tmp_path_factory):  # noqa: F811
    """{(case id, release): (source, converted)} for every release the oracle models."""
    out = {}
    for release in sorted({r for r, _ in LOADS}):
        if not modelled(release):
            continue
        for (family, scheme, kw), name in zip(PLUGIN_CASES, IDS):
            src = synth(family, scheme, **kw)
            dst = tmp_path_factory.mktemp("converted") / f"{name}-{release}"
            convert(src, dst, Target("gfx950", tp=TP, vllm=release), force=True, progress="off")
            assert manifest_release(read_manifest(dst)) == release
            out[(name, release)] = (src, dst)
    return out


def run_loads(converted, written: str, version: str, extra: dict | None = None, ids=None) -> dict:
    if (IDS[0], written) not in converted:
        pytest.skip(f"the oracle on this tree does not model vLLM {written}")
    src_dir = harness.require_vllm(version)
    cases, names = [], []
    for name in ids or IDS:
        src, out = converted[(name, written)]
        for case in probe_cases(src, out):
            cases.append({**case, **(extra or {})})
            names.append((name, case["rank"]))
    got = harness.run_probe("gfx950", "tests/vllm_plugin_probe.py:probe", cases, src=src_dir, timeout=1200)
    return dict(zip(names, got))


_RESULTS: dict = {}


@pytest.fixture(params=LOADS, ids=[f"written-{w}-on-{v}" for w, v in LOADS])
def load(request, converted):
    written, version = request.param
    if request.param not in _RESULTS:
        _RESULTS[request.param] = run_loads(converted, written, version)
    return written, version, _RESULTS[request.param]


@pytest.mark.parametrize("family,scheme,kw", PLUGIN_CASES, ids=IDS)
def test_plugin_load_equals_vllm_load(load, family, scheme, kw):
    written, version, results = load
    name = IDS[PLUGIN_CASES.index((family, scheme, kw))]
    for rank in range(TP):
        r = results[(name, rank)]
        assert "raised" not in r, r
        normal = r["normal"]
        assert normal["loaded"], "the source's experts did not reach vLLM's parameters"
        if r["plugin"]["mode"] == "kernel_ready":
            ((outcome, reason),) = r["verdicts"]
            expect = "convert" if (family, scheme, written, version) in CONVERT else "ready"
            assert outcome == expect or version not in harness.VERSIONS, reason
        else:  # identity bytes that vLLM converts itself: nothing to judge
            assert r["verdicts"] == [] and r["checked"] == 0
        for role in ("canary", "plugin"):
            got = r[role]
            assert "raised" not in got, got
            if (family, scheme) == ("quark", "w_mxfp4_a_fp8") and not kw:
                rest = {k: v for k, v in normal["params"].items() if k != "w13_input_scale"}
                assert {k: got["params"][k] for k in rest} == rest and "w2_input_scale" in rest
                # one scale (0.33: the max over experts) or one per expert (0.34)
                ours, vllms = got["params"]["w13_input_scale"][-1], normal["params"]["w13_input_scale"][-1]
                assert len(ours) == len(vllms) and all(o >= v for o, v in zip(ours, vllms))
                assert any(o > v for o, v in zip(ours, vllms)), "the synthetic gate / up scales differ: the max is the larger"
            else:
                assert got["params"] == normal["params"], (rank, role, got["mode"])
            env = dict(normal["env"])
            if not normal["backend"].startswith("AITER"):  # set by hand on the source's server, unused there
                env.pop("VLLM_ROCM_USE_AITER", None)
            assert (got["backend"], got["experts"], got["env"]) == (normal["backend"], normal["experts"], env)
        for role in ("canary", "plugin"):  # kernel-ready bytes are read when vLLM processes the layer
            assert r[role]["read_before_process"] == (0 if r[role]["mode"] == "kernel_ready" else 1)
        if normal["backend"].startswith("AITER"):
            assert r["plugin"]["mode"] == "kernel_ready" and normal["params"]["w13_weight"][3] is True
            assert r["checked"] == (1 if outcome == "ready" else 0)
            assert r["canary"]["mode"] == "kernel_ready"


def test_double_conversion_is_caught_not_served(converted):
    """A release that shuffles the experts again after its converter: the canary layer (converted
    by vLLM itself) is right, the fast-path layer is refused, never served."""
    results = run_loads(converted, "0.33", "0.33.0", {"convert_twice": True}, ids=["kimi_k3-None", "deepseek_v4-None"])
    for (name, rank), r in results.items():
        assert r["verdicts"] == [["ready", "equal"]], (name, rank)
        assert r["canary"]["params"] == r["normal"]["params"]
        refused = r["plugin"]
        assert refused.get("raised") == "RuntimeInputError", refused
        assert "w13_weight no longer holds the converted checkpoint's bytes" in refused["message"]
        assert "Nothing was served" in refused["message"]


def test_canary_mismatch_refused_in_strict_mode(converted):
    """Strict mode: the engine's disagreement (Quark w_mxfp4 written for 0.33, on vLLM 0.33) is a
    refusal naming the tensor, the first differing byte and both releases."""
    results = run_loads(converted, "0.33", "0.33.0", {"strict": True}, ids=["quark-w_mxfp4"])
    for r in results.values():
        refused = r["canary"]
        assert refused.get("raised") == "RuntimeInputError", refused
        msg = refused["message"]
        assert "w13_weight first differs at byte offset" in msg and "vLLM 0.33" in msg and "Strict mode" in msg
