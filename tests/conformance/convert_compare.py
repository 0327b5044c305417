"""mxfp4conv's layout recipes against what a vLLM release's own weight converter leaves in
memory, as rows of disagreement (see ``test_vllm_convert`` for what runs and what stands in).

``converter_cases(release)`` picks one matrix case per distinct converter path where mxfp4conv
states vLLM's converted bytes (ROCm targets whose pick it writes), where it states that vLLM's
converter raises, and where it states that vLLM converts the canonical bytes itself (NVIDIA
targets whose converter is Python over FlashInfer / CUTLASS calls the harness can stand in for).
``converter_rows(case, d, refused, got)`` compares one with ``probe_convert``'s answer.
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import torch

from conformance.compare import Row, decide_or_refusal
from conformance.matrix import Case, cases, vllm_case
from mxfp4conv.oracle import Target, decide
from mxfp4conv.oracle.backends import Server
from mxfp4conv.oracle.formats import LITERAL_G_ROWS
from mxfp4conv.shuffle import aiter as A
from mxfp4conv.shuffle.layouts import get_layout
from vllm_code import tiny_layer as T
from vllm_code.harness import run_probe

PROBE = "tests/vllm_code/probe_convert.py:probe"
SEED = 20260  # the tiny layer's bytes
GFX1250_MOE_SCALE = {"arch": "gfx1250", "preshuffle_factor": 32, "scale_kwidth": 4}
RECIPE_TENSORS = ("w13", "w13_scale", "w2", "w2_scale")
# NVIDIA picks whose converter runs here (its FlashInfer / CUTLASS calls answered by stubs):
# the statement checked is only that vLLM converts without raising
NVIDIA_CONVERTED = ("FLASHINFER_CUTLASS_MXFP4_BF16", "FLASHINFER_CUTLASS_MXFP4_MXFP8", "CUTLASS_MXFP4_MXFP4")

# converter branches no default pick of the matrix reaches: asked for with --backend
FORCED = [
    Case("quark_w4a4-gfx1250-tp1-aiter-backend_aiter_triton_mxfp4_mxfp4", "quark_w4a4",
         Target("gfx1250", backend="aiter_triton_mxfp4_mxfp4")),
    Case("dsv4-gfx1250-tp1-aiter-backend_aiter_triton_mxfp4_mxfp4", "dsv4",
         Target("gfx1250", backend="aiter_triton_mxfp4_mxfp4")),
    Case("quark_w4a4-gfx950-tp1-aiter-backend_aiter_mxfp4_mxfp4", "quark_w4a4",
         Target("gfx950", backend="aiter_mxfp4_mxfp4")),
]


def _key(case, d):
    t = case.target
    mode = case.situv2 if case.situv2 is not None else "default"
    return (t.arch, case.model_name, d.backend if d else None, mode, t.tp <= 2, t.backend)


def converter_cases(release: str) -> list[tuple[Case, object, str | None]]:
    """One case per distinct converter path for ``release``: (case, decision or None, refusal)."""
    from dataclasses import replace

    picked: dict[tuple, tuple] = {}
    for c in cases() + FORCED:
        c = replace(c, target=replace(c.target, vllm=release))
        d, refused = decide_or_refusal(c)
        if d is not None:
            vllm_pick = d.backend == d.options["vllm_backend"]
            if c.target.arch.startswith("gfx"):
                if not vllm_pick:
                    continue  # mxfp4conv's own format (stated by plan), not vLLM's bytes
            elif not (vllm_pick and d.backend in NVIDIA_CONVERTED):
                continue
        elif "weight converter raises" not in refused:
            continue
        picked.setdefault(_key(c, d), (c, d, refused))
    return list(picked.values())


def probe_case(case) -> dict:
    return {**vllm_case(case), "seed": SEED,
            "w13_rows": "interleaved" if case.model.gate_up_interleaved else "gate_up"}


def _recipe_vllm_writes(case, d):
    """(decision, rows): the recipe whose bytes must equal vLLM's and the w13 row order it is
    applied to. mxfp4conv departs from vLLM's bytes in two documented places, checked here:

    - gpt-oss on EMULATION: vLLM keeps the checkpoint's interleaved w13 rows; mxfp4conv's own
      format stores them as [gate; up] (its plan says so).
    - Quark w_mxfp4 on AITER_MXFP4_BF16 through converter G (vLLM 0.33): G de-interleaves rows
      that are already [gate; up] (a suspected vLLM bug, noted in plan);
      ``Server(quark_literal_deinterleave=True)`` models vLLM literally, and that recipe is the
      one compared. (0.34 converts these models with converter S, which keeps the rows.)
    """
    def canonical(name, t):
        return t

    if d.backend == "EMULATION" and case.model.gate_up_interleaved:
        assert any("de-interleaved as [gate; up]" in n for n in d.notes), d.notes

        def interleaved(name, t):  # the rows vLLM keeps
            return T.interleave_rows(t) if name.startswith("w13") else t
        return d, interleaved
    if (case.model.moe_method == "quark" and not case.model.gate_up_interleaved
            and d.backend == "AITER_MXFP4_BF16" and d.options["converter"] == "G"):
        assert any("Suspected vLLM bug" in n for n in d.notes), d.notes
        literal = decide(case.model, case.target, Server(quark_literal_deinterleave=True))
        assert literal.layout.gate_up == LITERAL_G_ROWS, literal.layout

        def literal_rows(name, t):  # rows 0::2 then 1::2 of the [gate; up] rows
            return A.deinterleave_gate_up_rows(t) if name.startswith("w13") else t
        return literal, literal_rows
    assert d.layout.gate_up == "[gate; up]", d.layout
    return d, canonical


def _vllm_bytes(got: dict, name: str) -> torch.Tensor | None:
    t = got["tensors"][name]
    return T.decode(t["bytes"]) if "bytes" in t else None


def _gfx1250_scale_rows(name, layout_name, x, got) -> list[Row]:
    """aiter's gfx1250 shuffle_scale_moe is stood in for by an identity that records its
    input: that input must be mxfp4conv's pre-shuffle bytes, with the arguments vLLM passes."""
    pre = (A.interleave_gate_up_rows(x) if layout_name.endswith("_gu1") else x).contiguous()
    calls = [c for c in got["calls"] if c["fn"] == "shuffle_scale_moe"
             and T.decode(c["input"]).numel() == pre.numel()
             and torch.equal(T.decode(c["input"]), pre.flatten())]
    if not calls:
        return [(name, f"{layout_name} (shuffle_scale_moe input)", "no call received these bytes")]
    rows = []
    if calls[0]["kwargs"] != GFX1250_MOE_SCALE:
        rows.append((f"{name} shuffle_scale_moe arguments", GFX1250_MOE_SCALE, calls[0]["kwargs"]))
    have = _vllm_bytes(got, name)
    if have is None or not torch.equal(have, pre.flatten()):  # the stand-in returned its input
        rows.append((name, layout_name, "other bytes kept"))
    return rows


