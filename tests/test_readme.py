"""The README's and the docs' code works as written: the README's first two commands are what
CI runs, the pipeline part of the first runs again, every other snippet runs here, and the few
that cannot (a GPU, a vLLM server, a hub download, minutes of benchmark) say why in the
markdown, as ``<!-- not run: REASON -->`` on the line before the fence."""

import os
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from mxfp4conv.runtime.loader import LayoutConversionWarning
from console import console_script

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?:<!-- not run: (?P<reason>[^\n]*?) -->\n)?```(?P<lang>[^\n`]*)\n(?P<body>.*?)^```$",
                   re.M | re.S)
CI_BLOCKS = 2  # the README's first two bash blocks: .ci/run runs them in fresh shells


def snippets() -> list[dict]:
    out = []
    for page in PAGES:
        bash = 0
        for m in FENCE.finditer(page.read_text()):
            s = {"page": page.relative_to(ROOT).as_posix(), "lang": m["lang"], "body": m["body"],
                 "reason": m["reason"], "ci": False}
            if page.name == "README.md" and m["lang"] == "bash":
                bash += 1
                s["ci"] = bash <= CI_BLOCKS
            s["id"] = f"{s['page']}:{m.start()}"
            out.append(s)
    return out


SNIPPETS = snippets()
RUN_HERE = [s for s in SNIPPETS if not s["ci"] and s["reason"] is None]


def readme_commands() -> list[str]:
    return [s["body"].strip() for s in SNIPPETS if s["ci"]]


def test_every_snippet_runs_or_says_why_not():
    assert len(SNIPPETS) >= 6 and len(RUN_HERE) >= 2
    for s in SNIPPETS:
        if s["reason"] is not None:  # (an output sample is marked so too, as ```text)
            assert len(s["reason"].split()) >= 4, f"{s['id']}: say why it is not run"
        else:
            assert s["lang"] in ("bash", "python"), f"{s['id']}: a code block runs as bash or python"
    # only a few cannot run here
    assert sum(s["reason"] is not None for s in SNIPPETS) <= 8


def test_ci_runs_the_readme_commands_as_written():
    first_two = readme_commands()
    assert len(first_two) == CI_BLOCKS
    printed = subprocess.run(["bash", str(ROOT / ".ci" / "run"), "--print"], capture_output=True,
                             text=True, check=True).stdout.strip()
    assert printed == "\n".join(first_two)
    for cmd in first_two:
        # One command over readable lines (each but the last ends in &&: it stops at the first
        # failure), which makes and enters its own environment: it works in a fresh shell and
        # does not rely on the other having run.
        lines = cmd.splitlines()
        assert all(line.endswith(" &&") for line in lines[:-1]) and not lines[-1].endswith("&&"), cmd
        assert cmd.startswith("python3 -m venv .venv && . .venv/bin/activate &&\n")


def test_the_first_command_installs_no_torch():
    install = [line for line in readme_commands()[0].splitlines() if line.startswith("pip install")]
    assert install == ["pip install -e . &&"]
    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, flags=re.M | re.S).group(1)
    assert "torch" not in deps and "triton" not in deps


def test_quick_start_pipeline_runs_again(tmp_path):
    """The mxfp4conv part of the first command through the console script; then the steps
    that write (example, convert) once more, as a second run of the command does."""
    steps = [s.strip() for s in readme_commands()[0].split("&&")]
    ours = [shlex.split(s) for s in steps if s.startswith("mxfp4conv ")]
    assert [s[1] for s in ours] == ["example", "inspect", "plan", "convert", "verify"]
    again = [argv for argv in ours if argv[1] in ("example", "convert")]
    for argv in ours + again:
        r = subprocess.run([console_script(), *argv[1:]], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, (argv, r.stderr)
    assert (tmp_path / "demo-k3" / "config.json").is_file()
    assert (tmp_path / "demo-k3-gfx950-tp2" / "mxfp4conv.json").is_file()


@pytest.mark.parametrize("snippet", [s for s in RUN_HERE if s["lang"] == "bash"], ids=lambda s: s["id"])
def test_shell_snippets_run_as_written(snippet, tmp_path):
    env = {**os.environ, "PATH": f"{Path(console_script()).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(["bash", "-e", "-c", snippet["body"]], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("snippet", [s for s in RUN_HERE if s["lang"] == "python"], ids=lambda s: s["id"])
def test_python_snippets_run_as_written(snippet, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):  # repeatable too
        ns: dict = {"__name__": "__snippet__"}
        with warnings.catch_warnings():  # the loader says it re-lays AITER bytes out for torch
            warnings.simplefilter("ignore", LayoutConversionWarning)
            exec(compile(snippet["body"], snippet["page"], "exec"), ns)
    # the snippets end with a forward of one MoE layer: a real output
    out = ns.get("out")
    if out is not None:
        assert torch.isfinite(out).all() and out.abs().sum() > 0


def test_loading_on_a_gpu_that_is_not_there_is_one_clear_error(tmp_path):
    """docs/runtime.md says device="cuda:1" on a GPU: without one, the loader says so."""
    child = (
        "from mxfp4conv.checkpoint.synthetic import make_checkpoint\n"
        "from mxfp4conv.convert import convert\n"
        "from mxfp4conv.oracle import Target\n"
        "from mxfp4conv.runtime import load_moe_layers\n"
        "make_checkpoint('kimi_k3', 'k3')\n"
        "convert('k3', 'out', Target('gfx950', tp=2), progress='none')\n"
        "load_moe_layers('out', rank=1, device='cuda:3')\n")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", child], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last == ("mxfp4conv.errors.RuntimeInputError: device 'cuda:3': this machine has no CUDA device: load "
                    "on device='cpu' (the torch reference backend)."), r.stderr
