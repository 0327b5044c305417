"""``mxfp4conv plan SOURCE --arch A [target options] [--json]``: the oracle's decision, explained."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from mxfp4conv.commands import options

# Bytes written per second by `convert --workers 2` on a 2-core machine
# (docs/convert-benchmark.md); the time estimate scales the output size by it.
CONVERT_RATE = 0.4e9


def _manifest_of(spec: str, root: Path | None = None) -> dict | None:
    from mxfp4conv.checkpoint.source import MANIFEST_NAME

    for base in (Path(spec), root):
        if base is not None and (base / MANIFEST_NAME).is_file():
            try:
                return json.loads((base / MANIFEST_NAME).read_text())
            except (OSError, ValueError):
                from mxfp4conv.errors import CheckpointError

                raise CheckpointError(
                    f"{base / MANIFEST_NAME}: the manifest of this converted checkpoint is not valid "
                    "JSON; re-run mxfp4conv convert, or plan from the original checkpoint.")
    return None


def _layout_of(t: dict) -> tuple:
    """(tp, dp, MoE expert parallel, placement) a manifest's target was converted for."""
    p = t.get("parallel") if isinstance(t.get("parallel"), dict) else None
    if p is None:  # a manifest of version 1: tp ranks, data parallel 1, linear placement
        return t.get("tp"), 1, bool(t.get("ep")) and (t.get("tp") or 1) > 1, "linear"
    return p.get("tp"), p.get("dp"), bool(p.get("use_ep")), p.get("placement")


def _already_converted(spec: str, manifest: dict, arch: str, asked: tuple, as_json: bool) -> None:
    """``asked``: (tp, dp, MoE expert parallel, placement) of the request, as vLLM derives them."""
    from mxfp4conv.errors import OracleError

    t = manifest.get("target", {}) if isinstance(manifest.get("target"), dict) else {}
    src = manifest.get("source", {}) if isinstance(manifest.get("source"), dict) else {}
    have = _layout_of(t)
    what = (f"arch {t.get('arch')}, backend {t.get('backend')}, {_layout_text(have)}, act-quant "
            f"{t.get('act_quant')}")
    origin = src.get("path") or src.get("repo") or src.get("repo_id") or "unknown"
    matches = t.get("arch") == arch and have == asked
    if not matches:
        raise OracleError(
            f"{spec} is already converted by mxfp4conv ({what}); it cannot be planned for arch "
            f"{arch}, {_layout_text(asked)}. Plan from the original checkpoint ({origin}).")
    if as_json:
        print(json.dumps({"already_converted": True, "target": t, "layout": manifest.get("layout"),
                          "moe": manifest.get("moe"), "runtime_env": manifest.get("runtime_env"),
                          "source": src}, indent=2))
        return
    print(f"{spec} is already converted by mxfp4conv for {what} (from {origin}); nothing to plan.")
    env = manifest.get("runtime_env") or {}
    if env:
        print("Server environment: " + " ".join(f"{k}={v}" for k, v in env.items()))


def _asked(manifest: dict, tp: int, dp: int, ep: bool, placement: str, all2all: str) -> tuple:
    """The request's layout as vLLM derives it, for the manifest's model (its experts and groups
    are not known here: the manifest's expert count, and round_robin taken as asked)."""
    from mxfp4conv.oracle.parallel import derive

    experts = (manifest.get("moe") or {}).get("num_experts") or 1
    groups = 2 if placement == "round_robin" else None
    par = derive(tp=tp, dp=dp, ep=ep, placement=placement, num_experts=experts, num_expert_group=groups,
                 all2all=all2all) if isinstance(experts, int) and ep and experts % (tp * dp) == 0 else None
    if par is None:
        return tp, dp, ep and tp * dp > 1, placement if ep and tp * dp > 1 else "linear"
    return par.tp, par.dp, par.use_ep, par.placement


def _layout_text(layout: tuple) -> str:
    tp, dp, ep, placement = layout
    return f"tp {tp} x dp {dp}" + (f" with EP ({placement} placement)" if ep else "")


def output_estimate(src, model, d, target) -> dict:
    """Size of what convert writes for this decision, and roughly how long it takes."""
    from mxfp4conv.convert.manifest import build_manifest
    from mxfp4conv.convert.plan import DEFAULT_SHARD_SIZE, build_plan, plan_metadata, resolve_layouts
    from mxfp4conv.shuffle.layouts import get_layout

    manifest = build_manifest(src, model, d, target)
    out = build_plan(src, model, d, resolve_layouts(d, get_layout), plan_metadata(manifest),
                     DEFAULT_SHARD_SIZE)
    size = out.total_size()
    return {"source_bytes": sum(src.tensor_info(n).nbytes for n in src.tensor_names()),
            "bytes": size, "shards": len(out.shards), "estimated_seconds": round(size / CONVERT_RATE, 3),
            "estimate_rate_bytes_per_s": CONVERT_RATE}


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _served_by(d) -> str | None:
    """Which kernel runs the experts when vLLM serves the output through the plugin."""
    o = d.options
    pick, kernel = o.get("vllm_backend"), o.get("serving_kernel")
    if kernel == "mxfp4conv":
        instead = f"in place of vLLM's {pick}" if pick else "(vLLM has no backend here)"
        return f"mxfp4conv's Triton MoE kernel {instead} (see the notes)"
    if kernel == "vllm" and pick:
        how = ("vLLM converts the canonical bytes at start-up" if d.layout.as_dict()["w13"] == "identity"
               else "the bytes are what its conversion produces")
        return f"vLLM's own {pick} kernel ({how})"
    return None


