"""The floor that the board's power limit puts under an MoE call: its bytes read and its FLOPs done, each sustained.

Where a call runs at the power limit (DSV3-like T = 1024 on the H200), its time is the energy it spends over the
power the board may draw. The model here: no kernel reads the call's bytes for less energy than a plain read of as
many bytes like them (random, as the fp4 codes are), nor does its bf16 math for less than cuBLAS's dense GEMM of as
many FLOPs on operands like the layer's (fp4 values times e8m0 scales against random bf16 activations). This times,
each sustained for --secs with nvidia-smi sampled every 100 ms (moe_power.py's method): the layer, and the same call
with every fp4 code byte 0x00 (what the weights' bits cost it); a float32 sum over as many random bytes as its model
bytes (moe_bench.py's byte model), and beside it one over uniform floats in [0, 1); the [T k, H] x [H, 3 I] bf16 GEMM
with its FLOPs, and again on a zero weight operand (what the values cost the math); and the idle board. From them:

- serial: read + GEMM one after the other, each at its own power;
- shared: their energies with the idle power paid once while both would run, spent at the power limit
  ((E_read + E_gemm - P_idle min(t_read, t_gemm)) / P_limit, at least the longer of the two): what a kernel that
  reads those bytes and does that math at once would take, decoding for free, if the two energies add up (a model);
- the layer's energy a call beyond that pair's (decode, padding, tiles, round trips), and the same for the layer on
  codes 0x00 beyond the uniform read and the GEMM on zeros: what the kernels spend past the data.

Each as a time and as % of the device copy bandwidth measured in the same run (moe_bench.py's "% copy").

    python benchmarks/moe_floor.py [--points dsv3:1024,k3:1024] [--secs 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from moe_bench import SHAPES, copy_bandwidth, model_bytes, routing  # noqa: E402
from moe_power import layer, mean_watts, power_limit, power_table, report, sampled  # noqa: E402

FP4 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def layer_flops(T: int, H: int, I: int, k: int) -> int:
    """Multiply-adds times two of both GEMMs over the call's T k pairs: [2 I, H] and [H, I] a pair."""
    return 2 * T * k * 3 * H * I


