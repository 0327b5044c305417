"""FlashInfer's own Python functions that vLLM's TRTLLM weight conversion calls, run on CPU.

Runs in the worker process (``probe_convert`` with a case's ``flashinfer`` key). The worker's
``flashinfer`` package is a stub (it decides vLLM's backend checks); this module loads the real
FlashInfer package's Python files from an extracted ``flashinfer-python`` wheel under another
name (``ALIAS``), executing only the modules that hold the functions vLLM's converter calls and
what they import, and puts those functions into the stub modules vLLM imports them from:

- ``flashinfer.fused_moe.core.get_w2_permute_indices_with_cache``: FlashInfer's own, for real
  (pure torch: ``utils.get_shuffle_matrix_a_row_indices`` / ``get_shuffle_matrix_sf_a_row_indices``
  and their row maps).
- ``flashinfer.fp4_quantization.nvfp4_block_scale_interleave``: the one compiled step (a C++ / CUDA
  op, ``block_scale_interleave_sm100``, built by FlashInfer's JIT with nvcc; its host path
  ``blockScaleInterleaveHost`` writes ``computeSFIndex``'s ``SWIZZLED_128x4`` order). Answered by
  FlashInfer's own pure-torch version of that layout, ``_swizzle_sf_128x4``
  (``diffusion_ops/minimax_h3_fc1_swiglu.py``: "the layout FlashInfer's ``mxfp8_quantize`` and
  ``nvfp4_quantize`` emit"), applied to the 2-D tensor vLLM passes, as the op does.

What stands in while those modules load (``STUBS``): the packages FlashInfer imports that a CPU
test environment lacks or that only build GPU kernels. None of them is called by the functions
above.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from pathlib import Path

ALIAS = "flashinfer_cpu_real"
# module (inside the real package, or third-party) -> why it is a stub here
STUBS = {
    "tvm_ffi": "FlashInfer's FFI to its compiled kernels (JIT modules)",
    "pynvml": "NVIDIA management library (device queries)",
    f"{ALIAS}.jit": "FlashInfer's JIT compiler of CUDA kernels",
    f"{ALIAS}.api_logging": "FlashInfer's API logging decorators",
    f"{ALIAS}.autotuner": "GPU kernel autotuner",
    f"{ALIAS}.trace": "API trace templates",
    f"{ALIAS}.tllm_enums": "TRTLLM enums of the compiled MoE kernels",
    f"{ALIAS}.fused_moe.shared": "MoE kernel inputs",
    f"{ALIAS}.fused_moe.utils": "MoE kernel helpers",
    f"{ALIAS}.diffusion_ops.cake_minimax_h3_sm120_quant_fc1_swiglu": "an sm120 CuTe kernel",
}
# real modules whose package __init__ (which imports every kernel family) is skipped
BARE_PACKAGES = ("fused_moe", "diffusion_ops")


def _bare(name: str, path: Path) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    mod.__package__ = name
    sys.modules[name] = mod
    return mod


def load(root: str) -> dict:
    """{"get_w2_permute_indices_with_cache", "swizzle_sf_128x4", "version"} from FlashInfer's
    package under ``root`` (the directory holding ``flashinfer/``)."""
    import stubs  # the worker's

    pkg = Path(root) / "flashinfer"
    if not (pkg / "fused_moe" / "core.py").is_file():
        raise FileNotFoundError(f"{pkg} holds no FlashInfer package")
    if stubs._finder is None:
        stubs.install(set(STUBS), {})
    else:  # the worker's finder: vLLM's own stubs stay as they are
        stubs._finder.names.update(STUBS)
    _bare(ALIAS, pkg)
    for sub in BARE_PACKAGES:
        _bare(f"{ALIAS}.{sub}", pkg / sub)
    core = importlib.import_module(f"{ALIAS}.fused_moe.core")
    sf = importlib.import_module(f"{ALIAS}.diffusion_ops.minimax_h3_fc1_swiglu")
    meta = (pkg / "_build_meta.py").read_text() if (pkg / "_build_meta.py").is_file() else ""
    found = re.search(r'__version__ = "([^"]+)"', meta)
    return {"get_w2_permute_indices_with_cache": core.get_w2_permute_indices_with_cache,
            "swizzle_sf_128x4": sf._swizzle_sf_128x4, "version": found.group(1) if found else "unknown"}


def install_into_stub(root: str) -> dict[str, str]:
    """Answer vLLM's FlashInfer imports with the real functions; returns {function: what runs}."""
    real = load(root)
    core = importlib.import_module("flashinfer.fused_moe.core")
    fp4 = importlib.import_module("flashinfer.fp4_quantization")
    core.get_w2_permute_indices_with_cache = real["get_w2_permute_indices_with_cache"]

    def nvfp4_block_scale_interleave(unswizzled_sf):
        assert unswizzled_sf.dim() == 2, "vLLM's TRTLLM branch passes [E * rows, K/32]"
        return real["swizzle_sf_128x4"](unswizzled_sf)

    fp4.nvfp4_block_scale_interleave = nvfp4_block_scale_interleave
    return {"get_w2_permute_indices_with_cache": "FlashInfer's own (fused_moe/core.py, utils.py)",
            "nvfp4_block_scale_interleave": "FlashInfer's pure-torch _swizzle_sf_128x4 in place of the "
                                            "compiled block_scale_interleave_sm100 op",
            "flashinfer-python": real["version"]}
