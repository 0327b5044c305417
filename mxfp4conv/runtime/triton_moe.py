"""Fused MXFP4 MoE forward in Triton (W4A16): the ``triton`` backend of ``fused_moe``.

Steps (four launches): align (sort the (token, k) pairs by expert into padded blocks),
GEMM1 (gate and up rows of w13 dequantised in registers, activation in the epilogue,
intermediate written once in the activation dtype), GEMM2 (w2, top-k weight and bias
applied, one row per (token, k) pair) and a deterministic sum over k. No float atomics.
When few tokens leave SMs idle, both GEMMs split K: GEMM1 then writes fp32 partials and a
fifth small kernel sums them and applies the activation; GEMM2's partials are summed by the
final k-sum.
On the Hopper layouts one token takes two kernels and a memset instead: no align (one block per
pair), the split-K activation and the k-sum in the GEMMs' tails (``hopper_options``); and on
hopper_mma_xor and hopper_mma_rot, 1 to 9 bf16 tokens on an sm_90 GPU go to the Gluon kernels of
``gluon_few_tokens`` (``gluon_plan``), a program per (token, expert) pair, while their pairs
number under a fifth of the experts, and past that, at up to 5.5 pairs an expert (gluon_grouped_pairs), to those of
``gluon_grouped`` (``grouped_plan``) on 8-pair expert blocks.
Two GEMM implementations: tensor-core MMA (swap-AB, weights decoded into the MMA operand) and,
for decode batches where each touched expert sees about one pair, a path without tensor cores
(``moe_gemv*_kernel``: the weight tile stays in its load layout, products accumulate
elementwise). ``uses_gemv`` says which one a call takes; ``MoEConfig.gemv_max_pairs`` sets the
threshold. See ``triton_moe_kernels`` for the kernels themselves.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass
from typing import Mapping

import torch
import triton
import triton.compiler.errors

from mxfp4conv.errors import RuntimeInputError
from mxfp4conv.runtime import triton_hopper_kernels as HK
from mxfp4conv.runtime import triton_moe_kernels as K
from mxfp4conv.runtime.activations import activation_params

LAYOUTS = ("identity", "hopper_mma_w", "hopper_mma_w_rot", "hopper_mma_w_xor", "hopper_mma_s")  # per tensor
# layout argument of fused_moe_triton -> (weights, scales) layouts it means; hopper_mma_rot and hopper_mma_xor differ
# from hopper_mma only in the bit order within the weight words (shuffle.hopper)
LAYOUT_SETS = {"identity": ("identity", "identity"), "hopper_mma": ("hopper_mma_w", "hopper_mma_s"),
               "hopper_mma_rot": ("hopper_mma_w_rot", "hopper_mma_s"),
               "hopper_mma_xor": ("hopper_mma_w_xor", "hopper_mma_s")}
# the hopper_mma sets -> their words' bit order (hopper_np.ORDERS); the Gluon kernels decode the last two
HOPPER_ORDERS = {"hopper_mma": "plain", "hopper_mma_rot": "rot", "hopper_mma_xor": "xor"}
HOPPER_SETS = tuple(HOPPER_ORDERS)
GLUON_SETS = ("hopper_mma_rot", "hopper_mma_xor")
_ACT_IDS = {"silu": K.ACT_SILU, "situ": K.ACT_SITU, "swigluoai": K.ACT_SWIGLUOAI}
_TL_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


@dataclass(frozen=True)
class MoEConfig:
    """Tile sizes of both GEMMs (BLOCK_N: weight rows per program, BLOCK_T: pairs per block)."""

    block_t: int = 16
    block_n1: int = 64
    block_n2: int = 128
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4
    # 0: byte decode, 1: int32-word decode (bf16 x; fp16 x falls back to 0), 2: tl.dot_scaled,
    # 3: word decode into 8 split dots (modes 1-3 need bf16/fp16 x; fp32 x always takes mode 0)
    mode: int = 0
    split_k1: int = 0  # K splits of GEMM1 / GEMM2; 0 = automatic (decode: fill the GPU), 1 = none
    split_k2: int = 0
    maxnreg: int = 0  # register cap per thread for both GEMMs (0 = compiler's choice)
    # decode path without tensor cores (moe_gemv*_kernel): taken when num_pairs / min(E, num_pairs)
    # is at most gemv_max_pairs (0 = never). Measured on an H200 (benchmarks/results/performance-notebook.md): it wins
    # 1.5-1.8x while that ratio is 1 (T = 1 and 8 on both test layers) and loses or ties from
    # 1.14 (K3 T = 64) and 2 (DSV3 T = 64) on: it decodes the weights once per pair block, the
    # MMA path once per 16 pairs.
    gemv_max_pairs: float = 1.0
    gemv_block_t: int = 0  # pairs per expert block on that path: 1, 2 or 4; 0 = from the pairs per expert
    gemv_block_n1: int = 32  # gate rows (and as many up rows) per program
    gemv_block_n2: int = 32
    gemv_block_k: int = 128  # K codes per step (halved, down to 128, until it divides K)
    gemv_num_warps: int = 4
    gemv_asm: bool = True  # PTX cvt of the fp16 halves on NVIDIA GPUs (the generic code elsewhere)
    gemv_kmajor: int = -1  # word tile stored [K words, rows] (1) or [rows, K words] (0); -1: by Triton version
    # hopper_mma path only (1 on, 0 off, -1 automatic; see triton_hopper_kernels):
    direct: int = -1  # one token: block m = pair m, no align kernel (automatic: on for T = 1)
    fused: int = -1  # split-K activation and the sum over k in the GEMMs' tails (automatic: with direct)
    pdl: int = -1  # GEMM2 launched as a programmatic dependent of GEMM1 (automatic: with direct, where Triton has it)
    num_warps2: int = 0  # warps of GEMM2 (0 = num_warps)
    rows2: int = 1  # GEMM2 row tiles per program, in one flat loop (hopper_mma, not with fused)
    maxnreg2: int = -1  # register cap of GEMM2 (-1 = maxnreg)
    align: int = -1  # align over many programs (1), one program (0), or by the pair count (-1; see moe_align)
    num_stages2: int = 0  # pipeline depth of GEMM2 (0 = num_stages; hopper_mma)
    # program order of GEMM1 / GEMM2 (hopper_mma, not with fused): 0 = pair blocks vary fastest
    # (a wave spans many experts at one row tile), 1 = row tiles vary fastest (a block's row tiles
    # run side by side, so its activation rows are read from DRAM about once)
    rows_first1: int = 0
    rows_first2: int = 0
    # pairs of a block's smaller tile (hopper_mma, sorted blocks; 0 = off): a block holding at most
    # tail_t pairs (an expert's last, partly filled block) runs both GEMMs on [rows, tail_t] tiles
    # instead of [rows, block_t] ones (its MMAs over the empty slots are not done)
    tail_t: int = 0
    # with tail_t: a block of up to 1.5 tail_t pairs in two tiles, [rows, tail_t] and [rows, tail_t / 2],
    # on the same decoded weights (1 on, 0 off; needs tail_t >= 32); 2: also [rows, tail_t] and [rows, tail_t / 4]
    # up to 1.25 tail_t (a tile's empty slots cost the MMAs what full ones do; needs tail_t >= 64: with 8-pair
    # second tiles Triton 3.6's kernels gave wrong, unrepeatable outputs on an H100 and ran 1.2-1.4x slower)
    dual: int = 0
    tail_t2: int = -1  # GEMM2's tail_t where it differs (-1: tail_t; 0: none)
    # with tail_t: an expert's last block of at most absorb pairs (absorb2 in GEMM2) run as a second [rows, absorb]
    # tile in the program of the expert's block before it, on the weights that program decodes anyway (0 off, else a
    # power of two from 16 up to that GEMM's tail_t)
    absorb: int = 0
    absorb2: int = 0
    # hopper_mma decode: the e8m0 factors of scales <= 2 two to a word (1: a byte permute and a
    # multiply-add per two) or one at a time (0: the v13 instructions)
    factor_pairs: int = 1
    # up to gluon_max_tokens tokens over hopper_mma_xor / _rot with bf16 x: the Gluon MMA v2 kernels of
    # gluon_few_tokens, a program per (token, expert) pair (1 on where they can run, 0 off, -1 automatic: on
    # GPUs of compute capability 9.x, where they were measured), codes a K step of their GEMM1 / GEMM2
    # (64 or 128; 64 where K is no multiple; GEMM1's 0: 64 at one token, 128 from two but see short_steps_fit) and K
    # splits (0: automatic, see gluon_tiles; each lowered to a divisor of the K steps)
    gluon: int = -1
    gluon_k1: int = 0
    gluon_k2: int = 128
    gluon_split1: int = 0
    gluon_split2: int = 0
    # and their GEMM2 a programmatic dependent of GEMM1 where Triton has it, released after GEMM1's K loops
    # (2: 0.970-0.985 / 0.951-0.962 of the time without, DSV3- / K3-like, T = 1), from its start
    # (1: 1.027-1.034 / 0.987-0.992), or not (0)
    gluon_pdl: int = 2
    # and the sum over a token's pairs in GEMM2's last program of each of its row blocks (1), or in the Triton k-sum
    # kernel launched after GEMM2 over its fp32 partials (0: GEMM2 counts no arrivals), or automatic (-1:
    # sum2_by_kernel)
    gluon_sum2: int = -1
    # and both Gluon paths' GEMM1 storing its rows in GEMM2's fragment order, so that GEMM2 loads a lane's B operand
    # of a step in 16-byte words (1), or in 32-bit ones from rows in plain order (0); bit-equal outputs. On an H200,
    # 1 against 0: per pair DSV3-like T = 1 / 2 / 4 0.985 / 0.990 / 0.988, K3-like T = 1 / 2 / 4 / 8 1.000 / 0.992 /
    # 0.994 / 0.979; expert blocks DSV3-like T = 8-16 0.987-0.993, K3-like T = 12-192 0.972-0.987
    gluon_frag: int = 1
    # they read an expert's weights once a pair: of the hopper_mma kernels' time at T = 1 / 2 / 4 / 8, DSV3-like
    # 0.92 / 0.860 / 0.887 / 0.955, K3-like 0.94 / 0.767 / 0.812 / 0.898; at T = 16 (the earlier plans) 1.106 / 1.069.
    # Against the expert blocks past 8 tokens, K3-like (under gluon_pair_share to T = 11): T = 9 0.938 / 0.972, T = 10
    # 1.020 / 1.020, T = 11 0.998 (two runs, the second with the K loops over pairs in both); with GEMM1's grid in one
    # wave of 64-code steps (short_steps_fit) T = 10 / 11 0.945 / 0.912
    gluon_max_tokens: int = 11
    # and from two tokens only while the pairs number under gluon_pair_share x the experts; past that, tokens share
    # enough experts for the expert blocks below, which read each touched expert once, to win. Their time over the
    # per-pair kernels' (pairs / experts in brackets): DSV3-like T = 8 (0.25) 0.950, T = 7 (0.22) 0.937, T = 6
    # (0.19) 1.025, T = 5 (0.16) 1.022; K3-like T = 8 (0.14) 1.053-1.115, T = 6 (0.11) 1.047-1.129
    gluon_pair_share: float = 0.2
    # where those do not take a call: the Gluon kernels on expert blocks of gluon_block_t (8 or 16) pairs, their
    # GEMM1 in steps of gluon_k1 codes (0: 128) and gluon_split1 K splits (0: none); gluon_grouped 1 on where they can
    # run, 0 off, -1 automatic (grouped_takes): at up to gluon_grouped_pairs pairs an expert on average. On an H200
    # (pairs an expert in brackets), 128-code steps against the default of 64 then: DSV3-like T = 12 / 16 / 32 / 64
    # (0.4-2) 0.959 / 0.936 / 0.942 / 0.941 (64-code steps: 0.903-0.953 of the hopper_mma time); against the
    # hopper_mma kernels: DSV3-like T = 96 (3) 0.908, T = 128 (4) 0.992 / 0.974, T = 160 / 192 (5 / 6) 1.075 / 1.204;
    # K3-like T = 32 / 64 / 96 / 128 / 160 (0.6-2.9) 0.948 / 0.958 / 0.961 / 0.980 / 0.983; with GEMM2 over 4 row
    # blocks K3-like T = 192 (3.4) 0.947 / 0.950, T = 224 / 256 (4 / 4.6) 1.028 / 1.053; 16-pair blocks 1.18-1.47
    # (DSV3-like T = 16-256). With GEMM2's B operand in 16-byte words (gluon_frag), against the hopper_mma kernels:
    # K3-like T = 208 / 224 / 240 / 256 (3.7-4.6) 0.963 / 0.975 / 0.982 / 0.987, DSV3-like T = 128 / 144 (4 / 4.5)
    # 0.911 / 0.898, past that DSV3-like T = 176 / 208 / 224 / 256 (5.5-8) 1.000 / 1.011 / 1.009 / 1.028. With GEMM1's
    # x tile shared (gluon_xshare), against them: DSV3-like T = 160 (5) 0.880 / 0.935 (two runs), T = 176 / 192 / 208 /
    # 224 / 256 (5.5-8) 0.969 / 1.007 / 1.063 / 1.104 / 1.151; K3-like T = 288 / 320 / 352 (5.1 / 5.7 / 6.3) 0.969 /
    # 0.973 / 1.064
    gluon_grouped: int = -1
    gluon_grouped_pairs: float = 5.5
    gluon_block_t: int = 8
    # and their GEMM2 in programs of gluon_blocks2 64-row blocks (0: automatic, grouped_tiles; lowered to a divisor
    # of H / 64)
    gluon_blocks2: int = 0
    # and which of their GEMMs mask the x operand's padding slots to 0 (bit 1 GEMM1, bit 2 GEMM2; -1 automatic,
    # grouped_masks); unmasked, a padding slot reads row 0, whose column is never stored: bit-equal outputs. On an
    # H200, GEMM2 unmasked (1 against 3): K3-like T = 10-256 0.991-1.002 (median 0.996), DSV3-like T = 8 / 12 0.998 /
    # 0.997. GEMM1 unmasked too (0 against 1) drops it to 74 registers from 84 (6 programs an SM, not 5), which moves
    # the last partial wave: DSV3-like (32 row blocks a pair block) T = 8-64 0.958-1.002 (two runs; T = 12 / 24 / 32
    # 0.986 / 0.986 / 0.975); K3-like (6) T = 16 / 64 / 224 0.957 / 0.983-0.992 / 0.986-1.003 but T = 10 / 12 / 24
    # 1.048 / 1.033-1.038 / 1.010-1.017
    gluon_xmask: int = -1
    # and their GEMM1's x tile loaded once a program, a quarter by each warp in 16-byte words, and read by the four
    # through shared memory (1), or by each warp from L1 / L2 in 4-byte ones (0); bit-equal outputs, about the same
    # instructions a step (x's 24-40 loads a lane become 9-10 beside 4-8 ldmatrix and a store). On an H200, 1 against
    # 0: DSV3-like T = 8 / 16 / 32 / 64 / 128 0.995 / 0.984 / 1.001 / 0.948 / 0.948, K3-like T = 10 / 12 / 16 / 24 / 64
    # / 192 / 224 / 256 0.993 / 0.996 / 0.981 / 0.996 / 0.989 / 0.965 / 0.952 / 0.954. Bit 2: GEMM2's B operand the
    # same way (from rows in plain order: with gluon_frag 0); 3 with gluon_frag 0 against the default: DSV3-like T = 8-160
    # 1.014-1.088, K3-like T = 12-288 0.992-1.012
    gluon_xshare: int = 1
    # both Gluon paths' GEMM2 in programs of gluon_rows2 rows (64; 128 / 256: each warp two / four 16-row slabs on
    # the same B operand; 64 where H is no multiple; 0 automatic, see gluon_rows2), the expert blocks' only with one
    # row block a program (gluon_blocks2; automatically, with more than 64 rows, one below _GROUPED_PROGRAMS2_WIDE)
    gluon_rows2: int = 0
    # both Gluon paths' GEMM1 / GEMM2 K loops over single steps (1) or pairs of steps (2: each pair's second words
    # loaded into registers of their own, so no register copies between steps; the expert blocks' GEMM2 only with one
    # row block a program; 0 automatic), and their register caps (0 none, -1 automatic); see loop_tuning
    gluon_unroll1: int = 0
    gluon_unroll2: int = 0
    gluon_maxnreg1: int = -1
    gluon_maxnreg2: int = -1
    # the per-pair kernels' arrival counters from the device's buffer that they leave zero (1: no fill launch before
    # them; calls on one device must not overlap in time, see counters.py), or zeroed for each call (0)
    gluon_counters: int = 1
    # the Triton k-sum kernel after either Gluon GEMM2 launched as its programmatic dependent, released from GEMM2's
    # start (1), or not (0). On an H200, 0 against 1 per pair K3-like T = 8 / 9 / 10 1.011 / 1.005 / 1.012
    gluon_sum_pdl: int = 1
    # the expert blocks' GEMM2 a programmatic dependent of their GEMM1, released after GEMM1's K loops, waiting for
    # the intermediate after its first weight loads (1; 2: and GEMM1 one of the align, waiting for it at its start),
    # or not (0). With the k-sum's, both off against 1: K3-like T = 12 / 16 1.014 / 1.015, DSV3-like T = 8 / 16
    # 1.004 / 1.002 (T = 64 within the power limit's drift); 2 against 1: K3-like T = 12 / 16 / 24 / 64 0.997 / 0.996
    # / 0.995 / 0.996, T = 160 / 256 1.006 / 1.000 (within their rounds' spread), DSV3-like T = 8 / 16 / 64 0.993 /
    # 0.999 / 0.998
    gluon_grouped_pdl: int = 2
    # the hopper_mma path's GEMM1 on expert blocks of up to 64 pairs in gluon_wgmma's kernel (warpgroup MMAs, x
    # through a ring of shared-memory stages) instead of moe_hgemm1_kernel (0), where it can run (wgmma1_runs): 1 each
    # MMA waited for at once, 2 each running while the next matrix decodes, 3 that on the tail tiles only; wgmma1_cap
    # its register cap (0 none, -1 automatic: 168 on 64-pair blocks); the weight words straight into registers, loaded
    # at a step's start (wgmma1_early 1) or once a matrix is decoded (0), or through the x tile's cp.async ring
    # (wgmma1_ring 1, wgmma1_stages deep). Bit-equal outputs. select_config asks for the ring form (1, 3 stages) on
    # 32-pair blocks: there moe_hgemm1_kernel took, on an H200, DSV3-like T = 512 / 640 / 768 1.043-1.047 / 1.026-1.076
    # / 1.052-1.065x its time, K3-like T = 768 / 896 / 1024 / 1280 1.048-1.065 / 1.026-1.067 / 1.052-1.075 /
    # 1.057-1.059x (sustained at the power limit 1.004x / 1.012x, DSV3-like T = 768 / K3-like T = 1024); on an H100
    # 1.010-1.031x. Of moe_hgemm1_kernel's time, on 64-pair blocks the ring (2 stages) took 0.985-1.012 on an H200,
    # the words into registers (3, early) 0.971-0.999 there but 1.002-1.042 on an H100; on 16-pair blocks the ring
    # 0.994-1.001 (H100): those keep moe_hgemm1_kernel (benchmarks/results/performance-notebook.md, "GEMM1 of 32-pair blocks in gluon_wgmma"),
    # 64-pair ones but where the ring takes 8-pair second tiles too (wgmma_dual, below)
    # The ring over two warpgroups was bit-equal and slower on an H100: gate rows in one, up rows in the other (commit
    # 9fc51ce) 1.04-1.07x on 64-pair blocks, 1.00-1.02x on 32-pair ones capped at 80 registers; 128 rows a program on
    # one x tile (commit b9c8b36), capped at 128, on 64-pair blocks 0.97-0.99x on one H100 and 1.01-1.07x on another,
    # with the same energy a call ("GEMM1 over two warpgroups")
    wgmma1: int = 0
    wgmma1_cap: int = -1
    wgmma1_early: int = 0
    wgmma1_ring: int = 0
    wgmma1_stages: int = 3
    # GEMM2 the same way (wgmma2 1, each MMA waited for at once), in programs of wgmma2_rows rows (64 or 128), its
    # words into registers a step ahead or through the intermediate tile's ring (wgmma2_ring 1, 3 stages). Bit-equal
    # outputs, slower on an H100: with GEMM1's (words into registers) DSV3-like / K3-like T = 1024 1.075 / 1.160; the
    # ring beside the default DSV3-like T = 768 / 1024 1.008-1.012 / 1.016-1.018, K3-like 1.057-1.079 / 1.073-1.105
    wgmma2: int = 0
    wgmma2_rows: int = 128
    wgmma2_ring: int = 0
    # with tail_t, gluon_wgmma's GEMMs (the ring forms) in two tiles a block as `dual` sets for the hopper_mma kernels
    # (0 off, 1 or 2): warpgroup MMAs take 8-wide tiles, so 2 runs where tail_t is 32 too, [rows, 32] + [rows, 8]
    # (the 8-wide tl.dot is not usable there: see `dual`). select_config asks for it on GEMM1 of DSV3-like 64-pair
    # blocks (benchmarks/results/performance-notebook.md, "32 + 8 tiles in gluon_wgmma"); GEMM2 in it as well was no faster on an H100
    wgmma_dual: int = 0


def layout_of(layout: Mapping[str, str]) -> str | None:
    """The ``layout`` argument of fused_moe_triton for per-kind stored layouts (w13, w13_scale,
    w2, w2_scale), or None when the kernels cannot read that combination."""
    for name, (w, s) in LAYOUT_SETS.items():
        if all(layout.get(k, "identity") == (s if k.endswith("scale") else w)
               for k in ("w13", "w13_scale", "w2", "w2_scale")):
            return name
    return None


# The word tile's loads carry no contiguity information (see triton_moe_kernels), and Triton's
# layout choice for such a tile differs by version: 3.6 puts a warp's threads along the tile's
# first axis, 3.9 along its last (read from the compiled layouts). Threads must run along K
# (one 128-byte row segment per warp), so the tile puts K first on older versions.
_KMAJOR_AUTO = tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 9)


def select_config(num_pairs: int, num_experts: int, hidden: int, inter: int, layout: str = "identity") -> MoEConfig:
    """Tiles measured best on an H200 (benchmarks/moe_bench.py --sweep / --gemv-sweep,
    benchmarks/results/performance-notebook.md): the decode path without tensor cores at <= 1 pair per touched expert,
    swap-AB 16-pair blocks with the int32-word decode while experts see few tokens (K split
    automatically when that leaves SMs idle), 64/128-pair blocks with the byte decode in prefill."""
    per_expert = num_pairs / max(1, min(num_experts, num_pairs))
    if layout in HOPPER_SETS:  # measured on an H200 (moe_bench.py --layout hopper_mma --sweep, both layers)
        short = inter <= 512  # short GEMM2 rows (I_pad <= 512: three 128-code steps a tile)
        if per_expert > 48:
            # prefill: row tiles first in both grids (a block's tiles side by side: its activation rows
            # come from DRAM about once); short rows: GEMM2 in 128-row tiles, 4 warps, one stage
            gemm2 = dict(block_n2=128, num_warps2=4, num_stages2=1) if short else dict(block_n2=256)
            # partly filled blocks in smaller tiles: past 96 pairs an expert, most experts' second block
            # holds <= 32 pairs; below, most blocks fit 64 or 64 + 32 (dual)
            tail = 32 if per_expert > 96 else 64
            # past 96 pairs an expert, an expert's last block of at most 32 pairs in the program of its block
            # before (GEMM1; GEMM2 too up to 16 where its rows are short): DSV3-like T = 3584 / 4096 / 4608 0.993 /
            # 0.931-0.962 / 0.914, T = 6144 / 8192 1.008 / 1.000; K3-like T = 6144 / 8192 0.964 / 0.964. DSV3-like
            # GEMM2 in 256-row tiles spills with a 32-wide second tile, and at 16 it was inside the spread (0.992 /
            # 1.028 in two runs)
            absorb = dict(absorb=32, absorb2=16 if short else 0) if tail == 32 else {}
            # the e8m0 factors two to a word measured 1.02x faster at 64 pairs an expert (DSV3 T = 2048) and
            # within the run's spread past it (DSV3 / K3 T = 4096): there the v13 instructions stay.
            # 64-pair tails in 64 + 16 too (dual 2), fewer empty slots through the MMAs: on an H100 DSV3-like
            # T = 1792 / 2048 / 2560 / 3072 0.988-0.997 / 0.977-0.988 / 0.972-0.980 / 1.000-1.002, K3-like T = 3072 /
            # 4096 0.989-0.993 / 0.975 of dual 1's time (two runs)
            return MoEConfig(block_t=128, block_n1=128, block_k=128, num_warps=8, num_stages=3, rows_first1=1,
                             rows_first2=1, tail_t=tail, dual=2 if tail == 64 else 0,
                             factor_pairs=int(per_expert <= 64), **gemm2, **absorb)
        bt = 16 if per_expert <= 12 else 32 if per_expert <= 24 else 64
        if num_pairs <= 16:  # one token (T = 1: one block per pair, fused reductions): 64-row GEMM2 tiles,
            # and no GEMM2 K split once those tiles alone give enough programs; GEMM1's K splits at least
            # six 128-code steps long (K3-like: 4 splits of 7 steps, not 10 of 3: the fused tail and the
            # pipeline fill of each program weigh less)
            split2 = 1 if num_pairs * (hidden // 64) >= 768 else 0
            auto1, _ = _splits(0, num_pairs * triton.cdiv(inter, 64), hidden, 128)
            return MoEConfig(block_t=16, block_n1=64, block_n2=64, block_k=128, num_warps=4, num_stages=3,
                             split_k1=max(1, min(auto1, hidden // 128 // 6)), split_k2=split2)
        # short GEMM2 rows: past one pair per expert four GEMM2 row tiles per program in one flat loop
        # (uncapped), at most one pair per expert three once one-tile programs would number three
        # times _TARGET_PROGRAMS (K3-like T = 8-32: 0.951-0.985 of one tile a program; T = 2 and 4,
        # fewer programs, 1.003-1.073); row tiles first in both grids, so a block's row tiles run side
        # by side (time over pair blocks first, benchmarks/results/performance-notebook.md: H100 DSV3-like T = 192-768 0.864-0.962,
        # K3-like T = 320-1024 0.956-0.972; H200 DSV3-like T = 384-1024 0.95-0.99 in nine timings of ten, the rest
        # within the spread; below 5.5 pairs an expert, where the Gluon kernels take bf16 calls, not timed)
        # register caps on 16-pair blocks, and on 32-pair ones where GEMM2's rows are short (both GEMMs where
        # GEMM2 runs one row tile a program): under them ptxas schedules GEMM1 in 54 / 78 registers, not 116 /
        # 138, with the same instructions and nothing spilled, so 7 / 5 programs share an SM, not 4 / 3
        # (time capped / uncapped, five runs: DSV3-like T = 160-384 0.948-1.016, median 0.975; K3-like T = 384 /
        # 512 0.972-0.995 / 0.962-0.983, T = 1024 0.965-1.010; DSV3-like 32-pair blocks 0.969-1.019, left uncapped)
        maxnreg = 96 if bt == 16 else 112 if bt == 32 and short else 0
        # blocks of 32 / 64 pairs: those holding at most half that in half-width tiles, 64-pair ones up
        # to 48 in 32 + 16 (GEMM2's too where it runs one row tile a program: the multi-tile loop has
        # no small tiles)
        tail = bt // 2 if bt >= 32 else 0
        rows2 = 1
        if short and bt < 64:
            rows2 = 4 if per_expert > 1.05 else 3 if num_pairs * triton.cdiv(hidden, 128) >= 3 * _TARGET_PROGRAMS else 1
        # GEMM1 of 32-pair blocks in gluon_wgmma where it can run (wgmma1_runs): warpgroup MMAs, the words and x
        # through a cp.async ring 3 stages deep (MoEConfig.wgmma1 says what was measured, and why 16-pair blocks
        # keep moe_hgemm1_kernel); of 64-pair ones from 32 pairs an expert where GEMM2's rows are long, the ring 2
        # stages deep with 32 + 8 and 32 + 16 tiles (wgmma_dual 2): fewer empty slots through the MMAs. H100s,
        # five runs, of moe_hgemm1_kernel's time: DSV3-like T = 1024 / 1280 / 1536 0.975-0.995 / 0.944-0.986 /
        # 0.979-0.992 (T = 896 0.991-1.006, K3-like T = 1536 / 2048 1.021 / 1.003: left out)
        wgmma = dict(wgmma1=1, wgmma1_ring=1) if bt == 32 else {}
        if bt == 64 and not short and per_expert >= 32:
            wgmma = dict(wgmma1=1, wgmma1_ring=1, wgmma1_stages=2, wgmma_dual=2)
        return MoEConfig(block_t=bt, block_n1=64, block_n2=128, block_k=128, num_warps=4, num_stages=3, maxnreg=maxnreg,
                         rows2=rows2, maxnreg2=0 if rows2 > 1 else -1, rows_first1=1, rows_first2=1,
                         tail_t=tail, dual=int(tail >= 32), **wgmma)
    if per_expert <= 32:
        # decode path without tensor cores (taken at <= 1 pair per touched expert): 16-row tiles
        # with 256-code K steps where I_pad allows them in GEMM2 (DSV3-like), else 32-row tiles
        # with 128-code steps (K3-like, I 384); each the faster of the two on its layer shape
        gemv = (dict(gemv_block_n1=16, gemv_block_n2=16, gemv_block_k=256) if inter % 256 == 0
                else dict(gemv_block_n1=32, gemv_block_n2=32, gemv_block_k=128))
        return MoEConfig(block_t=16, block_n1=64, block_n2=128, block_k=128, num_warps=4, num_stages=2,
                         mode=1, maxnreg=96, **gemv)
    return MoEConfig(block_t=64 if per_expert <= 64 else 128, block_n1=128, block_n2=128, block_k=64,
                     num_warps=8, num_stages=3, mode=0)


_TARGET_PROGRAMS = 1024  # about 8 programs per SM on 132 SMs: enough warps to hide latency


def _splits(requested: int, programs: int, k: int, block_k: int) -> tuple[int, int]:
    """(number of K splits, K elements per split); requested 0 = enough splits to reach
    _TARGET_PROGRAMS programs, keeping at least two K steps per split."""
    steps = triton.cdiv(k, block_k)
    want = requested or max(1, min(steps // 2, triton.cdiv(_TARGET_PROGRAMS, max(1, programs))))
    per = triton.cdiv(steps, max(1, want))
    return triton.cdiv(steps, per), per * block_k


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


def _activation_args(name: str, params: Mapping[str, float] | None) -> dict:
    if name not in _ACT_IDS:
        raise RuntimeInputError(
            f"The Triton MoE kernel does not support the activation {name!r}; it supports "
            f"{', '.join(sorted(_ACT_IDS))}. Use backend='torch' or a supported activation."
        )
    p = activation_params(name, params)
    args = dict(ACT=_ACT_IDS[name], HAS_LIMIT=False, HAS_LINEAR=False, p0=1.0, p1=1.0)
    if name == "situ":
        lin = p["linear_beta"]
        args.update(p0=p["beta"], p1=lin if lin is not None else 1.0, HAS_LINEAR=lin is not None and lin > 0)
    elif name == "silu":
        limit = p["swiglu_limit"]
        args.update(p1=limit if limit is not None else 1.0, HAS_LIMIT=limit is not None)
    else:
        args.update(p0=p["alpha"], p1=p["limit"])
    return args


def _check_inputs(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, layout):
    def bad(msg: str):
        raise RuntimeInputError(f"fused_moe_triton: {msg}")

    if layout not in LAYOUT_SETS:
        bad(f"layout {layout!r} is not readable by the Triton kernel (readable: {', '.join(LAYOUT_SETS)}); "
            "convert the weights to the canonical layout first (the loader does this with the layout's inverse).")
    if x.dim() != 2 or x.dtype not in _TL_DTYPES:
        bad(f"x must be a 2-D bf16/fp16/fp32 tensor [T, H_pad], got {tuple(x.shape)} {x.dtype}.")
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    if not interp and not x.is_cuda:
        bad(f"x is on {x.device}; the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1).")
    for name, t in (("w13", w13), ("w13_scale", w13_scale), ("w2", w2), ("w2_scale", w2_scale)):
        if t.dtype != torch.uint8 or t.dim() != 3:
            bad(f"{name} must be a 3-D uint8 tensor (raw MXFP4 bytes), got {tuple(t.shape)} {t.dtype}.")
        if t.device != x.device:
            bad(f"{name} is on {t.device} but x is on {x.device}.")
    T, H = x.shape
    E, two_i, hb = w13.shape
    if two_i % 2 or hb * 2 != H:
        bad(f"w13 {tuple(w13.shape)} does not match x {tuple(x.shape)}: expected [E, 2*I_pad, H_pad/2] "
            f"with H_pad = {H}.")
    i_pad = two_i // 2
    if H % 32 or i_pad % 32:
        bad(f"H_pad ({H}) and I_pad ({i_pad}) must be multiples of 32 (one e8m0 scale per 32 weights).")
    if layout in HOPPER_SETS and (H % 64 or i_pad % 64):
        bad(f"the hopper_mma layout needs H_pad ({H}) and I_pad ({i_pad}) to be multiples of 64.")
    if tuple(w13_scale.shape) != (E, two_i, H // 32):
        bad(f"w13_scale {tuple(w13_scale.shape)} must be {(E, two_i, H // 32)}.")
    if tuple(w2.shape) != (E, H, i_pad // 2):
        bad(f"w2 {tuple(w2.shape)} must be {(E, H, i_pad // 2)} for w13 {tuple(w13.shape)}.")
    if tuple(w2_scale.shape) != (E, H, i_pad // 32):
        bad(f"w2_scale {tuple(w2_scale.shape)} must be {(E, H, i_pad // 32)}.")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T or topk_ids.dtype not in (torch.int32, torch.int64):
        bad(f"topk_ids must be int32/int64 [T={T}, k], got {tuple(topk_ids.shape)} {topk_ids.dtype}.")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape) or not topk_weights.is_floating_point():
        bad(f"topk_weights must be a float tensor shaped like topk_ids {tuple(topk_ids.shape)}, "
            f"got {tuple(topk_weights.shape)} {topk_weights.dtype}.")
    for name, t, shape in (("w13_bias", w13_bias, (E, two_i)), ("w2_bias", w2_bias, (E, H))):
        if t is not None and (tuple(t.shape) != shape or not t.is_floating_point()):
            bad(f"{name} must be a float tensor {shape}, got {tuple(t.shape)} {t.dtype}.")
    return T, H, E, i_pad


def _act_launch(part, ids, b13, inter, num_pairs, i_pad, E, splits, act, acts, has_bias):
    """Sum GEMM1's K-split partials and apply the activation; tiles of at most 4096 elements."""
    sp2 = triton.next_power_of_2(splits)
    block = min(triton.next_power_of_2(i_pad), max(128, 4096 // sp2))
    K.moe_act_kernel[(num_pairs, triton.cdiv(i_pad, block))](
        part, ids, b13, inter, num_pairs, i_pad, E, splits, b13.stride(0), inter.stride(0),
        act["p0"], act["p1"], **acts, HAS_BIAS=has_bias, BLOCK=block, S_POW2=sp2, num_warps=4,
    )


def _sum_launch(pair_out, ids, out, H, top_k, E, splits, pdl=False):
    """Deterministic sum over k (and GEMM2's K splits): one program per (token, 1024 columns),
    8 columns per thread (one 16-byte load of each k row). pdl: a programmatic dependent of the kernel
    before it (which must release it: gdc_launch_dependents)."""
    k2 = triton.next_power_of_2(top_k)
    block_h = min(triton.next_power_of_2(H), 1024)
    K.moe_sum_kernel[(out.shape[0], triton.cdiv(H, block_h))](
        pair_out, ids, out, H, top_k, E, splits, pair_out.stride(0), pair_out.stride(1), out.stride(0),
        BLOCK_H=block_h, K_POW2=k2, PDL=pdl, num_warps=max(1, min(4, block_h // 256)),
        **({"launch_pdl": True} if pdl else {}),
    )


# from this many (token, k) pairs on, the align runs over many programs (a memset and two
# launches) instead of one: the single program costs about 3.4 ns a pair on an H200 (223 us for
# 65536 pairs, 13.0 us for 3584; the many-program align 6.5 us for 4096); the layer with it,
# against one program, K3-like 2048 / 2560 / 3072 / 3584 / 4080 pairs 1.000 / 0.995 / 0.993 /
# 0.992 / 0.986 (benchmarks/results/performance-notebook.md)
ALIGN_GRID_PAIRS = 2048


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_t: int, grid: int = -1, release: bool = False):
    """(sorted_ids, block_expert, num_post_pad) for the GEMM kernels; ids < 0 are skipped.
    ``grid``: 1 many programs, 0 one program, -1 by ALIGN_GRID_PAIRS. ``release``: its last kernel lets a
    programmatic dependent launched after it start early (which must wait for it: gdc_wait)."""
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    num_pairs = ids.numel()
    max_blocks = num_pairs // block_t + min(num_experts, num_pairs) + 1
    dev = ids.device
    sorted_ids = torch.empty(max_blocks * block_t, dtype=torch.int32, device=dev)
    block_expert = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    e2 = triton.next_power_of_2(num_experts)
    if grid == 1 or (grid < 0 and num_pairs >= ALIGN_GRID_PAIRS):
        scratch = torch.zeros(2 * num_experts + 2, dtype=torch.int32, device=dev)  # counts, arrivals | cursors, end
        counts, arrive = scratch[:num_experts], scratch[num_experts:num_experts + 1]
        cursor, num_post_pad = scratch[num_experts + 1:2 * num_experts + 1], scratch[2 * num_experts + 1:]
        chunk = 1024
        fill = max_blocks * block_t
        K.moe_align_count_kernel[(triton.cdiv(max(fill, num_pairs), chunk),)](
            ids, sorted_ids, block_expert, num_post_pad, counts, cursor, arrive, num_pairs, num_experts, max_blocks,
            fill, BLOCK_T=block_t, CHUNK=chunk, E_POW2=e2, num_warps=4,
        )
        K.moe_align_scatter_kernel[(triton.cdiv(num_pairs, chunk),)](
            ids, sorted_ids, cursor, num_pairs, num_experts, CHUNK=chunk, RELEASE=release, num_warps=4)
        return sorted_ids, block_expert, num_post_pad, max_blocks
    scratch = torch.empty(2 * num_experts + 1, dtype=torch.int32, device=dev)
    num_post_pad = scratch[2 * num_experts:]
    K.moe_align_kernel[(1,)](
        ids, sorted_ids, block_expert, num_post_pad, scratch[:num_experts], scratch[num_experts:2 * num_experts],
        num_pairs, num_experts, max_blocks,
        BLOCK_T=block_t, CHUNK=1024, E_POW2=e2, RELEASE=release, num_warps=8,
    )
    return sorted_ids, block_expert, num_post_pad, max_blocks


def fused_moe_triton(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, *, activation,
                     activation_params, w13_bias=None, w2_bias=None, layout="identity",
                     config: MoEConfig | None = None) -> torch.Tensor:
    """sum_k topk_weights[:, k] * expert_k(x) with MXFP4 weights stored in ``layout``.

    x [T, H_pad] bf16/fp16/fp32 (zero-padded); w13 uint8 [E, 2*I_pad, H_pad/2] rows
    [gate | up]; w13_scale [E, 2*I_pad, H_pad/32]; w2 [E, H_pad, I_pad/2]; w2_scale
    [E, H_pad, I_pad/32]; topk_ids [T, k] local expert ids, -1 = not on this rank.
    ``layout``: "identity" (those canonical bytes), "hopper_mma_xor" (weights in hopper_mma_w_xor, an
    8-instruction decode, scales in hopper_mma_s, same shapes; H_pad and I_pad multiples of 64: what convert
    writes), "hopper_mma_rot" (weights in hopper_mma_w_rot, a 9-instruction decode) or "hopper_mma" (weights in
    hopper_mma_w), the bit orders earlier releases wrote.
    Returns [T, H_pad] in x's dtype.
    """
    T, H, E, i_pad = _check_inputs(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids,
                                   w13_bias, w2_bias, layout)
    act = _activation_args(activation, activation_params)
    top_k = topk_ids.shape[1]
    num_pairs = T * top_k
    out = torch.empty_like(x)
    if num_pairs == 0:
        return out.zero_()
    cfg = config or select_config(num_pairs, E, H, i_pad, layout)
    if layout in HOPPER_SETS:
        weights = (w13, w13_scale, w2, w2_scale)
        plan = gluon_plan(cfg, x, weights, top_k, layout)
        if plan is not None:
            rows2 = gluon_rows2(cfg, H, i_pad, plan[1])
            done = _gluon_forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias,
                                  act, out, plan, cfg.gluon == 1, cfg.gluon_pdl, sum2_by_kernel(cfg, i_pad, plan),
                                  cfg.gluon_frag == 1, rows2,
                                  loop_tuning(cfg, False, plan[0], rows2, i_pad // 64 * num_pairs * plan[2],
                                              device_sms(x.device), HOPPER_ORDERS[layout]),
                                  cfg.gluon_counters == 1, cfg.gluon_sum_pdl == 1, order=HOPPER_ORDERS[layout])
            if done is not None:
                return done
        elif (blocks := grouped_plan(cfg, x, weights, topk_ids.shape[1], layout, E)) is not None:
            done = _gluon_grouped_forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias,
                                          act, out, cfg, blocks, HOPPER_ORDERS[layout])
            if done is not None:
                return done
        return _hopper_forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias,
                               act, cfg, out, rot=HK.ORDER_IDS[HOPPER_ORDERS[layout]])
    if uses_gemv(cfg, num_pairs, E):
        try:
            w13q, w2q = w13.view(torch.int32), w2.view(torch.int32)
        except RuntimeError:  # storage not 4-byte aligned: the MMA path's byte decode reads it as is
            w13q = None
        if w13q is not None:
            return _gemv_forward(x, w13q, w13_scale, w2q, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias,
                                 act, cfg, out)
    dtype = getattr(triton.language, _TL_DTYPES[x.dtype])
    mode = 0 if x.dtype == torch.float32 else cfg.mode
    if mode == 1 and x.dtype != torch.bfloat16:
        mode = 0  # the word decode builds bf16 bits; fp16 x takes the byte decode
    mma = dict(MODE=mode, X_FORMAT={torch.bfloat16: "bf16", torch.float16: "fp16"}.get(x.dtype, "bf16"))
    if mode == 3 and cfg.block_k < 128:
        mma["MODE"] = 1  # the split dots need K/8 >= 16
    if mma["MODE"] in (1, 3):  # the kernels read the packed codes as int32 words (8 codes each)
        try:
            w13, w2 = w13.view(torch.int32), w2.view(torch.int32)
        except RuntimeError:  # storage not 4-byte aligned: the byte decode reads it as is
            mma["MODE"] = 0
    x = x.contiguous()
    w13, w13_scale, w2, w2_scale = (t if t.stride(-1) == 1 else t.contiguous() for t in (w13, w13_scale, w2, w2_scale))
    acts = dict(ACT=act["ACT"], HAS_LIMIT=act["HAS_LIMIT"], HAS_LINEAR=act["HAS_LINEAR"])
    launch = _launch_options(cfg)

    def gemm1(grid, r):
        K.moe_gemm1_kernel[grid](
            x, w13, w13_scale, r.b13, r.inter, r.part, r.sorted_ids, r.block_expert, r.num_post_pad,
            num_pairs, top_k, H, i_pad, r.ks1,
            x.stride(0), w13.stride(0), w13.stride(1), w13_scale.stride(0), w13_scale.stride(1),
            r.b13.stride(0), r.inter.stride(0),
            act["p0"], act["p1"], **acts, HAS_BIAS=w13_bias is not None,
            BLOCK_N=cfg.block_n1, BLOCK_T=cfg.block_t, BLOCK_K=cfg.block_k, DTYPE=dtype, **mma, SPLIT=r.s1 > 1,
            **launch,
        )

    def gemm2(grid, r):
        K.moe_gemm2_kernel[grid](
            r.inter, w2, w2_scale, r.b2, r.tw, r.pair_out, r.sorted_ids, r.block_expert, r.num_post_pad,
            num_pairs, i_pad, H, r.ks2,
            r.inter.stride(0), w2.stride(0), w2.stride(1), w2_scale.stride(0), w2_scale.stride(1),
            r.b2.stride(0), r.pair_out.stride(1), r.pair_out.stride(0),
            HAS_BIAS=w2_bias is not None,
            BLOCK_N=cfg.block_n2, BLOCK_T=cfg.block_t, BLOCK_K=cfg.block_k, DTYPE=dtype, **mma,
            **launch,
        )

    return _two_gemms(x, topk_weights, topk_ids, w13_scale, w2_scale, w13_bias, w2_bias, act, cfg, out, gemm1, gemm2)


