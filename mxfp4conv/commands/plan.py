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


def _already_converted(spec: str, manifest: dict, arch: str, tp: int, ep: bool, as_json: bool) -> None:
    from mxfp4conv.errors import OracleError

    t = manifest.get("target", {}) if isinstance(manifest.get("target"), dict) else {}
    src = manifest.get("source", {}) if isinstance(manifest.get("source"), dict) else {}
    what = (f"arch {t.get('arch')}, backend {t.get('backend')}, tp {t.get('tp')}"
            f"{' with EP' if t.get('ep') else ''}, act-quant {t.get('act_quant')}")
    origin = src.get("path") or src.get("repo") or src.get("repo_id") or "unknown"
    matches = (t.get("arch"), t.get("tp"), bool(t.get("ep"))) == (arch, tp, ep)
    if not matches:
        raise OracleError(
            f"{spec} is already converted by mxfp4conv ({what}); it cannot be planned for arch "
            f"{arch}, tp {tp}{' with EP' if ep else ''}. Plan from the original checkpoint "
            f"({origin}).")
    if as_json:
        print(json.dumps({"already_converted": True, "target": t, "layout": manifest.get("layout"),
                          "moe": manifest.get("moe"), "runtime_env": manifest.get("runtime_env"),
                          "source": src}, indent=2))
        return
    print(f"{spec} is already converted by mxfp4conv for {what} (from {origin}); nothing to plan.")
    env = manifest.get("runtime_env") or {}
    if env:
        print("Server environment: " + " ".join(f"{k}={v}" for k, v in env.items()))


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


def _render(d, model, spec: str, output: dict | None = None, resolution=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console(highlight=False, soft_wrap=True)  # lines are never wrapped (copy-paste, pipes)
    params = ", ".join(f"{k}={v:g}" for k, v in d.activation_params.items())
    con.print(f"[bold]{escape(spec)}[/]: {model.family} ({model.quant_scheme}), activation "
              f"{d.activation}{f' ({params})' if params else ''}, {model.routing} routing, "
              f"{d.num_experts} experts, top-{d.top_k}")
    o = d.options
    con.print(f"Target: {d.arch}, tp {d.tp}{' with EP' if d.ep else ''}, act-quant "
              f"{o.get('requested_act_quant')} -> {d.act_quant}, AITER "
              f"{'on' if o.get('aiter') else 'off'}"
              f"{', --backend ' + o['forced_backend'] if o.get('forced_backend') else ''}"
              f"{', --moe-weight ' + o['moe_weight'] if o.get('moe_weight') else ''}")
    how = ""
    if resolution is not None and resolution.requested == "auto":
        how = (f", --vllm auto: the installed vLLM {resolution.installed}" if resolution.installed
               else ", --vllm auto: no vLLM installed here")
    con.print(f"vLLM {o.get('vllm_release')} (the release modelled{how}), selector: {o.get('selector')} "
              f"(converter {o.get('converter')})")
    if resolution is not None and resolution.note:
        con.print(escape(f"Note: {resolution.note}"))

    cands = Table(title="Backends tried, in order", show_lines=False)
    cands.add_column("#", justify="right")
    cands.add_column("backend")
    cands.add_column("result")
    cands.add_column("reason", overflow="fold")
    for i, c in enumerate(d.candidates, 1):
        if c.selected:
            result = "[green]selected[/]"
        elif c.backend == o.get("vllm_backend") and "vLLM's pick" in c.reason:
            result = "[yellow]vLLM's pick[/]"
        else:
            result = "[red]rejected[/]"
        cands.add_row(str(i), c.backend, result, escape(c.reason))
    con.print(cands)

    con.print(f"[bold]Backend: {d.backend}[/]"
              + (f"  (vLLM would pick {o['vllm_backend']})"
                 if o.get("vllm_backend") and o["vllm_backend"] != d.backend else ""))
    served = _served_by(d)
    if served:
        con.print(f"[bold]Served by (vLLM plugin):[/] {escape(served)}")
    geo = Table(title="Padded geometry (per rank)")
    for col in ("", "real", "padded"):
        geo.add_column(col, justify="right" if col else "left")
    geo.add_row("hidden", str(d.hidden), str(d.hidden_padded))
    geo.add_row("intermediate / rank", str(d.intermediate_per_rank),
                str(d.intermediate_per_rank_padded))
    geo.add_row("intermediate (global)", str(d.intermediate), "")
    geo.add_row("experts / rank", str(d.experts_per_rank), "")
    con.print(geo)
    con.print(f"Alignment: {o.get('alignment_rule')}")
    if output:
        n = output["shards"]
        con.print(f"Output: {_size(output['bytes'])} of tensors in {n} shard{'s' if n != 1 else ''} "
                  f"(source {_size(output['source_bytes'])}); convert takes about "
                  f"{_duration(output['estimated_seconds'])} at {CONVERT_RATE / 1e9:.1f} GB/s written "
                  f"(measured on 2 cores; more cores and a faster disk go faster, a hub download comes on top)")

    lay = Table(title="Layout recipe")
    lay.add_column("tensor")
    lay.add_column("layout")
    for k, v in d.layout.as_dict().items():
        lay.add_row(k, escape(v))
    con.print(lay)
    pad = f"0x{d.scale_pad_byte:02X}"
    con.print(f"gate_mode {d.gate_mode}, is_shuffled {d.is_shuffled}, scale pad byte {pad}, "
              f"kernel activations {o.get('kernel_act')}")
    con.print("Producible by mxfp4conv here: " + ", ".join(o.get("producible") or []))
    env = " ".join(f"{k}={v}" for k, v in d.runtime_env.items())
    con.print(f"[bold]Server environment:[/] {env or '(none)'}")
    if o.get("vllm_runtime_env") is not None:
        venv = " ".join(f"{k}={v}" for k, v in o["vllm_runtime_env"].items())
        con.print(f"vLLM's own pick ({o.get('vllm_backend')}) runs with: {venv or '(none)'}")
    for n in d.notes:
        con.print(f"- {escape(n)}")


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        source: str = options.source_argument(),
        arch: str = options.arch_option(),
        tp: int = options.tp_option(),
        ep: bool = typer.Option(False, "--ep", help="Expert parallel over the --tp ranks."),
        act_quant: str = options.act_quant_option(),
        no_aiter: bool = typer.Option(False, "--no-aiter", help="Model a ROCm server without AITER."),
        backend: str = options.backend_option(),
        layout: str = options.layout_option(),
        moe_weight: str = options.moe_weight_option(),
        vllm: str = options.vllm_option(),
        revision: str = options.revision_option(),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    ) -> None:
        """Show which backend vLLM would pick, why, and the padding, layouts, output size and
        server environment a conversion for that target produces."""
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
            _already_converted(source, manifest, canonical, tp, ep, as_json)
            return
        model = load_model(src)
        target = Target(arch=canonical, tp=tp, ep=ep, act_quant=act_quant, aiter=not no_aiter,
                        backend=backend, layout=layout, vllm=release, moe_weight=moe_weight)
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
        _render(d, model, source, output, resolution)
