"""Convert benchmark: peak RSS and time of ``mxfp4conv convert`` against a plain copy.

Generates a synthetic Kimi-K3-format checkpoint of the requested size (random MXFP4 bytes,
real names, config and sharding; single MoE layers of several GB), then, in the same run on
the same disk:

1. copies the checkpoint's files (read + write + fsync per file, like convert does);
2. for each target and each ``--workers`` value, converts it in a subprocess
   (``python -m mxfp4conv convert``) while sampling its RSS, then times
   ``mxfp4conv verify --source`` on the result with the same worker count.

The page cache is dropped before each run where the machine allows it. Prints a table
(optionally appends it to a markdown file and plots throughput against workers) and deletes
everything it made.

    python benchmarks/convert_bench.py --size-gb 10 --dir /path/on/the/disk \
        --targets gfx950:1 gfx950:8 sm90:1 --workers 1 2 4 8 16 --plot curve.png
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[1]  # the tree this script belongs to
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from mxfp4conv.checkpoint import synthetic  # noqa: E402
from mxfp4conv.convert.writer import ShardWriter, TensorSpec  # noqa: E402

SCALE_LO, SCALE_HI = 118, 131  # e8m0 exponents near 1.0, never 0xFF


class _Recorder(synthetic._Tensors):
    """Records (name, dtype, shape, kind) instead of making tensors."""

    def __init__(self, weight_dtype="U8", scale_dtype="U8"):
        super().__init__(0, weight_dtype, scale_dtype)
        self.specs: list[tuple[TensorSpec, str]] = []

    def _rec(self, name, dtype, shape, kind):
        self.specs.append((TensorSpec(name, dtype, tuple(int(d) for d in shape)), kind))

    def bf16(self, name, *shape):
        self._rec(name, "BF16", shape, "random")

    def f32(self, name, *shape):
        self._rec(name, "F32", shape, "random")

    def ones(self, name, n):
        self._rec(name, "BF16", (n,), "random")

    def fp8_block(self, name, n, k, scale_suffix="scale"):
        self._rec(name + ".weight", "F8_E4M3", (n, k), "random")
        self._rec(f"{name}.{scale_suffix}", "F8_E8M0", (-(-n // 128), -(-k // 128)), "scale")

    def expert(self, name, scale_name, n, k):
        self._rec(name, self.weight_dtype, (n, k // 2), "random")
        self._rec(scale_name, self.scale_dtype, (n, k // 32), "scale")

    def mark_split(self):
        pass


def generate(root: Path, size_gb: float, hidden: int, intermediate: int, experts: int,
             shard_gb: float, seed: int = 0) -> dict:
    """Write a Kimi-K3-format checkpoint of about ``size_gb`` GB into ``root``."""
    per_layer = experts * 3 * intermediate * (hidden // 2 + hidden // 32)
    layers = max(1, round(size_gb * 1e9 / per_layer))
    rec = _Recorder()
    g = {"hidden": hidden, "intermediate": intermediate, "num_experts": experts, "top_k": 8,
         "num_layers": layers, "vocab": 1024}
    config = synthetic._kimi_k3(rec, g, "w_mxfp4", {})
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (root / "generation_config.json").write_text(json.dumps({"do_sample": True}) + "\n")
    shards, cur, size = [], [], 0
    for spec, kind in rec.specs:
        if cur and size + spec.size() > shard_gb * 1e9:
            shards.append(cur)
            cur, size = [], 0
        cur.append((spec, kind))
        size += spec.size()
    shards.append(cur)
    rng = np.random.default_rng(seed)
    weight_map, total = {}, 0
    for i, group in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        with ShardWriter(root / name, [s for s, _ in group], {"format": "pt"}) as w:
            for spec, kind in group:
                left = spec.size()
                while left:
                    n = min(left, 64 << 20)
                    if kind == "scale":
                        chunk = rng.integers(SCALE_LO, SCALE_HI, n, dtype=np.uint8)
                    else:
                        chunk = np.frombuffer(rng.bytes(n), dtype=np.uint8)
                    w.write(spec.name, chunk)
                    left -= n
                weight_map[spec.name] = name
                total += spec.size()
            w.finish()
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return {"layers": layers, "layer_bytes": per_layer, "bytes": total, "shards": len(shards)}


def _mem_gb() -> float:
    try:
        return int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        return float("nan")


def drop_caches(*dirs: Path) -> str:
    """Drop the page cache (root); else evict the files under ``dirs`` with posix_fadvise."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "dropped"
    except OSError:
        pass
    for d in dirs:
        for p in d.rglob("*"):
            if p.is_file():
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
    return "files evicted with posix_fadvise"


