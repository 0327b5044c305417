"""``mxfp4conv convert SOURCE OUT --arch A ...``: write a kernel-ready checkpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from mxfp4conv.commands import options


def target_from_options(arch: str, tp: int, ep: bool, act_quant: str, no_aiter: bool, backend: str | None,
                        layout: str = "auto", vllm: str | None = None, moe_weight: str | None = None,
                        dp: int = 1, placement: str = "linear", all2all: str = "allgather_reducescatter"):
    """The Target the command-line options name (their values are checked by ``options``;
    ``--vllm`` is resolved to a modelled release here, so that a manifest records one; a
    malformed value is refused by ``resolve_release``)."""
    from mxfp4conv.oracle import resolve_arch
    from mxfp4conv.oracle.decision import Target
    from mxfp4conv.oracle.releases import resolve_release

    return Target(arch=resolve_arch(arch), tp=tp, ep=ep, act_quant=act_quant, aiter=not no_aiter,
                  backend=backend, layout=layout, vllm=resolve_release(vllm), moe_weight=moe_weight,
                  dp=dp, placement=placement, all2all=all2all)


def register(app: typer.Typer) -> None:
    @app.command("convert")
    def convert_cmd(
        source: str = options.source_argument(),
        out: Path = typer.Argument(..., metavar="OUT", help="Output directory (created; must be empty unless --resume/--force)."),
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
        shard_size: str = options.shard_size_option(),
        resume: bool = typer.Option(False, "--resume", help="Finish the same conversion in OUT (same source, target, tp/ep, shard size), keeping its finished shards; anything else is refused."),
        workers: int = typer.Option(None, "--workers", min=1, metavar="N", show_default=False,
                                    help="Threads that read, transform and write (default: the cores, at most 16)."),
        force: bool = typer.Option(False, "--force", help="Write into a non-empty OUT, replacing earlier output."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
        allow_nan_scales: bool = typer.Option(False, "--allow-nan-scales",
                                              help="Copy e8m0 NaN scale bytes (0xFF) instead of refusing."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout when done "
                                     "(progress stays on stderr)."),
    ) -> None:
        """Convert SOURCE into per-rank, pre-shuffled kernel-ready safetensors in OUT."""
        from mxfp4conv.convert.run import convert

        source = options.with_revision(source, revision)
        target = target_from_options(arch, tp, ep, act_quant, no_aiter, backend, layout, vllm, moe_weight,
                                     dp, placement, all2all)
        options.say_release(vllm, quiet)
        try:
            res = convert(source, out, target, shard_size=shard_size, resume=resume, workers=workers, force=force,
                          progress="none" if quiet else "auto", allow_nan_scales=allow_nan_scales)
        except KeyboardInterrupt:
            # finished shards are complete and recorded; nothing half-written has a final name
            sys.stderr.write(f"\ninterrupted; rerun with --resume to finish the conversion into {out} "
                             f"(finished shards are kept).\n")
            raise SystemExit(130) from None
        from mxfp4conv.commands.serve_hint import serve_lines

        serve = serve_lines(out, res.manifest)
        if as_json:
            print(json.dumps({"out": str(res.out), "shards": res.shards, "kept": res.kept, "redone": res.redone,
                              "bytes_written": res.bytes_written, "target": res.manifest.get("target"),
                              "layout": res.manifest.get("layout"),
                              "runtime_env": res.manifest.get("runtime_env"), "serve": serve[-1].strip()}, indent=2))
            return
        if not quiet:
            print("\n".join(serve))
