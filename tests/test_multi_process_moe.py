"""benchmarks/multi_gpu_moe.py's logic on CPU: two gloo processes load their ranks of a tensor
parallel, an expert parallel and a data + expert parallel conversion (their MoE rank from the
manifest's layout), run fused_moe (dp ranks on their own tokens, gathered), combine as vLLM does,
and match the tp-1 conversion within bf16 noise (the same script runs NCCL on GPUs)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import multi_gpu_moe  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_two_processes_match_one():
    rows = multi_gpu_moe.run(2, "tiny", "sm90", "cpu", ("tp", "ep", "dpep"), (1, 16), "torch", warmup=0, iters=1,
                             port=free_port())
    assert [(r["layout"], r["tokens"]) for r in rows] == [(lay, t) for lay in ("tp", "ep", "dpep") for t in (1, 16)]
    for r in rows:
        assert r["finite"], r
        # bf16 outputs: the rank sums and the tp-1 layer round differently, by a few 2^-8 at most
        assert r["rel_err"] < 1e-2, r
        assert r["us_per_layer"] > 0
