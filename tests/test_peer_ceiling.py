"""benchmarks/peer_ceiling.py on a moe_bench CSV written here: the ceiling is the peer's time over the copy floor."""

from __future__ import annotations

import csv
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import peer_ceiling  # noqa: E402

FIELDS = ["shape", "T", "floor_us", "triton_us", "humming_us", "tk_us", "tflops", "routing"]


def _csv(tmp_path, rows):
    path = tmp_path / "bench.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow(dict(zip(FIELDS, r)))
    return str(path)


def test_ceiling_is_the_peers_time_over_the_copy_floor(tmp_path, capsys):
    # peer at 90% of copy (ceiling 1.111: 1.2 impossible), peer at 50% (ceiling 2.0), a math-bound row, a row
    # without the peer
    path = _csv(tmp_path, [("dsv3", 8, 90.0, 95.0, 100.0, "nan", 11.0, "uniform"),
                           ("k3", 1, 10.0, 15.0, 20.0, "nan", 5.0, "skewed"),
                           ("k3", 4096, 700.0, 2000.0, 2200.0, "nan", 271.0, "uniform"),
                           ("k3", 2, 20.0, 30.0, "nan", 40.0, 6.0, "uniform")])
    assert peer_ceiling.main([path, "--markdown"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert len(lines) == 3
    dsv3, k3, big = ([c.strip() for c in line.strip("|").split("|")] for line in lines)
    assert dsv3[3:] == [f"{100 * 90 / 95:.1f}", "90.0", f"{100 / 95:.3f}", f"{100 / 90:.3f}", "no"]
    assert k3[1] == "skewed" and k3[6:] == ["2.000", "yes"]
    assert big[3] == "271 TFLOP/s" and big[6] == ""


def test_no_peer_column_is_one_clear_error(tmp_path, capsys):
    path = _csv(tmp_path, [("k3", 2, 20.0, 30.0, "nan", 40.0, 6.0, "uniform")])
    assert peer_ceiling.main([path]) == 1
    err = capsys.readouterr().err
    assert "humming_us" in err and path in err
    assert peer_ceiling.main([path, "--peer", "tk"]) == 0
