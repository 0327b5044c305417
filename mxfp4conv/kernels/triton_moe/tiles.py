"""The tile choice of the Triton paths: ``select_config`` (the configuration a call runs by default, by its
pairs an expert and the layer's shape) and the K splits sized from it.

The choice is data walked by ``select_config``: ``PATHS`` names the path a call takes (the first row of its layout
family that holds), ``TILES`` gives that path's MoEConfig fields (every row of the path that holds adds its own;
fields no row sets keep MoEConfig's defaults). Each row says in a line why it is there; the timings behind it are
in benchmarks/results/performance-notebook.md, "The default tiles, rule by rule", under the row's path, and in the
section a row names. Measured with benchmarks/moe_bench.py --sweep / --gemv-sweep on the DSV3-like (H 7168, I 2048,
E 256, k 8) and K3-like (H 3584, I 384, E 896, k 16) layers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Mapping, Union

import triton

from mxfp4conv.errors import RuntimeInputError
from mxfp4conv.kernels.triton_moe.config import MoEConfig
from mxfp4conv.kernels.triton_moe.layouts import HOPPER_SETS


@dataclass(frozen=True)
class Call:
    """What the tile choice reads of a call: its routing and the layer's shape."""

    num_pairs: int
    num_experts: int
    hidden: int
    inter: int
    family: str  # "hopper" (the hopper_mma layout sets) or "identity" (any other layout)

    @property
    def per_expert(self) -> float:
        """Pairs an expert, over the experts the pairs can touch."""
        return self.num_pairs / max(1, min(self.num_experts, self.num_pairs))

    @property
    def short(self) -> bool:
        """Short GEMM2 rows: I <= 512, at most four 128-code K steps (K3-like I = 384)."""
        return self.inter <= 512


@dataclass(frozen=True)
class Path:
    family: str
    name: str
    when: Callable[[Call], bool]
    why: str


@dataclass(frozen=True)
class Tiles:
    path: str
    when: Callable[[Call], bool]
    fields: Union[Mapping[str, object], Callable[[Call], Mapping[str, object]]]  # or a function of the call
    why: str


def _always(c: Call) -> bool:
    return True


def _pe(lo: float = -float("inf"), hi: float = float("inf")) -> Callable[[Call], bool]:
    """Pairs an expert in (lo, hi]."""
    return lambda c: lo < c.per_expert <= hi


