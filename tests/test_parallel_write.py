"""The pieces of the parallel write path: crc32 combination, the ordered pool, and pieces
written out of order by several threads giving the same file and checksum as a sequential write."""

import random
import threading
import time
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4conv.convert import crc
from mxfp4conv.convert.crc import crc32_combine
from mxfp4conv.convert.parallel import OrderedPool
from mxfp4conv.convert.writer import ShardWriter, TensorSpec, WriteError, shard_checksum


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600), st.binary(max_size=600), st.integers(0, 2**32 - 1))
def test_crc32_combine_equals_crc_of_concatenation(a, b, start):
    crc_a = zlib.crc32(a, start)
    assert crc32_combine(crc_a, zlib.crc32(b), len(b)) == zlib.crc32(a + b, start)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=70000), st.integers(0, 2**32 - 1))
def test_converter_crc32_is_zlibs(data, start):
    # the converter's crc32 (zlib-ng's where installed) is zlib's checksum, from any start value
    assert crc.crc32(data, start) == zlib.crc32(data, start)
    assert crc.crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])


def test_converter_crc32_is_zlib_ngs_when_installed():
    zlib_ng = pytest.importorskip("zlib_ng.zlib_ng", reason="zlib-ng is not installed")
    assert crc.crc32 is zlib_ng.crc32


def test_crc32_combine_long_zero_runs():
    # lengths far beyond the examples above, where every bit of the length matters
    for n in (1 << 20, (1 << 24) + 12345, 3 * (1 << 22) - 1):
        b = bytes(n)
        assert crc32_combine(0xDEADBEEF, zlib.crc32(b), n) == zlib.crc32(b, 0xDEADBEEF)


def test_ordered_pool_yields_in_submission_order_with_bounded_depth():
    running = {"now": 0, "max": 0}
    lock = threading.Lock()
    drawn = []

    def jobs():
        for i in range(40):
            drawn.append(i)
            yield i

    def work(i):
        with lock:
            running["now"] += 1
            running["max"] = max(running["max"], running["now"])
        time.sleep(random.random() / 500)
        with lock:
            running["now"] -= 1
        return i * i

    seen = []
    with OrderedPool(4, depth=6) as pool:
        for job, res in pool.map(work, jobs()):
            assert res == job * job
            assert len(drawn) - len(seen) <= 7  # never more than depth + 1 drawn ahead
            seen.append(job)
    assert seen == list(range(40))
    assert running["max"] <= 4


def test_ordered_pool_error_propagates_and_stops():
    started = []

    def work(i):
        started.append(i)
        if i == 3:
            raise ValueError("boom")
        time.sleep(0.001)
        return i

    with pytest.raises(ValueError, match="boom"):
        with OrderedPool(2, depth=3) as pool:
            for _ in pool.map(work, range(1000)):
                pass
    assert len(started) < 20


def test_pieces_written_out_of_order_give_the_sequential_file(tmp_path):
    rng = random.Random(0)
    specs = [TensorSpec("a", "U8", (5000,)), TensorSpec("b", "U8", (777,)), TensorSpec("c", "U8", (0,))]
    data = {s.name: rng.randbytes(s.size()) for s in specs}
    seq = ShardWriter(tmp_path / "seq.safetensors", specs, {"format": "pt"})
    with seq:
        for s in specs:
            seq.write(s.name, data[s.name])
        want = seq.finish()

    pieces = []
    for s in specs:
        cuts = sorted({0, s.size(), *(rng.randrange(s.size() + 1) for _ in range(4))})
        pieces += [(s.name, a, b - a) for a, b in zip(cuts, cuts[1:])]
    w = ShardWriter(tmp_path / "par.safetensors", specs, {"format": "pt"})
    w.open()
    crcs = {}
    order = list(range(len(pieces)))
    rng.shuffle(order)
    for i in order:  # written in any order ...
        name, off, n = pieces[i]
        crcs[i] = w.write_at(name, off, data[name][off:off + n])
    for i, (name, off, n) in enumerate(pieces):  # ... recorded in order
        w.record(name, off, n, crcs[i])
    assert w.finish() == want
    assert (tmp_path / "par.safetensors").read_bytes() == (tmp_path / "seq.safetensors").read_bytes()
    assert shard_checksum(tmp_path / "par.safetensors")[0] == want


def test_piece_recorded_out_of_order_or_outside_its_tensor_is_refused(tmp_path):
    specs = [TensorSpec("a", "U8", (100,))]
    w = ShardWriter(tmp_path / "x.safetensors", specs)
    w.open()
    with pytest.raises(WriteError, match="outside"):
        w.write_at("a", 90, bytes(20))
    crc = w.write_at("a", 50, bytes(50))
    with pytest.raises(WriteError, match="offset 50 after 0"):
        w.record("a", 50, 50, crc)
    assert not list(tmp_path.iterdir())  # the temporary file is gone


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 5000), st.integers(0, 800)), max_size=12),
       st.integers(0, 300))
def test_merged_readahead_ranges_cover_exactly_the_requested_bytes_plus_small_gaps(ranges, gap):
    from mxfp4conv.convert.direct_read import merge_ranges

    merged = merge_ranges(ranges, gap)
    want = {(s, b) for s, o, n in ranges for b in range(o, o + n)}
    got = {(s, b) for s, o, n in merged for b in range(o, o + n)}
    assert want <= got
    for s, o, n in merged:  # every merged range starts and ends on requested bytes
        assert (s, o) in want and (s, o + n - 1) in want
    per_shard = sorted(merged)
    for (s1, o1, n1), (s2, o2, _) in zip(per_shard, per_shard[1:]):
        assert s1 != s2 or o2 > o1 + n1 + gap  # nothing left that should have been joined
