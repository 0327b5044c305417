"""Fused MXFP4 MoE benchmark on one GPU: our Triton W4A16 kernel vs bf16 and emulation.

Layers: DeepSeek-V3-like (H 7168, I 2048, 256 experts, top-8) and Kimi-K3-like (H 3584,
I 384 per rank, 896 experts, top-16); T = 1, 8, 64, 256, 4096 tokens, uniform random routing.
The MXFP4 weights exist in several copies (> 4.5 GB together), each call of a timed CUDA graph
uses the next copy and its own routing, so L2 never serves weights. Columns:

- triton: our kernel (default heuristic tiles; with --sweep also the best of a few tile sets;
  with --gemv-sweep, where the default takes the decode path without tensor cores, also the
  MMA path and a few other tile sets of that path); "path" names what the default ran
- MB: bytes the appendix byte model counts for the routing used (touched experts' fp4 + e8m0,
  x and y, the intermediate written and read), TB/s = MB / time, % of the device copy
  bandwidth measured in the same run (4 GiB copy_, read + write counted)
- bf16: torch._grouped_mm over the same routing with bf16 weights (plus the unfused glue:
  sort, gather, SiLU-mul, weighting, scatter-add), graph-replayed over rotating routings
- emul: dequantise every expert to bf16 (torch, chunked), then the bf16 path (vLLM's
  emulation shape of work)

    python benchmarks/moe_bench.py --out DIR [--sweep] [--gemv-sweep] [--shapes dsv3,k3] [--tokens 1,8,...]
        [--layout hopper_mma_xor|hopper_mma_rot|hopper_mma] [--grid rows2|t1] [--no-baselines] [--random-layout] [--compile-workers N]
        [--before PKG.kernels.triton_moe [--before-layout L] --rounds 3] [--triton-kernels DIR] [--variants JSON]
        [--codes random|zero] [--humming] [--routing uniform|skewed]

--before times another tree's default beside ours, interleaved round by round (the same config
drifts by up to 10-15% over a run on the H200), e.g. the previous release copied under another
package name; --compile-workers fills Triton's cache from N processes first.
--triton-kernels DIR times OpenAI's triton_kernels (DIR holds the ``triton_kernels`` package; see
tk_moe.py) on the same bytes and routing, interleaved with ours: "tk" with its routing step
(bitmatrix, sort; ours includes the align the same way), "tk_gemms" with the routing made
outside the graph; its output is checked once per layer against a float64 reference beside
ours (both with the swigluoai activation, the one triton_kernels fuses).
--humming times Humming's MXFP4 MoE (humming-kernels, the JIT-compiled CUDA kernels vLLM 0.33 / 0.34 pick for
Kimi-K3 and DeepSeek-V4 on sm90) on the same bytes and routing, driven as vLLM's HummingIndexedExperts drives it
(humming_moe.py), interleaved with ours; the routing's block alignment is made outside the graph; its output is
checked against the float64 reference beside ours at the second T and at T = 1024, before timing.
--routing skewed draws each token's experts from a zipf-like popularity (1 / rank over a random order of the
experts) instead of uniformly.
--variants '{"1": [{"block_n1": 128}], "8": [{"direct": 1}]}' times config overrides of the
default at those T, interleaved with the default (ratio: median over rounds of variant / the
default timed next to it); a "layout" key times the same weights in the other hopper layout
(hopper_mma_rot: weights in hopper_mma_w_rot; hopper_mma_xor: hopper_mma_w_xor; hopper_mma: hopper_mma_w).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time

import torch
import triton
import triton.testing

from mxfp4conv.codec import dequantize_mxfp4
import dataclasses

from mxfp4conv.kernels.triton_moe import HOPPER_SETS, LAYOUT_SETS, MoEConfig, fused_moe_triton, select_config, uses_gemv
from mxfp4conv.shuffle import get_layout

SHAPES = {"dsv3": (7168, 2048, 256, 8), "k3": (3584, 384, 896, 16)}
BPW = 0.5 + 1 / 32
SITU = {"beta": 4.0, "linear_beta": 25.0}
C = MoEConfig
SWEEP_SMALL = [C(16, 64, 128, 128, 4, 3, 1), C(16, 64, 128, 128, 4, 3, 1, maxnreg=96),
               C(16, 64, 128, 128, 4, 2, 1, maxnreg=96), C(16, 64, 128, 128, 4, 2, 1, maxnreg=80),
               C(16, 64, 128, 128, 4, 3, 0, maxnreg=128), C(16, 32, 64, 128, 4, 2, 1, maxnreg=72),
               C(16, 64, 128, 128, 4, 2, 1)]
GEMV_SWEEP = [dict(gemv_block_n1=16, gemv_block_n2=16, gemv_block_k=256),
              dict(gemv_block_n1=8, gemv_block_n2=16, gemv_block_k=512),
              dict(gemv_block_n1=64, gemv_block_n2=32, gemv_block_k=128)]
SWEEP_LARGE = [C(64, 128, 128, 64, 8, 3, 0), C(64, 128, 128, 64, 8, 3, 0, maxnreg=128),
               C(64, 128, 128, 64, 8, 2, 0), C(64, 64, 128, 64, 4, 3, 0), C(64, 64, 128, 64, 4, 3, 0, maxnreg=128),
               C(128, 128, 128, 64, 8, 3, 0)]


# hopper_mma layout: variants around the default. V9 = the v9 launch sequence (align, separate
# activation and k-sum kernels, no programmatic dependent launch), the "before" of the fused options.
V9 = dict(fused=0, direct=0, pdl=0)
HOPPER_SWEEP = [V9, dict(pdl=1), dict(maxnreg=128), dict(maxnreg=0), dict(maxnreg2=128), dict(maxnreg2=112),
                dict(block_n2=256, num_warps2=8), dict(block_n2=256, num_warps2=8, maxnreg2=128),
                dict(block_n2=64), dict(block_n2=64, maxnreg=128), dict(num_stages=4, maxnreg=128)]
HOPPER_SWEEP_T1 = [dict(pdl=0), dict(fused=0), dict(split_k1=2), dict(split_k1=8), dict(split_k2=1),
                   dict(block_n2=64, split_k1=8), dict(block_n2=64, split_k2=1), dict(block_n2=64, split_k1=8, split_k2=1),
                   dict(block_n2=64, maxnreg=128, split_k1=8)]
# more pairs per expert (prefill): block_t, tile rows and warps
HOPPER_SWEEP_LARGE = [V9, dict(pdl=1), dict(maxnreg=128), dict(block_n2=256, num_warps2=8)] + [
    dict(block_t=bt, block_n1=n1, block_n2=n2, num_warps=w, num_stages=s)
    for bt, n1, n2, w, s in ((32, 64, 128, 4, 3), (64, 64, 128, 4, 3), (64, 128, 128, 8, 3), (128, 128, 128, 8, 3),
                             (128, 128, 256, 8, 3), (64, 128, 256, 8, 3), (128, 128, 256, 8, 4))]


def _short(cfg, pairs, E) -> str:
    if uses_gemv(cfg, pairs, E):
        return (f"gemv n1={cfg.gemv_block_n1} n2={cfg.gemv_block_n2} k={cfg.gemv_block_k} "
                f"t={cfg.gemv_block_t or 'auto'} asm={cfg.gemv_asm}")
    return f"mma {cfg}"


def copy_bandwidth() -> float:
    n = 4 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=100, rep=400, return_mode="median")
    del a, b
    return 2 * n / (ms * 1e-3)


def captured(fns) -> torch.cuda.CUDAGraph:
    """A CUDA graph of all fns in turn, warmed on a side stream, captured and replayed once."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    return g


