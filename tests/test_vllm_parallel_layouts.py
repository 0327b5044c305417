"""Data + expert parallel layouts: every MoE rank the plugin loads equals vLLM's own load of the
source, on vLLM's own code (0.33.0 and 0.34.0, emulated platforms; ``tests/vllm_code``).

Each worker of a layout (dp rank, tp rank) builds vLLM's ``RoutedExperts`` with the
``FusedMoEParallelConfig`` vLLM's ``make`` derives from tp / dp / --enable-expert-parallel and
the ``ExpertMapManager`` of the placement asked, so vLLM itself decides the MoE rank, the experts
it holds (its expert map) and the intermediate slice:

- gfx950 (AITER, kernel-ready bytes): ``probe`` loads the source through vLLM's weight loader and
  conversion, and the converted checkpoint through the plugin (canary and fast path); every
  parameter, byte for byte, and the expert map must be equal.
- sm90 (mxfp4conv's own format, which vLLM's pick there does not read): ``probe_params`` compares
  vLLM's weight loading of the source with the experts the plugin's rank mapping loads (the real
  bytes of every local expert) and the expert maps.

Layouts: DP 2 + EP, DP 2 x TP 2 + EP, DP 4 + EP round_robin (vLLM falls back to linear), TP 4 + EP
round_robin (kept), DP 2 x TP 2 without EP on a DeepSeek-V4 checkpoint with 2 expert groups (both
platforms); on gfx950 also DP 2 x TP 2 + EP served with EPLB and 4 redundant experts, and Kimi-K3
at DP 2 x TP 2 with and without EP (its model-level padding reads the attention tp).
One worker per release and platform holds every case (each worker start imports vLLM).
"""

from __future__ import annotations

import pytest

from checkpoint_fixtures import synth  # noqa: F401 (fixture)
from mxfp4conv.convert import convert
from mxfp4conv.oracle import Target
from mxfp4conv.runtime.loader import parallel_layout, read_manifest

harness = pytest.importorskip("tests.vllm_code.harness", reason="needs the vLLM harness (tests/vllm_code)")

RR = dict(ep=True, placement="round_robin")
# name -> layout, on a DeepSeek-V4 checkpoint whose config declares 2 expert groups (n_group),
# which vLLM's round_robin placement needs; with dp > 1 round_robin also needs a batched all2all
# (deepep_low_latency, nixl_ep) that no MXFP4 experts class mxfp4conv writes for takes, so at dp 4
# it falls back to linear as vLLM does with the default all2all, and tp 4 keeps it
GROUPS = 2
LAYOUTS = {
    "dp2-ep": dict(tp=1, dp=2, ep=True),
    "dp2-tp2-ep": dict(tp=2, dp=2, ep=True),
    "dp4-ep-round_robin": dict(tp=1, dp=4, **RR),
    "tp4-ep-round_robin": dict(tp=4, dp=1, **RR),
    "dp2-tp2": dict(tp=2, dp=2),
    # served with --enable-eplb and 4 redundant experts: 12 physical experts, 3 a rank
    "dp2-tp2-ep-eplb4": dict(tp=2, dp=2, ep=True),
}
REDUNDANT = {"dp2-tp2-ep-eplb4": 4}
# Kimi-K3 (gfx950 only): its model pads I / tp (the attention tp) to min_moe_intermediate_per_partition
# and the MoE layer splits that over tp x dp ranks; the layer is built as its AMD model builds it
K3 = {"k3-dp2-tp2": dict(tp=2, dp=2), "k3-dp2-tp2-ep": dict(tp=2, dp=2, ep=True)}
LAYOUTS.update(K3)
PLATFORMS = {"gfx950": "probe", "sm90": "probe_params"}
RELEASES = ("0.33.0", "0.34.0")


@pytest.fixture(scope="module")
def converted(synth, tmp_path_factory):  # noqa: F811
    """{(platform, layout name): (source, converted)}."""
    import json
    import shutil

    src = tmp_path_factory.mktemp("grouped") / "deepseek_v4"
    shutil.copytree(synth("deepseek_v4"), src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "n_group": GROUPS, "topk_group": 1}))
    out = {}
    for arch in PLATFORMS:
        for name, kw in LAYOUTS.items():
            if (name in REDUNDANT or name in K3) and arch != "gfx950":
                continue
            if name in K3:
                dst = tmp_path_factory.mktemp("layouts") / f"{arch}-{name}"
                convert(synth("kimi_k3"), dst, Target(arch, **kw), force=True, progress="off")
                out[(arch, name)] = (synth("kimi_k3"), dst)
                continue
            dst = tmp_path_factory.mktemp("layouts") / f"{arch}-{name}"
            convert(src, dst, Target(arch, **kw), force=True, progress="off")
            out[(arch, name)] = (src, dst)
    return out


