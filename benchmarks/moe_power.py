"""Sustained power, SM clock and energy per call of the Triton MoE layer, beside a device copy and a read.

moe_bench.py times short bursts of CUDA-graph replays. This runs each configuration alone for --secs
seconds of back-to-back replays and reads power draw and clocks from nvidia-smi, sampled every 100 ms
meanwhile; then the same for a 4 GiB device copy and a 4 GiB read. It shows whether a configuration
runs into the board's power limit, at what SM clock, and what one call costs in energy (power x
time). Under that limit, a configuration that spends less energy per call runs at a higher clock.

    python benchmarks/moe_power.py [--points JSON] [--secs 3] [--out DIR]

--points: [[shape, T, {config overrides}], ...], shapes dsv3 (7168, 2048, 256 experts, top-8) and k3
(3584, 384, 896, top-16), weights random bytes in hopper_mma_xor. Needs a CUDA GPU and nvidia-smi.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import io
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from mxfp4conv.kernels import triton_moe as M  # noqa: E402
from moe_bench import SHAPES, captured, make_weights, routing, zero_codes  # noqa: E402

QUERY = "timestamp,clocks.sm,power.draw,clocks.mem,temperature.memory,power.limit"
DEFAULT_POINTS = [["dsv3", 8, {}], ["dsv3", 64, {}], ["dsv3", 256, {}], ["dsv3", 1024, {}], ["dsv3", 4096, {}],
                  ["k3", 8, {}], ["k3", 256, {}], ["k3", 1024, {}]]


def sustained(fn, secs: float) -> tuple[float, float, float]:
    """(wall-clock start, end, microseconds a call) of back-to-back CUDA-graph replays of fn for secs seconds."""
    graph = captured([fn])
    time.sleep(1.5)  # let the board settle between configurations
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0, calls = time.time(), 0
    e0.record()
    while time.time() - t0 < secs:
        for _ in range(5):
            graph.replay()
        calls += 5
        torch.cuda.synchronize()
    e1.record()
    e1.synchronize()
    return t0, time.time(), e0.elapsed_time(e1) * 1e3 / calls


def layer(shape: str, T: int, overrides: dict, gen, cache: dict, codes: str = "random"):
    """One call of the layer (moe_bench.py's weights and routing) as a closure; the weights kept per shape. codes
    "zero": every fp4 code byte 0x00 (the scales as they are), in copies the closure holds."""
    H, I, E, k = SHAPES[shape]
    if shape not in cache:
        cache.clear()
        torch.cuda.empty_cache()
        cache[shape] = make_weights(H, I, E, gen)
    w13, s13, w2, s2 = zero_codes(*cache[shape]) if codes == "zero" else cache[shape]
    x = torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16)
    ids, tw = routing(T, E, k, gen)
    cfg = dataclasses.replace(M.select_config(T * k, E, H, I, "hopper_mma_xor"), **overrides)
    return lambda: M.fused_moe_triton(x, w13, s13, w2, s2, tw, ids, activation="silu", activation_params={},
                                      layout="hopper_mma_xor", config=cfg)


def samples(text: str) -> list[tuple[float, ...]]:
    """(unix time, SM MHz, W, memory MHz, HBM C, power limit W) rows of nvidia-smi's CSV."""
    rows = []
    for r in csv.reader(io.StringIO(text)):
        try:
            ts = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((ts, *(float(v.split()[0]) if v.split()[0][0].isdigit() else float("nan") for v in r[1:])))
        except (ValueError, IndexError):
            pass
    return rows


def sampled(configs, secs: float) -> tuple[list[tuple[str, float, list]], str]:
    """Each (name, fn) of configs (an iterable, so that each fn may be built after the one before has run) sustained
    for secs while nvidia-smi samples every 100 ms: ([(name, us a call, its samples)], nvidia-smi's CSV). fn None: the
    board idle for secs (us a call NaN)."""
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    windows = []
    for name, fn in configs:
        if fn is None:
            torch.cuda.synchronize()
            t0 = time.time()
            time.sleep(secs)
            t1, us = time.time(), float("nan")
        else:
            t0, t1, us = sustained(fn, secs)
        windows.append((name, t0 + 0.7, t1, us))
    time.sleep(0.5)
    smi.terminate()
    text = smi.communicate()[0]
    rows = samples(text)
    return [(name, us, [r for r in rows if a0 <= r[0] <= a1]) for name, a0, a1, us in windows], text


def mean_watts(sel) -> float:
    """The mean power draw of a window's samples (NaN without samples)."""
    return sum(r[2] for r in sel) / len(sel) if sel else float("nan")


def power_limit(windows) -> float | None:
    """The board's power limit as its last sample in the windows reads it (None without samples)."""
    limits = [r[5] for _, _, sel in windows for r in sel]
    return limits[-1] if limits else None


def power_table(windows, width: int = 58) -> list[str]:
    """sampled's windows as table lines: us a call and the means of power, SM clock and memory clock over each
    window's samples, the energy a call (mean power x time) and the hottest HBM reading."""
    head = f"{'us/call':>9} {'W':>5} {'SM MHz':>6} {'mJ/call':>8} {'mem MHz':>7} {'HBM C':>5}"
    lines = [f"{'configuration':{width}} {head}"]
    for name, us, sel in windows:
        if not sel:
            lines.append(f"{name:{width}} {us:9.1f}  (no nvidia-smi samples)")
            continue
        mhz, watts, mem = sum(r[1] for r in sel) / len(sel), mean_watts(sel), sum(r[3] for r in sel) / len(sel)
        lines.append(f"{name:{width}} {us:9.1f} {watts:5.0f} {mhz:6.0f} {watts * us * 1e-3:8.1f} {mem:7.0f} "
                     f"{max(r[4] for r in sel):5.0f}")
    return lines


def report(lines: list[str], out: str | None, name: str) -> None:
    """Print the table and, given a directory, write it there as name."""
    print("\n".join(lines))
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, name), "w") as f:
            f.write("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", default=json.dumps(DEFAULT_POINTS))
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--out", default=None, help="directory for the table and nvidia-smi's samples")
    args = ap.parse_args()

    def configs():
        gen = torch.Generator(device="cuda").manual_seed(0)
        cache: dict = {}
        for shape, T, overrides in json.loads(args.points):
            yield (f"{shape} T={T} {json.dumps(overrides) if overrides else 'default'}",
                   layer(shape, T, overrides, gen, cache))
        cache.clear()
        torch.cuda.empty_cache()
        a = torch.empty(4 << 30, dtype=torch.uint8, device="cuda").random_()
        b = torch.empty_like(a)
        yield "copy 4 GiB (read + write 8 GiB)", lambda: b.copy_(a)
        words, total = a.view(torch.float32), torch.empty((), device="cuda")
        yield "read 4 GiB (a float32 sum over it)", lambda: torch.sum(words, dim=0, out=total)

    windows, text = sampled(configs(), args.secs)
    lines = [f"{torch.cuda.get_device_name()}; torch {torch.__version__}; sustained {args.secs:.0f} s a configuration",
             *power_table(windows)]
    limit = power_limit(windows)
    if limit is not None:
        lines.append(f"power limit {limit:.0f} W")
    report(lines, args.out, "moe_power.txt")
    if args.out:
        with open(os.path.join(args.out, "nvidia_smi.csv"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
