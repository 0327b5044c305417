"""Golden vectors for the triton_kernels scale layouts, made by vLLM 0.33.0's own code.

Not run in CI: the vectors it writes (``vectors.safetensors`` next to this file) are committed.

    python tests/data/triton_kernels/make_vectors.py \
        --wheel vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl \
        --aiter-shuffle aiter/ops/triton/utils/shuffle.py   # from a ROCm/aiter checkout

What runs, unmodified, on CPU tensors:
- the wheel's bundled ``vllm/third_party/triton_kernels`` (imported as ``triton_kernels``, as
  vLLM does when no site-packages copy exists; needs only ``triton``): ``wrap_torch_tensor``,
  ``convert_layout``, ``StridedLayout``, ``CDNA4MXScaleLayout``;
- the wheel's ``interleave_gate_up`` (nested in ``convert_weight_to_mxfp4_moe_kernel_format``) and
  ``_interleave_gate_up_rows``, lifted out of ``fused_moe/oracle/mxfp4.py`` with ``ast``;
- aiter's ``shuffle_scale_moe``; the only stubs are that module's two imports
  (``aiter.ops.shuffle.shuffle_weight``, unused here, and ``arch_info.get_arch``: the arch is
  passed explicitly).
The call sequence is ``_swizzle_mxfp4``'s ROCm branch for the bundled triton_kernels (API 3.5.1):
transpose weight and scale to ``[E, K', N]``, the gfx1250 ``shuffle_scale_moe`` when on gfx1250,
then ``convert_layout`` with ``StridedLayout`` (weights; scales off gfx950 or at tp > 2) or
``CDNA4MXScaleLayout`` (scales, gfx950, tp <= 2). Each output is stored as the memory order of
the tensor vLLM keeps (its storage, dense).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import sys
import tempfile
import types
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
TK = "vllm/third_party/triton_kernels/"
ORACLE = "vllm/model_executor/layers/fused_moe/oracle/mxfp4.py"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def import_triton_kernels(wheel: zipfile.ZipFile, root: Path):
    for name in wheel.namelist():
        if name.startswith(TK) and name.endswith(".py"):
            dest = root / "triton_kernels" / name[len(TK):]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(wheel.read(name))
    sys.path.insert(0, str(root))
    import triton_kernels.tensor as tensor
    from triton_kernels.tensor_details import layout

    return tensor, layout


def lift_functions(source: str, names: set[str]) -> dict:
    """The functions called ``names`` anywhere in ``source`` (nested ones too), compiled alone."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name in names and node.name not in found:
            mod = ast.Module(body=[node], type_ignores=[])
            scope = {"torch": torch}
            exec(compile(mod, ORACLE, "exec"), scope)
            found[node.name] = scope[node.name]
    missing = names - set(found)
    if missing:
        raise SystemExit(f"{ORACLE} in the wheel has no function(s) {sorted(missing)}")
    return found


