"""``mxfp4conv convert SOURCE OUT --arch A ...``: write a kernel-ready checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer


def target_from_options(arch: str, tp: int, ep: bool, act_quant: str, no_aiter: bool, backend: str | None,
                        layout: str = "auto", vllm: str | None = None):
    from mxfp4conv.errors import Mxfp4convError
    from mxfp4conv.oracle import resolve_arch
    from mxfp4conv.oracle.decision import Target
    from mxfp4conv.oracle.releases import resolve_release

    if tp < 1:
        raise Mxfp4convError(f"--tp must be at least 1, got {tp}.")
    if act_quant not in ("auto", "bf16", "fp8", "mxfp4"):
        raise Mxfp4convError(f"--act-quant must be one of auto, bf16, fp8, mxfp4; got {act_quant!r}.")
    return Target(arch=resolve_arch(arch), tp=tp, ep=ep, act_quant=act_quant, aiter=not no_aiter,
                  backend=backend, layout=layout, vllm=resolve_release(vllm))


VLLM_HELP = ("vLLM release whose MoE decision is modelled (default: the newest modelled, 0.33 = "
             "vLLM 0.33.0).")
LAYOUT_HELP = ("Layout of mxfp4conv's own (EMULATION) format: auto (hopper_mma on sm90 with bf16 "
               "activations, else identity), identity (canonical bytes) or hopper_mma.")


def register(app: typer.Typer) -> None:
    @app.command("convert")
    def convert_cmd(
        source: str = typer.Argument(..., help="Source checkpoint: a local directory or org/name[@revision]."),
        out: Path = typer.Argument(..., help="Output directory (created; must be empty unless --resume/--force)."),
        arch: str = typer.Option(..., "--arch", help="Target GPU arch (gfx942, gfx950, gfx1250, sm90, ... or an alias)."),
        tp: int = typer.Option(1, "--tp", help="Tensor-parallel ranks."),
        ep: bool = typer.Option(False, "--ep", help="Expert parallel over the --tp ranks instead of splitting I."),
        act_quant: str = typer.Option("auto", "--act-quant", help="auto, bf16, fp8 or mxfp4."),
        no_aiter: bool = typer.Option(False, "--no-aiter", help="Model a ROCm server without AITER."),
        backend: str = typer.Option(None, "--backend", help="Force a vLLM MXFP4 MoE backend."),
        layout: str = typer.Option("auto", "--layout", help=LAYOUT_HELP),
        vllm: str = typer.Option(None, "--vllm", help=VLLM_HELP),
        shard_size: str = typer.Option("5GB", "--shard-size", help="Maximum output shard size, e.g. 5GB, 500MB."),
        resume: bool = typer.Option(False, "--resume", help="Keep finished shards of an interrupted run into OUT."),
        workers: int = typer.Option(2, "--workers", help="Threads that read and transform experts."),
        force: bool = typer.Option(False, "--force", help="Write into a non-empty OUT, replacing earlier output."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
        allow_nan_scales: bool = typer.Option(False, "--allow-nan-scales",
                                              help="Copy e8m0 NaN scale bytes (0xFF) instead of refusing."),
    ) -> None:
        """Convert SOURCE into per-rank, pre-shuffled kernel-ready safetensors in OUT."""
        from mxfp4conv.convert.run import convert

        target = target_from_options(arch, tp, ep, act_quant, no_aiter, backend, layout, vllm)
        convert(source, out, target, shard_size=shard_size, resume=resume, workers=workers, force=force,
                progress="none" if quiet else "auto", allow_nan_scales=allow_nan_scales)