def _render(d, model, spec: str, output: dict | None = None, resolution=None, trace: bool = False) -> None:
    """The plan in plain lines that fit a pipe as well as a terminal; ``trace`` adds every
    backend tried and why it was rejected, the padding rule and the modelled server."""
    from rich.console import Console
    from rich.markup import escape

    from mxfp4conv.oracle.arch import get_arch

    con = Console(highlight=False, soft_wrap=True)  # lines are never wrapped (copy-paste, pipes)
    o = d.options
    params = ", ".join(f"{k}={v:g}" for k, v in d.activation_params.items())
    con.print(f"[bold]{escape(spec)}[/]: {model.family} ({model.quant_scheme}), activation "
              f"{d.activation}{f' ({params})' if params else ''}, {model.routing} routing, "
              f"{d.num_experts} experts, top-{d.top_k}")
    rocm = get_arch(d.arch).is_rocm  # AITER exists on ROCm only
    con.print(f"Target: {d.arch}, {d.parallel.describe()}, act-quant "
              f"{o.get('requested_act_quant')} -> {d.act_quant}"
              f"{(', AITER ' + ('on' if o.get('aiter') else 'off')) if rocm else ''}"
              f"{', --backend ' + o['forced_backend'] if o.get('forced_backend') else ''}"
              f"{', --moe-weight ' + o['moe_weight'] if o.get('moe_weight') else ''}")
    how = ""
    if resolution is not None and resolution.requested == "auto":
        how = (f", --vllm auto: the installed vLLM {resolution.installed}" if resolution.installed
               else ", --vllm auto: no vLLM installed here")
    con.print(f"vLLM {o.get('vllm_release')} (the release modelled{how})")
    if resolution is not None and resolution.note:
        con.print(escape(f"Note: {resolution.note}"))
    rejected = [c for c in d.candidates if not c.selected and not
                (c.backend == o.get("vllm_backend") and "vLLM's pick" in c.reason)]
    pick = o.get("vllm_backend")
    con.print(f"[bold]Backend: {d.backend}[/]"
              + (f" (vLLM would pick {pick})" if pick and pick != d.backend else "")
              + (f"; {len(rejected)} rejected before it ({'listed below' if trace else '--trace lists why'})"
                 if rejected else ""))
    if trace:
        con.print(f"Backends tried, in order (selector {o.get('selector')}, converter {o.get('converter')}):")
        for i, c in enumerate(d.candidates, 1):
            result = "selected" if c.selected else "vLLM's pick" if c not in rejected else "rejected"
            con.print(f"  {i}. {c.backend}: {result}: {escape(c.reason)}")
    served = _served_by(d)
    if served:
        con.print(f"Served by (vLLM plugin): {escape(served)}")
    con.print(f"Padded geometry per rank: hidden {d.hidden} -> {d.hidden_padded}, intermediate "
              f"{d.intermediate_per_rank} -> {d.intermediate_per_rank_padded} (global {d.intermediate}), "
              f"{d.experts_per_rank} experts")
    _render_ranks(con, d, trace)
    if trace:
        con.print(f"Alignment: {o.get('alignment_rule')}")
    con.print("Layout recipe: " + escape(", ".join(f"{k} {v}" for k, v in d.layout.as_dict().items())))
    if trace:
        con.print(f"gate_mode {d.gate_mode}, is_shuffled {d.is_shuffled}, scale pad byte 0x{d.scale_pad_byte:02X}, "
                  f"kernel activations {o.get('kernel_act')}; producible by mxfp4conv here: "
                  + ", ".join(o.get("producible") or []))
    if output:
        n = output["shards"]
        con.print(f"Output: {_size(output['bytes'])} of tensors in {n} shard{'s' if n != 1 else ''} "
                  f"(source {_size(output['source_bytes'])}); convert takes about "
                  f"{_duration(output['estimated_seconds'])} at {CONVERT_RATE / 1e9:.1f} GB/s written "
                  f"(measured on 2 cores; more cores and a faster disk go faster, a hub download comes on top)")
    env = " ".join(f"{k}={v}" for k, v in d.runtime_env.items())
    con.print(f"[bold]Server environment:[/] {env or '(none)'}")
    if o.get("vllm_runtime_env") is not None:
        venv = " ".join(f"{k}={v}" for k, v in o["vllm_runtime_env"].items())
        con.print(f"vLLM's own pick ({o.get('vllm_backend')}) runs with: {venv or '(none)'}")
    # the notes that change what the output is; the modelled server's packages only with --trace
    notes = [n for n in d.notes if trace or not n.startswith("Modelled vLLM server")]
    for n in notes:
        con.print(f"- {escape(n)}")


