"""The converter runs without torch (the base install has none): every command, for every
family, in a process where ``import torch`` fails; and numpy writes the same bytes as the torch
paths."""

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


CASES = [("kimi_k3", None, "gfx950", 1), ("kimi_k3", None, "gfx950", 2), ("kimi_k3", None, "sm90", 1),
         ("kimi_k3", None, "gfx942", 2), ("deepseek_v4", None, "gfx950", 2), ("deepseek_v4", None, "sm90", 2),
         ("quark", "w_mxfp4", "gfx950", 2), ("quark", "w_mxfp4_a_mxfp4", "gfx950", 1),
         ("quark", "w_mxfp4_a_mxfp4", "gfx1250", 2), ("compressed_tensors", None, "sm90", 2),
         ("gpt_oss", None, "gfx950", 2), ("gpt_oss", None, "gfx942", 2), ("gpt_oss", None, "gfx1250", 1),
         ("gpt_oss", None, "sm90", 2), ("gpt_oss", None, "cpu", 1), ("quark_gpt_oss", "w_mxfp4_a_fp8", "gfx950", 2),
         ("quark_gpt_oss", "w_mxfp4", "gfx942", 1)]


@pytest.mark.parametrize("family,scheme,arch,tp", CASES)
def test_numpy_convert_skips_torch_and_matches_the_torch_path(tmp_path, family, scheme, arch, tp, monkeypatch):
    src = make_checkpoint(family, tmp_path / "src", **({"scheme": scheme} if scheme else {}))
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


VERIFY_CHILD = textwrap.dedent("""
    import sys
    from mxfp4conv.convert.verify import verify
    rep = verify(sys.argv[1], sys.argv[2], workers=2)
    print(rep.ok, rep.bytes_compared > 0, "torch" in sys.modules)
""")


@pytest.mark.parametrize("arch,tp", [("gfx950", 2), ("sm90", 1)])
def test_verify_without_torch(src, tmp_path, arch, tp):
    out = tmp_path / "out"
    convert(str(src), out, Target(arch=arch, tp=tp), progress="none", workers=2, chunk_bytes=50_000)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", VERIFY_CHILD, str(out), str(src)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "True", "False"]


@pytest.mark.parametrize("family,tp,ep,arch", [("kimi_k3", 2, False, "gfx950"), ("deepseek_v4", 2, True, "gfx950"),
                                               ("quark", 2, False, "gfx942"), ("deepseek_v4", 1, False, "gfx950")])
def test_numpy_weight_chunk_matches_build_chunk(tmp_path, family, tp, ep, arch):
    import torch

    from mxfp4conv.checkpoint import load_model, open_source
    from mxfp4conv.checkpoint.experts import read_expert
    from mxfp4conv.convert.rank_tensors import WEIGHT_KINDS, RankGeometry, build_chunk, build_weight_chunk_np
    from mxfp4conv.oracle import decide

    kw = {"scheme": "w_mxfp4"} if family == "quark" else {}
    source = open_source(str(make_checkpoint(family, tmp_path / family, **kw)))
    model = load_model(source)
    g = RankGeometry.from_decision(decide(model, Target(arch=arch, tp=tp, ep=ep)))
    layer = model.layers[-1]
    for r in range(tp):
        experts = range(g.expert_range(r).start + 1, g.expert_range(r).stop)
        data = [read_expert(source, layer, e) for e in experts]
        as_np = [{"w13": d.w13.numpy(), "w13_scale": d.w13_scale.numpy(), "w2": d.w2.numpy(),
                  "w2_scale": d.w2_scale.numpy()} for d in data]
        got = build_weight_chunk_np(as_np, g, r, WEIGHT_KINDS)
        ref = build_chunk(data, g, r, WEIGHT_KINDS)
        for k in WEIGHT_KINDS:
            assert torch.equal(torch.from_numpy(got[k]), ref[k]), (r, k)


NO_EXTENSION_CHILD = textwrap.dedent("""
    import sys
    sys.modules["mxfp4conv.shuffle._hopper_native"] = None  # as if it was never built: import fails
    from mxfp4conv.convert.run import convert
    from mxfp4conv.convert.verify import verify
    from mxfp4conv.oracle import Target
    from mxfp4conv.shuffle import hopper_native
    convert(sys.argv[1], sys.argv[2], Target(arch="sm90", tp=1), progress="none", workers=2, chunk_bytes=50_000)
    print(hopper_native.built(), verify(sys.argv[2], sys.argv[1], workers=2).ok, "torch" in sys.modules)
""")


def test_convert_without_the_compiled_extension(src, tmp_path):
    # the optional extension absent: the numpy path converts, without torch, the same bytes
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", NO_EXTENSION_CHILD, str(src), str(out)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["False", "True", "False"]
    ref = tmp_path / "ref"
    convert(str(src), ref, Target(arch="sm90", tp=1), progress="none", workers=2, chunk_bytes=50_000)
    assert _files(out) == _files(ref)


# ``import torch`` (and triton) fails in the child, as on an install without the runtime extra
NO_TORCH_CLI = textwrap.dedent("""
    import sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "triton"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, NoTorch())
    from mxfp4conv.cli import main
    main()
""")

# one target each family converts to (as vLLM 0.33.0 decides it), and one it plans for
CLI_FAMILIES = [("kimi_k3", None, "gfx950", "sm90"), ("deepseek_v4", None, "sm90", "gfx942"),
                ("quark", "w_mxfp4_a_fp8", "gfx942", "gfx950"), ("gpt_oss", None, "gfx942", "cpu"),
                ("compressed_tensors", "w_mxfp4_a_fp8", "gfx1250", "sm100"),
                ("quark_gpt_oss", "w_mxfp4_a_fp8", "gfx950", "sm90")]


@pytest.mark.parametrize("family,scheme,arch,other", CLI_FAMILIES)
def test_every_command_runs_where_torch_cannot_be_imported(tmp_path, family, scheme, arch, other):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def cli(*args):
        p = subprocess.run([sys.executable, "-c", NO_TORCH_CLI, *args], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=300)
        assert p.returncode == 0, (args, p.stderr)
        assert "torch" not in p.stderr, p.stderr
        return p.stdout

    cli("example", family, "src", *(["--scheme", scheme] if scheme else []))
    assert f"family        {family.replace('quark_gpt_oss', 'quark')}" in cli("inspect", "src")
    cli("plan", "src", "--arch", other, "--tp", "2")
    cli("convert", "src", "out", "--arch", arch, "--tp", "2", "--quiet")
    assert "verified out against src" in cli("verify", "out", "--source", "src", "--quiet")
    assert "converted by mxfp4conv" in cli("inspect", "out")


def test_the_runtime_without_torch_says_which_extra_to_install():
    child = NO_TORCH_CLI.replace("from mxfp4conv.cli import main\nmain()", "import mxfp4conv.runtime")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 1
    assert "ImportError: mxfp4conv.runtime needs torch" in p.stderr
    assert "pip install -e '.[runtime]'" in p.stderr and "download.pytorch.org/whl/cpu" in p.stderr
