"""``mxfp4conv example FAMILY OUT [--scheme S] [--force] [--json]``: a tiny synthetic checkpoint."""

from __future__ import annotations

import json

import typer

from mxfp4conv.commands import options

FAMILIES = ("kimi_k3", "deepseek_v4", "quark", "gpt_oss", "compressed_tensors", "quark_gpt_oss")  # synthetic.FAMILIES
SCHEMES = ("w_mxfp4", "w_mxfp4_a_mxfp4", "w_mxfp4_a_fp8")  # synthetic.QUARK_SCHEMES / CT_SCHEMES


def _check_family(value: str) -> str:
    family = value.replace("-", "_").lower()
    if family not in FAMILIES:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(FAMILIES)}."
                                 f"{options.did_you_mean(family, FAMILIES)}")
    return family


def register(app: typer.Typer) -> None:
    @app.command("example")
    def example_cmd(
        family: str = typer.Argument(..., metavar="FAMILY", callback=_check_family,
                                     autocompletion=lambda incomplete: [f for f in FAMILIES if f.startswith(incomplete)],
                                     help="kimi_k3, deepseek_v4, quark (DeepSeek-V3 base), gpt_oss, "
                                     "compressed_tensors (llmcompressor's Qwen3-MoE export) or quark_gpt_oss "
                                     "(Quark's gpt-oss export)."),
        out: str = typer.Argument(..., metavar="OUT", help="New (or empty) directory to write."),
        scheme: str = typer.Option(None, "--scheme", metavar="S", **options.one_of(SCHEMES),
                                   help="Quark / compressed-tensors scheme: w_mxfp4, w_mxfp4_a_mxfp4 "
                                        "or w_mxfp4_a_fp8."),
        seed: int = typer.Option(0, "--seed", metavar="N", help="Random seed of the synthetic weights."),
        force: bool = typer.Option(False, "--force",
                                   help="Replace OUT if it already holds a checkpoint (e.g. an earlier example)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    ) -> None:
        """Write a tiny synthetic checkpoint in FAMILY's real on-disk format."""
        from mxfp4conv.checkpoint.synthetic import make_checkpoint

        path = make_checkpoint(family, out, scheme=scheme, seed=seed, force=force)
        if as_json:
            print(json.dumps({"path": str(path), "family": family, "scheme": scheme or "w_mxfp4",
                              "seed": seed}, indent=2))
            return
        print(f"wrote a synthetic {family}{' ' + scheme if scheme else ''} checkpoint to {path}")
        print(f"next: mxfp4conv inspect {path}")