def _ids(experts: list[int]) -> str:
    """Expert ids, runs of consecutive or evenly spaced ids shortened (0-7, 3,11,..,59)."""
    if len(experts) <= 6:
        return ",".join(map(str, experts))
    step = experts[1] - experts[0]
    if all(b - a == step for a, b in zip(experts, experts[1:])):
        return f"{experts[0]}-{experts[-1]}" if step == 1 else \
            f"{experts[0]},{experts[1]},..,{experts[-1]} (every {step})"
    return ",".join(map(str, experts[:3])) + ",..," + ",".join(map(str, experts[-2:]))


def _render_ranks(con, d, trace: bool = False) -> None:
    """The per-rank map in plain lines: under expert parallel the first and last ranks' experts
    (two of each with ``trace``), else one line for the intermediate split."""
    from rich.markup import escape

    par = d.parallel
    if par.ranks == 1:
        return
    flat = f"MoE rank = dp rank x {par.tp} + tp rank" if par.dp > 1 else "MoE rank = tp rank"
    if not par.use_ep:
        per = d.intermediate // par.moe_tp
        con.print(f"MoE ranks: {par.ranks} ({flat}), tensor parallel: rank r holds intermediate "
                  f"[r x {per}, (r + 1) x {per}) of every expert")
        return
    shown = 2 if trace else 1
    rows = list(range(par.ranks))
    if len(rows) > 2 * shown + 1:
        rows = rows[:shown] + [-1] + rows[-shown:]
    con.print(f"MoE ranks: {par.ranks} ({flat}), expert parallel, {par.placement} placement:")
    for r in rows:
        if r < 0:
            con.print(f"  ... ranks {shown}..{par.ranks - shown - 1}")
            continue
        dp_rank, _, tp_rank = par.worker(r)
        ex = list(par.experts(r))
        con.print(escape(f"  rank {r} (dp rank {dp_rank}, tp rank {tp_rank}): experts {_ids(ex)} ({len(ex)})"))


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        ctx: typer.Context,
        source: str = options.source_argument(),
        arch: str = options.arch_option(),
        tp: int = options.tp_option(),
        dp: int = options.dp_option(),
        ep: bool = options.ep_option(),
        placement: str = options.placement_option(),
        all2all: str = options.all2all_option(),
        act_quant: str = options.act_quant_option(),
        no_aiter: bool = typer.Option(False, "--no-aiter", help="Model a ROCm server without AITER."),
        backend: str = options.backend_option(),
        layout: str = options.layout_option(),
        moe_weight: str = options.moe_weight_option(),
        vllm: str = options.vllm_option(),
        revision: str = options.revision_option(),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
        trace: bool = typer.Option(False, "--trace", help="Also list every backend tried and why it was rejected "
                                   "(as -v does)."),
    ) -> None:
        """Show which backend vLLM would pick, and the padding, layouts, output size and server
        environment a conversion for that target produces (--trace or -v: every backend tried, and why)."""
        from mxfp4conv.checkpoint import load_model, open_source
        from mxfp4conv.oracle import Target, decide, resolve_arch

        from mxfp4conv.oracle.releases import resolve

        source = options.with_revision(source, revision)
        canonical = resolve_arch(arch)
        resolution = resolve(vllm)
        release = resolution.key
        manifest = _manifest_of(source)
        src = None
        if manifest is None:
            src = open_source(source)
            manifest = _manifest_of(str(src.root))
        if manifest is not None:
            _already_converted(source, manifest, canonical, _asked(manifest, tp, dp, ep, placement, all2all),
                               as_json)
            return
        model = load_model(src)
        target = Target(arch=canonical, tp=tp, ep=ep, act_quant=act_quant, aiter=not no_aiter,
                        backend=backend, layout=layout, vllm=release, moe_weight=moe_weight,
                        dp=dp, placement=placement, all2all=all2all)
        d = decide(model, target)
        output = output_estimate(src, model, d, target)
        if as_json:
            out: dict[str, Any] = d.plan_json()
            out["vllm_resolution"] = {"requested": resolution.requested, "installed": resolution.installed,
                                      "modelled": resolution.release.version, "note": resolution.note}
            out["family"] = model.family
            out["quant_scheme"] = model.quant_scheme
            out["output"] = output
            print(json.dumps(out, indent=2))
            return
        verbose = ctx.find_root().params.get("verbose") or 0
        _render(d, model, source, output, resolution, trace=trace or verbose > 0)
