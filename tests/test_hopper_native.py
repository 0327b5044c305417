"""The compiled hopper_mma weight transform writes the numpy path's bytes (and the torch path's),
for every input the numpy path takes; convert and verify use it, and write the same files with it
switched off."""

import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4conv.shuffle import hopper, hopper_native, hopper_np
from mxfp4conv.shuffle.layouts import get_layout

pytestmark = pytest.mark.skipif(not hopper_native.built(), reason="the compiled extension "
                                "mxfp4conv.shuffle._hopper_native is not built (python setup.py build_ext --inplace)")

PROPS = settings(max_examples=40, deadline=None)


@pytest.fixture(autouse=True)
def native_on(monkeypatch):
    monkeypatch.delenv(hopper_native.ENV_OFF, raising=False)


@pytest.fixture
def calls(monkeypatch):
    """Counts the extension's calls."""
    n = [0]
    real = hopper_native._native.weight_forward

    class Spy:
        @staticmethod
        def weight_forward(*a):
            n[0] += 1
            return real(*a)

    monkeypatch.setattr(hopper_native, "_native", Spy)
    return n


def _numpy(x):
    return hopper_np.weight_forward(x)


@st.composite
def inputs(draw):
    """Random bytes [E, 16 nb, 32 kb], sometimes big enough for several of the numpy path's steps,
    at a byte offset 0-7 from an aligned buffer."""
    if draw(st.booleans()):
        e, nb, kb = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    else:
        e, nb, kb = draw(st.integers(1, 2)), draw(st.integers(1, 40)), draw(st.sampled_from([32, 64, 112]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    offset = draw(st.integers(0, 7))
    n = e * 16 * nb * 32 * kb
    buf = np.empty(n + offset, dtype=np.uint8)
    x = buf[offset:].reshape(e, 16 * nb, 32 * kb)
    x[...] = rng.integers(0, 256, x.shape, dtype=np.uint8)
    return x


@pytest.mark.parametrize("order", ["plain", "rot", "xor"])
@PROPS
@given(x=inputs())
def test_native_equals_numpy_and_torch_paths(order, x):
    before = x.copy()
    y = hopper_native.weight_forward(x, order)
    assert y.dtype == np.uint8 and y.shape == x.shape and y.flags.c_contiguous
    assert np.array_equal(y, hopper_np.weight_forward(x, order))
    assert np.array_equal(x, before)  # the input is left as it was
    if x.size <= 1 << 16:  # the torch path moves single bytes: slow
        assert torch.equal(torch.from_numpy(y), hopper._forward_torch(torch.from_numpy(x.copy()), order))


def test_native_is_what_runs(calls):
    x = np.random.default_rng(1).integers(0, 256, (2, 32, 64), dtype=np.uint8)
    hopper_native.weight_forward(x)
    get_layout("hopper_mma_w").forward_np(x)  # what convert and verify call
    get_layout("hopper_mma_w").forward(torch.from_numpy(x))  # the torch CPU path
    assert calls[0] == 3


def test_switched_off_by_the_environment(calls, monkeypatch):
    monkeypatch.setenv(hopper_native.ENV_OFF, "1")
    assert not hopper_native.enabled()
    x = np.random.default_rng(2).integers(0, 256, (1, 16, 32), dtype=np.uint8)
    assert np.array_equal(hopper_native.weight_forward(x), _numpy(x))
    assert calls[0] == 0
    monkeypatch.setenv(hopper_native.ENV_OFF, "0")
    assert hopper_native.enabled()


def test_non_contiguous_input():
    x = np.random.default_rng(3).integers(0, 256, (3, 32, 128), dtype=np.uint8)
    view = x[::2, :, :64]  # experts and columns strided
    assert not view.flags.c_contiguous
    assert np.array_equal(hopper_native.weight_forward(view), _numpy(view))


@pytest.mark.parametrize("x", [
    np.arange(2 * 8 * 32, dtype=np.uint8).reshape(2, 8, 32),  # N not a multiple of 16
    np.arange(16 * 64, dtype=np.uint8).view(np.int8).reshape(1, 16, 64),  # not uint8
], ids=["rows", "int8"])
def test_input_it_is_not_written_for_gives_the_numpy_result(x, calls):
    assert np.array_equal(hopper_native.weight_forward(x), _numpy(x))
    assert calls[0] == 0


@pytest.mark.parametrize("shape", [(0, 16, 32), (1, 16, 48)])
def test_input_numpy_refuses_is_refused_alike(shape):
    x = np.zeros(shape, dtype=np.uint8)
    with pytest.raises(Exception) as want:
        _numpy(x)
    with pytest.raises(type(want.value)):
        hopper_native.weight_forward(x)


@pytest.mark.parametrize("args", [
    (bytes(512), bytearray(512), 16),  # rows not a multiple of 32
    (bytes(512), bytearray(512), 0),
    (bytes(1024), bytearray(512), 32),  # sizes differ
    (bytes(700), bytearray(700), 32),  # not whole slabs
])
def test_extension_checks_its_arguments(args):
    with pytest.raises(ValueError, match="weight_forward"):
        hopper_native._native.weight_forward(*args)


def test_extension_refuses_overlapping_output():
    buf = bytearray(1024)
    with pytest.raises(ValueError, match="overlaps"):
        hopper_native._native.weight_forward(memoryview(buf)[:512], memoryview(buf)[256:768], 32)
    with pytest.raises(TypeError):  # read-only output
        hopper_native._native.weight_forward(bytes(512), bytes(512), 32)


def test_threads_at_once_each_get_their_bytes():
    xs = [np.random.default_rng(10 + i).integers(0, 256, (2, 256, 1024), dtype=np.uint8) for i in range(4)]
    got = [None] * 4

    def run(i):
        for _ in range(5):
            got[i] = hopper_native.weight_forward(xs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, y in zip(xs, got):
        assert np.array_equal(y, _numpy(x))


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file() and not p.name.startswith(".mxfp4conv.lock")}


@pytest.mark.parametrize("family,tp", [("kimi_k3", 1), ("deepseek_v4", 2)])
def test_convert_writes_the_same_files_with_native_on_and_off(tmp_path, family, tp, calls, monkeypatch):
    from mxfp4conv.checkpoint.synthetic import make_checkpoint
    from mxfp4conv.convert.run import convert
    from mxfp4conv.convert.verify import verify
    from mxfp4conv.oracle import Target

    src = make_checkpoint(family, tmp_path / "src")
    convert(str(src), tmp_path / "on", Target(arch="sm90", tp=tp), progress="none", workers=2, chunk_bytes=50_000)
    assert calls[0] > 0
    monkeypatch.setenv(hopper_native.ENV_OFF, "1")
    seen = calls[0]
    convert(str(src), tmp_path / "off", Target(arch="sm90", tp=tp), progress="none", workers=2, chunk_bytes=50_000)
    assert calls[0] == seen
    assert _files(tmp_path / "on") == _files(tmp_path / "off")
    assert verify(tmp_path / "on", str(src), workers=2).ok  # checked by the numpy path
    monkeypatch.delenv(hopper_native.ENV_OFF)
    assert verify(tmp_path / "off", str(src), workers=2).ok  # and by the native one
    assert calls[0] > seen
