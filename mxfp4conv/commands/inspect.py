"""``mxfp4conv inspect SOURCE [--json] [--full]``: what a checkpoint is, from its headers."""

from __future__ import annotations

import typer

from mxfp4conv.commands import options
from mxfp4conv.checkpoint.strict_json import dumps_finite
from mxfp4conv.errors import CheckpointError


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _render(data: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console(highlight=False, soft_wrap=True)  # lines are never wrapped (copy-paste, pipes)
    moe = data["moe"]
    params = ", ".join(f"{k}={v:g}" for k, v in (data.get("activation_params") or {}).items())
    src = data.get("source") or {}
    n = src.get("shards")
    con.print(f"[bold]{escape(str(src.get('spec')))}[/]  ({n} shard{'' if n == 1 else 's'}"
              f"{', revision ' + src['revision'] if src.get('revision') else ''})")
    con.print(f"family        {data['family']}   quant scheme {data['quant_scheme']}")
    con.print(f"activation    {data['activation']}{f' ({params})' if params else ''}")
    if data.get("routing"):
        con.print(f"routing       {data['routing']}   vLLM MoE method "
                  f"{data.get('moe_class') or data.get('moe_method')}")
    if data.get("declared_act"):
        con.print(f"declared act  {data['declared_act']} (input activations in the quant config)")
    layers = moe.get("layers") or []
    con.print(f"MoE           {len(layers)} layers, {moe['num_experts']} experts, top-k "
              f"{moe['top_k']}, hidden {moe['hidden']}, intermediate {moe['intermediate']}")
    if layers:
        shown = ", ".join(layers[:3]) + (f", ... {layers[-1]}" if len(layers) > 3 else "")
        con.print(f"MoE layers    {escape(shown)}")
    if data.get("dtype_variants"):
        con.print("expert dtypes " + ", ".join(f"{k} {v}" for k, v in data["dtype_variants"].items()))
    table = Table(title=f"{data['tensors']} tensors, {_human(data['bytes'])} of tensor data "
                        f"({_human(data['expert_bytes'])} routed experts)")
    table.add_column("group")
    table.add_column("tensors", justify="right")
    table.add_column("bytes", justify="right")
    table.add_column("dtypes")
    for g in data.get("groups") or []:
        table.add_row(escape(g["group"]), str(g["tensors"]), _human(g["bytes"]), ", ".join(g["dtypes"]))
    con.print(table)
    manifest = data.get("kernel_layout")
    if manifest:
        t = manifest.get("target") or {}
        con.print(f"[bold]converted by mxfp4conv[/]: arch {t.get('arch')}, backend "
                  f"{t.get('backend')}, tp {t.get('tp')}{' (EP)' if t.get('ep') else ''}, "
                  f"act-quant {t.get('act_quant')}")
        for kind, name in (manifest.get("layout") or {}).items():
            con.print(escape(f"  layout {kind}: {name}"))
        env = manifest.get("runtime_env") or {}
        if env:
            con.print(escape("  server env: " + " ".join(f"{k}={v}" for k, v in env.items())))
        from mxfp4conv.commands.serve_hint import serve_lines

        for line in serve_lines((data.get("source") or {}).get("spec"), manifest):
            con.print(escape(line))
    scan = data.get("scale_scan")
    if scan:
        if scan["mode"] == "full":
            con.print(f"scale check   read all {_human(scan['bytes_read'])} of expert scale bytes "
                      f"({scan['tensors_read']} tensors) for NaN (0xFF) and implausible magnitudes")
        else:
            con.print(f"scale check   sampled {_human(scan['bytes_read'])} of "
                      f"{_human(scan['bytes_total'])} of expert scale bytes ({scan['tensors_read']} "
                      f"tensors) for NaN (0xFF) and implausible magnitudes; --full scans them all")
    problems = data["problems"]
    if not problems:
        con.print("[green]no problems found[/]")
    for p in problems:
        colour = "red" if p["severity"] == "error" else "yellow"
        con.print(f"[{colour}]{p['severity']}[/]: {escape(p['message'])}")


def register(app: typer.Typer) -> None:
    @app.command("inspect")
    def inspect_cmd(
        source: str = options.source_argument(),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the summary."),
        full: bool = typer.Option(False, "--full", help="Scan every expert scale byte for NaN (reads all scales)."),
        revision: str = options.revision_option(),
    ) -> None:
        """Describe a checkpoint from its headers: family, scheme, MoE geometry, problems."""
        from mxfp4conv.checkpoint.summary import inspect_source

        source = options.with_revision(source, revision)
        report = inspect_source(source, full=full)
        if as_json:
            print(dumps_finite(report.data, indent=2, default=str))
        else:
            _render(report.data)
        errors = report.problems.errors
        if errors:
            raise CheckpointError(f"{source}: {len(errors)} problem(s) found (listed above); the "
                                  f"checkpoint cannot be converted as it is.")