@dataclass
class _Run:
    """Buffers and split sizes of one fused call, shared by its launches."""

    sorted_ids: torch.Tensor
    block_expert: torch.Tensor
    num_post_pad: torch.Tensor
    tw: torch.Tensor
    s1: int
    ks1: int
    s2: int
    ks2: int
    inter: torch.Tensor
    part: torch.Tensor
    b13: torch.Tensor
    b2: torch.Tensor | None = None
    pair_out: torch.Tensor | None = None
    ids: torch.Tensor | None = None  # topk_ids, contiguous
    cnt1: torch.Tensor | None = None  # arrival counters of the fused reductions (zeroed)
    cnt2: torch.Tensor | None = None
    out: torch.Tensor | None = None  # the call's result (GEMM2 writes it when fused)


def _launch_options(cfg: MoEConfig, second: bool = False) -> dict:
    """Launch options of GEMM1 (or, ``second``, GEMM2: num_warps2 / maxnreg2 where set)."""
    warps = cfg.num_warps2 if second and cfg.num_warps2 else cfg.num_warps
    maxnreg = cfg.maxnreg2 if second and cfg.maxnreg2 >= 0 else cfg.maxnreg
    stages = cfg.num_stages2 if second and cfg.num_stages2 else cfg.num_stages
    launch = dict(num_warps=warps, num_stages=stages)
    if maxnreg and os.environ.get("TRITON_INTERPRET") != "1":
        launch["maxnreg"] = maxnreg
    return launch


