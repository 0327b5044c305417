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


def test_triton_kernels_beside_ours_on_an_h100_fits_four_processes(monkeypatch):
    # the run that ran out of an H100's memory with 8: 7 token counts, each our default then triton_kernels'. With
    # DSV3-like weights of 5.6 GiB (w) and 68 of the 70 GiB free usable: 4 processes hold jobs 0, 4, 8, 12 (ours),
    # 1, 5, 9, 13 (triton_kernels'), 2, 6, 10 and 3, 7, 11: 2 (3w + 1) + 2 (w + 1) = 49 GiB; 5 give each process
    # a triton_kernels job: 5 (3w + 1) = 89 GiB
    jobs = [(T, cfg, "hopper_mma_xor") for T in (1, 8, 16, 64, 256, 1024, 4096) for cfg in ("default", "tk")]
    fitted, lines = _fit(monkeypatch, 70, jobs)
    assert fitted == 4
    assert lines == ["  dsv3: compiling in 4 processes, not 8: their weights would not fit the 68 GiB the GPU has free"]


def test_enough_memory_keeps_the_processes_asked_for(monkeypatch):
    jobs = [(T, "tk", "hopper_mma_xor") for T in (1, 8, 64)]
    assert _fit(monkeypatch, 139, jobs, workers=3) == (3, [])  # 3 (3w + 1) = 54 GiB on an H200
    assert _fit(monkeypatch, 139, jobs, workers=3, name="k3") == (3, [])


def test_too_little_memory_leaves_one_process(monkeypatch):
    jobs = [(T, "default", "hopper_mma_xor") for T in (1, 8, 64, 256)]
    fitted, lines = _fit(monkeypatch, 4, jobs, workers=4)
    assert fitted == 1 and "compiling in 1 process, not 4" in lines[0]
