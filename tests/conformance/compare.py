"""mxfp4conv's statements against what a vLLM release's own code did, as rows of disagreement.

``selection_rows(case, got)`` compares ``decide()`` for one matrix case (its ``Target.vllm``
names the modelled release) with ``probe_moe``'s answer from the release's wheel: the backend
and experts class vLLM picks (or the error it raises), ``maybe_roundup_sizes``, the environment
vLLM writes while building the method. Each row is ``(field, mxfp4conv's statement, vLLM's)``;
no row means mxfp4conv states what vLLM does. The tests assert there is none; ``report`` prints
them for any wheel.
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from conformance.matrix import BACKEND_REQUEST, vllm_case
from mxfp4conv.errors import OracleError
from mxfp4conv.oracle import decide
from mxfp4conv.oracle.releases import get_release
from vllm_code.harness import run_probe

Row = tuple[str, object, object]
PROBE = "tests/vllm_code/probe_moe.py:probe"


def probe_all(src, cases_, stubs_used=None) -> dict[str, dict]:
    """probe_moe's answer for every case, one worker per platform, two at a time."""
    groups = defaultdict(list)
    for c in cases_:
        groups[c.platform].append(c)

    def run(platform):
        found = run_probe(platform, PROBE, [vllm_case(c) for c in groups[platform]], src=src)
        return platform, found.stubs, {c.id: r for c, r in zip(groups[platform], found)}

    out: dict[str, dict] = {}
    with ThreadPoolExecutor(2) as pool:
        for platform, used, part in pool.map(run, list(groups)):
            if stubs_used is not None:
                stubs_used[platform] = used
            out.update(part)
    return out


def decide_or_refusal(case):
    """(decision or None, refusal text or None)."""
    try:
        return decide(case.model, case.target), None
    except OracleError as e:
        return None, str(e)


def _mode(value):
    return {"auto": "a4w4", "1": "a4w4", "0": "a16w4"}.get(value, value)


def _short(text: str | None, n: int = 160) -> str | None:
    return None if text is None else (text if len(text) <= n else text[: n - 3] + "...")


