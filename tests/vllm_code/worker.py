"""Worker process of ``harness.run_probe``: boots vLLM on one emulated platform, runs a probe.

Usage: ``python worker.py REQUEST.json`` (written by the harness). Results go to the answer
file named in the request, never to stdout, which vLLM's logger shares.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import traceback
import types

import torch

import stubs

# Per platform kind: stubs that exist only there (vLLM's "installed?" checks see them).
PLATFORM_STUBS: dict[str, dict[str, str]] = {
    "rocm": {"aiter": "AITER (ROCm kernels, with ActivationType.Situv2): its shuffles are "
                      "recorded, not run",
             "amdsmi": "answers the emulated GPU's gfx name (vLLM's ROCm platform detection)",
             "quark": "amd-quark (installed in vLLM's ROCm images): EMULATION's has_quark()"},
    "cuda": {"flashinfer": "FlashInfer (CUDA kernels)", "deep_gemm": "DeepGEMM (CUDA kernels)",
             "b12x": "b12x (sm120 MoE kernels): B12xExperts' device check finds its fused_moe",
             "vllm.vllm_flash_attn": "vLLM's compiled flash-attention wrapper"},
    "cpu": {},
}
# Packages a run may add or remove (``run_probe(packages={"quark": True})``).
OPTIONAL_STUBS = {
    "quark": "amd-quark: EMULATION's has_quark()",
    "flashinfer": "FlashInfer (CUDA kernels)",
    "deep_gemm": "DeepGEMM (CUDA kernels)",
    "aiter": "AITER (ROCm kernels)",
}
SUBSTITUTES = {
    "regex": "the standard library's re (vLLM uses only re-compatible calls here)",
    "torch.cpu._is_amx_tile_supported": "pinned to the emulated CPU's AMX support",
    "torch.accelerator.empty_cache": "a no-op: the emulated platform has no accelerator memory to free",
    "torch.accelerator.current_device_index": "CUDA only: 'cpu', where expert classes put their small "
                                              "per-expert tensors (TrtLlmMxfp4Experts' SiTU / SwiGLU constants)",
    "torch.ops._C": "CUDA only: vLLM's compiled op namespace, holding only the capability "
                    "queries: CUTLASS scaled-mm (True) and mxfp4_experts_quant_supported "
                    "(capability family 100, where the CUTLASS MXFP4 grouped GEMM is built)",
}


def _platform(spec: dict):
    kind = spec["kind"]
    import vllm.platforms as P

    if kind == "rocm":
        from vllm.platforms.rocm import RocmPlatform
        return RocmPlatform()
    if kind == "cuda":
        from vllm.platforms.cuda import CudaPlatform
        from vllm.platforms.interface import DeviceCapability
        major, minor = spec["capability"]

        class EmulatedCuda(CudaPlatform):
            @classmethod
            def get_device_capability(cls, device_id: int = 0):
                return DeviceCapability(major=major, minor=minor)

            @classmethod
            def get_device_name(cls, device_id: int = 0) -> str:
                return f"emulated sm{major}{minor}"

        return EmulatedCuda()
    from vllm.platforms.cpu import CpuPlatform
    del P
    return CpuPlatform()


def boot(src: str, spec: dict) -> dict[str, str]:
    """Make ``import vllm`` work on the emulated platform; returns the stubs in use."""
    kind = spec["kind"]
    names = dict(stubs.STUBS)
    names.update({n: why for n, why in stubs.STUBS_IF_ABSENT.items() if stubs.absent(n)})
    for k, v in PLATFORM_STUBS.items():
        if k != kind:
            for n in v:
                names.pop(n, None)
    names.update(PLATFORM_STUBS[kind])
    for pkg, present in spec.get("packages", {}).items():  # run_probe(packages=...)
        if present:
            names[pkg] = OPTIONAL_STUBS[pkg]
        else:
            names.pop(pkg, None)
    modules = {"regex": re, **stubs.fake_humming()}
    if kind == "rocm":
        modules["amdsmi"] = stubs.fake_amdsmi(spec["gcn_arch"])
    if kind == "cuda":
        # only the capability queries: hasattr(torch.ops._C, op) stays False for real ops
        torch.ops._C = types.SimpleNamespace(
            mxfp4_experts_quant_supported=lambda cap: cap // 10 == 10,
            **{f"cutlass_scaled_mm_supports_{q}": (lambda cap: True)
               for q in ("fp4", "fp8", "block_fp8")})
        torch.accelerator.current_device_index = lambda: "cpu"
    if kind == "cpu":
        os.environ["VLLM_TARGET_DEVICE"] = "cpu"
        torch.cpu._is_amx_tile_supported = (lambda amx=spec["amx"]: amx)
    torch.accelerator.empty_cache = lambda: None
    sys.path.insert(0, src)
    stubs.install(set(names), modules)
    import vllm.platforms as P
    P._current_platform = _platform(spec)
    return {**names, **SUBSTITUTES}


def main(request_path: str) -> None:
    with open(request_path) as f:
        req = json.load(f)
    used = boot(req["src"], req["spec"])
    spec = importlib.util.spec_from_file_location("vllm_probe", req["probe_path"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    probe = getattr(mod, req["probe_func"])
    results = []
    for case in req["cases"]:
        stubs.calls.clear()
        try:
            results.append(probe(case))
        except Exception as e:  # the probe's own bugs surface as the raised type too
            results.append({"raised": type(e).__name__, "message": str(e),
                            "traceback": traceback.format_exc(limit=-6)})
    tmp = req["answer"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"results": results, "stubs": used}, f)
    os.replace(tmp, req["answer"])


if __name__ == "__main__":
    main(sys.argv[1])