def hopper_launch_options(cfg: MoEConfig, x_bytes: int, second: bool = False) -> dict:
    """``_launch_options`` of moe_hgemm1_kernel (or, ``second``, moe_hgemm2_kernel) for x of ``x_bytes`` an element:
    fp32 x on blocks of 128 pairs or more two stages deep, not three. Three stages of fp32 [128, block_k] tiles take
    232-280 KiB of shared memory at select_config's prefill tiles, past the 227 KiB an sm_90 program may have (Triton
    refuses the launch); two take 148-180 KiB (tests/test_hopper_shared_memory.py)."""
    launch = _launch_options(cfg, second)
    if x_bytes >= 4 and cfg.block_t >= 128:
        launch["num_stages"] = min(launch["num_stages"], 2)
    return launch


def gemm_splits(cfg: MoEConfig, num_pairs: int, E: int, H: int, i_pad: int, direct: bool, rows2: int = 1):
    """((splits, K per split) of GEMM1, the same of GEMM2) of the tensor-core paths: the automatic
    counts size the grid from the blocks the align can make (one per pair with ``direct``)."""
    blocks = num_pairs if direct else num_pairs // cfg.block_t + min(E, num_pairs)
    programs2 = blocks * triton.cdiv(triton.cdiv(H, cfg.block_n2), rows2)
    return (_splits(cfg.split_k1, blocks * triton.cdiv(i_pad, cfg.block_n1), H, cfg.block_k),
            _splits(cfg.split_k2, programs2, i_pad, cfg.block_k))


