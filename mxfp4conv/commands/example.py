"""``mxfp4conv example FAMILY OUT [--scheme S] [--force] [--json]``: a tiny synthetic checkpoint."""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer) -> None:
    @app.command("example")
    def example_cmd(
        family: str = typer.Argument(..., metavar="FAMILY", help="kimi_k3, deepseek_v4, quark (DeepSeek-V3 base), gpt_oss, "
                                     "compressed_tensors (llmcompressor's Qwen3-MoE export) or quark_gpt_oss "
                                     "(Quark's gpt-oss export)."),
        out: str = typer.Argument(..., metavar="OUT", help="New (or empty) directory to write."),
        scheme: str = typer.Option(None, "--scheme", metavar="S",
                                   help="Quark / compressed-tensors scheme: w_mxfp4, w_mxfp4_a_mxfp4 "
                                        "or w_mxfp4_a_fp8."),
        seed: int = typer.Option(0, "--seed", metavar="N", help="Random seed of the synthetic weights."),
        force: bool = typer.Option(False, "--force",
                                   help="Replace OUT if it already holds a checkpoint (e.g. an earlier example)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    ) -> None:
        """Write a tiny synthetic checkpoint in FAMILY's real on-disk format."""
        from mxfp4conv.checkpoint.synthetic import make_checkpoint

        family = family.replace("-", "_")
        path = make_checkpoint(family, out, scheme=scheme, seed=seed, force=force)
        if as_json:
            print(json.dumps({"path": str(path), "family": family, "scheme": scheme or "w_mxfp4",
                              "seed": seed}, indent=2))
            return
        print(f"wrote a synthetic {family}{' ' + scheme if scheme else ''} checkpoint to {path}")
        print(f"next: mxfp4conv inspect {path}")