def graph_time_us(fns, replays=10) -> float:
    """Median time of one call, from CUDA-graph replays of all fns in turn."""
    g = captured(fns)
    times = []
    for _ in range(replays):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / len(fns))
    del g
    return statistics.median(times)


def weight_copies(H, I, E) -> int:
    """Copies of a layer's weights that together exceed L2 many times over (4.5 GB, at least 2): timing cycles
    through them, so no call finds its weights in L2."""
    return max(2, math.ceil(4.5e9 / (E * 3 * H * I * BPW)))


def make_weights(H, I, E, gen, codes="random"):
    """Random fp4 code bytes and e8m0 scales 118-121 (Gaussian weights quantised by quantize_mxfp4 come near: their
    codes hold 3.9 bits of entropy of 4 and set each bit 46-52% of the time); codes "zero": every code byte 0x00, the
    scales as they are."""
    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), device="cuda", dtype=torch.uint8, generator=gen)
    s13 = torch.randint(118, 122, (E, 2 * I, H // 32), device="cuda", dtype=torch.uint8, generator=gen)
    w2 = torch.randint(0, 256, (E, H, I // 2), device="cuda", dtype=torch.uint8, generator=gen)
    s2 = torch.randint(118, 122, (E, H, I // 32), device="cuda", dtype=torch.uint8, generator=gen)
    return zero_codes(w13, s13, w2, s2) if codes == "zero" else (w13, s13, w2, s2)


def zero_codes(w13, s13, w2, s2):
    """The weights with every fp4 code byte 0x00 (new tensors) and the same scales."""
    return torch.zeros_like(w13), s13, torch.zeros_like(w2), s2


ROUTING = "uniform"  # set from --routing
ZIPF_S = 1.0  # skewed routing: expert popularity 1 / rank^s


def routing(T, E, k, gen):
    """top-k ids [T, k] (int32) and weights summing to 1. uniform: every expert equally likely;
    skewed (ROUTING): expert popularity 1 / rank^ZIPF_S over a random order of the experts, k
    distinct experts a token drawn without replacement (Gumbel top-k)."""
    if ROUTING == "skewed":
        rank = torch.randperm(E, device="cuda", generator=gen).double() + 1
        logp = (-ZIPF_S * torch.log(rank)).float()
        u = torch.rand(T, E, device="cuda", generator=gen).clamp_(min=1e-20)
        ids = (logp - torch.log(-torch.log(u))).topk(k, dim=1).indices.to(torch.int32)
    else:
        ids = torch.rand(T, E, device="cuda", generator=gen).topk(k, dim=1).indices.to(torch.int32)
    tw = torch.rand(T, k, device="cuda", generator=gen)
    return ids, tw / tw.sum(1, keepdim=True)


def model_bytes(touched, T, H, I, k) -> float:
    return touched * 3 * H * I * BPW + T * H * 2 * 2 + T * k * I * 2 * 2


class Bf16MoE:
    """torch._grouped_mm MoE over bf16 weights [E, 2I, H] / [E, H, I] (sync-free, capturable)."""

    def __init__(self, w13, w2):
        self.w13t, self.w2t = w13.transpose(1, 2), w2.transpose(1, 2)
        self.E, self.I = w13.shape[0], w13.shape[1] // 2

    def __call__(self, x, ids, tw):
        T, k = ids.shape
        flat = ids.reshape(-1).long()
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(self.E, dtype=torch.int32, device=x.device).index_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        tok = order // k
        h = torch._grouped_mm(x[tok], self.w13t, offs=offs)
        a = torch.nn.functional.silu(h[:, :self.I]) * h[:, self.I:]
        y = torch._grouped_mm(a, self.w2t, offs=offs)
        y = y * tw.reshape(-1)[order, None].to(y.dtype)
        return torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device).index_add_(0, tok, y.float()).to(x.dtype)


def dequant_all(w, s, out, chunk=16):
    for a in range(0, w.shape[0], chunk):
        out[a:a + chunk].copy_(dequantize_mxfp4(w[a:a + chunk], s[a:a + chunk], dtype=torch.bfloat16))


# --grid rows2: GEMM2 row tiles per program, the default repeated between them (clock drift reference)
GRIDS = {"rows2": [dict(rows2=2), {}, dict(rows2=4), {}, dict(rows2=7), {}, dict(rows2=4, maxnreg2=0), {},
                   dict(rows2=4, block_n2=64), {}, dict(rows2=14, block_n2=64)],
         # one token: K splits, stages, K step, register caps, GEMM2 tiles
         "t1": [dict(split_k1=1), {}, dict(split_k1=2), dict(split_k1=3), dict(split_k1=6), {}, dict(num_stages=2),
                dict(num_stages=4), dict(block_k=64, num_stages=4), dict(block_k=64, num_stages=6), {},
                dict(maxnreg=96), dict(maxnreg=128), dict(block_n2=128, split_k2=1), dict(block_n2=128, split_k2=2),
                dict(split_k2=2), {}, dict(pdl=0), dict(split_k1=2, num_stages=4), {}]}
GRID = None  # set from --grid
CODES = "random"  # set from --codes


def sweep_for(layout, per_expert, T):
    """Config overrides tried besides the default (hopper_mma layouts), by pairs per touched expert."""
    if layout not in HOPPER_SETS:
        return None
    if GRID is not None:
        return GRIDS[GRID]
    if per_expert > 8:
        return HOPPER_SWEEP_LARGE
    return HOPPER_SWEEP + (HOPPER_SWEEP_T1 if T == 1 else [])


def _warm_worker(args):
    """Compile (run once on uninitialised weights) the configs of one shape in a child process,
    filling Triton's on-disk cache so the timing process finds every kernel compiled."""
    name, jobs, before, tk_path, before_layout = args
    H, I, E, k = SHAPES[name]  # jobs carry their configs: the grid is not needed here
    impl = fused_moe_triton
    if before:
        import importlib
        impl = importlib.import_module(before).fused_moe_triton
    w = (torch.empty(E, 2 * I, H // 2, dtype=torch.uint8, device="cuda"),
         torch.full((E, 2 * I, H // 32), 120, dtype=torch.uint8, device="cuda"),
         torch.empty(E, H, I // 2, dtype=torch.uint8, device="cuda"),
         torch.full((E, H, I // 32), 120, dtype=torch.uint8, device="cuda"))
    gen = torch.Generator(device="cuda").manual_seed(1)
    failed = 0
    tkm = None
    for T, cfg, layout in jobs:
        ids, tw = routing(T, E, k, gen)
        x = torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16)
        try:
            if cfg == "tk":
                if tkm is None:
                    import tk_moe
                    tkm = tk_moe.TkMoE(tk_moe.TritonKernels(tk_path), *w)
                tkm(x, ids, tw)
            elif cfg is None:  # the before tree's default
                impl(x, *w, tw, ids, activation="situ", activation_params=SITU, layout=before_layout or layout)
            else:
                fused_moe_triton(x, *w, tw, ids, activation="situ", activation_params=SITU, config=cfg, layout=layout)
        except Exception:  # reported again by the timing process
            failed += 1
    torch.cuda.synchronize()
    return failed


# a compile worker that also builds triton_kernels' copy of the weights held 18.7 GB against 6.2 GB without it
# (DSV3-like, on an H100)
TK_WORKER_FACTOR = 3


def fit_workers(name, jobs, workers, log) -> int:
    """The most of ``workers`` compile processes (each ``jobs[i::workers]``) whose weights fit the GPU's free
    memory: each holds its shape's weights once, three times if one of its jobs is triton_kernels', and about
    1 GiB of context and activations. Eight DSV3-like workers with triton_kernels beside them need more than an
    H100's 80 GB."""
    H, I, E, _ = SHAPES[name]
    weights = E * 3 * H * I * BPW
    free = torch.cuda.mem_get_info()[0] - (2 << 30)
    fitted = workers
    while fitted > 1:
        need = sum(weights * (TK_WORKER_FACTOR if any(j[1] == "tk" for j in jobs[i::fitted]) else 1) + (1 << 30)
                   for i in range(fitted) if jobs[i::fitted])
        if need <= free:
            break
        fitted -= 1
    if fitted < workers:
        log(f"  {name}: compiling in {fitted} process{'es' if fitted > 1 else ''}, not {workers}: their weights "
            f"would not fit the {free / 2**30:.0f} GiB the GPU has free")
    return fitted


def warm_compile(name, tokens, sweep, layout, workers, log, before=None, tk_path=None, variants=None,
                 before_layout=None):
    if workers <= 1:
        return
    import multiprocessing as mp
    H, I, E, k = SHAPES[name]
    jobs = []
    for T in tokens:
        default = select_config(T * k, E, H, I, layout)
        grid = sweep_for(layout, T * k / min(E, T * k), T) if sweep else None
        jobs += [(T, default, layout)] + [(T, dataclasses.replace(default, **h), layout) for h in (grid or [])]
        if before:
            jobs.append((T, None, layout))
        if tk_path:
            jobs.append((T, "tk", layout))
        for v in (variants or {}).get(str(T), []):
            cfg, lay = _variant(default, v, layout)
            jobs.append((T, cfg, lay))
    workers = fit_workers(name, jobs, workers, log)
    chunks = [jobs[i::workers] for i in range(workers)]
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(workers) as pool:
        failed = sum(pool.map(_warm_worker, [(name, c, before, tk_path, before_layout) for c in chunks if c]))
    log(f"  {name}: compiled {len(jobs)} configs in {workers} processes, {time.perf_counter() - t0:.0f}s"
        f"{f' ({failed} failed)' if failed else ''}")


def bench_shape(name, tokens, copy_bw, sweep, rows, log, gemv_sweep=False, layout="identity", baselines=True,
                random_layout=False, before=None, rounds=1, tk=None, variants=None, before_layout=None, hm=None):
    H, I, E, k = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    ncopies = weight_copies(H, I, E)
    copies = [make_weights(H, I, E, gen, CODES) for _ in range(ncopies)]
    if baselines:
        w13b = torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device="cuda")
        w2b = torch.empty(E, H, I, dtype=torch.bfloat16, device="cuda")
        dequant_all(copies[0][0], copies[0][1], w13b)
        dequant_all(copies[0][2], copies[0][3], w2b)
        bf16 = Bf16MoE(w13b, w2b)
    else:
        w13b = w2b = bf16 = None
    tkms, canon0 = None, None
    if tk is not None:  # triton_kernels' copies of the same bytes, made from the canonical layout
        import tk_moe
        tkms = [tk_moe.TkMoE(tk, *c) for c in copies]
        canon0 = copies[0]
    hms = None
    if hm is not None:  # Humming's copies of the same bytes, repacked from the canonical layout as vLLM does at load
        import humming_moe
        try:
            hms = [humming_moe.HummingMoE(hm, *c, SITU["beta"], SITU["linear_beta"]) for c in copies]
            canon0 = copies[0]
        except Exception as exc:
            import traceback
            log(f"  {name}: Humming's weight repack failed {type(exc).__name__}: {str(exc)[:300]}")
            log(traceback.format_exc()[-3000:])
    canonical = copies

    def laid_out(lay):  # the canonical copies in a hopper_mma layout set
        if random_layout:  # uniform random bytes are the stored bytes of other uniform random weights and
            return canonical  # scales in the same range: the conversion would only cost time
        Wl, Sl = (get_layout(n) for n in LAYOUT_SETS[lay])
        return [(Wl.forward(a), Sl.forward(b), Wl.forward(c), Sl.forward(d)) for a, b, c, d in canonical]

    if layout in HOPPER_SETS:
        copies = laid_out(layout)
    other = {}

    def relaid(lay):  # the copies in a variant's (or the before tree's) layout
        if lay not in other:
            if not {layout, lay} <= set(HOPPER_SETS):
                raise SystemExit(f"layout {lay!r} is not made from --layout {layout}")
            other[lay] = laid_out(lay)
        return other[lay]
    before_layout = before_layout or layout
    for T in tokens:
        routes = [routing(T, E, k, gen) for _ in range(ncopies)]
        xs = [torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(ncopies)]
        touched = statistics.mean(int(torch.unique(r[0]).numel()) for r in routes)
        mb = model_bytes(touched, T, H, I, k)

        def tri(cfg, lay=layout):
            ws = copies if lay == layout else relaid(lay)
            return [lambda c=c, cfg=cfg: fused_moe_triton(xs[c], *ws[c], routes[c][1], routes[c][0],
                                                           activation="situ", activation_params=SITU, config=cfg,
                                                           layout=lay)
                    for c in range(ncopies)]

        default = select_config(T * k, E, H, I, layout)
        path = layout if layout != "identity" else "gemv" if uses_gemv(default, T * k, E) else "mma"
        try:
            t_def = graph_time_us(tri(default))
        except Exception as exc:  # report it and time the other path (raw layout) / no PDL (hopper_mma) instead
            log(f"  {name} T={T} default {path} failed {type(exc).__name__}: {str(exc)[:200]}")
            if layout in HOPPER_SETS:
                default, path = dataclasses.replace(default, pdl=0), f"{layout} (pdl failed)"
            else:
                default, path = dataclasses.replace(default, gemv_max_pairs=0), "mma (gemv failed)"
            t_def = graph_time_us(tri(default))
        # timed beside ours, interleaved round by round (clocks drift over a run): another tree's
        # default, triton_kernels (with and without its routing step), config variants
        side = {}
        if before is not None:
            wb = copies if before_layout == layout else relaid(before_layout)
            side["before"] = [lambda c=c: before.fused_moe_triton(xs[c], *wb[c], routes[c][1], routes[c][0],
                                                                  activation="situ", activation_params=SITU,
                                                                  layout=before_layout) for c in range(ncopies)]
        if tkms is not None:
            side["tk"] = [lambda c=c: tkms[c](xs[c], routes[c][0], routes[c][1]) for c in range(ncopies)]
            preps = [tkms[c].prepare(routes[c][0], routes[c][1]) for c in range(ncopies)]
            side["tk_gemms"] = [lambda c=c: tkms[c].run(xs[c], preps[c]) for c in range(ncopies)]
        if hms is not None:  # the routing aligned outside the graph (vLLM's align is its own CUDA op)
            hpreps = [hms[c].prepare(routes[c][0]) for c in range(ncopies)]
            side["humming"] = [lambda c=c: hms[c].run(xs[c], routes[c][1], hpreps[c]) for c in range(ncopies)]
            if T in (tokens[min(1, len(tokens) - 1)], 1024):
                try:
                    check_peer(name, T, hms[0], "Humming", "situ", SITU, canon0, copies[0], xs[0], routes[0], layout, log)
                except Exception as exc:
                    import traceback
                    log(f"  {name} T={T} Humming check failed {type(exc).__name__}: {str(exc)[:300]}")
                    log(traceback.format_exc()[-3000:])
        for v in (variants or {}).get(str(T), []):
            cfg, lay = _variant(default, v, layout)
            side[_diff(cfg, default) + (f" layout={lay}" if lay != layout else "")] = tri(cfg, lay)
        res = {}
        if side:
            ours, times, ratios = [t_def], {n: [] for n in side}, {n: [] for n in side}
            for _ in range(rounds):
                for n, fns in side.items():
                    try:
                        times[n].append(graph_time_us(fns))
                    except Exception as exc:
                        log(f"  {name} T={T} {n}: failed {type(exc).__name__}: {str(exc)[:300]}")
                        if n.startswith("tk") or n == "humming":
                            import traceback
                            log(traceback.format_exc()[-3000:])
                        times[n].append(float("nan"))
                ours.append(graph_time_us(tri(default)))
                for n in side:
                    ratios[n].append(times[n][-1] / ours[-1])
            t_def = statistics.median(ours)
            for n in side:
                res[n] = statistics.median(times[n])
                log(f"  {name} T={T} {n}: {res[n]:.1f} us, ours {t_def:.1f} us, {n} / ours {statistics.median(ratios[n]):.3f} "
                    f"(rounds {' '.join(f'{t:.1f}' for t in times[n])}; ours {' '.join(f'{t:.1f}' for t in ours)})")
        t_before = res.get("before", float("nan"))
        if tkms is not None and T == tokens[min(1, len(tokens) - 1)]:
            check_peer(name, T, tkms[0], "triton_kernels", "swigluoai", {"alpha": 1.702, "limit": 7.0}, canon0,
                       copies[0], xs[0], routes[0], layout, log)
        best_t, best_cfg = t_def, default
        extra = []
        if gemv_sweep and uses_gemv(default, T * k, E):  # the other path and other tiles of this one
            extra = [dataclasses.replace(default, gemv_max_pairs=0)] + [dataclasses.replace(default, **g) for g in GEMV_SWEEP]
        elif gemv_sweep and uses_gemv(dataclasses.replace(default, gemv_max_pairs=4), T * k, E):
            extra = [dataclasses.replace(default, gemv_max_pairs=4)]  # the decode path just past its threshold
        if sweep and layout in HOPPER_SETS:
            extra += [dataclasses.replace(default, **h) for h in sweep_for(layout, T * k / min(E, T * k), T)]
        elif sweep:
            extra += SWEEP_LARGE if T * k / min(E, T * k) > 32 else SWEEP_SMALL
        if extra:
            for cfg in extra:
                try:
                    t = graph_time_us(tri(cfg))
                except Exception as exc:  # a tile set that does not fit (shared memory) is skipped
                    log(f"  {name} T={T} {cfg}: failed {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                log(f"  {name} T={T} {_short(cfg, T * k, E) if layout == 'identity' else _diff(cfg, default)}: "
                    f"{t:.1f} us ({100 * mb / (t * 1e-6) / copy_bw:.1f}% copy, {t / t_def:.3f}x default)")
                if t < best_t:
                    best_t, best_cfg = t, cfg
        if not baselines:
            t_bf16 = t_emul = float("nan")
        else:
            t_bf16, t_emul = time_baselines(bf16, xs, routes, copies, w13b, w2b, ncopies, log)
        floor = mb / copy_bw * 1e6
        flops = 2 * T * k * 3 * H * I
        row = dict(shape=name, T=T, path=path, touched=touched, MB=mb / 1e6, floor_us=floor, triton_us=t_def,
                   tbps=mb / (t_def * 1e-6) / 1e12, pct_copy=100 * mb / (t_def * 1e-6) / copy_bw,
                   tflops=flops / (t_def * 1e-6) / 1e12, before_us=t_before,
                   tk_us=res.get("tk", float("nan")), tk_gemms_us=res.get("tk_gemms", float("nan")),
                   humming_us=res.get("humming", float("nan")), routing=ROUTING,
                   best_us=best_t, best_cfg=str(best_cfg),
                   best_tbps=mb / (best_t * 1e-6) / 1e12, bf16_us=t_bf16, bf16_speedup=t_bf16 / best_t,
                   emul_us=t_emul, emul_speedup=t_emul / best_t, copy_tbps=copy_bw / 1e12)
        rows.append(row)
        log(f"{name} T={T}: triton {t_def:.1f} us (best {best_t:.1f}), bf16 {t_bf16:.1f}, emul {t_emul:.0f}, "
            f"floor {floor:.1f}, {row['pct_copy']:.1f}% copy, {row['tflops']:.0f} TFLOP/s")
        del routes, xs
    del copies, w13b, w2b, bf16, tkms, canon0, hms
    torch.cuda.empty_cache()


def check_peer(name, T, peer, label, activation, params, canon, copy, x, route, layout, log):
    """A peer kernel (``label``) and ours on one routing, both with ``activation``, against a float64
    reference from the canonical bytes: relative errors (||out - ref|| / ||ref||) of each, and
    between them."""
    from gpu_check import reference
    ids, tw = route
    ref = reference(x, *canon, tw, ids, activation, params)
    ours = fused_moe_triton(x, *copy, tw, ids, activation=activation, activation_params=params, layout=layout)
    theirs = peer(x, ids, tw)
    rel = lambda a, b: float((a.double() - b.double()).norm() / b.double().norm())
    log(f"  {name} T={T} accuracy ({activation}, bf16): ours {rel(ours, ref):.2e}, {label} {rel(theirs, ref):.2e}, "
        f"between them {rel(theirs, ours):.2e}; {label} finite: {bool(torch.isfinite(theirs).all())}")


def _variant(default, overrides: dict, layout: str):
    """(config, layout) of a --variants entry: config overrides, and "layout" for the weights' layout."""
    o = dict(overrides)
    return dataclasses.replace(default, **{k: v for k, v in o.items() if k != "layout"}), o.get("layout", layout)


def _diff(cfg, default) -> str:
    """The fields in which cfg differs from default, as key=value."""
    d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if getattr(cfg, f.name) != getattr(default, f.name)}
    return " ".join(f"{a}={b}" for a, b in d.items()) or "(default)"


def time_baselines(bf16, xs, routes, copies, w13b, w2b, ncopies, log):
    """bf16 grouped_mm (graph-replayed) and the emulation (dequantise everything, then bf16)."""
    try:
        t_bf16 = graph_time_us([lambda c=c: bf16(xs[c], *routes[c]) for c in range(ncopies)])
    except Exception as exc:  # grouped_mm not capturable here: time it eagerly instead
        log(f"  bf16 graph capture failed ({type(exc).__name__}: {str(exc)[:100]}); eager do_bench")
        torch.cuda.synchronize()
        t_bf16 = 1e3 * triton.testing.do_bench(lambda: bf16(xs[0], *routes[0]), return_mode="median")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    emul = []
    for rep in range(2):
        e0.record()
        dequant_all(copies[0][0], copies[0][1], w13b)
        dequant_all(copies[0][2], copies[0][3], w2b)
        bf16(xs[0], *routes[0])
        e1.record()
        e1.synchronize()
        emul.append(e0.elapsed_time(e1) * 1e3)
    return t_bf16, min(emul)


def plot(rows, path, copy_bw):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in dict.fromkeys(r["shape"] for r in rows):
        rs = [r for r in rows if r["shape"] == name]
        T = [r["T"] for r in rs]
        axes[0].plot(T, [r["best_us"] for r in rs], "o-", label=f"{name} triton W4A16")
        axes[0].plot(T, [r["bf16_us"] for r in rs], "s--", label=f"{name} bf16 grouped_mm")
        axes[0].plot(T, [r["floor_us"] for r in rs], ":", label=f"{name} byte floor")
        axes[1].plot(T, [r["best_tbps"] for r in rs], "o-", label=f"{name} triton")
    axes[1].axhline(copy_bw / 1e12, color="k", ls=":", label="copy bandwidth")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("tokens")
        ax.legend(fontsize=7)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("time per layer (us)")
    axes[1].set_ylabel("effective TB/s (byte model)")
    fig.suptitle(f"MXFP4 MoE layer on {torch.cuda.get_device_name()}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--gemv-sweep", action="store_true")
    ap.add_argument("--shapes", default="dsv3,k3")
    ap.add_argument("--tokens", default="1,8,64,256,4096")
    ap.add_argument("--layout", default="identity",
                    help="weight layout the kernel reads: identity, hopper_mma_xor (what convert writes for sm90), "
                         "hopper_mma_rot or hopper_mma (the earlier bit orders)")
    ap.add_argument("--no-baselines", action="store_true", help="skip the bf16 grouped_mm and emulation columns")
    ap.add_argument("--random-layout", action="store_true",
                    help="hopper_mma: time on random bytes as stored, without converting them (same timing)")
    ap.add_argument("--compile-workers", type=int, default=1,
                    help="compile every config first in N processes (fewer where their weights would not fit the "
                         "GPU's free memory)")
    ap.add_argument("--compile-only", action="store_true", help="only that compilation (fills Triton's cache)")
    ap.add_argument("--before", default=None,
                    help="module path of another tree's fused_moe_triton (PKG.kernels.triton_moe; PKG.runtime.triton_moe "
                         "in trees before 2026-12-07), e.g. a copy of the previous release under another package "
                         "name: its default timed beside ours, interleaved")
    ap.add_argument("--before-layout", default=None,
                    help="the layout the --before tree reads (default: --layout), e.g. hopper_mma for a tree "
                         "from before hopper_mma_rot")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds with --before (median)")
    ap.add_argument("--triton-kernels", default=None, metavar="DIR",
                    help="directory holding OpenAI's triton_kernels package: timed beside ours (tk_moe.py)")
    ap.add_argument("--humming", action="store_true",
                    help="time Humming's MXFP4 MoE (the humming-kernels package, as vLLM drives it on sm90; "
                         "humming_moe.py) beside ours, interleaved")
    ap.add_argument("--routing", default="uniform", choices=["uniform", "skewed"],
                    help="skewed: expert popularity 1 / rank (zipf-like) over a random order of the experts")
    ap.add_argument("--variants", default=None, help="JSON {T: [config overrides]} timed beside the default")
    ap.add_argument("--grid", default=None, choices=sorted(GRIDS), help="hopper_mma sweep grid instead of the default ones")
    ap.add_argument("--codes", default="random", choices=["random", "zero"],
                    help="zero: every fp4 code byte 0x00, the scales as they are: what the weights' bits cost a call "
                         "where it runs at the power limit (the outputs are all zero)")
    args = ap.parse_args()
    global GRID, CODES, ROUTING
    GRID, CODES, ROUTING = args.grid, args.codes, args.routing
    tag = "" if args.routing == "uniform" else f"_{args.routing}"
    logf = open(f"{args.out}/moe_bench{tag}{'_compile' if args.compile_only else ''}.log", "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    tokens = [int(t) for t in args.tokens.split(",")]
    import json
    variants = json.loads(args.variants) if args.variants else None
    if args.compile_only:
        for name in args.shapes.split(","):
            warm_compile(name, tokens, args.sweep, args.layout, max(2, args.compile_workers), log, args.before,
                         args.triton_kernels, variants, args.before_layout)
        return 0
    copy_bw = copy_bandwidth()
    log(f"{torch.cuda.get_device_name()} copy bandwidth {copy_bw / 1e12:.2f} TB/s; torch {torch.__version__}, triton {triton.__version__}")
    if CODES != "random":
        log(f"weights: every fp4 code byte 0x00 (--codes {CODES}), e8m0 scales 118-121")
    rows = []
    for name in args.shapes.split(","):
        warm_compile(name, tokens, args.sweep, args.layout, args.compile_workers, log, args.before,
                     args.triton_kernels, variants, args.before_layout)
    before = None
    if args.before:
        import importlib
        before = importlib.import_module(args.before)
    tk = None
    if args.triton_kernels:
        import tk_moe
        try:
            tk = tk_moe.TritonKernels(args.triton_kernels)
        except Exception as exc:  # say why, time the rest
            import traceback
            log(f"triton_kernels from {args.triton_kernels} could not be imported: {type(exc).__name__}: {exc}")
            log(traceback.format_exc())
    hm = None
    if args.humming:
        import humming_moe
        try:
            hm = humming_moe.Humming()
            log(f"Humming: {hm.describe()}; driven as vLLM 0.33.0 / 0.34.0's HummingIndexedExperts")
        except Exception as exc:  # say why, time the rest
            import traceback
            log(f"humming could not be imported: {type(exc).__name__}: {exc}")
            log(traceback.format_exc())
    log(f"routing: {args.routing}")
    for name in args.shapes.split(","):
        bench_shape(name, tokens, copy_bw, args.sweep, rows, log, args.gemv_sweep, args.layout,
                    baselines=not args.no_baselines, random_layout=args.random_layout, before=before,
                    rounds=args.rounds, tk=tk, variants=variants, before_layout=args.before_layout, hm=hm)
    with open(f"{args.out}/moe_bench{tag}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    try:
        plot(rows, f"{args.out}/moe_bench{tag}.png", copy_bw)
    except Exception as exc:
        log(f"plot failed: {exc}")
    log(f"\ncopy bandwidth {copy_bw / 1e12:.2f} TB/s")
    log(f"{'shape':6s} {'T':>5s} {'path':>5s} {'touch':>6s} {'MB':>7s} {'floor':>7s} {'triton':>8s} {'TB/s':>5s} {'%copy':>6s} "
        f"{'TFLOP/s':>7s} {'before':>8s} {'x bef':>6s} {'tk':>8s} {'tk/ours':>7s} {'tkgemm':>8s} {'humming':>8s} {'hum/ours':>8s} {'best':>8s} {'bf16':>8s} {'x bf16':>6s} {'emul':>8s} {'x emul':>7s}")
    for r in rows:
        log(f"{r['shape']:6s} {r['T']:5d} {r['path'][:5]:>5s} {r['touched']:6.0f} {r['MB']:7.0f} {r['floor_us']:7.1f} {r['triton_us']:8.1f} "
            f"{r['tbps']:5.2f} {r['pct_copy']:5.1f}% {r['tflops']:7.0f} {r['before_us']:8.1f} {r['before_us'] / r['triton_us']:6.3f} "
            f"{r['tk_us']:8.1f} {r['tk_us'] / r['triton_us']:7.3f} {r['tk_gemms_us']:8.1f} "
            f"{r['humming_us']:8.1f} {r['humming_us'] / r['triton_us']:8.3f} "
            f"{r['best_us']:8.1f} {r['bf16_us']:8.1f} {r['bf16_speedup']:6.2f} {r['emul_us']:8.0f} {r['emul_speedup']:7.1f}")
    for r in rows:
        log(f"best config {r['shape']} T={r['T']}: {r['best_cfg']}")
    logf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
