"""Compiling kernels for sm_90a without a GPU, in a child process: this test session runs Triton in its interpreter,
which cannot compile. The child prints one line "RESULT" + JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import triton

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def nvidia_tools() -> bool:
    """This Triton ships the NVIDIA tools (ptxas, cuobjdump) the compiles and SASS reads need."""
    return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))


def run_child(script: str, arg, timeout: int = 600):
    """The JSON after "RESULT" that ``script`` prints, run with the repo on its path, json-encoded arg as argv[1]
    and no interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", script, json.dumps(arg)], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(next(x for x in run.stdout.splitlines() if x.startswith("RESULT"))[len("RESULT"):])
