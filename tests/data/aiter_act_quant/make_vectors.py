"""Golden vectors for the activation quantiser: AITER's Triton ``dynamic_mxfp4_quant``, run in
Triton's CPU interpreter. Not run in CI: ``vectors.safetensors`` next to this file is committed.

    TRITON_INTERPRET=1 python tests/data/aiter_act_quant/make_vectors.py \
        --aiter <ROCm/aiter checkout> --aiter-commit <sha>

``dynamic_mxfp4_quant`` (``aiter/ops/triton/quant/quant.py``) and its kernel
(``aiter/ops/triton/_triton_kernels/quant/quant.py``: ``_dynamic_mxfp4_quant_kernel``,
``_mxfp4_quant_op``) run as written except for one rewrite the interpreter needs (``not mask``
-> ``~mask``, see ``INTERPRETER_NOT``); the stubs are only the wrapper module's logger and fp8
dtype imports. This is the per-32 MXFP4 quantisation AITER applies to activations (scale mode
"even"), what Kimi-K3's SiTUv2 a4w4 feeds its GEMMs.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNELS = "aiter/ops/triton/_triton_kernels/quant/quant.py"
WRAPPER = "aiter/ops/triton/quant/quant.py"


def load(name: str, path: Path, source: str | None = None):
    if source is not None:  # Triton reads a kernel's source from its file: give it its own
        path = Path(tempfile.mkdtemp(prefix="aiter_quant_")) / path.name
        path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# Triton's interpreter applies Python's ``not`` to a whole tensor (one bool) where the compiler
# emits an element-wise logical not; on these int1 masks ``~`` is that element-wise not.
INTERPRETER_NOT = {"(not saturate_mask)": "(~saturate_mask)",
                   "not (saturate_mask | denormal_mask)": "~(saturate_mask | denormal_mask)"}


def interpretable(source: str) -> str:
    for old, new in INTERPRETER_NOT.items():
        if old not in source:
            raise SystemExit(f"{KERNELS} no longer contains {old!r}; review the interpreter rewrite")
        source = source.replace(old, new)
    return source


def stub(name: str, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def inputs(torch):
    """bf16 activations [M, N]: normal rows, exact ties of the e2m1 grid, zeros, tiny and huge blocks."""
    g = torch.Generator().manual_seed(2026)
    rows = [torch.randn(24, 256, generator=g) * torch.logspace(-3, 3, 24).unsqueeze(1)]
    grid = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    ties = grid.repeat(32)[:256] * torch.where(torch.rand(256, generator=g) < 0.5, -1.0, 1.0)
    rows.append(torch.stack([ties * 2.0**k for k in (-4, 0, 3, 7)]))  # amax 6 * 2**k: the tie rule
    rows.append(torch.zeros(1, 256))
    rows.append(torch.randn(1, 256, generator=g) * 2.0**-120)  # scales near the bottom of e8m0
    rows.append(torch.randn(1, 256, generator=g) * 2.0**100)
    rows.append((torch.randn(1, 256, generator=g) * 8).round() / 4)  # many exact midpoints
    return torch.cat(rows).to(torch.bfloat16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--aiter", type=Path, required=True, help="a ROCm/aiter checkout (or the two files' root)")
    ap.add_argument("--aiter-commit", default="")
    ap.add_argument("--out", type=Path, default=HERE / "vectors.safetensors")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("set TRITON_INTERPRET=1: the kernel runs in Triton's CPU interpreter")
    import torch
    from safetensors.torch import save_file

    for pkg in ("aiter", "aiter.ops", "aiter.ops.triton", "aiter.ops.triton._triton_kernels",
                "aiter.ops.triton._triton_kernels.quant", "aiter.ops.triton.quant", "aiter.ops.triton.utils"):
        stub(pkg, __path__=[])

    class Logger:
        def info(self, *a, **k):
            pass

    stub("aiter.ops.triton.utils.logger", AiterTritonLogger=Logger)
    stub("aiter.ops.triton.utils.types", e4m3_dtype=torch.float8_e4m3fn)
    kernels = args.aiter / KERNELS
    load("aiter.ops.triton._triton_kernels.quant.quant", kernels, interpretable(kernels.read_text()))
    wrapper = load("aiter.ops.triton.quant.quant", args.aiter / WRAPPER)

    x = inputs(torch)
    fp4, scales = wrapper.dynamic_mxfp4_quant(x, scaling_mode="even")
    files = {p: hashlib.sha256((args.aiter / p).read_bytes()).hexdigest() for p in (KERNELS, WRAPPER)}
    meta = {"call": 'dynamic_mxfp4_quant(x, scaling_mode="even")', "aiter_commit": args.aiter_commit,
            "interpreter_rewrite": INTERPRETER_NOT,
            "sha256": files, "torch": torch.__version__}
    import triton

    meta["triton"] = triton.__version__
    save_file({"x": x, "fp4": fp4.contiguous(), "scale": scales.contiguous()}, str(args.out),
              metadata={"meta": json.dumps(meta)})
    print(f"wrote {args.out.name}: x {list(x.shape)}, {args.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
