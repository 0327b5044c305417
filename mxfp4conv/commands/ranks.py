"""``mxfp4conv ranks OUT [--ranks a-b | --data-parallel-start-rank S --data-parallel-size-local L]``:
the files one node of a multi-node server needs, as huggingface_hub ``allow_patterns``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer


def _files(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for f in filenames:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = p.stat().st_size
    return out


def node_ranks(par, ranks: str | None, start: int | None, local: int | None) -> str:
    """The ``--ranks`` text for the options given (vLLM's DP start rank and local size: a node
    runs DP ranks S..S+L-1, each over tp x pcp MoE ranks)."""
    from mxfp4conv.errors import Mxfp4convError

    if ranks is not None:
        if start is not None or local is not None:
            raise typer.BadParameter("give either --ranks or --data-parallel-start-rank with "
                                     "--data-parallel-size-local, not both.", param_hint="--ranks")
        return ranks
    if start is None and local is None:
        return f"0-{par.ranks - 1}"
    start = 0 if start is None else start
    local = par.dp - start if local is None else local
    if start + local > par.dp or local < 1:
        raise Mxfp4convError(
            f"data-parallel ranks {start}..{start + local - 1} are outside the checkpoint's data-parallel size "
            f"{par.dp} ({par.describe()}); a node runs --data-parallel-start-rank S with "
            f"--data-parallel-size-local L, S + L <= {par.dp}.")
    per = par.tp * par.pcp
    return f"{start * per}-{(start + local) * per - 1}"


def register(app: typer.Typer) -> None:
    @app.command("ranks")
    def ranks_cmd(
        out: Path = typer.Argument(..., metavar="OUT", help="A converted checkpoint directory."),
        ranks: str = typer.Option(None, "--ranks", metavar="A-B",
                                  help="MoE ranks the node serves: 0-7, 3 or 0-3,8-11 (default: all)."),
        start: int = typer.Option(None, "--data-parallel-start-rank", min=0, metavar="S",
                                  help="The node's first data-parallel rank (vLLM's option of that name)."),
        local: int = typer.Option(None, "--data-parallel-size-local", min=1, metavar="L",
                                  help="Data-parallel ranks on the node (vLLM's option of that name)."),
        print_patterns: bool = typer.Option(False, "--print-patterns",
                                            help="Print only the allow_patterns, one a line."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    ) -> None:
        """The per-rank map of OUT and the files a node serving some of its ranks needs: the shared
        tensors' shards, its ranks' expert shards and the small files, as huggingface_hub
        allow_patterns (snapshot_download(repo, allow_patterns=...))."""
        from mxfp4conv.convert.rank_files import node_share, parse_ranks
        from mxfp4conv.runtime.loader import _weight_map, parallel_layout, read_manifest

        manifest = read_manifest(out)
        par = parallel_layout(manifest)
        chosen = parse_ranks(node_ranks(par, ranks, start, local), par.ranks)
        share = node_share(_weight_map(out), chosen, _files(out))
        moe = manifest["moe"]
        rows = [{"rank": r, "dp_rank": par.worker(r)[0], "tp_rank": par.worker(r)[2],
                 "experts": list(par.experts(r)), "intermediate": list(par.intermediate_slice(r, moe["intermediate"]))}
                for r in chosen]
        if as_json:
            print(json.dumps({"layout": par.record(moe["intermediate"]) | {"rank_map": None},
                              "ranks": rows, "allow_patterns": share.allow_patterns(),
                              "shared_shards": share.shared_shards, "rank_shards": share.rank_shards,
                              "bytes": share.bytes, "total_bytes": share.total_bytes}, indent=2))
            return
        if print_patterns:
            print("\n".join(share.allow_patterns()))
            return
        from mxfp4conv.commands.plan import _ids, _size

        print(f"{out}: {par.describe()}; {len(chosen)} of {par.ranks} MoE ranks chosen")
        for row in rows:
            a, b = row["intermediate"]
            print(f"  rank {row['rank']} (dp rank {row['dp_rank']}, tp rank {row['tp_rank']}): experts "
                  f"{_ids(row['experts'])}, intermediate [{a}, {b})")
        print(f"files: {len(share.files)} ({_size(share.bytes)} of {_size(share.total_bytes)}): "
              f"{len(share.shared_shards)} shared shards, {len(share.rank_shards)} expert shards of these ranks, "
              f"{len(share.other_files)} other files")
        print("allow_patterns = " + json.dumps(share.allow_patterns()))
