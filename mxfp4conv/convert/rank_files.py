"""Which files of a converted checkpoint one node needs: the shared tensors' shards, the shards
of its MoE ranks' experts, and every file that is not a weight shard (config, tokenizer,
manifest, index).

``convert`` writes, for more than one rank, the shared tensors and each rank's experts into
shards of their own (``plan.rank_groups``), so a node serving ranks a..b reads (and downloads)
only its share; a checkpoint written before that mixes ranks in a shard, and the shards that
hold any of the node's tensors are listed, whatever else they hold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mxfp4conv.errors import Mxfp4convError

RANK_TENSOR = re.compile(r"\.experts\.rank(\d+)\.")


def parse_ranks(text: str, ranks: int) -> list[int]:
    """``0-7``, ``3`` or ``0-3,8-11`` as a sorted list of MoE ranks inside ``0..ranks-1``."""
    out: set[int] = set()
    for part in str(text).replace(" ", "").split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise Mxfp4convError(f"--ranks {text!r} is not a list of ranks; write e.g. 0-7, 3 or 0-3,8-11.")
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        if a > b or b >= ranks:
            raise Mxfp4convError(f"--ranks {text!r}: the checkpoint holds MoE ranks 0..{ranks - 1}; {part} is "
                                 "outside them.")
        out.update(range(a, b + 1))
    return sorted(out)


@dataclass(frozen=True)
class NodeShare:
    ranks: list[int]
    shared_shards: list[str]  # shards holding tensors every rank needs
    rank_shards: list[str]  # shards holding the experts of ``ranks`` (and no shared tensor)
    other_files: list[str]  # non-shard files (config, tokenizer, manifest, index)
    bytes: int  # size of the files listed
    total_bytes: int  # size of the whole checkpoint

    @property
    def files(self) -> list[str]:
        return sorted(set(self.other_files + self.shared_shards + self.rank_shards))

    def allow_patterns(self) -> list[str]:
        """huggingface_hub ``allow_patterns`` for this share: the file names (fnmatch patterns
        that match exactly themselves; shard and config names hold no wildcard characters)."""
        return self.files


def node_share(weight_map: dict[str, str], ranks: list[int], files: dict[str, int]) -> NodeShare:
    """``files``: every file of the checkpoint (relative path -> size)."""
    shards = set(weight_map.values())
    wanted = set(ranks)
    shared: set[str] = set()
    mine: set[str] = set()
    for name, shard in weight_map.items():
        m = RANK_TENSOR.search(name)
        if m is None:
            shared.add(shard)
        elif int(m.group(1)) in wanted:
            mine.add(shard)
    mine -= shared
    other = sorted(f for f in files if f not in shards and not f.startswith("."))
    listed = set(other) | shared | mine
    return NodeShare(ranks=list(ranks), shared_shards=sorted(shared), rank_shards=sorted(mine), other_files=other,
                     bytes=sum(files.get(f, 0) for f in listed), total_bytes=sum(files.values()))