def _two_gemms(x, topk_weights, topk_ids, w13_scale, w2_scale, w13_bias, w2_bias, act, cfg, out, gemm1, gemm2,
               direct=False, fused=False, rows2=1):
    """What both tensor-core paths do around their two GEMM kernels: align the pairs into expert
    blocks, size the K splits, GEMM1 (then the activation over its K-split partials), GEMM2 and
    the deterministic sum over k. ``gemm1(grid, run)`` / ``gemm2(grid, run)`` launch the kernels.
    ``direct``: one block per pair, no align (the kernels read topk_ids); ``fused``: the GEMMs do
    the activation over split-K partials and the sum over k themselves (arrival counters); ``rows2``:
    GEMM2 row tiles per program."""
    T, H = x.shape
    E, i_pad = w13_scale.shape[0], w13_scale.shape[1] // 2
    top_k = topk_ids.shape[1]
    num_pairs = T * top_k
    ids = topk_ids.contiguous()
    if direct:
        sorted_ids = block_expert = num_post_pad = ids
        max_blocks = num_pairs
    else:
        sorted_ids, block_expert, num_post_pad, max_blocks = moe_align(ids, E, cfg.block_t, cfg.align)
    n1, n2 = triton.cdiv(i_pad, cfg.block_n1), triton.cdiv(H, cfg.block_n2)
    g2 = triton.cdiv(n2, rows2)
    (s1, ks1), (s2, ks2) = gemm_splits(cfg, num_pairs, E, H, i_pad, direct, rows2)
    inter = torch.empty(num_pairs, i_pad, dtype=x.dtype, device=x.device)
    run = _Run(
        sorted_ids, block_expert, num_post_pad, topk_weights.reshape(-1).contiguous(), s1, ks1, s2, ks2, inter,
        part=torch.empty(s1, num_pairs, 2 * i_pad, dtype=torch.float32, device=x.device) if s1 > 1 else inter,
        b13=w13_bias.contiguous() if w13_bias is not None else w13_scale,  # dummy pointer when absent
        ids=ids,
    )
    if fused:
        # one memset: the output (rows of tokens with no local expert stay 0) and both counter sets
        n_out = out.numel() * out.element_size() // 4
        buf = torch.zeros(n_out + max_blocks * n1 + T * n2, dtype=torch.int32, device=x.device)
        out = buf[:n_out].view(out.dtype).view(out.shape)
        run.cnt1, run.cnt2 = buf[n_out:n_out + max_blocks * n1], buf[n_out + max_blocks * n1:]
    else:
        run.cnt1 = run.cnt2 = sorted_ids  # dummy pointers
    gemm1((max_blocks, n1, s1), run)
    acts = dict(ACT=act["ACT"], HAS_LIMIT=act["HAS_LIMIT"], HAS_LINEAR=act["HAS_LINEAR"])
    if s1 > 1 and not fused:
        _act_launch(run.part, ids, run.b13, inter, num_pairs, i_pad, E, s1, act, acts, w13_bias is not None)
    run.pair_out = torch.empty(s2, num_pairs, H, dtype=x.dtype if s2 == 1 else torch.float32, device=x.device)
    run.b2 = w2_bias.contiguous() if w2_bias is not None else w2_scale
    run.out = out
    gemm2((max_blocks, g2, s2), run)
    if not fused:
        _sum_launch(run.pair_out, ids, out, H, top_k, E, s2)
    return out


