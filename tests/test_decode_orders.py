"""The bit orders benchmarks/probes/gluon_decode_bench.py times (benchmarks/results/performance-notebook.md, "Other
decodes of the words"): the
stored bits its GF(2) solve gives make each order's decode land every code of 65536 random words where it should,
and nothing outside the decode's mask. Run as the benchmark's own check (numpy only, no GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_each_order_decodes_random_words_to_their_codes():
    run = subprocess.run([sys.executable, os.path.join("benchmarks", "probes", "gluon_decode_bench.py"), "--self-check"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "bit orders xor, f8: decode of 65536 random words checked" in run.stdout