def cases_of(arch: str, name: str, src, out) -> list[dict]:
    if name in K3:
        from test_vllm_plugin_params import probe_cases

        kw, base = K3[name], probe_cases(src, out)[0]
        par = parallel_layout(read_manifest(out))
        return [{**base, "tp": kw["tp"], "dp": kw["dp"], "ep": kw.get("ep", False), "rank": r,
                 "dp_rank": par.worker(r)[0], "tp_rank": par.worker(r)[2], "layout": name, "kernel": False}
                for r in range(par.ranks)]
    m = read_manifest(out)
    t, moe = m["target"], m["moe"]
    kw = LAYOUTS[name]
    par = parallel_layout(m)
    p = t["activation_params"]
    server_env = {"VLLM_ROCM_USE_AITER": "1"} if arch == "gfx950" else {}
    cases = []
    for rank in range(par.ranks):
        dp_rank, _, tp_rank = par.worker(rank)
        cases.append({
            "method": "mxfp4", "source": str(src),
            "converted": str(out), "prefix": moe["layers"][0], "tp": kw["tp"], "dp": kw["dp"],
            "ep": kw.get("ep", False), "placement": kw.get("placement", "linear"),
            "all2all": kw.get("all2all", "allgather_reducescatter"),
            "num_expert_group": GROUPS,
            "rank": rank, "dp_rank": dp_rank, "tp_rank": tp_rank,
            "geometry": {k: moe[k] for k in ("hidden", "intermediate", "num_experts", "top_k")},
            "activation": t["activation"], "routing": moe["routing"], "has_bias": moe["has_bias"],
            "swiglu_limit": p.get("swiglu_limit", p.get("limit")),
            "model_type": None,
            "server_env": server_env, "layout": name, "redundant": REDUNDANT.get(name, 0),
            # sm90, data parallel 1: also the layer's apply (vLLM's modular kernel with its expert map
            # around mxfp4conv's Triton experts, in the interpreter) against the torch reference
            "kernel": arch == "sm90" and kw["dp"] == 1 and rank == 1,
        })
    return cases


_RESULTS: dict = {}


def results_for(converted, arch: str, version: str) -> dict:
    """{(layout name, MoE rank): probe result} from one worker."""
    key = (arch, version)
    if key not in _RESULTS:
        src_dir = harness.require_vllm(version)
        cases = [c for name in LAYOUTS if (arch, name) in converted
                 for c in cases_of(arch, name, *converted[(arch, name)])]
        got = harness.run_probe(arch, f"tests/vllm_plugin_probe.py:{PLATFORMS[arch]}", cases, src=src_dir,
                                timeout=1800)
        _RESULTS[key] = {(c["layout"], c["rank"]): r for c, r in zip(cases, got)}
    return _RESULTS[key]


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_gfx950_every_rank_equals_vllms_load(converted, version, name):
    results = results_for(converted, "gfx950", version)
    m = read_manifest(converted[("gfx950", name)][1])
    par = parallel_layout(m)
    for rank in range(par.ranks):
        r = results[(name, rank)]
        assert "raised" not in r, r
        normal = r["normal"]
        assert normal["loaded"], (name, rank)
        # vLLM's own derivation: the MoE rank, sizes and placement the oracle recorded
        pc = normal["parallel"]
        assert (pc["use_ep"], pc["ep_size"] if pc["use_ep"] else pc["tp_size"]) == (par.use_ep, par.ranks)
        assert (pc["ep_rank"] if pc["use_ep"] else pc["tp_rank"]) == rank
        assert normal["placement"] == par.placement
        if name in REDUNDANT:  # vLLM's map is over the physical experts: linear, E + R of them
            per = (m["moe"]["num_experts"] + REDUNDANT[name]) // par.ranks
            assert normal["expert_ids"] == list(range(rank * per, (rank + 1) * per))
        else:
            assert normal["expert_ids"] == list(par.experts(rank)) == m["target"]["parallel"]["rank_map"][rank]["experts"]
        for role in ("canary", "plugin"):
            got = r[role]
            assert "raised" not in got, got
            assert got["params"] == normal["params"], (name, rank, role)
            assert got["expert_ids"] == normal["expert_ids"] and got["parallel"] == pc
            assert (got["backend"], got["experts"]) == (normal["backend"], normal["experts"])
        assert r["plugin"]["mode"] == "kernel_ready"


def test_round_robin_is_kept_or_falls_back_as_vllm_decides(converted):
    """round_robin with EP: vLLM keeps it at dp 1 (tp 4) and falls back to linear at dp 4 with the
    default all2all; so does the manifest (each rank's placement is read back from vLLM's expert
    map in the tests above)."""
    kept = parallel_layout(read_manifest(converted[("gfx950", "tp4-ep-round_robin")][1]))
    fallback = read_manifest(converted[("gfx950", "dp4-ep-round_robin")][1])
    assert kept.placement == "round_robin" and list(kept.experts(1)) == [1, 5]  # 8 experts over 4 ranks
    assert parallel_layout(fallback).placement == "linear"
    assert any("round_robin needs the deepep_low_latency" in n for n in fallback["notes"])


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("name", [n for n in LAYOUTS if n not in REDUNDANT and n not in K3])
def test_sm90_every_rank_equals_vllms_load(converted, version, name):
    results = results_for(converted, "sm90", version)
    m = read_manifest(converted[("sm90", name)][1])
    par = parallel_layout(m)
    assert m["target"]["backend"] == "EMULATION"
    for rank in range(par.ranks):
        r = results[(name, rank)]
        assert "raised" not in r, r
        assert r["loaded"] and r["mode"] == "mxfp4conv_kernel" and r["rank"] == rank
        assert r["expert_ids"] == r["facts_expert_ids"] == r["loaded_expert_ids"] == list(par.experts(rank))
        assert r["ir"][0] == r["ir"][1]
        assert r["plugin"] == r["normal"], (name, rank)
        assert (r["kernel"] is not None) == (LAYOUTS[name]["dp"] == 1 and rank == 1)
        if r["kernel"] is not None:
            k = r["kernel"]
            assert (k["mode"], k["experts"]) == ("mxfp4conv_kernel", "Mxfp4convTritonExperts")
            assert k["ref_norm"] > 0 and k["rel_err"] < 2e-3, k
