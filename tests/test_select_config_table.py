"""select_config's table (tiles.PATHS / TILES): every row is taken by some call, the rows a call takes never set a
field twice, and the measured rules the table encodes (benchmarks/results/performance-notebook.md, "The default
tiles, rule by rule") hold on the two tuned layers."""

from __future__ import annotations

import itertools

from hypothesis import given, settings, strategies as st

from mxfp4conv.kernels import triton_moe
from mxfp4conv.kernels.triton_moe import tiles
from mxfp4conv.kernels.triton_moe.layouts import HOPPER_SETS, LAYOUT_SETS
from layer_shapes import DSV3, K3


def _pick(T, shape, layout="hopper_mma_xor"):
    H, I, E, k = shape
    return triton_moe.select_config(T * k, E, H, I, layout)


def test_every_row_is_taken_by_some_call():
    # a row no call takes is dead data; the grid spans both families, short and long GEMM2 rows, I with and without
    # 256-code steps, few and many programs
    taken = set()
    for P, E, H, I, family in itertools.product(list(range(0, 300)) + [2 ** n for n in range(9, 17)],
                                                (8, 256, 896), (2880, 3584, 7168), (384, 2048, 2880),
                                                ("hopper", "identity")):
        path, rows = tiles.rows_of(tiles.Call(P, E, H, I, family))
        taken.add(id(path))
        taken.update(id(r) for r in rows)
    assert [p.name for p in tiles.PATHS if id(p) not in taken] == []
    assert [(r.path, r.why) for r in tiles.TILES if id(r) not in taken] == []
    assert {r.path for r in tiles.TILES} == {p.name for p in tiles.PATHS}


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 200_000), st.integers(1, 1024), st.integers(1, 16384), st.integers(1, 8192),
       st.sampled_from(list(LAYOUT_SETS) + ["unknown"]))
def test_a_call_never_takes_two_rows_that_set_one_field(P, E, H, I, layout):
    path, rows = tiles.rows_of(tiles.Call(P, E, H, I, "hopper" if layout in HOPPER_SETS else "identity"))
    names = [name for r in rows for name in (r.fields(tiles.Call(P, E, H, I, path.family)) if callable(r.fields)
                                             else r.fields)]
    assert len(names) == len(set(names))
    triton_moe.select_config(P, E, H, I, layout)  # and the fields are MoEConfig's


def test_decode_path_without_tensor_cores_at_one_pair_an_expert():
    # it wins while every touched expert sees one pair (T = 1 and 8 on both layers) and loses or ties from 1.14 (K3-like
    # T = 64) and 2 (DSV3-like T = 64) pairs an expert on; the hopper_mma sets take their own decode tiles
    for shape in (DSV3, K3):
        H, I, E, k = shape
        for T, gemv in ((1, True), (8, True), (64, False), (1024, False)):
            assert triton_moe.uses_gemv(_pick(T, shape, "identity"), T * k, E) == gemv, (shape, T)
    assert (_pick(8, DSV3, "identity").gemv_block_k, _pick(8, K3, "identity").gemv_block_k) == (256, 128)


def test_identity_blocks_by_pairs_an_expert():
    # int32-word decode on 16-pair blocks up to 32 pairs an expert, the byte decode on 64 / 128-pair blocks past
    got = [(c.mode, c.block_t) for c in (_pick(T, DSV3, "identity") for T in (512, 1024, 1056, 2048, 2080))]
    assert got == [(1, 16), (1, 16), (0, 64), (0, 64), (0, 128)]  # 16, 32, 33, 64, 65 pairs an expert


def test_hopper_blocks_by_pairs_an_expert():
    # DSV3-like: T / 32 pairs an expert. One token: a block a pair with 64-row GEMM2 tiles; 16 / 32 / 64-pair blocks
    # to 12 / 24 / 48 pairs an expert; 128-pair blocks with 128-row GEMM1 tiles and 8 warps past
    Ts = (1, 384, 385, 768, 800, 1536, 1568, 4096)
    assert [_pick(T, DSV3).block_t for T in Ts] == [16, 16, 32, 32, 64, 64, 128, 128]
    assert _pick(1, DSV3).block_n2 == 64 and _pick(384, DSV3).block_n2 == 128
    assert all((c.block_n1, c.num_warps, c.rows_first1, c.rows_first2) == (128, 8, 1, 1)
               for c in (_pick(T, shape) for T in (4096, 8192) for shape in (DSV3, K3)))


def test_hopper_prefill_gemm2_tiles_by_row_length():
    # short GEMM2 rows (K3-like): 128-row tiles, 4 warps, one stage; long ones (DSV3-like): 256-row tiles
    k3, dsv3 = _pick(4096, K3), _pick(4096, DSV3)
    assert (k3.block_n2, k3.num_warps2, k3.num_stages2) == (128, 4, 1)
    assert (dsv3.block_n2, dsv3.num_warps2, dsv3.num_stages2) == (256, 0, 0)


def test_e8m0_factors_two_to_a_word_up_to_64_pairs_an_expert():
    # faster at 64 pairs an expert (DSV3-like T = 2048), within the spread past it: one at a time there
    assert [_pick(T, DSV3).factor_pairs for T in (256, 1568, 2048, 2080, 4096)] == [1, 1, 1, 0, 0]
