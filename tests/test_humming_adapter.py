"""benchmarks/humming_moe.py's parts that run without Humming or a GPU: the routing alignment that
stands in for vLLM's moe_align_block_size, and the startup_cost byte model."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from sm90_child import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import humming_moe  # noqa: E402
import startup_cost  # noqa: E402


def _aligned(ids, block, E):
    """Each expert's flat (token, slot) indices in order, padded with T * k to a multiple of block."""
    flat = ids.reshape(-1).tolist()
    sorted_ids, experts = [], []
    for e in range(E):
        pairs = [i for i, v in enumerate(flat) if v == e]
        if pairs:
            pad = -(-len(pairs) // block) * block
            sorted_ids += pairs + [len(flat)] * (pad - len(pairs))
            experts += [e] * (pad // block)
    return sorted_ids, experts


@pytest.mark.parametrize("T,k,E,block", [(1, 8, 256, 16), (3, 16, 896, 64), (64, 8, 256, 32), (100, 4, 8, 16)])
def test_align_matches_the_per_expert_padding(T, k, E, block):
    g = torch.Generator().manual_seed(T * 1000 + E)
    ids = torch.rand(T, E, generator=g).topk(k, 1).indices.int()
    sorted_ids, expert_ids, padded = humming_moe.align_block_size(ids, block, E)
    want, experts = _aligned(ids, block, E)
    assert int(padded) == len(want)
    assert sorted_ids[:len(want)].tolist() == want
    assert (sorted_ids[len(want):] == T * k).all()
    assert expert_ids[:len(experts)].tolist() == experts


def test_situ_expression_has_the_parameters():
    expr = humming_moe.situ_expression(4.0, 25.0)
    assert "(4.0f)" in expr and "(25.0f)" in expr and "expf(-a)" in expr
    assert "tanhf(b" not in humming_moe.situ_expression(4.0, None)


def test_tensor_parallel_ranks_read_the_whole_source_but_their_experts_converted():
    rows = {(r["model"], r["tp"]): r for r in startup_cost.bytes_table(2.0, 13.1)}
    k3 = next(m for m in startup_cost.MODELS if m.name == "Kimi-K3")
    experts = k3.layers * k3.layer_bytes(1)
    assert rows["Kimi-K3", 8]["source_gb"] == pytest.approx(k3.checkpoint_bytes / 1e9)
    assert rows["Kimi-K3", 8]["converted_gb"] == pytest.approx((k3.checkpoint_bytes - experts + experts / 8) / 1e9)
    assert rows["Kimi-K3", 1]["converted_gb"] == pytest.approx(rows["Kimi-K3", 1]["source_gb"])
