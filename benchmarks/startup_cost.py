"""The start-up work of the expert path, per rank: vLLM's default loader on the source checkpoint
against the vLLM plugin on the converted one, for Kimi-K3, DeepSeek-V4 (Pro, Flash) and
gpt-oss-120b at their real sizes, tensor parallel 8 and 1.

Bytes read (computed from the geometries; no checkpoint needed). vLLM 0.33 / 0.34's default
loader (``safetensors_weights_iterator``, default load strategy) opens every shard and calls
``get_tensor`` on every tensor; only under expert parallelism (``local_expert_ids``) are experts
of other ranks skipped before the read. The tensor-parallel weight loaders then narrow the full
tensor to the rank's slice. So with tensor parallelism every rank reads the whole checkpoint.
The plugin loads the non-expert tensors the same way (every rank reads them whole) and reads only
its own rank's stacked expert tensors ``{P}.experts.rank{r}.*``, then checks their crc32.

GPU work at load (``--gpu``, measured on the device, one layer per rank at each tp, random bytes
of the real shapes): what vLLM runs on the source's experts before serving, with its own code
where it runs here: Humming's repack (``convert_humming`` + ``prepare_and_transform_humming_tensors``
as vLLM calls them; vLLM's sm90 pick for Kimi-K3 and DeepSeek-V4), triton_kernels' Hopper MX
swizzle for gpt-oss (``--triton-kernels DIR``; vLLM's sm90 pick for gpt-oss), and the AITER a16w4
sequence (shuffle_weight_a16w4, shuffle_scale_a16w4, e8m0_shuffle: mxfp4conv's torch ports run on
this GPU) as a stand-in for gfx950, which is not here. Time per layer, the model's total, and the
extra peak GPU memory over holding the layer once. The converted checkpoint needs none of it,
except one canary layer per kind that the plugin has vLLM convert (judge.py).

    python benchmarks/startup_cost.py [--read-gbps 2.0] [--crc-gbps 13.1]
    python benchmarks/startup_cost.py --gpu --out DIR [--triton-kernels DIR] [--read-file-gib 4]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BPW = 0.5 + 1 / 32  # bytes an MXFP4 weight takes with its e8m0 scale


@dataclass(frozen=True)
class Model:
    name: str
    layers: int  # MoE layers
    experts: int
    hidden: int  # the experts' K (Kimi-K3: the latent 3584)
    inter: int  # per expert
    checkpoint_bytes: float  # the whole source checkpoint
    bias: bool = False  # bf16 expert biases (gpt-oss)
    sm90: str = "humming"  # what vLLM 0.33 / 0.34 picks on sm90

    def layer_bytes(self, tp: int = 1) -> float:
        """One layer's expert bytes on one rank (tp slices the intermediate)."""
        i = self.inter_per_rank(tp)
        b = self.experts * 3 * self.hidden * i * BPW
        if self.bias:
            b += self.experts * (2 * i + self.hidden) * 2
        return b

    def inter_per_rank(self, tp: int) -> int:
        return math.ceil(self.inter / tp / 32) * 32  # a whole MX block per rank


# sizes: shared/reference checkpoint-formats (config.json values; checkpoint totals as published)
MODELS = [
    Model("Kimi-K3", 92, 896, 3584, 3072, 1561e9),
    Model("DeepSeek-V4-Pro", 61, 384, 7168, 3072, 865e9),
    Model("DeepSeek-V4-Flash", 43, 256, 4096, 2048, 160e9),
    Model("gpt-oss-120b", 36, 128, 2880, 2880, 60.8 * 2**30, bias=True, sm90="triton_kernels"),
]


def bytes_table(read_gbps: float, crc_gbps: float) -> list[dict]:
    rows = []
    for m in MODELS:
        experts = m.layers * m.layer_bytes(1)
        other = m.checkpoint_bytes - experts
        for tp in (8, 1):
            conv_experts = m.layers * m.layer_bytes(tp)
            src = m.checkpoint_bytes  # every rank reads every tensor whole
            conv = other + conv_experts
            rows.append(dict(model=m.name, tp=tp, source_gb=src / 1e9, converted_gb=conv / 1e9,
                             source_host_gb=tp * src / 1e9, converted_host_gb=(tp * other + tp * conv_experts) / 1e9,
                             source_s=src / (read_gbps * 1e9), converted_s=conv / (read_gbps * 1e9),
                             crc_s=conv_experts / (crc_gbps * 1e9), rank_expert_gb=conv_experts / 1e9))
    return rows


