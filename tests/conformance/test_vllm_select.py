"""Conformance: mxfp4conv's statement of vLLM 0.33.0's MoE decision against vLLM 0.33.0 itself.

For every case of ``matrix.cases()`` the real ``Mxfp4MoEMethod`` / ``GptOssMxfp4MoEMethod`` /
``QuarkOCP_MX_MoEMethod`` of the ``vllm==0.33.0`` wheel is built on an emulated platform
(``vllm_code.harness``; the stubs it installs are listed in ``vllm_code/stubs.py`` and
``vllm_code/worker.py`` and printed by ``test_stubs_listed``) and its backend pick and expert
class (or the error it raises), ``maybe_roundup_sizes`` and the environment it writes are
compared with ``decide()``. The weight converters are compared in ``test_vllm_convert``.
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from conformance.matrix import BACKEND_REQUEST, cases, vllm_case
from mxfp4conv.errors import OracleError
from mxfp4conv.oracle import decide
from vllm_code.harness import require_vllm, run_probe

PROBE = "tests/vllm_code/probe_moe.py:probe"
CASES = cases()


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    src = require_vllm()
    groups = defaultdict(list)
    for c in CASES:
        groups[c.platform].append(c)

    def run(platform):
        found = run_probe(platform, PROBE, [vllm_case(c) for c in groups[platform]], src=src)
        return platform, found.stubs, {c.id: r for c, r in zip(groups[platform], found)}

    out: dict[str, dict] = {}
    with ThreadPoolExecutor(2) as pool:
        for platform, used, part in pool.map(run, list(groups)):
            STUBS_USED[platform] = used
            out.update(part)
    return out


STUBS_USED: dict[str, dict[str, str]] = {}


def test_stubs_listed(vllm_results):
    """Every stand-in the runs used is named with its reason (printed with -s)."""
    for platform, used in sorted(STUBS_USED.items()):
        assert used and all(isinstance(v, str) and v for v in used.values()), platform
        print(f"{platform}: " + "; ".join(f"{k} ({v})" for k, v in sorted(used.items())))
    assert "aiter" in STUBS_USED["gfx950"] and "amdsmi" in STUBS_USED["gfx950"]
    assert "aiter" not in STUBS_USED["sm90"] and "flashinfer" in STUBS_USED["sm90"]


def test_matrix_size():
    assert len(CASES) >= 300
    assert len({c.id for c in CASES}) == len(CASES)


def _decide(case):
    """(decision or None, refusal text or None)."""
    try:
        return decide(case.model, case.target), None
    except OracleError as e:
        return None, str(e)


def _mode(value):
    return {"auto": "a4w4", "1": "a4w4", "0": "a16w4"}.get(value, value)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_matches_vllm(case, vllm_results):
    got = vllm_results[case.id]
    assert "traceback" not in got, got  # the probe itself failed: a harness bug
    d, refused = _decide(case)
    if case.target.moe_weight:
        # vLLM composes no online MoE method for int4_per_group_32: the checkpoint's method
        # (the one probed) serves the layer, as the oracle models
        assert got["online_moe_method"] is None, (case.id, got)
    if "raised" in got:  # vLLM raises: mxfp4conv must say so and refuse
        assert refused is not None and got["raised"] in refused, (case.id, got, refused)
        return
    if refused is not None:  # vLLM serves it: the only refusals allowed are vLLM's converter
        # raising later, an activation request vLLM's method does not honour, vLLM's int4
        # requantisation without --layout, and --layout where vLLM's pick is what is written
        if "--moe-weight" in refused:
            assert got.get("int4") and case.target.layout == "auto", (case.id, got, refused)
        elif "whose layout is fixed" in refused:
            auto, _ = _decide(replace(case, target=replace(case.target, layout="auto")))
            assert auto is not None and auto.backend == got["backend"], (case.id, got, refused)
        else:
            assert "raises" in refused or "act-quant" in refused, (case.id, got, refused)
        return
    o = d.options
    if case.target.moe_weight:  # vLLM's gfx942 int4 path taken or not, and its kernel-build check
        assert o["vllm_int4_requant"] == got["int4"], (case.id, got)
        if got["int4"]:
            assert (got["int4_weight_key"], got["int4_act_key"]) == (case.target.moe_weight, None), got
            assert got["int4_kernel_config"] == "ok", (case.id, got)
            assert d.backend == "EMULATION" and case.target.layout != "auto", case.id
    assert o["vllm_backend"] == got["backend"], (case.id, got)
    assert o["vllm_expert_class"] == got["experts_cls"], (case.id, got)
    assert (o["vllm_hidden_padded"], o["vllm_intermediate_padded"]) == (
        got["hidden_padded"], got["intermediate_padded"]), (case.id, got)
    if d.backend == got["backend"]:  # what is written is vLLM's pick: same padding
        assert (d.hidden_padded, d.intermediate_per_rank_padded) == (
            got["hidden_padded"], got["intermediate_padded"]), case.id
    # environment vLLM writes while building the method must be in the manifest's (or, where
    # mxfp4conv writes its own format for vLLM's int4 path, in the environment plan states for
    # vLLM's pick)
    env = d.runtime_env if o["vllm_runtime_env"] is None else o["vllm_runtime_env"]
    for k, v in got["env_set"].items():
        if k.startswith("AITER_SITUV2_"):  # derived by vLLM itself from the SiTUv2 switch
            continue
        assert env.get(k) == v, (case.id, k, v, env)
    if o["vllm_runtime_env"] is not None:  # nothing more than vLLM writes or is given
        extra = {k for k in env if k not in got["env_set"]} - {"VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MOE_SITUV2"}
        assert not extra, (case.id, extra, got["env_set"])
        assert env.get("VLLM_ROCM_USE_AITER") == "1"
        assert _mode(env["VLLM_ROCM_USE_AITER_MOE_SITUV2"]) == _mode(case.situv2 or "auto")
    if "AITER_BF16_FP8_MOE_BOUND" in d.runtime_env and "AITER_BF16_FP8_MOE_BOUND" not in got["env_set"]:
        # set later by converter S's interleaved AITER branch (DeepSeek-V4-style SiLU layers)
        assert got["backend"] == "AITER_MXFP4_BF16" and case.model.activation.name != "situ", case.id
    if "VLLM_ROCM_USE_AITER_MOE_SITUV2" in d.runtime_env:
        assert _mode(d.runtime_env["VLLM_ROCM_USE_AITER_MOE_SITUV2"]) == _mode(case.situv2 or "auto")
    assert "VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4" not in d.runtime_env  # not read by 0.33.0
    if got["backend"] == "B12X_MXFP4_BF16":  # what the server needed, besides --moe-backend, to reach it
        for k, v in BACKEND_REQUEST.get(case.target.backend, (None, {}))[1].items():
            assert d.runtime_env.get(k) == v, (case.id, d.runtime_env)