def selection_rows(case, got: dict) -> list[Row]:
    rows: list[Row] = []
    if "traceback" in got:  # the probe itself failed: a harness bug, not a statement
        return [("probe", "-", f"{got.get('raised')}: {got.get('message')}")]
    release = get_release(case.target.vllm)
    d, refused = decide_or_refusal(case)
    if case.target.moe_weight and got.get("online_moe_method") is not None:
        # vLLM composes no online MoE method for int4_per_group_32 in the releases modelled:
        # the checkpoint's method (the one probed) serves the layer
        rows.append(("online MoE method", None, got["online_moe_method"]))
    if "raised" in got:  # vLLM raises: mxfp4conv must say so and refuse
        if refused is None or got["raised"] not in refused:
            rows.append(("outcome", _short(refused) or f"serves with {d.options['vllm_backend']}",
                         f"raises {got['raised']}: {_short(got['message'])}"))
        return rows
    if refused is not None:  # vLLM serves it: the only refusals allowed are vLLM's converter
        # raising later, an activation request vLLM's method does not honour, vLLM's int4
        # requantisation without --layout, and --layout where vLLM's pick is what is written
        if "--moe-weight" in refused:
            ok = got.get("int4") and case.target.layout == "auto"
        elif "whose layout is fixed" in refused:
            auto, _ = decide_or_refusal(replace(case, target=replace(case.target, layout="auto")))
            ok = auto is not None and auto.backend == got["backend"]
        else:
            ok = "raises" in refused or "act-quant" in refused
        if not ok:
            rows.append(("outcome", _short(refused), f"serves with {got['backend']} ({got['experts_cls']})"))
        return rows
    o = d.options
    if case.target.moe_weight:  # vLLM's gfx942 int4 path taken or not, and its kernel-build check
        if o["vllm_int4_requant"] != got["int4"]:
            rows.append(("int4 requantisation", o["vllm_int4_requant"], got["int4"]))
        if got["int4"]:
            keys = (got["int4_weight_key"], got["int4_act_key"])
            if keys != (case.target.moe_weight, None):
                rows.append(("int4 quant keys", (case.target.moe_weight, None), keys))
            if got["int4_kernel_config"] != "ok":
                rows.append(("int4 kernel config", "ok", got["int4_kernel_config"]))
            if not (d.backend == "EMULATION" and case.target.layout != "auto"):
                rows.append(("written for the int4 path", d.backend, "EMULATION with --layout"))
    for field, ours, theirs in (
            ("backend", o["vllm_backend"], got["backend"]),
            ("experts class", o["vllm_expert_class"], got["experts_cls"]),
            ("padded (H, I per rank)", (o["vllm_hidden_padded"], o["vllm_intermediate_padded"]),
             (got["hidden_padded"], got["intermediate_padded"]))):
        if ours != theirs:
            rows.append((field, ours, theirs))
    if d.backend == got["backend"] and (d.hidden_padded, d.intermediate_per_rank_padded) != (
            got["hidden_padded"], got["intermediate_padded"]):  # vLLM's pick written: same padding
        rows.append(("written padding", (d.hidden_padded, d.intermediate_per_rank_padded),
                     (got["hidden_padded"], got["intermediate_padded"])))
    # environment vLLM writes while building the method must be in the manifest's (or, where
    # mxfp4conv writes its own format for vLLM's int4 path, in the environment plan states for
    # vLLM's pick)
    env = d.runtime_env if o["vllm_runtime_env"] is None else o["vllm_runtime_env"]
    for k, v in got["env_set"].items():
        if k.startswith("AITER_SITUV2_"):  # derived by vLLM itself from the SiTUv2 switch
            continue
        if env.get(k) != v:
            rows.append((f"env {k}", env.get(k), v))
    if o["vllm_runtime_env"] is not None:  # nothing more than vLLM writes or is given
        extra = {k for k in env if k not in got["env_set"]} - {"VLLM_ROCM_USE_AITER",
                                                                 "VLLM_ROCM_USE_AITER_MOE_SITUV2"}
        for k in sorted(extra):
            rows.append((f"env {k}", env[k], None))
        if env.get("VLLM_ROCM_USE_AITER") != "1":
            rows.append(("env VLLM_ROCM_USE_AITER", env.get("VLLM_ROCM_USE_AITER"), "1"))
        if _mode(env.get("VLLM_ROCM_USE_AITER_MOE_SITUV2")) != _mode(case.situv2 or "auto"):
            rows.append(("SiTUv2 mode", env.get("VLLM_ROCM_USE_AITER_MOE_SITUV2"), case.situv2 or "auto"))
    if "AITER_BF16_FP8_MOE_BOUND" in d.runtime_env and "AITER_BF16_FP8_MOE_BOUND" not in got["env_set"]:
        # set later, by converter S's interleaved AITER branch (SiLU layers); checked by the
        # converter conformance, which runs it
        if not (got["backend"] == "AITER_MXFP4_BF16" and case.model.activation.name != "situ"):
            rows.append(("env AITER_BF16_FP8_MOE_BOUND", d.runtime_env["AITER_BF16_FP8_MOE_BOUND"], None))
    mode = d.runtime_env.get("VLLM_ROCM_USE_AITER_MOE_SITUV2")
    if mode is not None and _mode(mode) != _mode(case.situv2 or "auto"):
        rows.append(("SiTUv2 mode", mode, case.situv2 or "auto"))
    for k in sorted(set(d.runtime_env) & (set(release.removed_env) | {"VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4"})):
        rows.append((f"env {k}", d.runtime_env[k], f"not read by vLLM {release.version}"))
    if got["backend"] == "B12X_MXFP4_BF16":  # what the server needed, besides --moe-backend, to reach it
        for k, v in BACKEND_REQUEST.get(case.target.backend, (None, {}))[1].items():
            if d.runtime_env.get(k) != v:
                rows.append((f"env {k}", d.runtime_env.get(k), v))
    return rows
