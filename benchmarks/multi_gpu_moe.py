"""The converted MoE layers run across several processes, one GPU each, combined as vLLM combines
them, against the single-GPU result of the tp-1 conversion.

For each layout (tensor parallel over the world, expert parallel over the world), rank 0 writes a
synthetic checkpoint of two MoE layers and converts it for ``--arch`` at that layout and at tp 1;
every process loads its rank (``load_moe_layers(..., rank=r, device=...)``), runs ``fused_moe`` on
the same tokens and routing (each layer on the same tokens), and the ranks' partial outputs are
summed with an all-reduce (tensor
parallel ranks hold a slice of the intermediate size; expert parallel ranks only their experts'
contributions, zero for the others). Rank 0 compares the sum with the tp-1 layer on its own device
and times the layer with the collective included. ``dpep`` is wide expert parallelism: data
parallel over the world with expert parallel MoE; each process is a dp rank with its own tokens,
which are gathered for the experts and whose summed outputs come back to it (vLLM's
allgather_reducescatter), and every rank checks its own tokens against the tp-1 layer.

    python benchmarks/multi_gpu_moe.py --world 2                    # NCCL, one GPU a process
    python benchmarks/multi_gpu_moe.py --world 2 --device cpu --shape tiny   # gloo, CPU processes

NVLink multicast stays off in every process (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1): on shared hosts it can take the GPUs out of service.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# (family, hidden, intermediate, experts, top-k): the real sizes of the issue, and a CPU-sized one
SHAPES = {
    "dsv3": ("deepseek_v4", 7168, 2048, 256, 8),
    "k3": ("kimi_k3", 3584, 384, 896, 16),
    "tiny": ("deepseek_v4", 256, 256, 8, 2),
}
LAYOUTS = ("tp", "ep", "dpep")  # dpep: data parallel over the world, experts parallel (wide EP)


def make_sources(shape: str, arch: str, world: int, layouts: tuple[str, ...], root: Path) -> dict[str, Path]:
    """{layout: converted checkpoint}, with "ref" the tp-1 conversion; written by rank 0."""
    from mxfp4conv.checkpoint.synthetic import make_checkpoint
    from mxfp4conv.convert import convert
    from mxfp4conv.oracle import Target

    family, hidden, inter, experts, top_k = SHAPES[shape]
    src = make_checkpoint(family, root / "src", hidden=hidden, intermediate=inter, num_experts=experts,
                          top_k=top_k, num_layers=2, seed=7)
    outs = {"ref": root / "tp1"}
    convert(src, outs["ref"], Target(arch, tp=1), progress="off")
    for layout in layouts:
        outs[layout] = root / f"{layout}{world}"
        target = (Target(arch, tp=1, dp=world, ep=True) if layout == "dpep"
                  else Target(arch, tp=world, ep=layout == "ep"))
        convert(src, outs[layout], target, progress="off")
    return outs


def inputs(hidden: int, experts: int, top_k: int, tokens: int, device, stream: int = 0):
    import torch

    g = torch.Generator().manual_seed(1000 + tokens + 7919 * stream)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    scores = torch.randn(tokens, experts, generator=g)
    weights, ids = scores.softmax(-1).topk(top_k, dim=-1)
    return x.to(device), (weights / weights.sum(-1, keepdim=True)).to(device), ids.to(torch.int32).to(device)


def worker(rank: int, world: int, args: dict, sources: dict[str, str], results: str) -> None:
    import torch
    import torch.distributed as dist

    from mxfp4conv.runtime import fused_moe, load_moe_layers
    from mxfp4conv.runtime.loader import parallel_layout

    os.environ.update(NO_MULTICAST)
    on_gpu = args["device"] == "cuda"
    device = torch.device(f"cuda:{rank}") if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=rank, world_size=world,
                            init_method=f"tcp://127.0.0.1:{args['port']}")
    backend = args["backend"]
    _, hidden, _, experts, top_k = SHAPES[args["shape"]]
    ref = load_moe_layers(sources["ref"], rank=0, device=device, backend=backend)
    rows = []
    for layout in args["layouts"]:
        # the worker's MoE rank as vLLM flattens it (a dp rank here, for dpep; the tp rank else)
        par = parallel_layout(sources[layout])
        dp_rank, tp_rank = (rank, 0) if layout == "dpep" else (0, rank)
        moe_rank = par.moe_rank(dp_rank=dp_rank, tp_rank=tp_rank)
        layers = load_moe_layers(sources[layout], rank=moe_rank, device=device, backend=backend)
        dpep = layout == "dpep"
        for tokens in args["tokens"]:
            # dpep: each dp rank has its own tokens; they are gathered for the experts and each rank
            # keeps its own rows of the summed outputs (vLLM's allgather_reducescatter all2all)
            own = inputs(hidden, experts, top_k, tokens, device, stream=rank if dpep else 0)
            mine = slice(rank * tokens, (rank + 1) * tokens) if dpep else slice(None)

            def gather(t):
                parts = [torch.empty_like(t) for _ in range(world)]
                dist.all_gather(parts, t)
                return torch.cat(parts)

            def layers_on_x():  # each layer on the same tokens (a model's norms sit between them)
                x, w, ids = (gather(t) for t in own) if dpep else own
                outs = []
                for ex in layers.values():
                    part = fused_moe(x, ex, w, ids, backend=backend, act_quant="none").float()
                    dist.all_reduce(part)
                    outs.append(part[mine].to(x.dtype))
                return outs

            ys = layers_on_x()
            errs = torch.zeros(world, dtype=torch.float64, device=device)
            fin = torch.zeros(world, dtype=torch.float64, device=device)
            if rank == 0 or dpep:  # every dp rank checks its own tokens
                refs = [fused_moe(own[0], ex, own[1], own[2], backend=backend, act_quant="none") for ex in ref.values()]
                errs[rank] = max(((y.float() - r.float()).norm() / r.float().norm()).item() for y, r in zip(ys, refs))
                fin[rank] = float(all(bool(torch.isfinite(y).all()) for y in ys))
            dist.all_reduce(errs)
            dist.all_reduce(fin)
            checked = world if dpep else 1
            err, finite = float(errs.max()), bool(fin.sum() == checked)
            for _ in range(args["warmup"]):
                layers_on_x()
            if on_gpu:
                torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args["iters"]):
                layers_on_x()
            if on_gpu:
                torch.cuda.synchronize()
            seconds = (time.perf_counter() - t0) / args["iters"] / len(layers)
            if rank == 0:
                rows.append({"layout": layout, "world": world, "tokens": tokens, "rel_err": err,
                             "finite": finite, "us_per_layer": seconds * 1e6})
    if rank == 0:
        Path(results).write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def run(world: int, shape: str, arch: str, device: str, layouts: tuple[str, ...], tokens: tuple[int, ...],
        backend: str, warmup: int = 2, iters: int = 5, port: int = 29533) -> list[dict]:
    """Every layout's rows (rel_err against tp 1, time per layer with the all-reduce) for one world size."""
    import torch.multiprocessing as mp

    os.environ.update(NO_MULTICAST)
    with tempfile.TemporaryDirectory() as tmp:
        sources = {k: str(v) for k, v in make_sources(shape, arch, world, layouts, Path(tmp)).items()}
        results = str(Path(tmp) / "rows.json")
        args = {"shape": shape, "device": device, "layouts": layouts, "tokens": tokens, "backend": backend,
                "warmup": warmup, "iters": iters, "port": port}
        mp.spawn(worker, args=(world, args, sources, results), nprocs=world, join=True)
        return json.loads(Path(results).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, nargs="+", default=[2], help="world sizes to run (default 2)")
    ap.add_argument("--shape", choices=SHAPES, default="dsv3")
    ap.add_argument("--arch", default="sm90", help="convert target (default sm90)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--layouts", default="tp,ep,dpep", help="comma list of tp, ep, dpep")
    ap.add_argument("--tokens", default="1,64,1024")
    ap.add_argument("--backend", default=None, help="fused_moe backend (default triton on cuda, torch on cpu)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    layouts = tuple(x for x in a.layouts.split(",") if x)
    bad = set(layouts) - set(LAYOUTS)
    if bad:
        ap.error(f"--layouts: unknown {', '.join(sorted(bad))}; choose from {', '.join(LAYOUTS)}")
    if a.device == "cuda":
        import torch

        if torch.cuda.device_count() < max(a.world):
            ap.error(f"--world {max(a.world)} needs that many GPUs; this machine has {torch.cuda.device_count()}")
    backend = a.backend or ("triton" if a.device == "cuda" else "torch")
    tokens = tuple(int(t) for t in a.tokens.split(","))
    rows = []
    for world in a.world:
        rows += run(world, a.shape, a.arch, a.device, layouts, tokens, backend, iters=a.iters)
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"shape {a.shape} {SHAPES[a.shape][1:]}, --arch {a.arch}, {a.device}, fused_moe backend {backend}")
    print(f"{'layout':6} {'world':>5} {'tokens':>6} {'rel err vs tp 1':>16} {'us / layer':>11}")
    for r in rows:
        print(f"{r['layout']:6} {r['world']:5d} {r['tokens']:6d} {r['rel_err']:16.2e} {r['us_per_layer']:11.1f}"
              + ("" if r["finite"] else "  NOT FINITE"))


if __name__ == "__main__":
    main()
