"""``MoEConfig``: every tile size and switch of the kernels, with what was measured for each default.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoEConfig:
    """Tile sizes of both GEMMs (BLOCK_N: weight rows per program, BLOCK_T: pairs per block)."""

    block_t: int = 16
    block_n1: int = 64
    block_n2: int = 128
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4
    # 0: byte decode, 1: int32-word decode (bf16 x; fp16 and fp32 x take 0). tl.dot_scaled and a word decode into 8
    # split dots took 1.10-1.40x and 1.13-1.20x their time at every point measured (benchmarks/results/
    # performance-notebook.md, "Version notes")
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
    # hopper_mma path only (1 on, 0 off, -1 automatic; see hopper_kernels):
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
    # with tail_t: an expert's last block of at most absorb pairs (absorb2 in GEMM2) run as a second [rows, absorb]
    # tile in the program of the expert's block before it, on the weights that program decodes anyway (0 off, else a
    # power of two from 16 up to tail_t)
    absorb: int = 0
    absorb2: int = 0
    # hopper_mma decode: the e8m0 factors of scales <= 2 two to a word (1: a byte permute and a
    # multiply-add per two) or one at a time (0: an add and a shift each; select_config's choice past 64 pairs an
    # expert, where pairs gained nothing)
    factor_pairs: int = 1
    # up to gluon_max_tokens bf16 tokens over hopper_mma_xor / _rot: the Gluon MMA v2 kernels of gluon_few_tokens, a
    # program per (token, expert) pair (1 on where they can run, 0 off, -1: on compute capability 9.x, where measured);
    # codes a K step of GEMM1 / GEMM2 (64 or 128; GEMM1's 0: gluon_tiles) and K splits (0: gluon_tiles)
    gluon: int = -1
    gluon_k1: int = 0
    gluon_k2: int = 128
    gluon_split1: int = 0
    gluon_split2: int = 0
    # the per-pair GEMM2's sum over a token's pairs in its last program of a row block (1) or in the k-sum kernel
    # after it (0); -1: sum2_by_kernel
    gluon_sum2: int = -1
    # an expert is read once a pair there, so from two tokens only while the pairs number under gluon_pair_share x
    # the experts (benchmarks/results/performance-notebook.md: "GEMM1 in 64-code steps where that fits a wave")
    gluon_max_tokens: int = 11
    gluon_pair_share: float = 0.2
    # past those, the expert-block kernels of gluon_grouped (8-pair blocks) at up to gluon_grouped_pairs pairs an
    # expert (1 on, 0 off, -1: grouped_takes; the notebook's "Expert blocks: GEMM1's x tile shared")
    gluon_grouped: int = -1
    gluon_grouped_pairs: float = 5.5
    # their GEMM2's 64-row blocks a program (0: grouped_tiles; lowered to a divisor of H / 64)
    gluon_blocks2: int = 0
    # their GEMM1's x operand masked at the padding slots (1) or not (0: a padding slot reads row 0, whose column is
    # never stored; bit-equal); -1: grouped_masks. GEMM2's is never masked (notebook: "without x-operand masks")
    gluon_xmask: int = -1
    # both Gluon paths' GEMM2 rows a program (64, 128 or 256; 0: gluon_rows2)
    gluon_rows2: int = 0
    # both Gluon paths' K loops over single steps (1) or pairs of steps (2; 0: loop_tuning) and their register caps
    # (0 none, -1: loop_tuning)
    gluon_unroll1: int = 0
    gluon_unroll2: int = 0
    gluon_maxnreg1: int = -1
    gluon_maxnreg2: int = -1
    # the per-pair kernels' arrival counters from the device's buffer that they leave zero (1: no fill launch), or
    # zeroed for each call (0: for calls on one device that overlap in time on two streams; see counters.py)
    gluon_counters: int = 1
    # GEMM1 of expert blocks of up to 64 pairs in gluon_wgmma's kernel where it can run (wgmma1_runs; 1 on, 0: in
    # moe_hgemm1_kernel): warpgroup MMAs, the weight words and x through a cp.async ring, bit-equal outputs.
    # select_config asks for it on 32-pair blocks (1.01-1.08x faster on an H100 / H200) and on DSV3-like 64-pair ones
    # from 32 pairs an expert, with wgmma_dual 2 (benchmarks/results/performance-notebook.md, "GEMM1 of 32-pair
    # blocks in gluon_wgmma" and "32 + 8 tiles in gluon_wgmma")
    wgmma1: int = 0
    # the ring's stages: 3 on 32-pair blocks, 2 on 64-pair ones (3 there took 1.04-1.06x the time on an H200)
    wgmma1_stages: int = 3
    # with tail_t, wgmma1's blocks in two tiles as `dual` sets for the hopper_mma kernels (0 off, 1 or 2); 2 with tail_t
    # 32 gives 32 + 8 tiles, which tl.dot cannot take (0.944-0.995 of the time on an H100, DSV3-like T = 1024-1536)
    wgmma_dual: int = 0