def import_aiter_shuffle(path: Path):
    stubs = {
        "aiter": types.ModuleType("aiter"),
        "aiter.ops": types.ModuleType("aiter.ops"),
        "aiter.ops.shuffle": types.ModuleType("aiter.ops.shuffle"),
        "aiter.ops.triton": types.ModuleType("aiter.ops.triton"),
        "aiter.ops.triton.utils": types.ModuleType("aiter.ops.triton.utils"),
        "aiter.ops.triton.utils._triton": types.ModuleType("aiter.ops.triton.utils._triton"),
        "aiter.ops.triton.utils._triton.arch_info": types.ModuleType("aiter.ops.triton.utils._triton.arch_info"),
    }

    def unused(*a, **k):
        raise RuntimeError("stub: not used by the scale shuffles")

    stubs["aiter.ops.shuffle"].shuffle_weight = unused
    stubs["aiter.ops.triton.utils._triton.arch_info"].get_arch = unused
    sys.modules.update(stubs)
    spec = importlib.util.spec_from_file_location("aiter_triton_shuffle", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` in memory order, shaped as its dense storage."""
    order = sorted(range(t.ndim), key=lambda d: (t.stride(d), t.shape[d]), reverse=True)
    dense = t.permute(order).contiguous()
    assert t.untyped_storage().nbytes() == dense.numel() * dense.element_size(), "not a dense view"
    return dense.view(torch.uint8)


def rand_u8(shape, seed):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", type=Path, required=True, help="the vllm==0.33.0 wheel (.whl)")
    ap.add_argument("--aiter-shuffle", type=Path, required=True, help="aiter's aiter/ops/triton/utils/shuffle.py")
    ap.add_argument("--aiter-commit", default="", help="the aiter commit that file comes from (recorded)")
    ap.add_argument("--out", type=Path, default=HERE / "vectors.safetensors")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="tk_vectors_"))
    with zipfile.ZipFile(args.wheel) as whl:
        T, L = import_triton_kernels(whl, tmp)
        oracle = whl.read(ORACLE).decode()
    vllm_fns = lift_functions(oracle, {"interleave_gate_up", "_interleave_gate_up_rows"})
    aiter = import_aiter_shuffle(args.aiter_shuffle)
    assert not hasattr(L, "GFX950MXScaleLayout"), "this triton_kernels has GFX950MXScaleLayout: vLLM would use it"

    def swizzle_value(w):  # _swizzle_mxfp4: weights are StridedLayout on ROCm
        t = T.convert_layout(T.wrap_torch_tensor(w.transpose(-2, -1), dtype=T.FP4), L.StridedLayout)
        return storage_bytes(t.storage.data)

    def swizzle_scale(s, arch):  # _swizzle_mxfp4's scale path
        st = s.transpose(-2, -1)
        if arch == "gfx1250":
            st = aiter.shuffle_scale_moe(st, arch="gfx1250", preshuffle_factor=32, scale_kwidth=4)
        layout = L.CDNA4MXScaleLayout if arch == "gfx950" else L.StridedLayout
        return storage_bytes(T.convert_layout(T.wrap_torch_tensor(st), layout).storage.data)

    gu1 = vllm_fns["interleave_gate_up"]
    rows1 = vllm_fns["_interleave_gate_up_rows"]
    cases = {  # name -> (layout, input shape, producer)
        "strided_w13": ("identity", (2, 64, 32), swizzle_value),
        "strided_scale_gfx942": ("identity", (2, 64, 12), lambda s: swizzle_scale(s, "gfx942")),
        "gu1_w13": ("triton_gu1", (2, 64, 32), lambda w: swizzle_value(gu1(w))),
        "gu1_w13_scale_gfx942": ("triton_gu1", (3, 32, 12), lambda s: swizzle_scale(gu1(s), "gfx942")),
        "gu1_rows_w13": ("triton_gu1", (2, 96, 16), lambda w: swizzle_value(rows1(w))),
        "cdna4_w2_scale": ("triton_cdna4_scale", (3, 64, 8), lambda s: swizzle_scale(s, "gfx950")),
        "cdna4_w13_scale_k512": ("triton_cdna4_scale", (2, 96, 16), lambda s: swizzle_scale(s, "gfx950")),
        "cdna4_gu1_w13_scale": ("triton_cdna4_scale_gu1", (2, 128, 8), lambda s: swizzle_scale(gu1(s), "gfx950")),
        "gfx1250_w2_scale": ("triton_gfx1250_scale", (3, 64, 4), lambda s: swizzle_scale(s, "gfx1250")),
        "gfx1250_w13_scale_k384": ("triton_gfx1250_scale", (2, 96, 12), lambda s: swizzle_scale(s, "gfx1250")),
        "gfx1250_gu1_w13_scale": ("triton_gfx1250_scale_gu1", (2, 64, 8), lambda s: swizzle_scale(gu1(s), "gfx1250")),
        "gfx1250_rows1_w13_scale": ("triton_gfx1250_scale_gu1", (1, 128, 12),
                                    lambda s: swizzle_scale(rows1(s), "gfx1250")),
    }
    tensors, meta = {}, {}
    for i, (case, (layout, shape, make)) in enumerate(cases.items()):
        x = rand_u8(shape, seed=1000 + i)
        y = make(x.clone())
        tensors[f"{case}.input"] = x
        tensors[f"{case}.output"] = y.contiguous()
        meta[case] = layout
    provenance = {
        "wheel": args.wheel.name,
        "wheel_sha256": sha256(args.wheel),
        "aiter_shuffle_sha256": sha256(args.aiter_shuffle),
        "aiter_commit": args.aiter_commit,
        "torch": torch.__version__,
    }
    save_file(tensors, str(args.out), metadata={"layouts": json.dumps(meta), "provenance": json.dumps(provenance)})
    print(f"wrote {len(meta)} vectors to {args.out.name} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
