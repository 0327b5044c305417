"""benchmarks/moe_power.py's reading of nvidia-smi's CSV and its table (what moe_power.py and decode_probe.py print):
the samples of each window averaged, the energy a call the mean power times the time a call."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import moe_power  # noqa: E402

CSV = """2026/12/06 10:00:00.100, 1600 MHz, 680.00 W, 3201 MHz, 55, 700.00 W
2026/12/06 10:00:00.200, 1700 MHz, 690.00 W, 3201 MHz, 57, 700.00 W
2026/12/06 10:00:00.300, [N/A], 1.00 W, 3201 MHz, 40, 700.00 W
garbage line
"""


def test_samples_reads_each_row_and_skips_what_is_not_one():
    rows = moe_power.samples(CSV)
    assert len(rows) == 3
    assert rows[0][1:] == (1600.0, 680.0, 3201.0, 55.0, 700.0)
    assert rows[1][0] - rows[0][0] == pytest.approx(0.1, abs=1e-3)
    assert rows[2][1] != rows[2][1]  # [N/A] reads as NaN


def test_power_table_means_and_energy():
    rows = moe_power.samples(CSV)
    lines = moe_power.power_table([("layer", 2000.0, rows[:2]), ("idle", 5.0, [])], width=10)
    assert lines[0].split()[:3] == ["configuration", "us/call", "W"]
    name, us, watts, mhz, mj, mem, hbm = lines[1].split()
    assert (name, float(us), float(watts), float(mhz), float(mem), float(hbm)) == ("layer", 2000.0, 685, 1650, 3201, 57)
    assert float(mj) == 685 * 2000.0 * 1e-3
    assert lines[2].endswith("(no nvidia-smi samples)")
