"""Test-session setup shared by every test module.

Triton decides at import time whether kernels run in its CPU interpreter, so the switch has
to be set before any test module imports triton. On machines without a CUDA GPU the
kernels can only run interpreted.

Kernels the tests compile are cached in a temporary folder removed at the end of the session,
not in ~/.triton (set TRITON_CACHE_DIR to keep them).
"""

import atexit
import os
import shutil
import tempfile

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if "TRITON_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="mxfp4conv-tests-triton-")
    os.environ["TRITON_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)


def pytest_collection_finish(session):
    """Say before the run when tests that run vLLM's own code will download its wheels."""
    import sys

    harness = sys.modules.get("vllm_code.harness")
    if harness is None or not session.items:  # no collected module uses vLLM's code
        return
    cache = harness.cache_dir()
    missing = [v for v in harness.versions() if not v.endswith(".whl") and not any(cache.glob(f"vllm-{v}-*.whl"))]
    if missing and not os.environ.get("MXFP4CONV_NO_WHEEL_DOWNLOAD"):
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"mxfp4conv tests: the vLLM wheel(s) {', '.join(missing)} are not in {cache}; the tests that run vLLM's "
            f"code download them with pip (240-340 MB each). MXFP4CONV_NO_WHEEL_DOWNLOAD=1 skips those tests instead.")