def _one_token_splits(c: Call) -> dict:
    # GEMM1's K splits at least six 128-code steps long, fewer than the automatic count where that is more (the
    # fused tail and each program's pipeline fill weigh less); no GEMM2 K split once its 64-row tiles alone give
    # enough programs
    auto1, _ = _splits(0, c.num_pairs * triton.cdiv(c.inter, 64), c.hidden, 128)
    return dict(split_k1=max(1, min(auto1, c.hidden // 128 // 6)),
                split_k2=1 if c.num_pairs * (c.hidden // 64) >= 768 else 0)


def _many_programs(c: Call) -> bool:
    """GEMM2 in one 128-row tile a program would run at least three times _TARGET_PROGRAMS programs."""
    return c.num_pairs * triton.cdiv(c.hidden, 128) >= 3 * _TARGET_PROGRAMS


# The path a call takes: the first row of its family that holds.
PATHS = (
    Path("hopper", "hopper prefill", _pe(48),
         "128-pair blocks, row tiles first, once experts see many pairs"),
    Path("hopper", "hopper one token", lambda c: c.num_pairs <= 16,
         "one token: one block a pair, the reductions fused into the GEMMs' tails (MoEConfig.direct / fused)"),
    Path("hopper", "hopper expert blocks", _always,
         "swap-AB blocks of 16 / 32 / 64 pairs while experts see few pairs"),
    Path("identity", "identity decode", _pe(hi=32),
         "the decode path without tensor cores at <= 1 pair an expert (uses_gemv), 16-pair word-decode blocks past"),
    Path("identity", "identity prefill", _always, "64 / 128-pair blocks with the byte decode"),
)


# The fields of each path. Rows of one path that hold together set different fields.
TILES = (
    Tiles("hopper prefill", _always,
          dict(block_t=128, block_n1=128, block_k=128, num_warps=8, num_stages=3, rows_first1=1, rows_first2=1),
          "a block's row tiles side by side in both grids: its activation rows come from DRAM about once"),
    Tiles("hopper prefill", lambda c: c.short, dict(block_n2=128, num_warps2=4, num_stages2=1),
          "short GEMM2 rows: 128-row tiles, 4 warps, one stage (K3-like)"),
    Tiles("hopper prefill", lambda c: not c.short, dict(block_n2=256),
          "long GEMM2 rows: 256-row tiles (DSV3-like)"),
    Tiles("hopper prefill", _pe(48, 96), dict(tail_t=64, dual=2),
          "most blocks fit 64 or 64 + 16 pairs: 64-pair tail tiles, up to 80 pairs in 64 + 16 "
          "(\"64-pair tails in 64 + 16 tiles on 128-pair blocks\")"),
    Tiles("hopper prefill", _pe(96), dict(tail_t=32, absorb=32),
          "most experts' second block holds <= 32 pairs: 32-pair tail tiles, GEMM1 running an expert's last one in "
          "the program of the block before (\"Prefill: an expert's last small block in the program of the block "
          "before it\")"),
    Tiles("hopper prefill", lambda c: c.per_expert > 96 and c.short, dict(absorb2=16),
          "GEMM2 absorbs up to 16 pairs where its rows are short; 256-row tiles spill with a second tile"),
    Tiles("hopper prefill", _pe(64), dict(factor_pairs=0),
          "the e8m0 factors two to a word win at 64 pairs an expert, not past it: one at a time there"),

    Tiles("hopper one token", _always,
          dict(block_t=16, block_n1=64, block_n2=64, block_k=128, num_warps=4, num_stages=3),
          "64-row GEMM2 tiles: more programs for few pairs"),
    Tiles("hopper one token", _always, _one_token_splits,
          "K3-like: 4 GEMM1 K splits of 7 steps beat 10 of 3"),

    Tiles("hopper expert blocks", _always,
          dict(block_n1=64, block_n2=128, block_k=128, num_warps=4, num_stages=3, rows_first1=1, rows_first2=1),
          "a block's row tiles side by side in both grids (\"Row tiles first on every sorted block\")"),
    Tiles("hopper expert blocks", _pe(hi=12), dict(block_t=16, maxnreg=96),
          "16-pair blocks capped at 96 registers: the same instructions in 54, 7 programs an SM, not 4 "
          "(\"The power limit; register caps on 16- and 32-pair blocks\")"),
    Tiles("hopper expert blocks", _pe(12, 24), dict(block_t=32, tail_t=16),
          "32-pair blocks; those holding at most 16 pairs in 16-pair tiles"),
    Tiles("hopper expert blocks", lambda c: 12 < c.per_expert <= 24 and c.short, dict(maxnreg=112),
          "capped at 112 registers where GEMM2's rows are short; long rows uncapped (no faster capped)"),
    Tiles("hopper expert blocks", _pe(12, 24), dict(wgmma1=1),
          "GEMM1 in gluon_wgmma, the words through a 3-stage cp.async ring "
          "(\"GEMM1 of 32-pair blocks in gluon_wgmma\")"),
    Tiles("hopper expert blocks", _pe(24), dict(block_t=64, tail_t=32, dual=1),
          "64-pair blocks; those holding at most 32 pairs in 32-pair tiles, up to 48 in 32 + 16"),
    Tiles("hopper expert blocks", lambda c: c.per_expert >= 32 and not c.short,
          dict(wgmma1=1, wgmma1_stages=2, wgmma_dual=2),
          "long GEMM2 rows from 32 pairs an expert: GEMM1 in gluon_wgmma's 2-stage ring, 32 + 8 and 32 + 16 tiles "
          "(\"32 + 8 tiles in gluon_wgmma\")"),
    Tiles("hopper expert blocks", lambda c: c.short and 1.05 < c.per_expert <= 24, dict(rows2=4, maxnreg2=0),
          "short GEMM2 rows past one pair an expert: four row tiles a program in one flat loop, uncapped"),
    Tiles("hopper expert blocks", lambda c: c.short and c.per_expert <= 1.05 and _many_programs(c),
          dict(rows2=3, maxnreg2=0),
          "short rows at one pair an expert: three row tiles a program once one a program gives programs enough"),

    Tiles("identity decode", _always,
          dict(block_t=16, block_n1=64, block_n2=128, block_k=128, num_warps=4, num_stages=2, mode=1, maxnreg=96),
          "16-pair blocks with the int32-word decode"),
    Tiles("identity decode", lambda c: c.inter % 256 == 0,
          dict(gemv_block_n1=16, gemv_block_n2=16, gemv_block_k=256),
          "no tensor cores: 16-row tiles with 256-code K steps where I allows them (faster on DSV3-like)"),
    Tiles("identity decode", lambda c: c.inter % 256 != 0,
          dict(gemv_block_n1=32, gemv_block_n2=32, gemv_block_k=128),
          "no tensor cores: 32-row tiles with 128-code K steps (faster on K3-like, I 384)"),

    Tiles("identity prefill", _always, dict(block_n1=128, block_n2=128, block_k=64, num_warps=8, num_stages=3, mode=0),
          "the byte decode on 128-row tiles"),
    Tiles("identity prefill", _pe(32, 64), dict(block_t=64), "64-pair blocks up to 64 pairs an expert"),
    Tiles("identity prefill", _pe(64), dict(block_t=128), "128-pair blocks past"),
)


def rows_of(call: Call) -> tuple[Path, list[Tiles]]:
    """The path ``call`` takes and the rows of TILES that give its fields."""
    path = next(p for p in PATHS if p.family == call.family and p.when(call))
    return path, [row for row in TILES if row.path == path.name and row.when(call)]


@functools.lru_cache(maxsize=4096)  # a pure function of a few ints, asked at every call that brings no config
def select_config(num_pairs: int, num_experts: int, hidden: int, inter: int, layout: str = "identity") -> MoEConfig:
    """The default MoEConfig of a call routing num_pairs (token, expert) pairs over num_experts experts of a layer
    (hidden, inter) whose weights are in ``layout``: the fields of its path's rows in TILES."""
    call = Call(num_pairs, num_experts, hidden, inter, "hopper" if layout in HOPPER_SETS else "identity")
    path, rows = rows_of(call)
    fields: dict = {}
    for row in rows:
        more = row.fields(call) if callable(row.fields) else row.fields
        if fields.keys() & more.keys():
            raise AssertionError(f"tiles.TILES: {path.name} sets {sorted(fields.keys() & more.keys())} twice")
        fields.update(more)
    return MoEConfig(**fields)


_TARGET_PROGRAMS = 1024  # about 8 programs per SM on 132 SMs: enough warps to hide latency


def _splits(requested: int, programs: int, k: int, block_k: int) -> tuple[int, int]:
    """(number of K splits, K elements per split); requested 0 = enough splits to reach
    _TARGET_PROGRAMS programs, keeping at least two K steps per split."""
    steps = triton.cdiv(k, block_k)
    want = requested or max(1, min(steps // 2, triton.cdiv(_TARGET_PROGRAMS, max(1, programs))))
    per = triton.cdiv(steps, max(1, want))
    return triton.cdiv(steps, per), per * block_k


def gemm_splits(cfg: MoEConfig, num_pairs: int, E: int, H: int, i_pad: int, direct: bool, rows2: int = 1):
    """((splits, K per split) of GEMM1, the same of GEMM2) of the tensor-core paths: the automatic
    counts size the grid from the blocks the align can make (one per pair with ``direct``)."""
    blocks = num_pairs if direct else num_pairs // cfg.block_t + min(E, num_pairs)
    programs2 = blocks * triton.cdiv(triton.cdiv(H, cfg.block_n2), rows2)
    return (_splits(cfg.split_k1, blocks * triton.cdiv(i_pad, cfg.block_n1), H, cfg.block_k),
            _splits(cfg.split_k2, programs2, i_pad, cfg.block_k))


def _gemv_block_t(cfg: MoEConfig, per_expert: float) -> int:
    if cfg.gemv_block_t:
        if cfg.gemv_block_t not in (1, 2, 4):
            raise RuntimeInputError(f"fused_moe_triton: gemv_block_t must be 1, 2 or 4, got {cfg.gemv_block_t}.")
        return cfg.gemv_block_t
    return 1 if per_expert <= 1.25 else 2 if per_expert <= 2.5 else 4


def _gemv_block_k(block_k: int, k: int) -> int:
    """Largest of block_k, block_k/2, ... (>= 128) dividing k, else block_k (masked tail)."""
    bk = block_k
    while bk > 128 and k % bk:
        bk //= 2
    return bk if k % bk == 0 else block_k


def uses_gemv(cfg: MoEConfig, num_pairs: int, num_experts: int) -> bool:
    """Whether fused_moe_triton takes the decode path without tensor cores for this routing."""
    per_expert = num_pairs / max(1, min(num_experts, num_pairs))
    return cfg.gemv_max_pairs > 0 and per_expert <= cfg.gemv_max_pairs