def converter_rows(case, d, refused, got: dict) -> list[Row]:
    if "traceback" in got:  # the probe itself failed: a harness bug
        return [("probe", "-", f"{got.get('raised')}: {got.get('message')}")]
    if d is None:  # mxfp4conv says vLLM's converter raises: it must
        if "raised" not in got or got["raised"] not in refused:
            return [("converter", f"raises ({refused.split('raises', 1)[-1].lstrip(': ')[:120].strip()})",
                     f"raises {got['raised']}: {got['message']}" if "raised" in got else "converts")]
        return []
    if "raised" in got:
        return [("converter", f"{d.backend} converts", f"raises {got['raised']}: {got['message']}")]
    if got["backend"] != d.backend:
        return [("backend", d.backend, got["backend"])]
    rows: list[Row] = []
    # environment vLLM writes while converting must be in the manifest's
    for k, v in got.get("env_set", {}).items():
        if not k.startswith("AITER_SITUV2_") and d.runtime_env.get(k) != v:
            rows.append((f"env {k}", d.runtime_env.get(k), v))
    if not case.target.arch.startswith("gfx"):  # NVIDIA: vLLM converts; only that it does
        return rows
    x = T.canonical(SEED)
    d, order = _recipe_vllm_writes(case, d)
    recipe = d.layout.as_dict()
    for name in RECIPE_TENSORS:
        layout_name = recipe[name]
        if layout_name.startswith("triton_gfx1250_scale"):
            rows.extend(_gfx1250_scale_rows(name, layout_name, x[name], got))
            continue
        want = get_layout(layout_name).forward(order(name, x[name])).flatten()
        have = _vllm_bytes(got, name)
        if have is None or have.numel() != want.numel():
            rows.append((name, f"{layout_name} ({want.numel()} bytes)", got["tensors"][name]))
        elif not torch.equal(have, want):
            at = int((have != want).nonzero()[0])
            rows.append((name, layout_name, f"other bytes (first difference at byte {at})"))
    shuffles = [c["fn"] for c in got["calls"] if c["fn"] != "shuffle_scale_moe"]
    if d.is_shuffled and not shuffles:
        rows.append(("AITER shuffles called", "yes", "none"))
    elif not d.is_shuffled and shuffles:
        rows.append(("AITER shuffles called", "none", shuffles))
    return rows


def probe_converters(src, selected) -> dict[str, dict]:
    """probe_convert's answer for every selected case, one worker per platform, two at a time."""
    groups = defaultdict(list)
    for c, _, _ in selected:
        groups[c.platform].append(c)

    def run(platform):
        found = run_probe(platform, PROBE, [probe_case(c) for c in groups[platform]], src=src)
        return {c.id: r for c, r in zip(groups[platform], found)}

    out: dict[str, dict] = {}
    with ThreadPoolExecutor(2) as pool:
        for part in pool.map(run, list(groups)):
            out.update(part)
    return out
