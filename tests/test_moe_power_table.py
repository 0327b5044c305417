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


def test_floor_pays_the_idle_power_once_and_is_never_below_either_part():
    import moe_floor
    read, gemm = (1000.0, 600.0), (800.0, 700.0)  # (us a call, W)
    fl = moe_floor.floor(read, gemm, p_idle=100.0, p_limit=700.0)
    assert fl["serial"] == 1800.0
    assert fl["shared"] == pytest.approx((1000 * 600 + 800 * 700 - 100 * 800) / 700)
    assert fl["mj"] == pytest.approx(fl["shared"] * 700 * 1e-3)
    # little energy: the longer of the two still takes its time, and the energy stays the parts' sum
    low = moe_floor.floor((1000.0, 50.0), (10.0, 50.0), p_idle=40.0, p_limit=700.0)
    assert low["shared"] == 1000.0
    assert low["mj"] == pytest.approx((1000 * 50 + 10 * 50 - 40 * 10) * 1e-3)


def test_layer_flops_counts_both_gemms_of_every_pair():
    import moe_floor
    H, I, k, T = 7168, 2048, 8, 1024
    assert moe_floor.layer_flops(T, H, I, k) == T * k * (2 * (2 * I) * H + 2 * H * I)


def test_report_prints_the_table_and_writes_it_where_asked(tmp_path, capsys):
    moe_power.report(["a  b", "1  2"], str(tmp_path / "out"), "t.txt")
    assert capsys.readouterr().out == "a  b\n1  2\n"
    assert (tmp_path / "out" / "t.txt").read_text() == "a  b\n1  2\n"
    moe_power.report(["x"], None, "t.txt")  # no directory: printed only
    assert capsys.readouterr().out == "x\n"
