"""Run the installed ``mxfp4conv`` console script, as a user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def console_script() -> str:
    """The ``mxfp4conv`` script of the environment running the tests (next to its python)."""
    here = Path(sys.executable).parent / "mxfp4conv"
    found = str(here) if here.is_file() else shutil.which("mxfp4conv")
    if not found:
        pytest.fail("the mxfp4conv console script is not installed in this environment; "
                    "run `pip install -e .` first")
    return found


def mxfp4conv(*args, cwd=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    """``mxfp4conv ARGS...`` with stdout/stderr captured (not a terminal: like a pipe)."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("MXFP4CONV_DEBUG", None)
    return subprocess.run([console_script(), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=timeout)


def one_paragraph_error(rc: int, err: str, *needles: str) -> None:
    """A refusal as the CLI's contract says: exit 1, one paragraph on stderr, no traceback,
    naming each of ``needles``."""
    flat = " ".join(err.split())
    assert rc == 1, err
    assert err.startswith("error:") and "Traceback" not in err and "\n\n" not in err.strip(), err
    for n in needles:
        assert n in flat, (n, flat)