# --baseline-env: extra variables for the runs of the baseline's code, told apart by identity (the
# baseline may be this very tree, run with other settings)
BASELINE_ENV: dict[str, str] = {}
BASELINE_CODE: list[Path] = []


def _env(code: Path | None) -> dict | None:
    """Environment that runs the package found under ``code`` (None: this one)."""
    if code is None:
        return None
    env = dict(os.environ)
    env["PYTHONPATH"] = str(code.resolve()) + os.pathsep + env.get("PYTHONPATH", "")
    if any(code is b for b in BASELINE_CODE):
        env.update(BASELINE_ENV)
    return env


def startup_seconds(code: Path | None = None) -> float:
    """Interpreter start and imports a convert pays before its first byte (after drop_caches)."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import mxfp4conv.cli, mxfp4conv.convert.run, mxfp4conv.checkpoint, "
                    "mxfp4conv.oracle, mxfp4conv.commands.convert"], check=True, env=_env(code), cwd=code)
    return time.perf_counter() - t


def plain_copy(src: Path, dst: Path) -> float:
    t = time.perf_counter()
    dst.mkdir(parents=True)
    for p in sorted(src.iterdir()):
        shutil.copyfile(p, dst / p.name)
        fd = os.open(dst / p.name, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return time.perf_counter() - t


def _run_measured(cmd: list[str], code: Path | None = None) -> dict:
    """Run ``cmd``; wall time, CPU seconds, peak RSS and RSS samples every 0.1 s.

    The peak is the child's last ``VmHWM`` (its own high-water mark since ``exec``), not
    ``wait4``'s ``ru_maxrss``: that one also counts the process before ``exec``, i.e. a copy of
    this script with its torch import and generation buffers (about 330 MiB here, more with a
    CUDA build of torch), whatever the command itself used. Runs shorter than one sample fall
    back to ``ru_maxrss``."""
    samples: list[tuple[float, int]] = []
    hwm: list[int] = []
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=_env(code), cwd=code)
    done = threading.Event()

    def poll():
        while not done.is_set():
            try:
                for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        samples.append((time.perf_counter() - t, int(line.split()[1]) * 1024))
                    elif line.startswith("VmHWM:"):
                        hwm.append(int(line.split()[1]) * 1024)
            except OSError:
                pass
            time.sleep(0.1)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    try:
        _, status, usage = os.wait4(p.pid, 0)
    except BaseException:  # interrupted: leave no run behind
        p.kill()
        p.wait()
        done.set()
        raise
    elapsed = time.perf_counter() - t
    done.set()
    th.join()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd[2:4])} failed with status {status}")
    return {"seconds": elapsed, "peak_rss": hwm[-1] if len(hwm) > 1 else usage.ru_maxrss * 1024,
            "samples": samples, "cpu": usage.ru_utime + usage.ru_stime}


def run_convert(src: Path, out: Path, arch: str, tp: int, workers: int, shard_size: str,
                code: Path | None = None) -> dict:
    return _run_measured([sys.executable, "-m", "mxfp4conv", "convert", str(src), str(out), "--arch", arch,
                          "--tp", str(tp), "--workers", str(workers), "--shard-size", shard_size, "--quiet"], code)


def run_verify(src: Path, out: Path, workers: int, code: Path | None = None) -> dict:
    return _run_measured([sys.executable, "-m", "mxfp4conv", "verify", str(out), "--source", str(src),
                          "--workers", str(workers), "--quiet"], code)


def _target(text: str) -> tuple[str, int]:
    arch, _, tp = text.partition(":")
    return arch, int(tp or 1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=10.0)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=384)
    ap.add_argument("--source-shard-gb", type=float, default=4.0)
    ap.add_argument("--shard-size", default="5GB")
    ap.add_argument("--targets", nargs="+", default=["gfx950:1"], metavar="ARCH[:TP]",
                    help="targets to convert for, e.g. gfx950:1 gfx950:8 sm90:1")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--verify-workers", type=int, nargs="*", default=None,
                    help="worker counts at which verify --source is timed too (default: all of --workers)")
    ap.add_argument("--dir", type=Path, default=Path.cwd() / "convert-bench-tmp")
    ap.add_argument("--markdown", type=Path, help="append the table to this markdown file")
    ap.add_argument("--plot", type=Path, help="write throughput-by-workers and RSS plots (needs matplotlib)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--json", type=Path, help="write every measurement (RSS samples left out) to this file")
    ap.add_argument("--baseline", type=Path, metavar="DIR",
                    help="a checkout of other mxfp4conv code (e.g. a git worktree of main): every convert and "
                         "verify runs with it too, right after this tree's, for before/after in one run")
    ap.add_argument("--baseline-env", nargs="+", default=[], metavar="NAME=VALUE",
                    help="environment variables for the baseline's runs only, e.g. --baseline . "
                         "--baseline-env MXFP4CONV_NO_NATIVE=1 (this tree without its compiled transform)")
    args = ap.parse_args(argv)
    for item in args.baseline_env:
        name, eq, value = item.partition("=")
        if not eq or not name:
            ap.error(f"--baseline-env {item!r}: write NAME=VALUE")
        BASELINE_ENV[name] = value
    verify_at = set(args.workers if args.verify_workers is None else args.verify_workers)
    codes = [("this", HERE)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    BASELINE_CODE[:] = [c for label, c in codes if label == "baseline"]
    if args.baseline_env and not args.baseline:
        ap.error("--baseline-env needs --baseline (. for this tree)")

    work = args.dir.resolve()
    if work.exists():
        raise SystemExit(f"{work} exists; give a new --dir")
    src = work / "source"
    rows, curves, start_s = [], {}, {}
    interrupted = False
    try:
        t = time.perf_counter()
        info = generate(src, args.size_gb, args.hidden, args.intermediate, args.experts, args.source_shard_gb)
        print(f"generated {info['bytes'] / 1e9:.2f} GB, {info['layers']} MoE layers of "
              f"{info['layer_bytes'] / 1e9:.2f} GB, {info['shards']} shards in {time.perf_counter() - t:.0f} s",
              flush=True)
        cached = drop_caches(src)
        for label, code in codes:
            drop_caches(src)
            start_s[label] = startup_seconds(code)
        drop_caches(src)
        copy_s = plain_copy(src, work / "copy")
        shutil.rmtree(work / "copy")
        print(f"plain copy: {copy_s:.1f} s ({info['bytes'] / copy_s / 1e6:.0f} MB/s); start-up "
              + ", ".join(f"{k} {v:.1f} s" for k, v in start_s.items()), flush=True)
        try:
            for text in args.targets:
                arch, tp = _target(text)
                for w in args.workers:
                    for label, code in codes:
                        out = work / f"out-{arch}-{tp}-w{w}-{label}"
                        drop_caches(src)
                        r = run_convert(src, out, arch, tp, w, args.shard_size, code)
                        v = None
                        if w in verify_at:
                            drop_caches(src, out)
                            v = run_verify(src, out, w, code)
                        shutil.rmtree(out)
                        curves[(text, w, label)] = r["samples"]
                        rows.append((text, w, label, r, v))
                        print(f"{text} --workers {w} ({label}): convert {r['seconds']:.1f} s "
                              f"({r['seconds'] / copy_s:.2f}x copy), peak RSS {r['peak_rss'] / 2**20:.0f} MiB"
                              + (f"; verify {v['seconds']:.1f} s ({v['seconds'] / r['seconds']:.2f}x convert), "
                                 f"peak RSS {v['peak_rss'] / 2**20:.0f} MiB" if v else ""), flush=True)
        except KeyboardInterrupt:  # e.g. a time limit: the table still shows what was measured
            interrupted = True
            print("interrupted: the table holds the runs that finished", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    gb = info["bytes"] / 1e9
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    lines = [
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: {platform.machine()}, "
        f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}, {_mem_gb():.0f} GB RAM, load average "
        f"at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min).",
        f"Checkpoint: Kimi-K3 format, {gb:.2f} GB, {info['layers']} MoE layers of {info['layer_bytes'] / 1e9:.2f} GB "
        f"({args.experts} experts, hidden {args.hidden}, intermediate {args.intermediate}), {info['shards']} source "
        f"shards. Page cache before each run: {cached}. Plain copy (read + write + fsync): {copy_s:.1f} s, "
        f"{info['bytes'] / copy_s / 1e6:.0f} MB/s. Interpreter start-up and imports (cold, included in every "
        f"convert and verify time): " + ", ".join(f"{k} {v:.1f} s" for k, v in start_s.items()) + "."
        + (" Interrupted before the last runs." if interrupted else ""),
        "",
        "| target | code | workers | convert (s) | MB/s | convert / copy | less start-up / copy | CPU (s) "
        "| peak RSS (MiB) | verify --source (s) | verify / convert | verify peak RSS (MiB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for text, w, label, r, v in rows:
        s = r["seconds"]
        ver = (f"{v['seconds']:.1f} | {v['seconds'] / s:.2f} | {v['peak_rss'] / 2**20:.0f}" if v else "- | - | -")
        lines.append(f"| {text.replace(':', ' tp ')} | {label} | {w} | {s:.1f} | {info['bytes'] / s / 1e6:.0f} | "
                     f"{s / copy_s:.2f} | {(s - start_s[label]) / copy_s:.2f} | {r['cpu']:.1f} | "
                     f"{r['peak_rss'] / 2**20:.0f} | {ver} |")
    table = "\n".join(lines)
    print()
    print(table, flush=True)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write("\n" + table + "\n")
    if args.json:
        strip = lambda d: d and {k: v for k, v in d.items() if k != "samples"}  # noqa: E731
        args.json.write_text(json.dumps({
            "checkpoint": info, "copy_seconds": copy_s, "startup_seconds": start_s, "page_cache": cached,
            "cpus": os.cpu_count(), "load_average": load,
            "runs": [{"target": t, "workers": w, "code": c, "convert": strip(r), "verify": strip(v)}
                     for t, w, c, r, v in rows]}, indent=1) + "\n")
    if args.plot:
        _plot(args.plot, rows, curves, info["bytes"], copy_s, gb)


def _plot(path: Path, rows, curves, nbytes: int, copy_s: float, gb: float) -> None:
    try:
        import matplotlib
    except ImportError:
        print("no plot: matplotlib is not installed (pip install mxfp4conv[bench])")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for text, label in dict.fromkeys((t, c) for t, _, c, _, _ in rows):
        tag = text if label == "this" else f"{text} ({label})"
        pts = [(w, nbytes / r["seconds"] / 1e6) for t, w, c, r, _ in rows if (t, c) == (text, label)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"convert {tag}")
        ver = [(w, nbytes / v["seconds"] / 1e6) for t, w, c, _, v in rows if (t, c) == (text, label) and v]
        if ver:
            ax.plot([p[0] for p in ver], [p[1] for p in ver], marker="x", linestyle="--", label=f"verify {tag}")
    ax.axhline(nbytes / copy_s / 1e6, color="grey", linestyle=":", label="plain copy")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("--workers")
    ax.set_ylabel("MB/s of checkpoint")
    ax.set_title(f"throughput, {gb:.1f} GB checkpoint")
    ax.legend(fontsize=7)
    for (text, w, label), pts in curves.items():
        bx.plot([p[0] for p in pts], [p[1] / 2**20 for p in pts], label=f"{text} w{w}" + ("" if label == "this" else
                                                                                             f" {label}"))
    bx.set_xlabel("seconds")
    bx.set_ylabel("convert RSS (MiB)")
    bx.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
