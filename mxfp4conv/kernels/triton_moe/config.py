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
    tail_t2: int = -1  # GEMM2's tail_t where it differs (-1: tail_t; 0: none)
    # with tail_t: an expert's last block of at most absorb pairs (absorb2 in GEMM2) run as a second [rows, absorb]
    # tile in the program of the expert's block before it, on the weights that program decodes anyway (0 off, else a
    # power of two from 16 up to that GEMM's tail_t)
    absorb: int = 0
    absorb2: int = 0
    # hopper_mma decode: the e8m0 factors of scales <= 2 two to a word (1: a byte permute and a
    # multiply-add per two) or one at a time (0: an add and a shift each; select_config's choice past 64 pairs an
    # expert, where pairs gained nothing)
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
