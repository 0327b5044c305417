"""benchmarks/moe_bench.py's compile processes fitted to the GPU's free memory (no GPU: the free bytes are given)."""

from __future__ import annotations

import os
import sys

import torch

from sm90_child import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import moe_bench  # noqa: E402

GIB = 1 << 30


def _fit(monkeypatch, free_gib, jobs, workers=8, name="dsv3"):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (int(free_gib * GIB), 80 * GIB))
    lines = []
    return moe_bench.fit_workers(name, jobs, workers, lines.append), lines


def _weights(name):
    H, I, E, _ = moe_bench.SHAPES[name]
    return E * 3 * H * I * moe_bench.BPW


def test_dsv3_weights_are_about_6_gb():
    assert 5.9e9 < _weights("dsv3") < 6.1e9  # the 6.18 GB a compile process held on an H100, less its context


def test_triton_kernels_beside_ours_on_an_h100_fits_fewer_processes(monkeypatch):
    # 7 token counts, each our default and triton_kernels': the run that ran out of an H100's memory with 8
    jobs = [(T, cfg, "hopper_mma_xor") for T in (1, 8, 16, 64, 256, 1024, 4096) for cfg in ("default", "tk")]
    fitted, lines = _fit(monkeypatch, 70, jobs)
    w = _weights("dsv3")
    need = sum(w * (3 if any(j[1] == "tk" for j in jobs[i::fitted]) else 1) + GIB for i in range(fitted))
    assert 1 < fitted < 8 and need <= 68 * GIB
    more = fitted + 1
    assert sum(w * (3 if any(j[1] == "tk" for j in jobs[i::more]) else 1) + GIB for i in range(more)) > 68 * GIB
    assert lines and f"compiling in {fitted} processes, not 8" in lines[0]


def test_enough_memory_keeps_the_processes_asked_for(monkeypatch):
    jobs = [(T, "default", "hopper_mma_xor") for T in (1, 8, 64)]
    assert _fit(monkeypatch, 139, jobs, workers=3) == (3, [])
    assert _fit(monkeypatch, 139, jobs, workers=3, name="k3") == (3, [])


def test_too_little_memory_leaves_one_process(monkeypatch):
    jobs = [(T, "default", "hopper_mma_xor") for T in (1, 8, 64, 256)]
    fitted, lines = _fit(monkeypatch, 4, jobs, workers=4)
    assert fitted == 1 and "compiling in 1 processes, not 4" in lines[0]