def _gemv_forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, act, cfg, out):
    """The decode path without tensor cores (moe_gemv1/2_kernel); w13 / w2 as int32 words."""
    T, H = x.shape
    E, two_i, _ = w13.shape
    i_pad = two_i // 2
    top_k = topk_ids.shape[1]
    num_pairs = T * top_k
    bt = _gemv_block_t(cfg, num_pairs / max(1, min(E, num_pairs)))
    x = x.contiguous()
    w13, w13_scale, w2, w2_scale = (t if t.stride(-1) == 1 else t.contiguous() for t in (w13, w13_scale, w2, w2_scale))
    ids = topk_ids.contiguous()
    tw = topk_weights.reshape(-1).contiguous()
    sorted_ids, block_expert, num_post_pad, max_blocks = moe_align(ids, E, bt, cfg.align)
    blocks_est = min(num_pairs, num_pairs // bt + min(E, num_pairs))
    bk1 = _gemv_block_k(cfg.gemv_block_k, H)
    bk2 = _gemv_block_k(cfg.gemv_block_k, i_pad)
    s1, ks1 = _splits(cfg.split_k1, blocks_est * triton.cdiv(i_pad, cfg.gemv_block_n1), H, bk1)
    s2, ks2 = _splits(cfg.split_k2, blocks_est * triton.cdiv(H, cfg.gemv_block_n2), i_pad, bk2)
    acts = dict(ACT=act["ACT"], HAS_LIMIT=act["HAS_LIMIT"], HAS_LINEAR=act["HAS_LINEAR"])
    launch = dict(num_warps=cfg.gemv_num_warps, num_stages=cfg.num_stages)
    kt = _KMAJOR_AUTO if cfg.gemv_kmajor < 0 else bool(cfg.gemv_kmajor)
    asm = cfg.gemv_asm and x.is_cuda and torch.version.cuda is not None and os.environ.get("TRITON_INTERPRET") != "1"

    inter = torch.empty(num_pairs, i_pad, dtype=x.dtype, device=x.device)
    part = torch.empty(s1, num_pairs, 2 * i_pad, dtype=torch.float32, device=x.device) if s1 > 1 else inter
    b13 = w13_bias.contiguous() if w13_bias is not None else w13_scale  # dummy pointer when absent
    K.moe_gemv1_kernel[(max_blocks, triton.cdiv(i_pad, cfg.gemv_block_n1), s1)](
        x, w13, w13_scale, b13, inter, part, sorted_ids, block_expert, num_post_pad,
        num_pairs, top_k, H // 8, i_pad, ks1 // 8,
        x.stride(0), w13.stride(0), w13.stride(1), w13_scale.stride(0), w13_scale.stride(1),
        b13.stride(0), inter.stride(0), 1,
        act["p0"], act["p1"], **acts, HAS_BIAS=w13_bias is not None,
        BLOCK_N=cfg.gemv_block_n1, BLOCK_T=bt, BLOCK_KW=bk1 // 8, EVEN_K=H % bk1 == 0, SPLIT=s1 > 1, ASM=asm, KT=kt,
        **launch,
    )
    if s1 > 1:
        _act_launch(part, ids, b13, inter, num_pairs, i_pad, E, s1, act, acts, w13_bias is not None)
    pair_out = torch.empty(s2, num_pairs, H, dtype=x.dtype if s2 == 1 else torch.float32, device=x.device)
    b2 = w2_bias.contiguous() if w2_bias is not None else w2_scale
    K.moe_gemv2_kernel[(max_blocks, triton.cdiv(H, cfg.gemv_block_n2), s2)](
        inter, w2, w2_scale, b2, tw, pair_out, sorted_ids, block_expert, num_post_pad,
        num_pairs, i_pad // 8, H, ks2 // 8,
        inter.stride(0), w2.stride(0), w2.stride(1), w2_scale.stride(0), w2_scale.stride(1),
        b2.stride(0), pair_out.stride(1), pair_out.stride(0), 1,
        HAS_BIAS=w2_bias is not None,
        BLOCK_N=cfg.gemv_block_n2, BLOCK_T=bt, BLOCK_KW=bk2 // 8, EVEN_K=i_pad % bk2 == 0, ASM=asm, KT=kt,
        **launch,
    )
    _sum_launch(pair_out, ids, out, H, top_k, E, s2)
    return out


def _big_scales(*scales: torch.Tensor) -> bool:
    """Whether any e8m0 byte exceeds 128 (a scale above 2: the one-multiply decode of the Hopper
    kernels would overflow). Remembered on the tensor with its version counter, so repeated calls
    (and CUDA graph capture after a first call) cost nothing and in-place changes are seen."""
    big = False
    for t in scales:
        memo = getattr(t, "_mxfp4conv_big_scale", None)
        if memo is None or memo[0] != t._version:
            memo = (t._version, bool(t.numel()) and int(t.view(torch.uint8).max()) > 128)
            t._mxfp4conv_big_scale = memo
        big = big or memo[1]
    return big


@functools.lru_cache(maxsize=None)
def _gluon_grouped_module():
    """mxfp4conv.runtime.gluon_grouped (the caller has checked _gluon_module)."""
    from mxfp4conv.runtime import gluon_grouped
    return gluon_grouped


@functools.lru_cache(maxsize=None)
def _gluon_wgmma_module():
    """mxfp4conv.runtime.gluon_wgmma (the caller has checked _gluon_module)."""
    from mxfp4conv.runtime import gluon_wgmma
    return gluon_wgmma


@functools.lru_cache(maxsize=None)
def _gluon_module():
    """mxfp4conv.runtime.gluon_few_tokens, or None where this Triton has no Gluon (or not the parts it uses)."""
    try:
        from mxfp4conv.runtime import gluon_few_tokens
    except (ImportError, AttributeError, TypeError):
        return None
    return gluon_few_tokens


_GLUON_BROKEN: list[str] = []  # why the Gluon kernels failed to compile here, once they have


def _divisor_splits(requested: int, steps: int) -> int:
    """The largest number of splits <= requested that divides steps."""
    s = max(1, min(requested, steps))
    while steps % s:
        s -= 1
    return s


# programs the few-token Gluon kernels' automatic K splits aim for, measured on an H200 at T = 1
# (benchmarks/probes/gluon_moe.py): GEMM1 (gate and up, 64-code steps) DSV3-like 4 splits (1024 programs)
# 44.0 us against 54.5 for 2 and 49.0 for 8, K3-like 8 splits (768) 13.5 us against 16.6 for 4;
# GEMM2 (128-code steps) is fastest unsplit on both (896 programs)
_GLUON_PROGRAMS1 = 1024
_GLUON_PROGRAMS2 = 512
# from two tokens on, with 128-code steps (gluon_moe.py at T = 2-8, GEMM1 alone, L2 flushed): DSV3-like T = 3 / 6 / 8
# unsplit 106.0 / 198.0 / 260.3 us, K3-like T = 2 / 4 / 8 4 / 2 / 1 splits (768 programs) 19.7 / 33.8 / 57.0 us, the
# fastest on each; 1024-1535 programs were slow on both (DSV3-like T = 2 2 splits 89.0 against 80.7 with 4, T = 4
# unsplit 156.8 against 141.3 with 2; K3-like T = 6 2 splits 51.7 against 48.7-50.1; K3-like T = 8 2 splits 62.4)
_GLUON_PROGRAMS1_T = 768
# The expert-block kernels' GEMM1 is unsplit unless asked: in 128-code steps (benchmarks/moe_bench.py, three runs)
# unsplit against 2 K splits K3-like T = 12 0.966 / 0.983 / 0.979, T = 24 0.973 / 0.977 / 0.982, T = 16 1.002 /
# 1.004, DSV3-like T = 8 0.992; 4 splits 1.018-1.040. Their GEMM2 runs _GROUPED_BLOCKS2 64-row blocks a program
# where its rows are short (at most _GROUPED_SHORT_STEPS K steps) and that still gives _GROUPED_PROGRAMS2 programs
# over min(E, pairs) blocks: K3-like (3 steps of 128 codes) T = 32 / 64 / 128 4 blocks 0.966 / 0.943 / 0.950 of
# one, T = 24 (5376 programs) 0.979 / 1.002 (two runs), T = 16 (3584) 0.987 / 1.018, T = 12 (2688) 1.000 / 1.027;
# 2 blocks 0.992-1.018, 7 0.960-1.014; DSV3-like (16 steps) 4 blocks 1.015-1.038 at T = 12-32
_GROUPED_BLOCKS2 = 4
_GROUPED_SHORT_STEPS = 4
_GROUPED_PROGRAMS2 = 4096
# Both Gluon GEMM2s in programs of this many rows where the rows are short (each warp two 16-row slabs on one B
# operand: half the x loads and the fixed code a weight): against 64, K3-like (3 steps) per pair T = 1 / 4 / 6 / 8
# 0.984 / 0.990 / 0.992 / 0.987 (T = 2 1.002), expert blocks T = 10 / 12 / 16 0.987 / 0.987 / 0.983, and with one
# row block a program against the 4 of _GROUPED_BLOCKS2 T = 24 / 32 0.976 / 0.983; DSV3-like (16 steps) T = 1 / 8
# / 16 / 64 1.002 / 1.002 / 1.002 / 0.998, T = 4 0.986
_GLUON_ROWS2_SHORT = 128
# where those are more than 64, the expert blocks' GEMM2 runs _GROUPED_BLOCKS2 64-row blocks a program only from this
# many such programs: one 128-row block a program against 4 64-row ones, K3-like T = 24 / 32 / 40 (5376 / 7168 /
# 8960 programs of 4) 0.976 / 0.983 / 0.992, T = 64 / 128 / 256 (12544) 0.997 / 1.003 / 1.014
_GROUPED_PROGRAMS2_WIDE = 12288
# Their GEMM1 reads x unmasked (74 registers, 6 programs an SM) where a pair block's rows make this many 64-row
# blocks or more (DSV3-like 32: its tiles fill many waves), masked (84, 5 an SM) below (K3-like 6, where the last
# wave's fill decides, and most often for the masked kernel); see MoEConfig.gluon_xmask
_GROUPED_UNMASKED_ROWS = 16


def gluon_tiles(cfg: MoEConfig, H: int, i_pad: int, pairs: int, tokens: int = 1, sms: int = 0
                ) -> tuple[int, int, int, int]:
    """(k1, k2, splits1, splits2) of the per-pair Gluon kernels for this layer, number of pairs and
    of tokens: codes a K step of GEMM1 / GEMM2 (cfg's; for GEMM1 by default 64 at one token and 128
    from two; 64 where K is no multiple) and their K splits (cfg's, or gemm1_splits on a GPU of sms SMs and the fewest
    that give GEMM2 its target of programs), each lowered to a divisor of its K steps; from two tokens, where
    short_steps_fit, GEMM1 in 64-code steps unsplit."""
    _check_gluon_knobs(cfg)
    short = not cfg.gluon_k1 and tokens > 1 and short_steps_fit(i_pad // 64 * pairs, sms)
    k1 = cfg.gluon_k1 or (64 if tokens == 1 or short else 128)
    k1 = k1 if H % k1 == 0 else 64
    k2 = cfg.gluon_k2 if i_pad % cfg.gluon_k2 == 0 else 64
    if cfg.gluon_split1:
        s1 = _divisor_splits(cfg.gluon_split1, H // k1)
    else:
        s1 = 1 if short else gemm1_splits(i_pad // 64 * pairs, H // k1, tokens, sms)
    s2 = cfg.gluon_split2 or triton.cdiv(_GLUON_PROGRAMS2, H // 64 * pairs)
    return k1, k2, s1, _divisor_splits(s2, i_pad // k2)


def sum2_by_kernel(cfg: MoEConfig, i_pad: int, plan: tuple[int, int, int, int]) -> bool:
    """Whether the per-pair GEMM2's sum over k runs in the Triton k-sum kernel after it (cfg.gluon_sum2 0; 1: in
    GEMM2's last programs), automatically where GEMM2's rows are at most _GROUPED_SHORT_STEPS K steps and neither GEMM
    is split (gluon_tiles' plan): then no arrival is counted and no counter cleared. On an H200, against the sum in
    GEMM2 (two runs): K3-like T = 8 (3 steps, unsplit) 0.979 / 0.980; where it is not taken, K3-like T = 1 / 2 / 4 / 6
    1.025-1.040 / 1.006-1.009 / 0.987-0.998 / 1.001-1.004 (GEMM1 split), DSV3-like (16 steps) T = 1-6 1.021-1.047."""
    if cfg.gluon_sum2 >= 0:
        return cfg.gluon_sum2 == 0
    _, k2, splits1, splits2 = plan
    return i_pad // k2 <= _GROUPED_SHORT_STEPS and splits1 == 1 and splits2 == 1


# From two tokens the per-pair GEMM1 runs over pairs of steps under _UNROLLED_MAXNREG registers: _PAIRS_AN_SM programs
# an SM; over single steps (72 registers uncapped) _SINGLE_AN_SM. Where K splits would make its grid just over a wave
# of the former, one split fewer fills under one wave: K3-like T = 5 (480 programs unsplit, 960 in 2 splits, 132 SMs)
# unsplit 0.928 of the time in 2. Where one split is just over a wave, single steps take it in one: K3-like T = 9 (864
# programs) 0.902 of the time over pairs capped at 80 (0.923 over pairs capped at 72: they spill); T = 8 (768, a wave
# either way) over pairs capped at 72 1.051
_PAIRS_AN_SM = 6
_SINGLE_AN_SM = 7
# In 64-code steps (pairs, 62 registers uncapped) it fits _SHORT_AN_SM programs an SM. Where the unsplit grid is over a
# wave of _SINGLE_AN_SM and at most one of those, 64-code steps unsplit run it in one wave: K3-like T = 10 / 11 (960 /
# 1056 programs on 132 SMs) 0.945 / 0.912 of the expert blocks' time (which ran those before), DSV3-like T = 4 (1024)
# 0.987 of 128-code steps in 2 splits; where 128-code steps already fit a wave, 64-code ones are slower (K3-like T = 9
# 1.012)
_SHORT_AN_SM = 8


def short_steps_fit(programs: int, sms: int) -> bool:
    """Whether the per-pair GEMM1's unsplit grid of `programs` fits one wave in 64-code steps and not in 128-code ones
    on a GPU of sms SMs (0: not known, False)."""
    return bool(sms) and _SINGLE_AN_SM * sms < programs <= _SHORT_AN_SM * sms


def gemm1_splits(programs: int, steps: int, tokens: int, sms: int = 0) -> int:
    """The per-pair GEMM1's automatic K splits for `programs` programs unsplit and `steps` K steps: at
    one token the fewest giving _GLUON_PROGRAMS1 programs; from two tokens the fewest giving
    _GLUON_PROGRAMS1_T, stepping past totals in [1024, 1536), each a divisor of the steps; then, on a GPU of sms SMs
    (0: not known), the next smaller divisor where that fits the grid in a wave of _PAIRS_AN_SM programs an SM and
    this does not."""
    if tokens == 1:
        return _divisor_splits(triton.cdiv(_GLUON_PROGRAMS1, programs), steps)
    s = _divisor_splits(triton.cdiv(_GLUON_PROGRAMS1_T, programs), steps)
    while 1024 <= programs * s < 1536 and s < steps:
        s = next(d for d in range(s + 1, steps + 1) if steps % d == 0)
    wave = _PAIRS_AN_SM * sms
    if sms and s > 1 and programs * s > wave:
        fewer = _divisor_splits(s - 1, steps)
        if programs * fewer <= wave:
            return fewer
    return s


def gluon_rows2(cfg: MoEConfig, H: int, i_pad: int, k2: int) -> int:
    """GEMM2's rows a program in the Gluon kernels (steps of k2 codes): cfg.gluon_rows2, or automatically
    _GLUON_ROWS2_SHORT where its rows are at most _GROUPED_SHORT_STEPS K steps, else 64; 64 where H is no multiple."""
    _check_gluon_knobs(cfg)
    rows = cfg.gluon_rows2 or (_GLUON_ROWS2_SHORT if i_pad // k2 <= _GROUPED_SHORT_STEPS else 64)
    return rows if H % rows == 0 else 64


def _check_gluon_knobs(cfg: MoEConfig) -> None:
    for name, k in (("gluon_k1", cfg.gluon_k1), ("gluon_k2", cfg.gluon_k2)):
        if k not in (64, 128) and not (name == "gluon_k1" and k == 0):
            raise RuntimeInputError(f"fused_moe_triton: {name} must be 64 or 128, got {k}.")
    if cfg.gluon_frag not in (0, 1):
        raise RuntimeInputError(f"fused_moe_triton: gluon_frag must be 0 or 1, got {cfg.gluon_frag}.")
    if cfg.gluon_xmask not in (-1, 0, 1, 2, 3):
        raise RuntimeInputError(f"fused_moe_triton: gluon_xmask must be -1, 0, 1, 2 or 3, got {cfg.gluon_xmask}.")
    if cfg.gluon_sum2 not in (-1, 0, 1):
        raise RuntimeInputError(f"fused_moe_triton: gluon_sum2 must be -1, 0 or 1, got {cfg.gluon_sum2}.")
    if cfg.gluon_xshare not in (0, 1, 2, 3):
        raise RuntimeInputError(f"fused_moe_triton: gluon_xshare must be 0, 1, 2 or 3, got {cfg.gluon_xshare}.")
    if cfg.gluon_rows2 not in (0, 64, 128, 256):
        raise RuntimeInputError(f"fused_moe_triton: gluon_rows2 must be 0, 64, 128 or 256, got {cfg.gluon_rows2}.")
    if cfg.gluon_block_t not in (8, 16):
        raise RuntimeInputError(f"fused_moe_triton: gluon_block_t must be 8 or 16, got {cfg.gluon_block_t}.")
    if cfg.gluon_grouped_pdl not in (0, 1, 2):
        raise RuntimeInputError(f"fused_moe_triton: gluon_grouped_pdl must be 0, 1 or 2, got {cfg.gluon_grouped_pdl}.")
    for name in ("gluon_counters", "gluon_sum_pdl"):
        if getattr(cfg, name) not in (0, 1):
            raise RuntimeInputError(f"fused_moe_triton: {name} must be 0 or 1, got {getattr(cfg, name)}.")
    for name in ("gluon_unroll1", "gluon_unroll2"):
        if getattr(cfg, name) not in (0, 1, 2):
            raise RuntimeInputError(f"fused_moe_triton: {name} must be 0, 1 or 2, got {getattr(cfg, name)}.")
    for name in ("gluon_maxnreg1", "gluon_maxnreg2"):
        if getattr(cfg, name) not in (-1, 0) and not 24 <= getattr(cfg, name) <= 255:
            raise RuntimeInputError(f"fused_moe_triton: {name} must be -1, 0 or 24-255, got {getattr(cfg, name)}.")


def pairs_take(cfg: MoEConfig, T: int, num_pairs: int, E: int) -> bool:
    """Whether a call of T tokens is the per-pair Gluon kernels' (the device and weights aside:
    gluon_runnable): up to gluon_max_tokens tokens, and from two tokens pairs under gluon_pair_share x E."""
    return T <= cfg.gluon_max_tokens and (T == 1 or num_pairs < cfg.gluon_pair_share * E)


def grouped_takes(cfg: MoEConfig, T: int, num_pairs: int, E: int) -> bool:
    """Whether the expert-block Gluon kernels take a call of T tokens that is not the per-pair
    kernels' (pairs_take; the device and weights aside: gluon_runnable): gluon_grouped 1, or
    automatic (-1) at up to gluon_grouped_pairs pairs an expert on average; and the pair blocks fit
    grid axis 1."""
    if pairs_take(cfg, T, num_pairs, E) or cfg.gluon_grouped == 0:
        return False
    if num_pairs // cfg.gluon_block_t + min(E, num_pairs) >= 65535:
        return False
    return cfg.gluon_grouped == 1 or num_pairs <= cfg.gluon_grouped_pairs * E


def grouped_tiles(cfg: MoEConfig, H: int, i_pad: int, pairs: int, E: int) -> tuple[int, int, int, int]:
    """(k1, k2, splits1, blocks2) of the expert-block kernels: steps of cfg.gluon_k1 (default 128) and
    gluon_k2 codes (64 where K is no multiple); GEMM1's K splits (cfg.gluon_split1, default 1), lowered
    to a divisor of the K steps; and GEMM2's 64-row blocks a program (cfg.gluon_blocks2, or
    _GROUPED_BLOCKS2 where its rows are at most _GROUPED_SHORT_STEPS K steps long and its programs over
    min(E, pairs) blocks still number _GROUPED_PROGRAMS2, _GROUPED_PROGRAMS2_WIDE where one block a program would
    be of more rows (gluon_rows2), else 1), lowered to a divisor of H / 64."""
    _check_gluon_knobs(cfg)
    k1 = cfg.gluon_k1 or 128
    k1 = k1 if H % k1 == 0 else 64
    k2 = cfg.gluon_k2 if i_pad % cfg.gluon_k2 == 0 else 64
    b2 = _divisor_splits(cfg.gluon_blocks2 or _GROUPED_BLOCKS2, H // 64)
    least = _GROUPED_PROGRAMS2_WIDE if gluon_rows2(cfg, H, i_pad, k2) > 64 else _GROUPED_PROGRAMS2
    if not cfg.gluon_blocks2 and (i_pad // k2 > _GROUPED_SHORT_STEPS or min(E, pairs) * (H // 64 // b2) < least):
        b2 = 1
    return k1, k2, _divisor_splits(cfg.gluon_split1 or 1, H // k1), b2


def grouped_masks(cfg: MoEConfig, i_pad: int) -> int:
    """The expert-block GEMMs' x masks (bit 1 GEMM1, bit 2 GEMM2): cfg.gluon_xmask, or automatically GEMM2
    unmasked, and GEMM1 too where a pair block's rows make at least _GROUPED_UNMASKED_ROWS 64-row blocks (its
    tiles then fill enough waves for the sixth program an SM to win over the last wave's fill)."""
    _check_gluon_knobs(cfg)
    if cfg.gluon_xmask >= 0:
        return cfg.gluon_xmask
    return 0 if i_pad // 64 >= _GROUPED_UNMASKED_ROWS else 1


def gluon_plan(cfg: MoEConfig, x: torch.Tensor, weights, top_k: int, layout: str) -> tuple[int, int, int, int] | None:
    """gluon_tiles for this call (on its GPU's SMs), or None where other kernels run it: not pairs_take's, another
    layout, x not bf16, no CUDA GPU of compute capability 8.0 or more (9.x when automatic), an e8m0
    byte above 128 (the one-multiply factor decode), storage not 4-byte aligned, no Gluon in this
    Triton, or cfg.gluon = 0."""
    T = x.shape[0]
    # (before the gates: a bad knob raises on any device)
    tiles = gluon_tiles(cfg, x.shape[1], weights[0].shape[1] // 2, T * top_k, T, device_sms(x.device))
    if not pairs_take(cfg, T, T * top_k, weights[0].shape[0]) or not gluon_runnable(cfg, x, weights, layout):
        return None
    return tiles


def grouped_plan(cfg: MoEConfig, x: torch.Tensor, weights, top_k: int, layout: str, E: int
                 ) -> tuple[int, int, int, int] | None:
    """grouped_tiles for this call where the expert-block kernels take it (grouped_takes and
    gluon_runnable), else None."""
    T, H = x.shape
    if not grouped_takes(cfg, T, T * top_k, E) or not gluon_runnable(cfg, x, weights, layout):
        return None
    return grouped_tiles(cfg, H, weights[0].shape[1] // 2, T * top_k, E)


def device_sms(device: torch.device) -> int:
    """The SMs of a CUDA device (0 for any other); looked up once a device."""
    if device.type != "cuda":
        return 0
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def gluon_runnable(cfg: MoEConfig, x: torch.Tensor, weights, layout: str) -> bool:
    """Whether the Gluon kernels can take this call, the number of tokens aside (gluon_plan)."""
    w13, w13_scale, w2, w2_scale = weights
    if cfg.gluon == 0 or layout not in GLUON_SETS or x.dtype != torch.bfloat16:
        return False
    if not x.is_cuda or torch.version.cuda is None or os.environ.get("TRITON_INTERPRET") == "1" or _GLUON_BROKEN:
        return False
    major = torch.cuda.get_device_capability(x.device)[0]
    if major < 8 or (cfg.gluon < 0 and major != 9):
        return False
    return not (any(t.data_ptr() % 4 for t in weights) or _big_scales(w13_scale, w2_scale) or _gluon_module() is None)


def _gluon_forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, act, out, plan,
                   required, pdl=0, by_kernel=False, frag=False, rows2=64, tune=None, reuse_counters=True,
                   sum_pdl=False, *, order):
    """The layer in the few-token Gluon kernels; None (the caller runs the hopper_mma kernels) where
    they fail to compile and were not required: a Triton whose Gluon differs from the one they were
    written for. The failure is warned about once. by_kernel: the sum over k in the k-sum kernel; frag: the
    intermediate rows in fragment order; rows2: GEMM2's rows a program; tune: loop_tuning's unroll and maxnreg;
    reuse_counters: the arrival counters from the device's buffer (counters.zeroed_counters); sum_pdl: the k-sum kernel
    a programmatic dependent of GEMM2; order: the weight words' bit order (GLUON_SETS')."""
    k1, k2, s1, s2 = plan
    tensors = _contiguous(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias)
    sum_pdl = sum_pdl and HK.HAS_GDC  # (k_sum runs only with by_kernel; forward releases it only then)

    def k_sum(part2):
        _sum_launch(part2, tensors[6], out, x.shape[1], topk_ids.shape[1], w13.shape[0], s2, sum_pdl)
        return out

    return _compiled_or_none(lambda: _gluon_module().forward(*tensors, act, out, k1=k1, k2=k2, splits1=s1, splits2=s2,
                                                             pdl=pdl if HK.HAS_GDC else 0,
                                                             k_sum=k_sum if by_kernel else None,
                                                             frag=frag, rows2=rows2, reuse_counters=reuse_counters,
                                                             release2=sum_pdl, order=order,
                                                             **(tune or {})), required)


# The Gluon K loops over pairs of steps (gluon_unroll1 / 2) drop the 7-15 register copies a step that a loop over single
# steps makes (sm_90a SASS a step: per-pair GEMM1 155 -> 146.5 instructions with 64-code steps, 292 -> 281.5 with
# 128-code ones, GEMM2 64 / 128 rows 150 -> 142.5 / 290 -> 272.5, the expert blocks' GEMM1 304 -> 281, GEMM2 128 rows
# 289 -> 271.5) for more registers (GEMM1 59 -> 63, 72 -> 94, GEMM2 56 -> 64, 80 -> 95, the expert blocks' 95 -> 109,
# 84 -> 93). Where that costs programs an SM, a cap of _UNROLLED_MAXNREG gives them back without spilling in the loop:
# the per-pair GEMM1 in 128-code steps and both GEMM2s of 128 rows. On an H200 against single steps (one run): per
# pair DSV3-like T = 1 / 2 / 4 0.976 / 0.969 / 0.980 (GEMM1 0.988 / 0.969 / 0.980 alone, GEMM2 0.996 / 0.996 / 0.987),
# K3-like T = 1 / 4 / 8 GEMM1 0.979 / 0.987 / 0.983, GEMM2 1.003 / 0.976 / 0.995; expert blocks K3-like (128-row GEMM2)
# T = 12 / 16 / 24 / 40 GEMM2 0.979 / 0.980 / 0.978 / 0.973 (the cap alone 0.989 / 0.992 / 0.986 / 0.984). Left on
# single steps: the expert blocks' GEMM1 (4 programs an SM, and spills under a cap; K3-like T = 12 / 16 / 24 0.972 /
# 1.001 / 1.020, DSV3-like T = 8-32 1.024-1.027) and their 64-row GEMM2 (DSV3-like T = 8 / 16 / 32 0.995 / 0.995 /
# 1.015)
_UNROLLED_MAXNREG = 80
# The expert blocks' GEMM1 over pairs holds 4 programs an SM (single steps 5). It wins where its expected grid fits two
# waves of those: on an H200 (5 rounds) K3-like T = 12 (1045 expected of 1056 slots) 0.967-0.973 of single steps in
# three routing draws of six, 0.996-1.002 in the other three; with the expert blocks forced below their range, T = 9 /
# 10 / 11 0.970 / 0.979 / 0.955. Past that it loses: K3-like T = 13 / 14 / 16 / 20 / 24 / 32 1.051-1.064 / 1.041 /
# 1.017 / 1.018 / 1.030 / 1.022, DSV3-like T = 8 / 12 / 16 1.054 / 1.033 / 1.047 (3 rounds)
_GROUPED_PAIRS_AN_SM = 4
# hopper_mma_w_xor's decode moves three loops' registers (sm_90a SASS, triton 3.6): the per-pair 128-row GEMM2 over
# pairs of steps spills in its loop under the cap of 80, so it runs over single steps (80 registers, nothing spilled); the
# per-pair GEMM1 in 128-code single steps takes 74 (6 programs an SM where BITS_ROT's 72 fit 7), the expert blocks'
# GEMM1 100 (4 where 96 fit 5), so they are capped at those. On an H100 against hopper_mma_w_rot: K3-like T = 1 / 8 / 9
# / 10 0.974 / 0.999 / 0.994 / 1.000 with them, 0.989 / 1.017 / 1.130 / 1.014 without; on an H200 with them 0.965-0.969 /
# 0.996-0.999 / 0.977-0.979 / 0.983-0.988 (benchmarks/results/performance-notebook.md)
_XOR_MAXNREG1 = {False: 72, True: 96}  # grouped -> the cap of GEMM1 in 128-code single steps


def expected_experts(T: int, top_k: int, E: int) -> float:
    """The mean number of distinct experts that T tokens touch when each picks top_k of E uniformly at random."""
    return E * (1.0 - (1.0 - top_k / E) ** T)


def loop_tuning(cfg: MoEConfig, grouped: bool, k1: int, rows2: int, programs1: int = 0, sms: int = 0,
                order: str = "rot") -> dict:
    """The Gluon kernels' K loops (1 single steps, 2 pairs) and register caps (0 none), (GEMM1, GEMM2) each, for the
    per-pair kernels (grouped False; GEMM1 of programs1 programs on a GPU of sms SMs, 0 where not known) or the expert
    blocks' with GEMM1 steps of k1 codes and GEMM2 programs of rows2 rows: cfg's, or automatically (see
    _UNROLLED_MAXNREG) pairs but for the expert blocks' GEMM1 and 64-row GEMM2, capped where the per-pair GEMM1 takes
    128-code steps and where GEMM2 takes 128 rows; the per-pair GEMM1 in 128-code steps over single steps where its
    grid is over a wave of _PAIRS_AN_SM programs an SM and at most one of _SINGLE_AN_SM; the expert blocks' GEMM1 in
    128-code steps over pairs where its expected programs1 fit two waves of _GROUPED_PAIRS_AN_SM programs an SM. order:
    the weight words' bit order ("xor": see _XOR_MAXNREG1)."""
    if grouped:
        two_waves = sms and 0 < programs1 <= 2 * _GROUPED_PAIRS_AN_SM * sms
        u1 = cfg.gluon_unroll1 or (2 if k1 == 128 and two_waves else 1)
    else:
        one_wave = sms and _PAIRS_AN_SM * sms < programs1 <= _SINGLE_AN_SM * sms
        u1 = cfg.gluon_unroll1 or (1 if k1 == 128 and one_wave else 2)
    xor = order == "xor"
    u2 = cfg.gluon_unroll2 or (1 if xor and not grouped and rows2 == 128 else 2 if not grouped or rows2 > 64 else 1)
    capped1 = u1 == 2 and k1 == 128 and not grouped
    capped2 = u2 == 2 and rows2 == 128
    auto1 = _XOR_MAXNREG1[grouped] if xor and u1 == 1 and k1 == 128 else _UNROLLED_MAXNREG * capped1
    m1 = cfg.gluon_maxnreg1 if cfg.gluon_maxnreg1 >= 0 else auto1
    m2 = cfg.gluon_maxnreg2 if cfg.gluon_maxnreg2 >= 0 else _UNROLLED_MAXNREG * capped2
    return {"unroll": (u1, u2), "maxnreg": (m1, m2)}


def _compiled_or_none(run, required: bool):
    """run(), or None where its Gluon kernels fail to compile and were not required (warned about
    once; later calls skip the Gluon paths)."""
    try:
        return run()
    except triton.compiler.errors.CompilationError as exc:
        if required:
            raise
        _GLUON_BROKEN.append(str(exc).splitlines()[-1] if str(exc) else type(exc).__name__)
        warnings.warn(f"mxfp4conv: the Gluon MoE kernels do not compile with triton {triton.__version__} "
                      f"({_GLUON_BROKEN[0]}); the hopper_mma kernels run instead.", RuntimeWarning, stacklevel=4)
        return None


def grouped_programs1(T: int, top_k: int, E: int, i_pad: int, splits1: int) -> int:
    """The expert blocks' GEMM1 programs with work that a call of T tokens is expected to have: 64-row blocks x K
    splits x the expected experts touched (each one pair block at the few pairs an expert where it matters)."""
    return round(i_pad // 64 * splits1 * expected_experts(T, top_k, E))


def _gluon_grouped_forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, act, out,
                           cfg, plan, order):
    """The layer in the Gluon kernels on expert blocks with grouped_plan's (k1, k2, splits1, blocks2): the align
    and the k-sum are the Triton path's; None as _gluon_forward; order: the weight words' bit order."""
    H, E, top_k = x.shape[1], w13.shape[0], topk_ids.shape[1]
    k1, k2, splits1, blocks2 = plan
    rows2 = gluon_rows2(cfg, H, w13.shape[1] // 2, k2)
    pdl = cfg.gluon_grouped_pdl if HK.HAS_GDC else 0
    sum_pdl = cfg.gluon_sum_pdl == 1 and HK.HAS_GDC

    tensors = _contiguous(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias)

    def k_sum(pair_out):  # (nothing launched between GEMM2 and it: the ids are made contiguous before)
        _sum_launch(pair_out, tensors[6], out, H, top_k, E, 1, sum_pdl)
        return out

    return _compiled_or_none(lambda: _gluon_grouped_module().forward(
        *tensors, act, lambda bt: moe_align(topk_ids, E, bt, cfg.align, pdl == 2), k_sum, k1=k1, k2=k2,
        block_t=cfg.gluon_block_t, splits1=splits1, blocks2=blocks2, frag=cfg.gluon_frag == 1,
        masks=grouped_masks(cfg, w13.shape[1] // 2), shared=bool(cfg.gluon_xshare & 1),
        shared2=bool(cfg.gluon_xshare & 2), rows2=rows2, pdl=pdl, release2=sum_pdl, order=order,
        **loop_tuning(cfg, True, k1, rows2 if blocks2 == 1 else 64,
                      grouped_programs1(x.shape[0], top_k, E, w13.shape[1] // 2, splits1), device_sms(x.device),
                      order)),
        cfg.gluon_grouped == 1 and cfg.gluon == 1)


def _contiguous(*tensors):
    """Each tensor contiguous (None stays None)."""
    return [t.contiguous() if t is not None else None for t in tensors]


def hopper_options(cfg: MoEConfig, T: int, num_pairs: int, cuda: bool) -> tuple[bool, bool, bool]:
    """(direct, fused, pdl) for this call. Automatic: all three for one token only. Measured on an
    H200 (benchmarks/results/performance-notebook.md): with the one-token tiles, T = 1 runs 1.13x (DSV3-like) and 1.23x
    (K3-like) faster than the five-launch sequence; from T = 8 on the fused k-sum costs more than
    the kernel it replaces (each program of GEMM2 counts the arrival of each of its pairs, one
    atomic round trip after another) and PDL is within noise or slower."""
    direct = cfg.direct == 1 or (cfg.direct < 0 and T == 1)
    fused = cfg.fused == 1 or (cfg.fused < 0 and direct)
    pdl = cuda and HK.HAS_GDC and (cfg.pdl == 1 or (cfg.pdl < 0 and direct))
    return direct, fused, pdl


def gemm2_tail(cfg: MoEConfig) -> int:
    """GEMM2's tail_t (MoEConfig.tail_t2, or tail_t where that is -1)."""
    return cfg.tail_t if cfg.tail_t2 < 0 else cfg.tail_t2


def hopper_constants(cfg: MoEConfig, T: int, top_k: int, H: int, i_pad: int, dtype, asm: bool, fact: int, acts: dict,
                     bias13: bool, bias2: bool, rot: int = 0) -> tuple[dict, dict, tuple[bool, bool, int]]:
    """The compile-time arguments of moe_hgemm1_kernel and moe_hgemm2_kernel for one call (all but
    SPLIT and ROWS_FIRST, which follow from the grid), and (direct, fused, GEMM2 row tiles a program)."""
    direct, fused, pdl = hopper_options(cfg, T, T * top_k, asm)
    rows2 = 1 if fused else max(1, cfg.rows2)
    tail = 0 if direct or fused else cfg.tail_t
    tail2 = 0 if direct or fused or rows2 > 1 else gemm2_tail(cfg)
    common = dict(BLOCK_T=cfg.block_t, BLOCK_K=cfg.block_k, DTYPE=dtype, ASM=asm, FACT=fact, DIRECT=direct,
                  FUSED=fused, PDL=pdl, ROT=rot)
    c1 = dict(common, **acts, HAS_BIAS=bias13, BLOCK_N=cfg.block_n1, TAIL_T=tail, DUAL=cfg.dual if tail else 0,
              EVEN=H % cfg.block_k == 0 and i_pad % cfg.block_n1 == 0, ABSORB=cfg.absorb if tail else 0)
    c2 = dict(common, HAS_BIAS=bias2, BLOCK_N=cfg.block_n2, K_POW2=triton.next_power_of_2(top_k), ROW_TILES=rows2,
              TAIL_T=tail2, DUAL=cfg.dual if tail2 else 0, EVEN=i_pad % cfg.block_k == 0 and H % cfg.block_n2 == 0,
              ABSORB=cfg.absorb2 if tail2 else 0)
    return c1, c2, (direct, fused, rows2)


def _wgmma_parts(rot):
    """(gluon_wgmma, gluon_few_tokens' int32 view of the words, the decode of bit order rot) for a launch."""
    return _gluon_wgmma_module(), _gluon_module()._words, _gluon_module().WORDS32_PTX["xor" if rot == 2 else "rot"]


def _wgmma_can_run(cfg, x, w, s, splits, direct, fused, fact, rot) -> bool:
    """Whether a gluon_wgmma kernel can take a GEMM: bf16 x on a CUDA GPU of compute capability 9.x (warpgroup MMAs),
    expert blocks of at most 64 pairs in one K split, every e8m0 scale <= 2, the xor or rot bit order, word-aligned
    weights and Gluon here that has compiled."""
    return bool(x.dtype == torch.bfloat16 and x.is_cuda and torch.version.cuda is not None
                and os.environ.get("TRITON_INTERPRET") != "1" and cfg.block_t <= 64 and splits == 1 and not direct
                and not fused and fact != 2 and rot in (1, 2) and w.data_ptr() % 16 == 0 and s.data_ptr() % 4 == 0
                and not _GLUON_BROKEN and torch.cuda.get_device_capability(x.device)[0] == 9
                and _gluon_module() is not None)


def wgmma1_runs(cfg, x, w13, w13_scale, i_pad, splits, direct, fused, fact, rot) -> bool:
    """Whether GEMM1 runs in gluon_wgmma.wg_gemm1: asked for (wgmma1), 128-code steps of H, and x's offsets in int32."""
    return bool(cfg.wgmma1 and x.shape[1] % 128 == 0 and i_pad % 64 == 0 and x.numel() < 2 ** 31
                and _wgmma_can_run(cfg, x, w13, w13_scale, splits, direct, fused, fact, rot))


def wgmma2_runs(cfg, x, w2, w2_scale, H, i_pad, pairs, splits, direct, fused, fact, rot) -> bool:
    """Whether GEMM2 runs in gluon_wgmma.wg_gemm2: asked for (wgmma2), rows of wgmma2_rows dividing H, 128-code steps
    of I, and the intermediate's offsets in int32."""
    return bool(cfg.wgmma2 and cfg.wgmma2_rows in (64, 128) and H % cfg.wgmma2_rows == 0 and i_pad % 128 == 0
                and pairs * i_pad < 2 ** 31 and _wgmma_can_run(cfg, x, w2, w2_scale, splits, direct, fused, fact, rot))


def _wgmma_gemm1(x, w13, w13_scale, w13_bias, act, cfg, r, num_pairs, top_k, i_pad, max_blocks, rot):
    """GEMM1 of the hopper_mma path in gluon_wgmma.wg_gemm1: r.inter = act(gate . x, up . x) per pair; True once
    launched."""
    gluon_wgmma, words, ptx = _wgmma_parts(rot)
    cap = cfg.wgmma1_cap if cfg.wgmma1_cap >= 0 else 168 if cfg.block_t > 32 else 0
    gluon_wgmma.wg_gemm1[(i_pad // 64, max_blocks)](
        words(w13), words(w13_scale), x, r.sorted_ids, r.block_expert, r.num_post_pad,
        r.b13 if w13_bias is not None else r.inter, r.inter, num_pairs, top_k, x.shape[1], i_pad, act["p0"], act["p1"],
        KB=2, BT=cfg.block_t, TAIL=cfg.tail_t, STAGES=cfg.wgmma1_stages, ACT=act["ACT"], HAS_LIMIT=act["HAS_LIMIT"],
        HAS_LINEAR=act["HAS_LINEAR"], HAS_BIAS=w13_bias is not None, OVERLAP={1: 0, 2: 3, 3: 2}.get(cfg.wgmma1, 3),
        EARLY=bool(cfg.wgmma1_early), RING=bool(cfg.wgmma1_ring), WPTX=ptx,
        DUAL=cfg.wgmma_dual if cfg.tail_t else 0, num_warps=4,
        **({"maxnreg": cap} if cap else {}))
    return True


def _wgmma_gemm2(w2, w2_scale, w2_bias, cfg, r, num_pairs, H, i_pad, max_blocks, rot):
    """GEMM2 of the hopper_mma path in gluon_wgmma.wg_gemm2: r.pair_out[0] = tw * (w2 . inter + b2) per pair; True
    once launched."""
    gluon_wgmma, words, ptx = _wgmma_parts(rot)
    rows = cfg.wgmma2_rows
    tail = gemm2_tail(cfg)
    gluon_wgmma.wg_gemm2[(H // rows, max_blocks)](
        words(w2), words(w2_scale), r.inter, r.sorted_ids, r.block_expert, r.num_post_pad,
        r.b2 if w2_bias is not None else r.tw, r.tw, r.pair_out, num_pairs, i_pad, H, KB=2, BT=cfg.block_t,
        TAIL=tail, ROWS=rows, STAGES=3, HAS_BIAS=w2_bias is not None, RING=bool(cfg.wgmma2_ring), WPTX=ptx,
        DUAL=cfg.wgmma_dual if tail else 0, num_warps=4)
    return True


def _hopper_forward(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, w13_bias, w2_bias, act, cfg, out,
                    rot=0):
    """The MMA path over the hopper_mma layouts (moe_hgemm1/2_kernel); rot: the weight words' bit order
    (triton_hopper_kernels.ORDER_IDS)."""
    T, H = x.shape
    E, two_i, _ = w13.shape
    i_pad = two_i // 2
    top_k = topk_ids.shape[1]
    num_pairs = T * top_k
    dtype = getattr(triton.language, _TL_DTYPES[x.dtype])
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    asm = x.is_cuda and torch.version.cuda is not None and not interp
    fact = 2 if _big_scales(w13_scale, w2_scale) else cfg.factor_pairs
    if cfg.block_k % 64 or cfg.block_n1 % 16 or cfg.block_n2 % 16:
        raise RuntimeInputError(
            f"fused_moe_triton: the hopper_mma kernels need block_k a multiple of 64 and block_n1/block_n2 "
            f"multiples of 16, got {cfg.block_k}, {cfg.block_n1}, {cfg.block_n2}.")
    tails = (("tail_t", cfg.tail_t), ("tail_t2", gemm2_tail(cfg)))
    for name, t in tails:
        if t and (t < 16 or t & (t - 1) or t >= cfg.block_t):
            raise RuntimeInputError(
                f"fused_moe_triton: {name} must be 0 or a power of two from 16 to below block_t ({cfg.block_t}), "
                f"got {t}.")
    if cfg.wgmma_dual and ((cfg.wgmma1 and not cfg.wgmma1_ring) or (cfg.wgmma2 and not cfg.wgmma2_ring)):
        raise RuntimeInputError("fused_moe_triton: wgmma_dual needs gluon_wgmma's ring forms (wgmma1_ring and "
                                "wgmma2_ring 1 where wgmma1 / wgmma2 are asked for).")
    # two-tile blocks' second tiles (tail_t / 4 with 2, else tail_t / 2): tl.dot's at least 16 pairs wide, the
    # warpgroup MMAs' 8 (gluon_wgmma, where asked for)
    for (name, t), gluon in zip(tails, (cfg.wgmma1, cfg.wgmma2)):
        for option, dual, least in (("dual", cfg.dual, 16), ("wgmma_dual", cfg.wgmma_dual if gluon else 0, 8)):
            need = least * (4 if dual == 2 else 2)
            if dual and t and t < need:
                raise RuntimeInputError(f"fused_moe_triton: {option}{' 2' if dual == 2 else ''} needs {name} of "
                                        f"{need} or more (second tiles of at least {least} pairs), got {t}.")
    for name, a, t in (("absorb", cfg.absorb, tails[0][1]), ("absorb2", cfg.absorb2, tails[1][1])):
        if a and t and (a < 16 or a & (a - 1) or a > t):
            raise RuntimeInputError(
                f"fused_moe_triton: {name} must be 0 or a power of two from 16 up to that GEMM's tail_t ({t}), "
                f"got {a}.")
    x = x.contiguous()
    w13, w13_scale, w2, w2_scale = (t.contiguous() for t in (w13, w13_scale, w2, w2_scale))
    acts = dict(ACT=act["ACT"], HAS_LIMIT=act["HAS_LIMIT"], HAS_LINEAR=act["HAS_LINEAR"])
    launch, launch2 = (hopper_launch_options(cfg, x.element_size(), second) for second in (False, True))
    c1, c2, (direct, fused, rows2) = hopper_constants(cfg, T, top_k, H, i_pad, dtype, asm, fact, acts,
                                                      w13_bias is not None, w2_bias is not None, rot)

    def order(grid, on):  # (grid, rows first): row tiles on grid axis 0 where asked and possible
        if on and not fused and grid[0] < 65536:
            return (grid[1], grid[0], grid[2]), True
        return grid, False

    def gemm1(grid, r):
        if wgmma1_runs(cfg, x, w13, w13_scale, i_pad, r.s1, direct, fused, fact, rot) and _compiled_or_none(
                lambda: _wgmma_gemm1(x, w13, w13_scale, w13_bias, act, cfg, r, num_pairs, top_k, i_pad, grid[0], rot),
                required=False):
            return
        grid, rf = order(grid, cfg.rows_first1)
        HK.moe_hgemm1_kernel[grid](
            x, w13, w13_scale, r.b13, r.inter, r.part, r.sorted_ids, r.block_expert, r.num_post_pad,
            r.cnt1, num_pairs, E, top_k, H, i_pad, r.ks1,
            x.stride(0), w13.stride(0), w13_scale.stride(0), r.b13.stride(0), r.inter.stride(0),
            act["p0"], act["p1"], **c1, SPLIT=r.s1 > 1, ROWS_FIRST=rf, **launch,
        )

    def gemm2(grid, r):
        if wgmma2_runs(cfg, x, w2, w2_scale, H, i_pad, num_pairs, r.s2, direct, fused, fact, rot) and _compiled_or_none(
                lambda: _wgmma_gemm2(w2, w2_scale, w2_bias, cfg, r, num_pairs, H, i_pad, grid[0], rot), required=False):
            return
        grid, rf = order(grid, cfg.rows_first2)
        HK.moe_hgemm2_kernel[grid](
            r.inter, w2, w2_scale, r.b2, r.tw, r.pair_out, r.sorted_ids, r.block_expert, r.num_post_pad,
            r.ids, r.out, r.cnt2, num_pairs, E, top_k, i_pad, H, r.ks2,
            r.inter.stride(0), w2.stride(0), w2_scale.stride(0), r.b2.stride(0), r.pair_out.stride(1),
            r.pair_out.stride(0), r.out.stride(0),
            **c2, ROWS_FIRST=rf, **launch2,
            **({"launch_pdl": True} if c2["PDL"] else {}),
        )

    return _two_gemms(x, topk_weights, topk_ids, w13_scale, w2_scale, w13_bias, w2_bias, act, cfg, out, gemm1, gemm2,
                      direct=direct, fused=fused, rows2=rows2)
