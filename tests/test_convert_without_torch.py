"""A conversion whose every step has a numpy path never imports torch, and writes the same
bytes as the torch paths."""

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mxfp4conv.checkpoint.synthetic import make_checkpoint
from mxfp4conv.convert.run import convert
from mxfp4conv.oracle import Target
from mxfp4conv.shuffle import layouts

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import sys
    from mxfp4conv.convert.run import convert
    from mxfp4conv.oracle import Target
    convert(sys.argv[1], sys.argv[2], Target(arch=sys.argv[3], tp=int(sys.argv[4])), progress="none",
            workers=2, chunk_bytes=50_000)
    print("torch" in sys.modules)
""")


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_checkpoint("kimi_k3", tmp_path_factory.mktemp("k3") / "k3")


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file() and not p.name.startswith(".mxfp4conv.lock")}


@pytest.mark.parametrize("arch,tp", [("gfx950", 1), ("gfx950", 2), ("sm90", 1), ("gfx942", 2)])
def test_numpy_convert_skips_torch_and_matches_the_torch_path(src, tmp_path, arch, tp, monkeypatch):
    out = tmp_path / "np"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", CHILD, str(src), str(out), arch, str(tp)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"  # torch never imported

    # the same conversion with every layout's numpy path switched off: the torch paths
    for name, lay in list(layouts._REGISTRY.items()):
        monkeypatch.setitem(layouts._REGISTRY, name, dataclasses.replace(lay, forward_np=None))
    ref = tmp_path / "torch"
    convert(str(src), ref, Target(arch=arch, tp=tp), progress="none", workers=2, chunk_bytes=50_000)
    assert _files(out) == _files(ref)
