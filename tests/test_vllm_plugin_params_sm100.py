"""Plugin load == vLLM's own load on an emulated sm100 (B200), byte for byte, on vLLM's own code,
for each release the suite runs against.

As ``test_vllm_plugin_params`` does for gfx950: ``tests/vllm_plugin_probe.py`` builds each family's
layer from the source checkpoint through vLLM's loader and conversion, and twice from the
converted checkpoint through the plugin (the engine's canary, then a fast-path layer), tp 2, every
rank, for each release's own checkpoint and a 0.33 checkpoint on vLLM 0.34.0; every parameter (dtype, shape, bytes, ``is_shuffled``), the experts class and the
environment must be equal. vLLM's FlashInfer TRTLLM conversion runs FlashInfer's own Python
functions on CPU (``tests/vllm_code/flashinfer_cpu.py`` names the one compiled step answered by
FlashInfer's pure-torch equivalent). FlashInfer's kernels never run here.

Kimi-K3 and DeepSeek-V4 are written in TRTLLM-Gen's layout (``kernel_ready``: the canary must
agree and the fast path serve the stored bytes, through vLLM's own ``weights_already_processed``
path), and so is gpt-oss (its converter answering with the stored bytes, its biases put in the
same row order at load); Quark ``w_mxfp4_a_fp8`` is vLLM's own EMULATION (``vllm_transforms``).
"""

from __future__ import annotations

import pytest

from checkpoint_fixtures import synth  # noqa: F401 (fixture)
from mxfp4conv.convert import convert
from mxfp4conv.oracle import Target
from mxfp4conv.runtime.loader import read_manifest

harness = pytest.importorskip("tests.vllm_code.harness", reason="needs the vLLM harness (tests/vllm_code)")
from test_vllm_plugin_params import TP, load_pairs, modelled, probe_cases  # noqa: E402

# Quark w_mxfp4 and w_mxfp4_a_mxfp4 are not here: vLLM's own conversion raises on sm100 (plan refuses)
FAMILIES = [("kimi_k3", None), ("deepseek_v4", None), ("gpt_oss", None),
            ("quark", "w_mxfp4_a_fp8", {"shared_input_scales": True})]
IDS = ["-".join(str(x) for x in f[:2]) for f in FAMILIES]
NATIVE = {"kimi_k3": "FLASHINFER_TRTLLM_MXFP4_MXFP8", "deepseek_v4": "FLASHINFER_TRTLLM_MXFP4_MXFP8",
          "gpt_oss": "FLASHINFER_TRTLLM_MXFP4_BF16"}  # written in TRTLLM-Gen's layout
PRE_PROCESSED = {"kimi_k3", "deepseek_v4"}  # Mxfp4MoEMethod: vLLM's weights_already_processed path


LOADS = list(dict.fromkeys(load_pairs()))  # (written for, engine): each release's own, 0.33's on 0.34.0


@pytest.fixture(scope="module", params=LOADS, ids=[f"written-{w}-on-{v}" for w, v in LOADS])
def loads(request, synth, tmp_path_factory):  # noqa: F811
    release, version = request.param
    if not modelled(release):
        pytest.skip(f"the oracle on this tree does not model vLLM {release}")
    src_dir = harness.require_vllm(version)
    fi = harness.require_flashinfer()
    cases, names = [], []
    for (family, scheme, *kw), name in zip(FAMILIES, IDS):
        src = synth(family, scheme, **(kw[0] if kw else {}))
        dst = tmp_path_factory.mktemp("sm100") / f"{name}-{release}"
        convert(src, dst, Target("sm100", tp=TP, vllm=release), force=True, progress="off")
        assert read_manifest(dst)["target"]["options"]["serving_kernel"] == "vllm"
        for case in probe_cases(src, dst):
            cases.append({**case, "server_env": {}, "flashinfer": str(fi)})
            names.append((name, case["rank"]))
    # amd-quark installed, as mxfp4conv's modelled server has it wherever a Quark checkpoint is served
    got = harness.run_probe("sm100", "tests/vllm_plugin_probe.py:probe", cases, src=src_dir, timeout=1200,
                            packages={"quark": True})
    return version, dict(zip(names, got))


@pytest.mark.parametrize("name", IDS)
def test_plugin_load_equals_vllm_load_on_sm100(loads, name):
    version, results = loads
    family = name.split("-")[0]
    for rank in range(TP):
        r = results[(name, rank)]
        assert "raised" not in r, r
        normal = r["normal"]
        assert normal["loaded"], "the source's experts did not reach vLLM's parameters"
        if family in NATIVE:
            assert normal["backend"] == NATIVE[family], normal["backend"]
            assert r["plugin"]["mode"] == r["canary"]["mode"] == "kernel_ready"
            assert r["verdicts"] == [["ready", "equal"]] and r["checked"] == 1, (version, r["verdicts"])
            # the fast-path layer went through vLLM's own weights_already_processed path where it exists
            assert r["pre_processed"] == (1 if family in PRE_PROCESSED else 0)
            # what vLLM keeps: uint8 weights, scales as float8_e4m3fn, no is_shuffled mark
            assert normal["params"]["w13_weight"][0] == "torch.uint8"
            assert normal["params"]["w13_weight_scale"][0] == "torch.float8_e4m3fn"
        else:
            assert r["plugin"]["mode"] == "vllm_transforms", r["plugin"]["mode"]
            assert r["verdicts"] == [] and r["checked"] == 0
        for role in ("canary", "plugin"):
            got = r[role]
            assert "raised" not in got, got
            assert got["params"] == normal["params"], (version, rank, role, got["mode"])
            env = {k: v for k, v in normal["env"].items() if k != "VLLM_ROCM_USE_AITER"}
            assert (got["backend"], got["experts"], got["env"]) == (normal["backend"], normal["experts"], env)
