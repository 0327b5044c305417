"""What the vLLM plugin's checks cost at load: the canary layer and the fast path's check, against
vLLM's own load of the same layer, on vLLM's own code (the test harness's emulated gfx950, on CPU).

One DeepSeek-V3-sized layer slice per rank (hidden 7168, intermediate 256 per rank as at tp 8,
``--experts`` experts), converted for gfx950 (AITER layouts); each way of loading runs in its own
vLLM worker process so that its peak resident memory is its own. AITER's shuffles are mxfp4conv's
torch ports on the CPU, so the seconds are a CPU's, not a GPU's: the ratios and the memory are what
carry over.

    python benchmarks/canary_cost.py [--experts 32] [--vllm 0.34.0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experts", type=int, default=32, help="experts in the layer (default 32)")
    ap.add_argument("--vllm", default="0.34.0", help="vLLM release whose code runs (default 0.34.0)")
    args = ap.parse_args()

    from mxfp4conv.checkpoint.synthetic import make_checkpoint
    from mxfp4conv.convert import convert
    from mxfp4conv.oracle import Target
    from test_vllm_plugin_params import probe_cases
    from vllm_code import harness

    src_dir = harness.vllm_source(args.vllm)
    with tempfile.TemporaryDirectory() as tmp:
        src = make_checkpoint("deepseek_v4", Path(tmp) / "src", hidden=7168, intermediate=256,
                              num_experts=args.experts, top_k=8, num_layers=1)
        out = Path(tmp) / "out"
        convert(src, out, Target("gfx950", tp=1), progress="off")
        case = {**probe_cases(src, out)[0], "tp": 1, "rank": 0}
        rows = []
        for phase in ("normal", "canary", "fast"):
            (r,) = harness.run_probe("gfx950", "tests/vllm_plugin_probe.py:probe_cost",
                                     [{**case, "phase": phase}], src=src_dir, timeout=1800)
            if "raised" in r:
                raise SystemExit(f"{phase}: {r['raised']}: {r['message']}\n{r.get('traceback', '')}")
            rows.append(r)
    size = rows[0]["layer_bytes"]
    base = rows[0]["load_s"] + rows[0]["process_s"]
    print(f"vLLM {args.vllm} code, emulated gfx950, CPU; one layer of {args.experts} experts, "
          f"{size / 2**20:.1f} MiB of expert bytes")
    print(f"{'load':8} {'read+place s':>12} {'process s':>10} {'total / vLLM':>13} {'peak RSS growth':>16} {'x layer':>8}")
    for r in rows:
        total = r["load_s"] + r["process_s"]
        growth = r["peak_rss_growth_bytes"]
        print(f"{r['phase']:8} {r['load_s']:12.3f} {r['process_s']:10.3f} {total / base:13.2f} "
              f"{growth / 2**20:13.1f} MiB {growth / size:8.2f}")


if __name__ == "__main__":
    main()
