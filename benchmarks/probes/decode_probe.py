"""What the weight decode costs the MoE layer's kernels: the layer beside the same kernels with the decode taken out.

Two timing probes, whose outputs are wrong (``triton_hopper_kernels.PROBE_IDS``): ``nodecode`` makes each weight
word's four bf16 pairs in three logic instructions in place of the decode's 8 and applies the e8m0 factors as usual
(in the hopper_mma kernels and in the Gluon kernels of a few pairs an expert); ``noscale`` (hopper_mma kernels only)
xors each word with its lane's scale word and takes that as the pairs: every weight and scale byte still loaded, one
integer instruction a word, no factors. Everything else is the hopper_mma_w_xor layer's: grids, loads, x tiles, MMAs,
epilogues, the align and the k-sum. Where the default runs a point on the hopper_mma kernels both probes run beside
it, each GEMM of theirs capped at the default's registers where ptxas would take more (``probe_caps``); where it runs
on the Gluon kernels, ``nodecode`` does, on the default's loops (``loop_tuning`` of the xor order).

Two measurements a point: moe_bench.py's (CUDA-graph replays over weight copies that defeat L2, rounds interleaved,
ratio = median over rounds of a probe / the default timed beside it; % of the copy bandwidth measured in the same
run), then moe_power.py's (each kernel set sustained for --secs on one weight copy, nvidia-smi sampled every 100 ms:
W, SM clock, energy a call).

    python benchmarks/probes/decode_probe.py [--points dsv3:256,dsv3:1024,k3:1024] [--rounds 3] [--secs 3] [--out DIR]
        [--compile-workers 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(_HERE, ".."), os.path.join(_HERE, "..", "..")]  # the probes, the tools, the repository

import torch  # noqa: E402

from mxfp4conv.kernels.triton_moe import gluon_few_tokens as GF  # noqa: E402
from mxfp4conv.kernels.triton_moe import hopper_kernels as HK  # noqa: E402
from mxfp4conv.kernels import triton_moe as M  # noqa: E402
from moe_bench import (SHAPES, SITU, _warm_worker, copy_bandwidth, fit_workers, graph_time_us,  # noqa: E402
                       make_weights, model_bytes, routing, weight_copies)
from moe_power import power_table, sampled  # noqa: E402

BASE = "hopper_mma_xor"


def _rebind(name: str, value) -> None:
    """name = value in every module of the kernel package that imported the same object (each holds its own binding)."""
    old = getattr(M.layouts, name, None) or getattr(M.gluon_choice, name)
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith(M.__name__) and getattr(mod, name, None) is old:
            setattr(mod, name, value)


def register_probes() -> dict[str, str]:
    """The probes as layouts of this process only, {probe: layout}: hopper_mma_xor's bytes, read with a probe's
    decode (nodecode in the Gluon kernels too)."""
    layouts = {}
    for probe, rot in HK.PROBE_IDS.items():
        layouts[probe] = f"hopper_mma_probe_{probe}"
        M.LAYOUT_SETS[layouts[probe]] = M.LAYOUT_SETS[BASE]
        M.HOPPER_ORDERS[layouts[probe]] = probe
        HK.ORDER_IDS[probe] = rot
    _rebind("HOPPER_SETS", tuple(M.HOPPER_ORDERS))
    GF.WORDS32_PTX["nodecode"] = GF.words32_ptx("nodecode")
    _rebind("GLUON_SETS", M.GLUON_SETS + (layouts["nodecode"],))
    tuning = M.gluon_choice.loop_tuning

    def xor_tuning(cfg, grouped, k1, rows2, programs1=0, sms=0, order="rot"):  # the Gluon probe on the default's loops
        return tuning(cfg, grouped, k1, rows2, programs1, sms, "xor" if order == "nodecode" else order)
    _rebind("loop_tuning", xor_tuning)
    return layouts


def _warm(args):
    """moe_bench's compile worker, with the probes registered in its process."""
    register_probes()
    return _warm_worker(args)