def mxfp4_like(rows: int, cols: int, gen) -> torch.Tensor:
    """[rows, cols] bf16 holding what the layer's weights decode to: uniform fp4 codes times an e8m0 scale per 32
    values along cols, 2**-9 to 2**-6 (moe_bench.py's scale bytes 118-121)."""
    codes = torch.randint(0, 16, (rows, cols), device="cuda", generator=gen)
    scales = torch.exp2(torch.randint(-9, -5, (rows, cols // 32), device="cuda", generator=gen).float())
    return (torch.tensor(FP4, device="cuda")[codes] * scales.repeat_interleave(32, dim=1)).to(torch.bfloat16)


def floor(read: tuple[float, float], gemm: tuple[float, float], p_idle: float, p_limit: float) -> dict[str, float]:
    """Serial and shared floors (us) of a call that reads as a plain read and computes as the GEMM, and the energy
    (mJ) of the shared one: read and gemm are (us a call, mean W) sustained; p_idle the idle board's W, p_limit the
    power limit's. Where the longer part's time bounds the shared floor, its energy is still the two parts' sum."""
    (t_r, w_r), (t_g, w_g) = read, gemm
    energy = t_r * w_r + t_g * w_g - p_idle * min(t_r, t_g)
    return {"serial": t_r + t_g, "shared": max(energy / p_limit, t_r, t_g), "mj": energy * 1e-3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", default="dsv3:1024,k3:1024", help="shape:T,... (shapes dsv3, k3)")
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--out", default=None, help="directory for the table")
    args = ap.parse_args()
    points = [(p.split(":")[0], int(p.split(":")[1])) for p in args.points.split(",")]
    copy_bw = copy_bandwidth()
    gen = torch.Generator(device="cuda").manual_seed(0)
    sizes = {}

    def configs():
        cache: dict = {}
        yield "idle", None  # (moe_power.sampled: the board idle)
        for shape, T in points:
            H, I, E, k = SHAPES[shape]
            touched = statistics.mean(int(torch.unique(routing(T, E, k, gen)[0]).numel()) for _ in range(4))
            mb = model_bytes(touched, T, H, I, k)
            sizes[shape, T] = mb
            yield f"{shape} T={T} layer", layer(shape, T, {}, gen, cache)
            # the same call with every code byte 0x00: what the weights' bits cost it (DRAM, decode, MMA operands)
            yield f"{shape} T={T} layer, codes 0x00", layer(shape, T, {}, gen, cache, codes="zero")
            # the energy of a read depends on the bits it moves: the floor reads random bytes, as the layer's fp4
            # codes are; uniform floats in [0, 1) (their high bits nearly constant) are read beside them
            total = torch.empty((), device="cuda")
            for what, words in (("random bytes", torch.empty(int(mb) // 4 * 4, dtype=torch.uint8, device="cuda")
                                 .random_().view(torch.float32)),
                                ("uniform floats", torch.empty(int(mb) // 4, device="cuda").uniform_())):
                yield f"{shape} T={T} read {mb / 1e9:.2f} GB {what}", lambda w=words: torch.sum(w, dim=0, out=total)
            a = torch.randn(T * k, H, device="cuda", generator=gen).to(torch.bfloat16)
            b = mxfp4_like(3 * I, H, gen).t()
            c = torch.empty(T * k, 3 * I, device="cuda", dtype=torch.bfloat16)
            yield f"{shape} T={T} bf16 GEMM [{T * k}, {H}] x [{H}, {3 * I}]", lambda: torch.mm(a, b, out=c)
            # the same GEMM on a zero weight operand: what the weights' values cost the math alone
            z = torch.zeros_like(b)
            yield f"{shape} T={T} bf16 GEMM, weights 0", lambda: torch.mm(a, z, out=c)

    windows, _ = sampled(configs(), args.secs)
    lines = [f"{torch.cuda.get_device_name()}; torch {torch.__version__}; copy bandwidth {copy_bw / 1e12:.2f} TB/s; "
             f"sustained {args.secs:.0f} s a configuration", *power_table(windows)]
    mean = {name: (us, mean_watts(sel)) for name, us, sel in windows}

    def window(start: str, end: str = "") -> tuple[float, float]:  # (us, W) of the configuration named so
        return next(v for n, v in mean.items() if n.startswith(start) and n.endswith(end))

    limit = power_limit(windows)
    p_idle, p_limit = mean["idle"][1], float("nan") if limit is None else limit
    lines.append(f"\nidle {p_idle:.0f} W, power limit {p_limit:.0f} W")
    lines.append(f"{'point':12} {'what':32} {'us':>8} {'% copy':>7} {'mJ':>7}")
    for shape, T in points:
        mb, pre = sizes[shape, T], f"{shape} T={T}"
        lay, lay_zero = mean[f"{pre} layer"], mean[f"{pre} layer, codes 0x00"]
        read, read_uniform = window(f"{pre} read", "random bytes"), window(f"{pre} read", "uniform floats")
        gemm, gemm_zero = window(f"{pre} bf16 GEMM ["), window(f"{pre} bf16 GEMM, weights 0")
        H, I, _, k = SHAPES[shape]
        fl, fl_zero = floor(read, gemm, p_idle, p_limit), floor(read_uniform, gemm_zero, p_idle, p_limit)
        tflops = layer_flops(T, H, I, k) / gemm[0] * 1e-6
        measured = [("layer", lay), ("layer, codes 0x00", lay_zero), (f"bf16 GEMM ({tflops:.0f} TFLOP/s)", gemm),
                    ("bf16 GEMM, weights 0", gemm_zero), ("read, random bytes", read),
                    ("read, uniform floats", read_uniform)]
        rows = [(what, us, us * watts * 1e-3) for what, (us, watts) in measured]
        rows += [("floor: read and GEMM serial", fl["serial"], float("nan")),
                 ("floor: shared at the limit", fl["shared"], fl["mj"]),
                 ("layer beyond the shared floor", float("nan"), rows[0][2] - fl["mj"]),
                 # the same on zero data (codes 0x00): the read of uniform floats is the nearest to theirs measured
                 ("floor on zero data, shared", fl_zero["shared"], fl_zero["mj"]),
                 ("layer 0x00 beyond that floor", float("nan"), rows[1][2] - fl_zero["mj"])]
        for what, us, mj in rows:
            pct = 100 * mb / (us * 1e-6) / copy_bw if us == us else float("nan")
            lines.append(f"{pre:12} {what:32} {us:8.1f} {pct:7.1f} {mj:7.1f}")
    report(lines, args.out, "moe_floor.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
