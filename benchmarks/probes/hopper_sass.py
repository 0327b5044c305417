"""Instructions per K step of the hopper_mma GEMMs, read from their sm_90a SASS without a GPU.

Compiles moe_hgemm1_kernel / moe_hgemm2_kernel for sm_90a with the installed Triton (its bundled
ptxas and cuobjdump), with the compile-time arguments fused_moe_triton would pass for each layer
and token count (select_config, hopper_constants, the register cap), and prints, per kernel:
registers, stack frame, shared memory, and each loop of 100+ instructions with its instruction
count and commonest opcodes. The K loop's count is the issue cost of one block_k step; a decode
change can be judged here before any GPU time is spent (benchmarks/results/performance-notebook.md).

    python benchmarks/probes/hopper_sass.py [--shapes dsv3,k3] [--tokens 1,8,64,4096] [--override JSON]
        [--layout hopper_mma_xor|hopper_mma_rot|hopper_mma] [--keep DIR]

--override '{"factor_pairs": 0}' applies config overrides to every point; --layout hopper_mma_rot or
hopper_mma compiles the decode of an earlier bit order (hopper_mma_w_rot, hopper_mma_w; the default is
hopper_mma_w_xor, what convert writes); --keep writes the TTGIR, PTX and SASS there.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(_HERE, ".."), os.path.join(_HERE, "..", "..")]  # the probes, the tools, the repository

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from mxfp4conv.kernels.triton_moe import hopper_kernels as HK  # noqa: E402
from mxfp4conv.kernels import triton_moe as M  # noqa: E402
from moe_bench import SHAPES  # noqa: E402

X_PTRS = ("x_ptr", "a_ptr", "out_ptr", "y_ptr")  # x, the intermediate, the pair outputs, y: x's element type
PTR_TYPES = {"b_ptr": "*fp32", "part_ptr": "*fp32", "tw_ptr": "*fp32", "sorted_ids_ptr": "*i32",
             "block_expert_ptr": "*i32", "num_post_pad_ptr": "*i32", "ids_ptr": "*i32", "cnt_ptr": "*i32"}
DIVISIBLE = {"K", "I_pad", "K_SPLIT", "N", "num_experts"}  # multiples of 16 in every real call


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_kernel(fn, consts: dict, num_warps: int, num_stages: int, maxnreg: int | None = None, x_type: str = "bf16"):
    """``fn`` compiled for sm_90a with these compile-time arguments (constexprs not in ``consts`` take their
    defaults, as at a launch) and x, the intermediate and the outputs of element type ``x_type``."""
    consts = _with_defaults(fn, consts)
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
            continue
        if name.endswith("_ptr"):
            sig[name] = f"*{x_type}" if name in X_PTRS else PTR_TYPES.get(name, "*u8")
        else:
            sig[name] = "fp32" if name in ("p0", "p1") else "i32"
        if name.endswith("_ptr") or name in DIVISIBLE or name.startswith("stride_"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, sig, constexprs=consts, attrs=attrs)
    options = dict(num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_sass(fn, consts: dict, num_warps: int, num_stages: int, keep: str | None, tag: str,
                 maxnreg: int | None = None) -> tuple[str, str]:
    """(SASS text, registers / stack / shared memory) of ``fn`` for sm_90a (``compile_kernel``, bf16 x)."""
    kernel = compile_kernel(fn, consts, num_warps, num_stages, maxnreg)
    sass, res = _dump(kernel)
    if keep:
        os.makedirs(keep, exist_ok=True)
        for ext in ("ttgir", "ptx"):
            with open(os.path.join(keep, f"{tag}.{ext}"), "w") as f:
                f.write(kernel.asm[ext])
        with open(os.path.join(keep, f"{tag}.sass"), "w") as f:
            f.write(sass)
    usage = re.search(r"REG:\d+ STACK:\d+", res)
    return sass, f"{usage.group(0) if usage else '?'} SMEM:{kernel.metadata.shared // 1024}K"


def _with_defaults(fn, consts: dict) -> dict:
    """consts and, for each constexpr of ``fn`` not in it, its default (as a launch gives it)."""
    import inspect

    return dict(consts, **{p.name: p.default for p in fn.params
                           if p.is_constexpr and p.name not in consts and p.default is not inspect.Parameter.empty})


def _dump(kernel) -> tuple[str, str]:
    """(SASS, cuobjdump's resource usage) of a compiled kernel's cubin."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        sass = subprocess.run([_tool("cuobjdump"), "-sass", cubin], check=True, capture_output=True, text=True).stdout
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", cubin], check=True, capture_output=True, text=True).stdout
    return sass, res


def compile_gluon_sass(fn, consts: dict, types: dict, shape_args, options: dict) -> tuple[str, str]:
    """(SASS, resource usage) of Gluon kernel ``fn`` for sm_90a: constexprs not in ``consts`` take their defaults (as
    at a launch), other arguments are typed by ``types`` (pointers not named there *i32, the rest i32), and pointers
    and ``shape_args`` are specialised as multiples of 16, as a launch from torch specialises them."""
    from triton.experimental.gluon._runtime import GluonASTSource
    consts = _with_defaults(fn, consts)
    sig = {n: "constexpr" if n in consts else types.get(n, "*i32" if n.endswith("_ptr") else "i32")
           for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(sig) if n.endswith("_ptr") or n in shape_args}
    kernel = triton.compile(GluonASTSource(fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": 4, **options})
    return _dump(kernel)


def loops(sass: str, least: int = 100) -> list[tuple[int, collections.Counter]]:
    """(instructions, opcode counts) of each loop body (a backward branch's span) of least+ instructions."""
    ins = [(int(m.group(1), 16), m.group(2).strip())
           for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    out = []
    for addr, text in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
            if len(body) >= least:
                ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body)
                out.append((len(body), ops))
    return out


def point_constants(shape: str, T: int, override: dict, layout: str = "hopper_mma_xor", act: str = "silu",
                    act_params: dict | None = None, dtype=tl.bfloat16):
    """(config, GEMM1 and GEMM2 compile-time arguments) of a call with x of ``dtype`` and this activation (silu: no
    limit)."""
    H, I, E, k = SHAPES[shape]
    cfg = dataclasses.replace(M.select_config(T * k, E, H, I, layout), **override)
    acts = {n: v for n, v in M.launch._activation_args(act, act_params).items() if n in ("ACT", "HAS_LIMIT", "HAS_LINEAR")}
    c1, c2, (direct, fused, rows2) = M.hopper_forward.hopper_constants(cfg, T, k, H, I, dtype, True, cfg.factor_pairs, acts,
                                                        False, False, rot=HK.ORDER_IDS[M.HOPPER_ORDERS[layout]])
    (s1, _), _ = M.tiles.gemm_splits(cfg, T * k, E, H, I, direct, rows2)
    c1.update(SPLIT=s1 > 1, ROWS_FIRST=bool(cfg.rows_first1 and not fused))
    c2.update(ROWS_FIRST=bool(cfg.rows_first2 and not fused))
    return cfg, c1, c2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="dsv3,k3")
    ap.add_argument("--tokens", default="1,8,64,4096")
    ap.add_argument("--override", default="{}", help="JSON config overrides applied at every point")
    ap.add_argument("--layout", default="hopper_mma_xor", choices=M.HOPPER_SETS)
    ap.add_argument("--keep", default=None, help="directory for the TTGIR, PTX and SASS")
    args = ap.parse_args()
    override = json.loads(args.override)
    print(f"triton {triton.__version__}, sm_90a, {args.layout}; loops of 100+ instructions (the K loop: one block_k step)")
    print(f"{'shape':6} {'T':>5} {'kernel':6} {'warps':>5} {'REG/STACK/SMEM':>26}  loops: instructions (top opcodes)")
    for shape in args.shapes.split(","):
        for T in (int(t) for t in args.tokens.split(",")):
            cfg, c1, c2 = point_constants(shape, T, override, args.layout)
            for name, fn, consts, second in (("gemm1", HK.moe_hgemm1_kernel, c1, False),
                                             ("gemm2", HK.moe_hgemm2_kernel, c2, True)):
                launch = M.launch._launch_options(cfg, second=second)
                sass, usage = compile_sass(fn, consts, launch["num_warps"], launch["num_stages"], args.keep,
                                           f"{shape}_T{T}_{name}", launch.get("maxnreg"))
                body = "; ".join(f"{n} ({', '.join(f'{op} {c}' for op, c in ops.most_common(4))})"
                                 for n, ops in loops(sass))
                print(f"{shape:6} {T:>5} {name:6} {launch['num_warps']:>5} {usage:>26}  {body}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