def warm_compile(points, probes, workers: int, log) -> None:
    """Every point's kernel sets compiled first in worker processes (Triton's on-disk cache)."""
    import multiprocessing as mp
    t0 = time.perf_counter()
    jobs = {}
    for shape, T in points:
        H, I, E, k = SHAPES[shape]
        cfg = M.select_config(T * k, E, H, I, BASE)
        jobs.setdefault(shape, []).extend((T, cfg, lay) for lay in (BASE, *probes.values()))
    workers = min(fit_workers(shape, js, workers, log) for shape, js in jobs.items())
    args = [(shape, js[i::workers], None, None, None) for shape, js in jobs.items() for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        failed = sum(pool.map(_warm, [a for a in args if a[1]]))
    log(f"  compiled {sum(map(len, jobs.values()))} kernel sets in {workers} processes, "
        f"{time.perf_counter() - t0:.0f} s{f' ({failed} failed)' if failed else ''}")


def programs_an_sm(registers: int, smem_kb: int, warps: int) -> int:
    """Programs of a kernel one Hopper SM holds at once: its 64K registers (allocated 8 a thread at a time) and its
    228 KB of shared memory (1 KB of it kept by the driver for each program)."""
    return min(65536 // (32 * warps * -(-registers // 8) * 8), 228 // (smem_kb + 1))


def probe_caps(shape: str, T: int, cfg, probes: dict[str, str]) -> dict[str, dict]:
    """{probe: config overrides}: with fewer instructions ptxas may give a probe's hopper_mma GEMM more registers, and
    fewer of its programs would then share an SM than the default's; there the GEMM is capped at the most registers
    that keep the default's count. From their sm_90a SASS compiled with this Triton as the runtime compiles them
    (hopper_sass.py)."""
    import hopper_sass as S

    def usage(layout, c):
        _, c1, c2 = S.point_constants(shape, T, {}, layout, "situ", SITU)
        out = []
        for fn, consts, second in ((HK.moe_hgemm1_kernel, c1, False), (HK.moe_hgemm2_kernel, c2, True)):
            launch = M.launch._launch_options(c, second=second)
            _, text = S.compile_sass(fn, consts, launch["num_warps"], launch["num_stages"], None, "",
                                     launch.get("maxnreg"))
            regs, smem = (int(text.split(key)[1].split()[0].rstrip("K")) for key in ("REG:", "SMEM:"))
            out.append(programs_an_sm(regs, smem, launch["num_warps"]))
        return out

    base = usage(BASE, cfg)
    caps = {}
    for probe, layout in probes.items():
        over = {}
        for second, (want, got) in enumerate(zip(base, usage(layout, cfg))):
            warps = M.launch._launch_options(cfg, second=bool(second))["num_warps"]
            if got < want:
                over["maxnreg2" if second else "maxnreg"] = 65536 // (32 * warps * want) // 8 * 8
        if "maxnreg" in over and "maxnreg2" not in over:  # (maxnreg caps GEMM2 too unless maxnreg2 is set)
            over["maxnreg2"] = M.launch._launch_options(cfg, second=True).get("maxnreg", 0)
        caps[probe] = over
    return caps


def calls(inputs, layout: str, cfg) -> list:
    """One layer call a (x, weights, routing) of inputs, as closures."""
    return [lambda x=x, w=w, r=r: M.fused_moe_triton(x, *w, r[1], r[0], activation="situ", activation_params=SITU,
                                                     config=cfg, layout=layout)
            for x, w, r in inputs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", default="dsv3:256,dsv3:1024,k3:1024", help="shape:T,... (shapes dsv3, k3)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--secs", type=float, default=3.0, help="seconds each kernel set runs sustained (0: skip)")
    ap.add_argument("--out", default=None, help="directory for the log")
    ap.add_argument("--compile-workers", type=int, default=8, help="processes that compile the kernels first (1: none)")
    args = ap.parse_args()
    probes = register_probes()
    points = [(p.split(":")[0], int(p.split(":")[1])) for p in args.points.split(",")]
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    copy_bw = copy_bandwidth()
    log(f"{torch.cuda.get_device_name()} copy bandwidth {copy_bw / 1e12:.2f} TB/s; torch {torch.__version__}")
    if args.compile_workers > 1:
        warm_compile(points, probes, args.compile_workers, log)
    gen = torch.Generator(device="cuda").manual_seed(0)
    table, power_sets = [], []
    for shape, T in points:
        H, I, E, k = SHAPES[shape]
        ncopies = weight_copies(H, I, E)
        copies = [make_weights(H, I, E, gen) for _ in range(ncopies)]  # random bytes: valid stored bytes
        routes = [routing(T, E, k, gen) for _ in range(ncopies)]
        xs = [torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(ncopies)]
        mb = model_bytes(statistics.mean(int(torch.unique(r[0]).numel()) for r in routes), T, H, I, k)
        cfg = M.select_config(T * k, E, H, I, BASE)
        per_pair = M.gluon_choice.gluon_plan(cfg, xs[0], copies[0], k, BASE) is not None
        grouped = not per_pair and M.gluon_choice.grouped_plan(cfg, xs[0], copies[0], k, BASE, E) is not None
        gluon = per_pair or grouped
        if gluon:  # the same kernels, required: a probe that failed to compile would raise, not run other kernels
            cfg = dataclasses.replace(cfg, gluon=1, **({"gluon_grouped": 1} if grouped else {}))
        inputs = list(zip(xs, copies, routes))
        del copies, routes, xs
        kernels = "Gluon" if gluon else "hopper_mma"
        sets = {f"xor ({kernels})": calls(inputs, BASE, cfg)}
        caps = {} if gluon else probe_caps(shape, T, cfg, probes)
        for p in ("nodecode",) if gluon else probes:
            over = caps.get(p, {})
            name = f"{p} ({kernels}{''.join(f', {n}={v}' for n, v in over.items())})"
            sets[name] = calls(inputs, probes[p], dataclasses.replace(cfg, **over))
        times = {n: [] for n in sets}
        for _ in range(args.rounds):
            for n, fns in sets.items():
                times[n].append(graph_time_us(fns))
        base = times[f"xor ({kernels})"]
        for n in sets:
            t = statistics.median(times[n])
            ratio = statistics.median(a / b for a, b in zip(times[n], base))
            table.append((f"{shape} T={T}", n, t, 100 * mb / (t * 1e-6) / copy_bw, ratio))
            log(f"  {shape} T={T} {n}: {t:.1f} us, {table[-1][3]:.1f}% copy, / xor {ratio:.3f} "
                f"(rounds {' '.join(f'{v:.1f}' for v in times[n])})")
        log(f"  {shape} T={T}: 60% of copy is {mb / (0.6 * copy_bw) * 1e6:.1f} us, "
            f"75% {mb / (0.75 * copy_bw) * 1e6:.1f}")
        # sustained on the first weight copy (over 1.8 GB a layer: L2 serves none of it)
        power_sets += [(f"{shape} T={T} {n}", fns[0]) for n, fns in sets.items()] if args.secs > 0 else []
        del inputs, sets
        torch.cuda.empty_cache()
    log(f"\n{'point':14} {'kernels':24} {'us':>8} {'% copy':>7} {'/ xor':>6}")
    for row in table:
        log(f"{row[0]:14} {row[1]:24} {row[2]:8.1f} {row[3]:7.1f} {row[4]:6.3f}")
    if power_sets:
        _power(power_sets, args.secs, log)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "decode_probe.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


def _power(power_sets, secs, log) -> None:
    """moe_power.py's sustained runs, nvidia-smi sampled meanwhile."""
    windows, _ = sampled(power_sets, secs)
    log(f"\nsustained {secs:.0f} s each")
    for line in power_table(windows, 40):
        log(line)


if __name__ == "__main__":
    sys.exit(main())