def read_speed(path: Path, gib: int, log) -> dict:
    """Sequential read of a fresh file with O_DIRECT (the page cache bypassed), then again buffered."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dd", "if=/dev/urandom", f"of={path}", "bs=64M", f"count={gib * 16}", "status=none"], check=True)
    subprocess.run(["sync"], check=True)
    out = {}
    for mode, flags in (("direct", ["iflag=direct"]), ("buffered", [])):
        t0 = time.perf_counter()
        subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=64M", "status=none", *flags], check=True)
        out[mode] = gib * 2**30 / (time.perf_counter() - t0) / 1e9
    path.unlink()
    log(f"read speed of {gib} GiB on this machine: O_DIRECT {out['direct']:.2f} GB/s, buffered (page cache "
        f"after the write) {out['buffered']:.2f} GB/s")
    return out


def gpu_layer(m: Model, tp: int, how: str, hm, tk, log) -> dict:
    """One rank's layer of random MXFP4 bytes converted the way ``how`` says; seconds and extra peak bytes."""
    import torch
    E, H, I = m.experts, m.hidden, m.inter_per_rank(tp)
    g = torch.Generator(device="cuda").manual_seed(0)
    torch.cuda.empty_cache()
    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), dtype=torch.uint8, device="cuda", generator=g)
    s13 = torch.randint(118, 122, (E, 2 * I, H // 32), dtype=torch.uint8, device="cuda", generator=g)
    w2 = torch.randint(0, 256, (E, H, I // 2), dtype=torch.uint8, device="cuda", generator=g)
    s2 = torch.randint(118, 122, (E, H, I // 32), dtype=torch.uint8, device="cuda", generator=g)
    layer = sum(t.numel() for t in (w13, s13, w2, s2))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    if how == "humming":
        import humming_moe
        hmm = humming_moe.HummingMoE.__new__(humming_moe.HummingMoE)
        hmm.hm, hmm.E, hmm.I, hmm.H = hm, E, I, H
        out = [hmm._repack(w13, s13, 2 * I, H, [I, I]), hmm._repack(w2, s2, H, I, [H])]
    elif how == "triton_kernels":
        import tk_moe
        out = tk_moe.TkMoE(tk, w13, s13, w2, s2)
    elif H % 128 == 0 and I % 128 == 0:  # the AITER a16w4 sequence, torch ports (gfx950 stand-in)
        from mxfp4conv.shuffle import aiter as A
        out = (A.shuffle_weight_a16w4(w13, 16, False), A.shuffle_weight_a16w4(w2, 16, False),
               A.shuffle_scale_a16w4(s13.view(-1, s13.shape[-1]), E, False), A.e8m0_shuffle(s2.view(-1, s2.shape[-1])))
    else:  # K not a multiple of 128 fp4 (gpt-oss): the default shuffle_weight and e8m0_shuffle, torch ports
        from mxfp4conv.shuffle import aiter as A
        out = (A.shuffle_weight(w13), A.shuffle_weight(w2), A.e8m0_shuffle(s13.view(-1, s13.shape[-1])),
               A.e8m0_shuffle(s2.view(-1, s2.shape[-1])))
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    extra = torch.cuda.max_memory_allocated() - before
    del out, w13, s13, w2, s2
    torch.cuda.empty_cache()
    return dict(model=m.name, tp=tp, how=how, layer_gb=layer / 1e9, seconds=seconds, model_s=seconds * m.layers,
                extra_peak_gb=extra / 1e9, gbps=layer / seconds / 1e9)


def gpu_part(args, log) -> list[dict]:
    import torch
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    hm = tk = None
    try:
        import humming_moe
        hm = humming_moe.Humming()
        log(f"Humming: {hm.describe()}")
    except Exception as exc:
        log(f"humming not available: {type(exc).__name__}: {exc}")
    if args.triton_kernels:
        try:
            import tk_moe
            tk = tk_moe.TritonKernels(args.triton_kernels)
        except Exception as exc:
            log(f"triton_kernels not available: {type(exc).__name__}: {exc}")
    warm = Model("warm-up", 1, 8, 1024, 512, 0)
    results = []
    for how, ok in (("humming", hm is not None), ("triton_kernels", tk is not None), ("aiter", True)):
        if not ok:
            continue
        t0 = time.perf_counter()  # the first call compiles the conversion's kernels (cached on disk afterwards)
        try:
            gpu_layer(warm, 1, how, hm, tk, log)
        except Exception as exc:
            import traceback
            log(f"{how}: warm-up failed {type(exc).__name__}: {str(exc)[:300]}\n{traceback.format_exc()[-2000:]}")
            continue
        log(f"{how}: first call (compiles, cached afterwards) {time.perf_counter() - t0:.1f} s")
        for m in MODELS:
            if how != "aiter" and how != m.sm90:
                continue
            for tp in (8, 1):
                try:
                    best = min((gpu_layer(m, tp, how, hm, tk, log) for _ in range(2)), key=lambda r: r["seconds"])
                except Exception as exc:
                    log(f"{how} {m.name} tp {tp}: failed {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                results.append(best)
                log(f"{how:14s} {m.name:18s} tp {tp}: layer {best['layer_gb']:.2f} GB, {1e3 * best['seconds']:.1f} ms "
                    f"({best['gbps']:.0f} GB/s), model {best['model_s']:.2f} s, extra peak {best['extra_peak_gb']:.2f} GB")
    return results


def print_table(rows, gpu, read_gbps, crc_gbps, log):
    log(f"\nper rank, tensor parallel (no EP); read time at {read_gbps:.2f} GB/s, crc32 at {crc_gbps:.1f} GB/s")
    log(f"{'model':18s} {'tp':>2s} {'src GB':>8s} {'conv GB':>8s} {'src s':>7s} {'conv s':>7s} {'crc s':>6s} "
        f"{'host src GB':>11s} {'host conv GB':>12s}")
    for r in rows:
        log(f"{r['model']:18s} {r['tp']:2d} {r['source_gb']:8.0f} {r['converted_gb']:8.0f} {r['source_s']:7.0f} "
            f"{r['converted_s']:7.0f} {r['crc_s']:6.1f} {r['source_host_gb']:11.0f} {r['converted_host_gb']:12.0f}")
    if gpu:
        log("\nload-time GPU conversion of the experts (source only), one rank")
        for g in gpu:
            log(f"{g['how']:14s} {g['model']:18s} tp {g['tp']}: {1e3 * g['seconds']:7.1f} ms a layer, "
                f"{g['model_s']:6.2f} s the model, extra peak {g['extra_peak_gb']:.2f} GB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--read-gbps", type=float, default=None, help="disk read speed (GB/s); --gpu measures it")
    ap.add_argument("--crc-gbps", type=float, default=13.1,
                    help="the plugin's crc32 check speed (GB/s; docs/hardening.md measured 13.1 on one core)")
    ap.add_argument("--gpu", action="store_true", help="measure the load-time GPU work and the read speed here")
    ap.add_argument("--triton-kernels", default=None, metavar="DIR", help="directory holding triton_kernels")
    ap.add_argument("--read-file", default="/tmp/startup_cost_read.bin")
    ap.add_argument("--read-file-gib", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    logf = open(f"{args.out}/startup_cost.log", "w") if args.out else None

    def log(msg):
        print(msg, flush=True)
        if logf:
            logf.write(msg + "\n")
            logf.flush()

    read_gbps = args.read_gbps
    gpu = []
    if args.gpu:
        speeds = read_speed(Path(args.read_file), args.read_file_gib, log)
        read_gbps = read_gbps or speeds["direct"]
        gpu = gpu_part(args, log)
    read_gbps = read_gbps or 2.0
    rows = bytes_table(read_gbps, args.crc_gbps)
    print_table(rows, gpu, read_gbps, args.crc_gbps, log)
    if args.out:
        Path(args.out, "startup_cost.json").write_text(json.dumps(dict(read_gbps=read_gbps, rows=rows, gpu=gpu), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
