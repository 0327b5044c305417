"""Data + expert parallel layouts without vLLM: the derivation's rules and refusals, the options
(vLLM's spellings too), the manifest's rank map, per-rank shards a node fetches alone, and the
runtime's rank mapping (every rank of a layout run as a torch.distributed program would, summed,
equals the one-rank conversion). vLLM's own code checks the same layouts rank by rank in
test_vllm_parallel_layouts.py.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from checkpoint_fixtures import load_index, run_cli, synth, tree_digest  # noqa: F401 (fixture)
from mxfp4conv.convert import convert
from mxfp4conv.errors import CheckpointError, OracleError
from mxfp4conv.format.manifest import validate_manifest
from mxfp4conv.oracle import Target
from mxfp4conv.oracle.parallel import derive
from mxfp4conv.runtime import fused_moe, load_moe_layers, parallel_layout
from mxfp4conv.runtime.loader import read_manifest


def one_paragraph(rc: int, err: str, *needles: str, code: int = 1) -> None:
    flat = " ".join(err.split())
    assert rc == code, err
    assert "Traceback" not in err, err
    if code == 1:  # one paragraph (usage errors are click's usage text and one line)
        assert err.startswith("error:") and "\n\n" not in err.strip(), err
    for n in needles:
        assert n in flat, (n, flat)


@pytest.mark.parametrize("tp,dp,ep,placement,groups", [
    (1, 2, True, "linear", None), (2, 2, True, "linear", None), (4, 1, True, "round_robin", 2),
    (1, 4, True, "round_robin", 2), (2, 2, False, "linear", None), (8, 2, True, "linear", 8)])
def test_every_expert_and_column_is_held_exactly_once(tp, dp, ep, placement, groups):
    E, I = 16, 512
    par = derive(tp=tp, dp=dp, ep=ep, placement=placement, num_experts=E, num_expert_group=groups)
    assert par.ranks == tp * dp and par.moe_tp * par.ep_size == tp * dp
    held = {}
    for r in range(par.ranks):
        d, _, t = par.worker(r)
        assert par.moe_rank(d, t) == r
        a, b = par.intermediate_slice(r, I)
        for e in par.experts(r):
            held.setdefault(e, []).append((a, b))
        emap = par.expert_map(r)
        if par.use_ep:
            assert [g for g, local in sorted(enumerate(emap), key=lambda x: x[1]) if local >= 0] == list(par.experts(r))
    for e in range(E):  # each expert's columns covered once, by one rank (EP) or all ranks (TP)
        cols = sorted(held[e])
        assert cols[0][0] == 0 and cols[-1][1] == I and all(x[1] == y[0] for x, y in zip(cols, cols[1:]))
    if par.use_ep and par.placement == "round_robin":
        assert list(par.experts(1)) == list(range(1, E, par.ranks))


def test_round_robin_falls_back_as_vllm_does():
    assert derive(tp=4, ep=True, placement="round_robin", num_experts=8, num_expert_group=1).placement == "linear"
    assert derive(tp=4, ep=True, placement="round_robin", num_experts=8, num_expert_group=2).placement == "round_robin"
    par = derive(tp=1, dp=4, ep=True, placement="round_robin", num_experts=8, num_expert_group=2)
    assert par.placement == "linear" and "deepep_low_latency" in par.note
    kept = derive(tp=1, dp=4, ep=True, placement="round_robin", num_experts=8, num_expert_group=2,
                  all2all="deepep_low_latency")
    assert kept.placement == "round_robin" and kept.batched
    assert not derive(tp=2, dp=2, ep=False, num_experts=8).use_ep  # DP without EP: MoE tp 4


def test_kimi_k3_rule_reads_the_attention_tp(synth):  # noqa: F811
    """vLLM's Kimi-K3 model pads I / tp (its attention tp) to 256 and the MoE layer splits that
    over tp x dp: at dp 2 x tp 2 each of the 4 ranks holds 2 x 256 / 4 = 128."""
    from mxfp4conv.checkpoint import load_model, open_source
    from mxfp4conv.oracle import decide

    model = load_model(open_source(str(synth("kimi_k3"))))
    d = decide(model, Target("gfx950", tp=2, dp=2))
    assert (d.tp, d.ep, d.intermediate_per_rank, d.intermediate_per_rank_padded) == (4, False, 64, 128)
    assert any("at tp 2, so the model pads the global size to 512; per rank 128" in n for n in d.notes)


def test_vllm_spellings_are_the_same_plan(synth, capsys):  # noqa: F811
    src = synth("deepseek_v4")
    ours = run_cli(["plan", src, "--arch", "gfx950", "--tp", "2", "--dp", "2", "--ep", "--placement", "linear",
                    "--json"], capsys)
    vllms = run_cli(["plan", src, "--arch", "gfx950", "--tensor-parallel-size", "2", "-dp", "2",
                     "--enable-expert-parallel", "--expert-placement-strategy", "linear", "--json"], capsys)
    assert ours[0] == vllms[0] == 0 and json.loads(ours[1]) == json.loads(vllms[1])
    plan = json.loads(ours[1])
    assert (plan["tp"], plan["ep"], plan["parallel"]["tp"], plan["parallel"]["dp"]) == (4, True, 2, 2)
    assert [r["experts"] for r in plan["parallel"]["rank_map"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_plan_prints_the_first_and_last_ranks_of_a_wide_ep_layout(synth, capsys):  # noqa: F811
    rc, out, _ = run_cli(["plan", synth("deepseek_v4"), "--arch", "gfx950", "-dp", "8", "--ep"], capsys)
    assert rc == 0
    assert "MoE ranks: 8 (MoE rank = dp rank x 1 + tp rank), expert parallel, linear placement:" in out
    assert "rank 0 (dp rank 0, tp rank 0): experts 0 (1)" in out and "rank 7 (dp rank 7, tp rank 0): experts 7 (1)" in out
    assert "rank 3 " not in out and "... ranks 1..6" in out


@pytest.mark.parametrize("args,code,needles", [
    (["--dp", "3", "--ep"], 1, ["needs the expert count (8) to be divisible by 3", "ranks 0..1 3 experts"]),
    (["--dp", "0"], 2, ["--dp", "greater than or equal to 1"]),
    (["--placement", "striped", "--ep", "--dp", "2"], 2, ["striped", "linear, round_robin"]),
    (["--dp", "2", "--ep", "--placement", "round_robin", "--all2all-backend", "deepep_low_latency"], 1,
     ["BatchedExperts activation format", "allgather_reducescatter"]),
    (["--tp", "3"], 1, ["intermediate size 256"]),
])
def test_layouts_vllm_or_the_format_refuse(synth, tmp_path, capsys, args, code, needles):  # noqa: F811
    src = synth("deepseek_v4")
    before = tree_digest(src)
    for cmd in (["plan", src], ["convert", src, tmp_path / "OUT"]):
        rc, _, err = run_cli([*cmd, "--arch", "gfx950", *args], capsys)
        one_paragraph(rc, err, *needles, code=code)
    assert not (tmp_path / "OUT").exists() and tree_digest(src) == before


@pytest.fixture(scope="module")
def layouts(synth, tmp_path_factory):  # noqa: F811
    """A DeepSeek-V4 checkpoint with 2 expert groups converted for several layouts (CPU target)."""
    src = tmp_path_factory.mktemp("grouped") / "dsv4"
    shutil.copytree(synth("deepseek_v4"), src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "n_group": 2, "topk_group": 1}))
    out = {}
    for name, kw in {"one": dict(tp=1), "dp2-tp2-ep": dict(tp=2, dp=2, ep=True),
                     "tp4-ep-rr": dict(tp=4, ep=True, placement="round_robin"), "dp2-tp2": dict(tp=2, dp=2)}.items():
        out[name] = tmp_path_factory.mktemp("out") / name
        convert(src, out[name], Target("cpu", **kw), progress="off", shard_size="200KB")
    return src, out


def test_manifest_records_the_layout_and_refuses_an_edited_map(layouts):
    _, out = layouts
    m = read_manifest(out["tp4-ep-rr"])
    p = m["target"]["parallel"]
    assert m["version"] == 2 and (m["target"]["tp"], m["target"]["ep"]) == (4, True)
    assert (p["tp"], p["dp"], p["placement"], p["ep_size"]) == (4, 1, "round_robin", 4)
    assert [r["experts"] for r in p["rank_map"]] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    p["rank_map"][1]["experts"] = [5, 1]
    with pytest.raises(CheckpointError, match="target.parallel.rank_map"):
        validate_manifest(m)
    m["target"].pop("parallel")  # version 1: no record (tp ranks, dp 1, linear)
    m["version"] = 1
    assert parallel_layout(validate_manifest(m)).placement == "linear"


def test_each_rank_shards_apart_and_a_node_loads_from_its_share_alone(layouts, tmp_path, capsys):
    _, out = layouts
    root = out["dp2-tp2-ep"]
    wm = load_index(root)["weight_map"]
    for shard in set(wm.values()):  # a shard holds shared tensors or one rank's experts
        ranks = {n.split(".experts.rank")[1].split(".")[0] if ".experts.rank" in n else "shared"
                 for n, s in wm.items() if s == shard}
        assert len(ranks) == 1, (shard, ranks)
    rc, text, _ = run_cli(["ranks", root, "--data-parallel-start-rank", "1", "--data-parallel-size-local", "1",
                           "--json"], capsys)
    share = json.loads(text)
    assert rc == 0 and [r["rank"] for r in share["ranks"]] == [2, 3] and share["bytes"] < share["total_bytes"]
    node = tmp_path / "node"
    node.mkdir()
    for f in share["allow_patterns"]:  # what snapshot_download(allow_patterns=...) fetches
        shutil.copy(root / f, node / f)
    assert not any(f"rank{r}." in n for r in (0, 1) for n, s in wm.items() if (node / s).exists())
    for r in (2, 3):
        ex = load_moe_layers(node, rank=r)
        assert all(layer.global_ids == (2 * r, 2 * r + 1) for layer in ex.values())
    with pytest.raises(CheckpointError, match="missing"):
        load_moe_layers(node, rank=0)
    rc, text, _ = run_cli(["ranks", root, "--ranks", "0-1", "--print-patterns"], capsys)
    assert rc == 0 and set(text.split()) | set(share["allow_patterns"]) == {
        *load_index(root)["weight_map"].values(), *[f for f in share["allow_patterns"] if not f.endswith(".safetensors")]}


@pytest.mark.parametrize("name", ["dp2-tp2-ep", "tp4-ep-rr", "dp2-tp2"])
def test_ranks_run_apart_and_summed_equal_one_rank(layouts, name):
    """What a torch.distributed program does with the runtime: each MoE rank (parallel_layout's
    moe_rank of its dp / tp ranks) loads its experts and runs the same tokens with the global
    routing; the all-reduce (here a sum) gives the one-rank conversion's output."""
    _, out = layouts
    one = load_moe_layers(out["one"], rank=0)
    par = parallel_layout(out[name])
    g = torch.Generator().manual_seed(0)
    prefix = next(iter(one))
    H, E, k = one[prefix].hidden, one[prefix].num_experts, 2
    x = torch.randn(6, H, generator=g)
    w = torch.rand(6, k, generator=g).softmax(-1)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(6)])
    want = fused_moe(x, one[prefix], w, ids, backend="torch")
    total = torch.zeros_like(want)
    seen = []
    for d in range(par.dp):
        for t in range(par.tp):
            rank = par.moe_rank(d, t)
            ex = load_moe_layers(out[name], rank=rank)[prefix]
            seen += list(ex.global_ids) if ex.ep else []
            if ex.ep:
                emap = ex.expert_map
                assert [int(emap[e]) for e in ex.global_ids] == list(range(ex.experts_per_rank))
            total += fused_moe(x, ex, w, ids, backend="torch")
    if par.use_ep:
        assert sorted(seen) == list(range(E))
    assert torch.allclose(total, want, rtol=1e-4, atol=1e-4), (total - want).abs().max()


def test_a_hub_worker_fetches_its_share(layouts):
    """The plugin's hub download for one worker: the JSON files, the shared tensors' shards and its
    rank's; every shard where its rank is not known (no vLLM process groups here)."""
    from mxfp4conv.integrations.vllm.model_loader import hub_patterns, worker_moe_rank

    _, out = layouts
    root = out["dp2-tp2-ep"]
    wm = load_index(root)["weight_map"]
    got = hub_patterns(root, 2)
    assert got[0] == "*.json"
    assert set(got[1:]) == {s for n, s in wm.items() if ".experts.rank" not in n or ".experts.rank2." in n}
    assert worker_moe_rank(read_manifest(root)) is None and "*.safetensors" in hub_patterns(root, None)
