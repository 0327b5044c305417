"""The README's commands and Python snippet work as written."""

import re
import shlex
import subprocess
import warnings
from pathlib import Path

import torch

from mxfp4conv.runtime.loader import LayoutConversionWarning
from console import console_script

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def fenced(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", README, flags=re.M | re.S)


def test_ci_runs_the_readme_commands_as_written():
    first_two = [b.strip() for b in fenced("bash")[:2]]
    printed = subprocess.run(["bash", str(ROOT / ".ci" / "run"), "--print"], capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()
    assert printed == first_two
    for cmd in first_two:
        # One line each, and each makes and enters its own environment: it works in a fresh
        # shell and does not rely on the other having run.
        assert "\n" not in cmd
        assert cmd.startswith("python3 -m venv .venv && . .venv/bin/activate && ")


def test_quick_start_pipeline_runs_again(tmp_path):
    """The mxfp4conv part of the first command through the console script; then the steps
    that write (example, convert) once more, as a second run of the command does."""
    cmd = fenced("bash")[0].strip()
    steps = [s.strip() for s in cmd.split("&&")]
    ours = [shlex.split(s) for s in steps if s.startswith("mxfp4conv ")]
    assert [s[1] for s in ours] == ["example", "inspect", "plan", "convert", "verify"]
    again = [argv for argv in ours if argv[1] in ("example", "convert")]
    for argv in ours + again:
        r = subprocess.run([console_script(), *argv[1:]], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, (argv, r.stderr)
    assert (tmp_path / "demo-k3" / "config.json").is_file()
    assert (tmp_path / "demo-k3-gfx950-tp2" / "mxfp4conv.json").is_file()


def test_python_api_snippet_runs_as_written(tmp_path, monkeypatch):
    (snippet,) = fenced("python")
    monkeypatch.chdir(tmp_path)
    for _ in range(2):  # repeatable too
        ns: dict = {}
        with warnings.catch_warnings():  # the loader says it re-lays AITER bytes out for torch
            warnings.simplefilter("ignore", LayoutConversionWarning)
            exec(compile(snippet, "README.md", "exec"), ns)
    out, x = ns["out"], ns["x"]
    assert out.shape == x.shape and out.dtype == x.dtype and torch.isfinite(out).all()
    assert out.abs().sum() > 0
