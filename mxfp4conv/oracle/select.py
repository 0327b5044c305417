"""The oracle: which MXFP4 MoE backend vLLM picks for a checkpoint on a target, and what
that means for the bytes mxfp4conv writes.

``decide`` walks vLLM's selectors with the capability table of ``backends``:

- ``Mxfp4MoEMethod`` (Kimi-K3, DeepSeek-V4): ``select_deepseek_v4_mxfp4_moe_backend``,
  platform priority list (ROCm: AITER_MXFP4_BF16, EMULATION; ROCm with DeepseekV4
  routing: AITER_MXFP4_BF16, TRITON_UNFUSED; otherwise the CUDA list), each backend tried
  with its default activation key, no user activation override; converter S.
- ``GptOssMxfp4MoEMethod`` and ``QuarkOCP_MX_MoEMethod``: ``select_mxfp4_moe_backend``
  with the activation key the checkpoint declares (Quark scheme) or ``--act-quant``
  requests, filtered priority list, CPU forced last; converter G. Quark schemes the oracle
  does not select (MXFP6, ...) go straight to EMULATION.
- ``--backend``: vLLM's ``--moe-backend`` strings (``map_mxfp4_backend``) or member names;
  a forced backend that fails its gates is refused with the reasons.

Every backend tried is recorded with the reason it was accepted or rejected, in order.

What is written (the choice for targets whose vLLM backend mxfp4conv cannot produce):
``Decision.backend`` always names a backend whose bytes the recipe produces and that a
reader can serve from them; it is never a backend that cannot read them. When vLLM's
pick has a layout mxfp4conv cannot write (Marlin, TRTLLM, CUTLASS, DeepGEMM, CPU prepack,
triton_kernels' CUDA swizzles, CDNA4 scale swizzle, gpt-oss's interleaved rows), the
decision falls back to ``EMULATION``: the canonical identity layout (checkpoint bytes,
``[gate; up]`` rows, 32-aligned), the format vLLM's EMULATION backend keeps and mxfp4conv's
own runtime (Triton on a GPU, torch on CPU) reads. vLLM's own pick stays visible in
``candidates`` (its entry, not selected, says why it is not written) and in
``options["vllm_backend"]``; ``options["producible"]`` lists the backends mxfp4conv can
write for the target, and ``notes`` say so in words. A forced ``--backend`` whose layout
cannot be written is refused instead of substituted.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mxfp4conv.checkpoint.canonical import MoEModel
from mxfp4conv.errors import OracleError
from mxfp4conv.oracle import compressed_tensors as ct_methods
from mxfp4conv.oracle import nvidia
from mxfp4conv.oracle.arch import Arch, get_arch
from mxfp4conv.oracle.backends import (
    B12X_FORCE_A16_ENV, BACKENDS, DSV4_ROCM_PRIORITY, FP8_STATIC, INT4_G32, KEY_TEXT, MOE_BACKEND_STRINGS,
    MOE_WEIGHTS, MXFP4_DYN, Ctx,
    Server, b12x_requested, backend_table, filter_by_activation, gpt_oss_priority, parse_backend, priority_backends, try_backend,
)
from mxfp4conv.oracle import parallel as moe_parallel
from mxfp4conv.oracle.decision import Candidate, Decision, Target
from mxfp4conv.oracle.releases import RELEASES, Release, resolve
from mxfp4conv.oracle.formats import (
    HOPPER_MMA_ALIGN, K3_INT4_CONVERSION, K3_INT4_PYTHON, KERNEL_LAYOUTS, ActQuantRefused, ConverterRaises,
    KernelFormat, NotProducible, emulation_format, k3_int4_env, k3_int4_not_producible,
    kernel_format_g, kernel_format_quark_s, kernel_format_s,
)
from mxfp4conv.oracle.roundup import (
    K3_MIN_INTERMEDIATE_PER_PARTITION, k3_min_per_rank, padded_geometry, split,
)

SELECTOR_S = "select_deepseek_v4_mxfp4_moe_backend"
SELECTOR_G = "select_mxfp4_moe_backend"
ACT_QUANTS = ("auto", "bf16", "fp8", "mxfp4")
KERNEL_LAYOUT_CHOICES = ("auto", *KERNEL_LAYOUTS)
QUARK_SCHEME_KEYS = {"w_mxfp4": None, "w_mxfp4_a_mxfp4": MXFP4_DYN, "w_mxfp4_a_fp8": FP8_STATIC}
KEY_ACT = {None: "bf16", MXFP4_DYN: "mxfp4", FP8_STATIC: "fp8"}
ACT_OVERRIDE = {"fp8": FP8_STATIC, "mxfp4": MXFP4_DYN}  # fp8_per_tensor_static, mxfp4
ASSUMES = {
    "EMULATION": "amd-quark assumed installed",
    "TRITON": "triton_kernels assumed installed",
    "TRITON_UNFUSED": "triton_kernels assumed installed",
    "FLASHINFER_TRTLLM_MXFP4_BF16": "flashinfer assumed installed",
    "FLASHINFER_TRTLLM_MXFP4_MXFP8": "flashinfer assumed installed, with Situ",
    "FLASHINFER_CUTLASS_MXFP4_BF16": "flashinfer assumed installed",
    "FLASHINFER_CUTLASS_MXFP4_MXFP8": "flashinfer assumed installed",
    "DEEPGEMM_MXFP4": "deep_gemm assumed installed",
    "CPU": "x86 AMX assumed",
}


@dataclass
class _Walk:
    selector: str
    tried: list[tuple[str, bool, str]] = field(default_factory=list)  # (backend, ok, reason)
    pick: str | None = None
    cls: str | None = None
    error: str | None = None  # what vLLM raises when nothing serves the layer
    key: str | None = None  # activation key (converter G); None for converter S
    act_quant: str = "bf16"  # resolved by the key (converter G)
    int4: bool = False  # gfx942's Kimi-K3 int4 requantisation path (--moe-weight int4_per_group_32)


def _model_key(model: MoEModel) -> tuple[str | None, bool]:
    """(activation key the checkpoint declares, selected by the oracle at all)."""
    if model.moe_method != "quark":
        return None, True
    scheme = model.quant_scheme
    if scheme not in QUARK_SCHEME_KEYS:
        return None, False
    key = QUARK_SCHEME_KEYS[scheme]
    if key == FP8_STATIC and not model.static_input_scales:
        raise OracleError(
            f"Quark scheme {scheme} with dynamic fp8 input scales is not supported by vLLM "
            "(QuarkOCP_MX_MoEMethod raises NotImplementedError); only static per-tensor input "
            "scales (input_scale tensors) are served.")
    if key == MXFP4_DYN and model.static_input_scales:
        raise OracleError(
            f"Quark scheme {scheme} with static input scales is not supported by vLLM "
            "(QuarkOCP_MX_MoEMethod raises NotImplementedError); re-export with dynamic "
            "MXFP4 activations.")
    return key, True


def _resolve_key(model: MoEModel, act_quant: str, model_key: str | None,
                 release: Release) -> str | None:
    """_resolve_activation_key: the checkpoint's key, or the --act-quant override (the
    server's --quantization-config.moe.activation). Where the release lets the override win
    (an explicit null is bf16), a conflicting request is what the server runs."""
    if act_quant == "auto":
        return model_key
    if release.moe_activation_override_wins:
        return None if act_quant == "bf16" else ACT_OVERRIDE[act_quant]
    if act_quant == "bf16":
        if model_key is not None:
            raise OracleError(
                f"The checkpoint declares {KEY_TEXT[model_key]} activations "
                f"({model.quant_scheme}); vLLM has no override to run them unquantised. Use "
                "--act-quant auto.")
        return None
    override = ACT_OVERRIDE[act_quant]
    if model_key is not None and model_key != override:
        raise OracleError(
            f"--act-quant {act_quant} conflicts with the checkpoint's declared "
            f"{KEY_TEXT[model_key]} activations ({model.quant_scheme}); {release.label} raises "
            "ValueError for a conflicting quantization_config.moe.activation. Use --act-quant auto.")
    return override


def _walk(selector: str, names: tuple[str, ...], ctx: Ctx, key_for,
          dropped: dict[str, str] | None = None) -> _Walk:
    """Try ``names`` in order; the ``dropped`` ones (filtered out by activation) are listed
    after the walk, not tried."""
    w = _Walk(selector)
    for name in names:
        cls, reason = try_backend(name, replace(ctx, act_key=key_for(name)))
        if cls is not None:
            assumed = ASSUMES.get(name)
            w.tried.append((name, True, reason + (f" ({assumed})" if assumed else "")))
            w.pick, w.cls = name, cls
            break
        w.tried.append((name, False, reason))
    for name, why in (dropped or {}).items():
        w.tried.append((name, False, why))
    return w


NO_BACKEND = "NotImplementedError: No MXFP4 MoE backend supports the deployment configuration."


def _k3_situ_aiter(ctx: Ctx, params: dict) -> bool:
    """_use_k3_situ_aiter (quantization/mxfp4.py): Kimi-K3 SiTU on gfx950 with AITER MoE
    takes AITER_MXFP4_BF16 without any selection, even under --moe-backend."""
    return (ctx.arch.is_rocm and ctx.aiter and ctx.arch.on_gfx950 and ctx.activation == "situ"
            and params.get("linear_beta") is not None)


INT4_OPTION = "--quantization-config.moe.weight int4_per_group_32"


def k3_situ_int4_gfx942(ctx: Ctx, params: dict) -> str | None:
    """_use_k3_situ_int4_gfx942 (quantization/mxfp4.py), asked of Mxfp4MoEMethod: None when
    the gfx942 int4 path applies, else why vLLM ignores the option."""
    if ctx.moe_weight != INT4_G32:
        return "the server is not given " + INT4_OPTION
    if not ctx.arch.is_rocm:
        return f"it needs ROCm; {ctx.arch.describe()}"
    if not (ctx.aiter and (ctx.arch.cdna or 0) > 2):
        return ("it needs AITER fused MoE (rocm_aiter_ops.is_fused_moe_enabled), which is off "
                "(--no-aiter / VLLM_ROCM_USE_AITER unset)" if not ctx.aiter
                else f"it needs AITER fused MoE; {ctx.arch.describe()}")
    if ctx.arch.name != "gfx942":
        return f"it needs gfx942 (on_gfx942); {ctx.arch.describe()}"
    if ctx.activation != "situ" or params.get("linear_beta") is None:
        return (f"it needs a SiTU layer with linear_beta (Kimi-K3); this layer's activation is "
                f"{ctx.activation}" + ("" if ctx.activation != "situ" else " without linear_beta"))
    return None


def _select_s(ctx: Ctx, forced: tuple[str, ...] | None, params: dict) -> _Walk:
    default = lambda n: backend_table(ctx.release)[n].default_key  # noqa: E731
    if k3_situ_int4_gfx942(ctx, params) is None:
        # no selection (--moe-backend is not read); the kernel build later validates
        # AiterMxfp4Experts with int4 weights in groups of 32 and bf16 activations
        w = _Walk(SELECTOR_S, int4=True)
        cls, reason = try_backend("AITER_MXFP4_BF16", replace(ctx, weight_key=INT4_G32, act_key=None))
        w.tried.append(("AITER_MXFP4_BF16", cls is not None,
                        f"Kimi-K3 SiTU int4 path ({INT4_OPTION}; _use_k3_situ_int4_gfx942: gfx942, "
                        f"AITER MoE, SiTU with linear_beta): AiterMxfp4Experts without selection, "
                        f"weights requantised to int4 at load; {reason}"))
        if cls is None:  # _validate_mxfp4_experts_config at the kernel build
            w.error = f"ValueError: AiterMxfp4Experts does not support this MoE deployment ({reason})"
        else:
            w.pick, w.cls = "AITER_MXFP4_BF16", cls
        return w
    if _k3_situ_aiter(ctx, params):
        w = _Walk(SELECTOR_S)
        w.tried.append(("AITER_MXFP4_BF16", True,
                        "Kimi-K3 SiTU AITER path (_use_k3_situ_aiter: gfx950, AITER MoE, SiTU "
                        "with linear_beta): AiterMxfp4Experts without selection"))
        w.pick, w.cls = "AITER_MXFP4_BF16", "AiterMxfp4Experts"
        return w
    if forced is not None:
        w = _walk(SELECTOR_S, forced, ctx, default)
        if w.pick is None:
            w.error = "ValueError: " + "; ".join(r for _, _, r in w.tried)
        return w
    if ctx.arch.is_rocm and ctx.routing == "DeepseekV4":
        names = DSV4_ROCM_PRIORITY
    else:
        names = priority_backends(ctx.arch)
    w = _walk(SELECTOR_S, names, ctx, default)
    if w.pick is None:
        w.error = NO_BACKEND
    return w


def _select_g(ctx: Ctx, key: str | None, forced: tuple[str, ...] | None, value: str | None) -> _Walk:
    # EMULATION takes the requested key, every other backend its own
    keyed = lambda n: key if n == "EMULATION" else BACKENDS[n].default_key  # noqa: E731
    names = forced if forced is not None else gpt_oss_priority(ctx.arch, ctx.release)
    kept, dropped = filter_by_activation(names, key)
    if forced is not None and forced == MOE_BACKEND_STRINGS["b12x"]:
        special = b12x_requested(forced, key, force_a16=False)
        if special is not None:
            kept, dropped = special, {}
    if forced is not None:
        if not kept:
            raise OracleError(
                f"--backend {value} offers no backend for {KEY_TEXT[key]} activations "
                f"({', '.join(names)} run other activation quantisations).")
        w = _walk(SELECTOR_G, kept, ctx, keyed, dropped)
        if w.pick is None:
            w.error = "ValueError: " + "; ".join(r for _, ok, r in w.tried if r not in dropped.values())
    else:
        w = _walk(SELECTOR_G, kept, ctx, keyed, dropped)
        if w.pick is None:
            w.error = NO_BACKEND
    w.key, w.act_quant = key, KEY_ACT[key]
    return w


@dataclass
class _Resolved:
    walk: _Walk
    fmt: KernelFormat | NotProducible | None  # format of vLLM's pick


def quark_converter(model: MoEModel, release: Release) -> str:
    """The converter QuarkOCP_MX_MoEMethod calls: G (convert_gpt_oss_...) on a gpt-oss
    model, or on every model where the release has no other; S otherwise."""
    gpt_oss = model.extra.get("base_model_type") == "gpt_oss" or model.family == "gpt_oss"
    return "S" if release.quark_converter_s and not gpt_oss else "G"


def converter_of(model: MoEModel, release: Release) -> str:
    return quark_converter(model, release) if model.moe_method == "quark" else (
        "S" if model.moe_method == "mxfp4" else "G")


def _resolve(model: MoEModel, target: Target, arch: Arch, server: Server) -> _Resolved:
    """vLLM's pick and the format written for it: on NVIDIA, a pick whose converted layout
    mxfp4conv does not write is kept with canonical bytes vLLM converts (``oracle.nvidia``)."""
    r = _resolve_pick(model, target, arch, server)
    if (r.walk.pick is not None and type(r.fmt) is NotProducible
            and nvidia.keeps_vllm_backend(arch, model.moe_method, target.layout != "auto", target.backend is not None)):
        canonical = _fallback_format(model, target, arch, r.walk)
        if isinstance(canonical, KernelFormat):
            kernel_act = KEY_TEXT[BACKENDS[r.walk.pick].default_key]
            return _Resolved(r.walk, nvidia.vllm_converts(r.walk.pick, r.fmt, canonical, arch, kernel_act))
    return r


def _resolve_pick(model: MoEModel, target: Target, arch: Arch, server: Server) -> _Resolved:
    quark = model.moe_method == "quark"
    release = RELEASES[target.vllm]
    forced = parse_backend(target.backend) if target.backend else None
    par = moe_parallel.of_target(target, model)  # the MoE layer's sizes (tp x dp flattened)
    ctx = Ctx(
        arch=arch, aiter=target.aiter, server=server, quark_checkpoint=quark,
        activation=model.activation.name, act_key=None, routing=model.routing,
        num_local_experts=len(par.experts(0)),
        ep=par.use_ep, dp=par.dp, all2all=par.all2all_kernels, batched=par.batched, has_bias=model.has_bias,
        hidden=model.geometry.hidden,
        intermediate=(model.geometry.intermediate if par.use_ep
                      else model.geometry.intermediate // par.moe_tp),
        situ_params=((model.activation.params.get("beta"), model.activation.params.get("linear_beta"))
                     if model.activation.name == "situ" else ()),
        moe_weight=target.moe_weight, release=release,
    )
    if model.moe_method == "mxfp4":
        walk = _select_s(ctx, forced, model.activation.params)
        if walk.int4:
            return _Resolved(walk, None if walk.pick is None else k3_int4_not_producible())
        fmt = None if walk.pick is None else kernel_format_s(
            walk.pick, arch, target.tp, model.activation.name, target.act_quant,
            model.static_input_scales)
        return _Resolved(walk, fmt)
    if model.moe_method == "compressed_tensors_mxfp4":
        choice = ct_methods.choose(model, arch, target.backend, target.act_quant)
        return _Resolved(choice, NotProducible(
            f"{choice.pick} ({choice.cls}) repacks or swizzles the weights at load time in a "
            "layout mxfp4conv does not write"))
    if model.moe_method not in ("gpt_oss_mxfp4", "quark"):
        raise OracleError(
            f"Unknown MoE quant method {model.moe_method!r} for family {model.family}; the "
            "oracle knows mxfp4 (Kimi-K3, DeepSeek-V4), gpt_oss_mxfp4 and quark.")
    model_key, selected = _model_key(model)
    if not selected:
        walk = _quark_unselected(model, target, forced)
        return _Resolved(walk, kernel_format_g(
            "EMULATION", arch, target.tp, walk.act_quant, interleaved_source=False, quark=True,
            has_static_input_scales=model.static_input_scales))
    key = _resolve_key(model, target.act_quant, model_key, release)
    walk = _select_g(ctx, key, forced, target.backend)
    if walk.pick is None:
        return _Resolved(walk, None)
    if quark and quark_converter(model, release) == "S":
        return _Resolved(walk, kernel_format_quark_s(
            walk.pick, arch, target.tp, walk.act_quant, activation=model.activation.name,
            has_static_input_scales=model.static_input_scales))
    return _Resolved(walk, kernel_format_g(
        walk.pick, arch, target.tp, walk.act_quant,
        interleaved_source=model.gate_up_interleaved, quark=quark,
        has_static_input_scales=model.static_input_scales,
        literal_deinterleave=server.quark_literal_deinterleave,
        activation=model.activation.name, has_bias=model.has_bias))


def _quark_unselected(model: MoEModel, target: Target, forced: tuple[str, ...] | None) -> _Walk:
    if forced is not None and forced != ("EMULATION",):
        raise OracleError(
            f"Quark scheme {model.quant_scheme} is not selected by vLLM's MXFP4 oracle (the "
            f"backend stays NONE) and only EMULATION serves it; --backend {target.backend} "
            "cannot.")
    if target.act_quant != "auto":
        raise OracleError(
            f"Quark scheme {model.quant_scheme} runs under EMULATION with the activations it "
            "declares; use --act-quant auto.")
    act = model.quant_scheme.split("_a_", 1)[1] if "_a_" in model.quant_scheme else "bf16"
    w = _Walk(SELECTOR_G, act_quant=act)
    w.tried.append(("EMULATION", True,
                    f"Quark scheme {model.quant_scheme} is not one the oracle selects "
                    "(backend stays NONE), so QuarkOCP_MX_MoEMethod uses EMULATION"))
    w.pick, w.cls = "EMULATION", "OCP_MXQuantizationEmulationTritonExperts"
    return w


def _fallback_format(model: MoEModel, target: Target, arch: Arch,
                     walk: _Walk) -> KernelFormat | ActQuantRefused:
    if model.moe_method == "mxfp4":
        fmt = kernel_format_s("EMULATION", arch, target.tp, model.activation.name,
                              target.act_quant, model.static_input_scales)
        assert isinstance(fmt, (KernelFormat, ActQuantRefused))
        return fmt
    return emulation_format(walk.act_quant, gpt_oss=model.gate_up_interleaved)


def _producible(model: MoEModel, target: Target, arch: Arch, server: Server) -> list[str]:
    """Backends mxfp4conv can write for this target (each accepted by --backend without --layout;
    on NVIDIA some as canonical bytes that vLLM converts, see ``oracle.nvidia``)."""
    out = []
    for name in BACKENDS:
        try:
            r = _resolve(model, replace(target, backend=name, layout="auto"), arch, server)
        except OracleError:
            continue
        if r.walk.pick == name and isinstance(r.fmt, KernelFormat):
            out.append(name)
    if "EMULATION" not in out:
        try:
            auto = _resolve(model, replace(target, backend=None), arch, server)
            fmt = _fallback_format(model, target, arch, auto.walk)
        except OracleError:
            fmt = None
        if isinstance(fmt, KernelFormat):
            out.append("EMULATION")
    return out


def _who(model: MoEModel, arch: Arch) -> str:
    return (f"{model.family} ({model.quant_scheme}, activation {model.activation.name}, "
            f"{model.routing} routing) on {arch.describe()}")


def decide(model: MoEModel, target: Target, server: Server | None = None) -> Decision:
    """vLLM's backend decision for ``model`` on ``target`` and the recipe mxfp4conv writes.

    Pure: no I/O. Raises ``OracleError`` with the reason when the target cannot be served
    (unknown arch, impossible tp, refused --backend or --act-quant).
    """
    server = server or Server()
    resolved_release = resolve(target.vllm)
    rel = resolved_release.release
    target = replace(target, vllm=rel.key)
    arch = get_arch(target.arch)
    if target.act_quant not in ACT_QUANTS:
        raise OracleError(
            f"Unknown --act-quant {target.act_quant!r}; use one of {', '.join(ACT_QUANTS)}.")
    if target.layout not in KERNEL_LAYOUT_CHOICES:
        raise OracleError(
            f"Unknown --layout {target.layout!r}; use one of {', '.join(KERNEL_LAYOUT_CHOICES)}.")
    if target.moe_weight is not None and target.moe_weight not in MOE_WEIGHTS:
        raise OracleError(
            f"Unknown --moe-weight {target.moe_weight!r}: mxfp4conv models vLLM's "
            f"--quantization-config.moe.weight {', '.join(MOE_WEIGHTS)} only (other names make vLLM "
            "requantise the experts online, which is not modelled).")
    target = replace(target, arch=arch.name)
    geo = model.geometry
    par = moe_parallel.of_target(target, model)
    split(geo.hidden, geo.intermediate, geo.num_experts, par.ranks, par.use_ep)

    resolved = _resolve(model, target, arch, server)
    walk, fmt = resolved.walk, resolved.fmt
    forced = target.backend is not None
    if walk.pick is None and forced:
        reasons = "; ".join(f"{b}: {r}" for b, _, r in walk.tried)
        raise OracleError(f"--backend {target.backend} cannot serve {_who(model, arch)} (vLLM "
                          f"raises ValueError for this --moe-backend): {reasons}.")
    if isinstance(fmt, ActQuantRefused):
        raise OracleError(f"{_who(model, arch)}: {fmt}.")
    version = rel.version
    raises = walk.error if walk.pick is None else (
        f"{walk.pick}'s weight converter raises: {fmt}" if isinstance(fmt, ConverterRaises) else None)
    own_format = target.layout != "auto"  # the user asked for mxfp4conv's runtime format
    if walk.int4 and walk.pick is not None and not own_format:
        raise OracleError(
            f"--moe-weight {INT4_G32}: vLLM {version} serves {_who(model, arch)} with {walk.pick} "
            f"({walk.cls}) on its gfx942 int4 path ({INT4_OPTION}), but mxfp4conv cannot write "
            f"that layout: {fmt}. vLLM's conversion, {K3_INT4_CONVERSION}. Pass --layout identity "
            "to write mxfp4conv's own runtime format instead, or drop --moe-weight.")
    if raises and not own_format:
        raise OracleError(
            f"vLLM {version} cannot serve {_who(model, arch)}: "
            f"{raises if isinstance(fmt, ConverterRaises) else 'it raises ' + raises}, so a server "
            f"fails {'at load' if isinstance(fmt, ConverterRaises) else 'building the layer'}. mxfp4conv does "
            "not write a checkpoint for a server that cannot load it; pass --layout identity (or "
            "hopper_mma on sm90) to write mxfp4conv's own runtime format instead.")

    producible = _producible(model, target, arch, server)
    notes: list[str] = [resolved_release.note] if resolved_release.note else []
    candidates = [Candidate(b, False, r) for b, _, r in walk.tried]
    head = None  # set when mxfp4conv falls back to its own format
    # on NVIDIA, --layout asks for mxfp4conv's own format even where vLLM's layout is written too
    replaced = own_format and nvidia.layout_replaces(arch, walk.pick)
    if walk.pick is not None and isinstance(fmt, KernelFormat) and not replaced:
        backend, final = walk.pick, fmt
        idx = max(i for i, c in enumerate(candidates) if c.backend == backend)
        candidates[idx] = replace(candidates[idx], selected=True)
    else:
        if forced and not own_format:  # with --layout: write mxfp4conv's format, say why
            raise OracleError(
                f"--backend {target.backend}: vLLM would serve {_who(model, arch)} with "
                f"{walk.pick}, but mxfp4conv cannot write that backend's layout: {fmt}. "
                f"Layouts mxfp4conv can produce for {arch.name}: {', '.join(producible) or 'none'}; "
                "or pass --layout identity to write mxfp4conv's own runtime format.")
        final = _fallback_format(model, target, arch, walk)
        if isinstance(final, ActQuantRefused):
            vllm = f"vLLM picks {walk.pick}" if walk.pick else "vLLM has no backend"
            raise OracleError(
                f"{_who(model, arch)}: {final} ({vllm}, which mxfp4conv cannot write, so "
                "the EMULATION layout would be written).")
        backend = "EMULATION"
        if walk.pick is not None:
            idx = max(i for i, c in enumerate(candidates) if c.backend == walk.pick)
            not_written = (f"--layout {target.layout} asks for mxfp4conv's own format instead"
                           if isinstance(fmt, KernelFormat) else fmt)
            candidates[idx] = replace(
                candidates[idx], reason=f"vLLM's pick ({candidates[idx].reason}); not written: {not_written}")
            head = (f"vLLM would pick {walk.pick} ({walk.cls}) here, but mxfp4conv cannot "
                    f"write its layout ({fmt}).")
            if isinstance(fmt, KernelFormat):
                head = (f"vLLM would pick {walk.pick} ({walk.cls}) here, whose layout mxfp4conv writes "
                        f"too; {not_written}.")
            if walk.int4:
                head = (f"With {INT4_OPTION}, vLLM {version} takes {walk.pick} ({walk.cls}) here "
                        f"without selection (_use_k3_situ_int4_gfx942) and requantises the experts "
                        f"at load (Mxfp4MoEMethod._setup_kernel_k3_situ_gfx942): {K3_INT4_CONVERSION}. "
                        f"{K3_INT4_PYTHON}. mxfp4conv cannot write that layout ({fmt}).")
            if raises:
                head = f"vLLM {version} picks {walk.pick} ({walk.cls}) here, then {raises}."
            why = (f"--layout {target.layout} asked for mxfp4conv's format" if isinstance(fmt, KernelFormat)
                   else f"vLLM's pick {walk.pick} has a layout mxfp4conv cannot write")
        else:
            head = f"vLLM {version} raises here ({walk.error})"
            why = f"vLLM {version} raises for this deployment; --layout asked for mxfp4conv's format"
        candidates.append(Candidate("EMULATION", True,
                                    f"mxfp4conv fallback: {why}; the format mxfp4conv's runtime reads"))

    kernel_layout = _kernel_layout(target, arch, backend, final)
    if head is not None:  # the fallback: say what is written instead
        if kernel_layout == "identity":
            what = ("the checkpoint bytes unchanged (identity, [gate; up] rows) padded to multiples "
                    "of 32, which mxfp4conv's own runtime reads (Triton on a GPU, torch on CPU); vLLM "
                    "reads it only with --moe-backend emulation where amd-quark is installed")
        else:
            what = ("mxfp4conv's own format, which its runtime reads (Triton on a GPU, torch on CPU); "
                    "its layout is below")
        notes.append(
            f"{head} This plan writes the EMULATION format instead: {what}. Layouts mxfp4conv can "
            f"produce for {arch.name}: {', '.join(producible)}.")
    if kernel_layout != "identity":
        final = replace(final, layout=KERNEL_LAYOUTS[kernel_layout])
        notes.append(
            f"Layout {kernel_layout}: mxfp4conv's Triton kernel reads the weights and scales in the "
            "order each thread of a Hopper wgmma holds them (mxfp4conv.shuffle.hopper), so it "
            f"decodes without a shared-memory shuffle; both sizes are padded to multiples of "
            f"{HOPPER_MMA_ALIGN}. Only mxfp4conv's runtime reads this layout (its torch backend "
            "inverts it); pass --layout identity for the canonical bytes.")
    kernel = nvidia.serving_kernel(arch, backend, own_format, final.kernel_act)
    if kernel == nvidia.MXFP4CONV:
        notes.append(nvidia.replacement_note(arch, walk.pick, walk.cls, kernel_layout, own_format))
    if walk.pick == "B12X_MXFP4_BF16" and target.backend and parse_backend(target.backend) == ("B12X_MXFP4_BF16",):
        # vLLM reaches this member only through --moe-backend b12x with the bf16-only switch
        final = replace(final, runtime_env={**final.runtime_env, B12X_FORCE_A16_ENV: "1"})
        notes.append(f"The server reaches B12X_MXFP4_BF16 with --moe-backend b12x and "
                     f"{B12X_FORCE_A16_ENV}=1 (in the manifest's runtime environment).")
    vllm_env = None  # the server environment of vLLM's pick, where mxfp4conv writes another format
    if target.moe_weight is not None:
        why = k3_situ_int4_gfx942(_int4_ctx(model, target, arch, rel), model.activation.params) \
            if model.moe_method == "mxfp4" else (
                f"{'the compressed-tensors' if model.moe_method == 'compressed_tensors_mxfp4' else 'this'} "
                "MoE method never reads quantization_config.moe.weight (only Mxfp4MoEMethod does), and "
                "the online quantization config maps int4_per_group_32 to no online method")
        if walk.int4:
            vllm_env = k3_int4_env(target.act_quant)
            env_text = " ".join(f"{k}={v}" for k, v in vllm_env.items())
            notes.append(f"The server for vLLM's int4 path runs with {INT4_OPTION} and {env_text} "
                         "(Mxfp4MoEMethod writes AITER_BF16_FP8_MOE_BOUND=0 itself unless SiTUv2 is "
                         "a16w4); it loads the original MXFP4 checkpoint, not this output.")
        else:
            notes.append(f"vLLM {version} ignores {INT4_OPTION} here: {why}; the decision is the one "
                         "without it.")
    k3_minimum = _k3_minimum(model)
    g = padded_geometry(
        backend=backend, platform=arch.platform, cdna=arch.cdna,
        activation=model.activation.name if model.moe_method == "mxfp4" else None,
        hidden=geo.hidden, intermediate=geo.intermediate, num_experts=geo.num_experts,
        tp=par.ranks, ep=par.use_ep, k3_minimum=k3_minimum, attn_tp=target.tp,
        align=HOPPER_MMA_ALIGN if kernel_layout == "hopper_mma" else 1,
        align_rule=f"{kernel_layout} layout: {HOPPER_MMA_ALIGN}")
    vg = None if walk.pick is None else padded_geometry(
        backend=walk.pick, platform=arch.platform, cdna=arch.cdna,
        activation=model.activation.name if model.moe_method == "mxfp4" else None,
        hidden=geo.hidden, intermediate=geo.intermediate, num_experts=geo.num_experts,
        tp=par.ranks, ep=par.use_ep, k3_minimum=k3_minimum, attn_tp=target.tp)
    notes.extend(final.notes)
    if par.note:
        notes.append(par.note)
    if g.k3_rule:
        notes.append(g.k3_rule + ".")
    if "AITER_BF16_FP8_MOE_BOUND" in final.runtime_env:
        notes.append("AITER_BF16_FP8_MOE_BOUND=0 is process-global: vLLM sets it while "
                     "converting the weights, so a server loading these bytes must set it.")
    if model.moe_method == "quark" and model.quant_scheme not in QUARK_SCHEME_KEYS:
        notes.append(f"Quark scheme {model.quant_scheme}: vLLM's oracle does not select a "
                     "backend for it; EMULATION dequantises every forward pass.")
    declared = ct_methods.declared_act_note(model, walk.pick)
    if declared:
        notes.append(declared)
    override = _override_note(model, target, rel)
    if override:
        notes.append(override)
    removed = sorted(set(final.runtime_env) & set(rel.removed_env))
    assert not removed, f"{rel.label} no longer reads {removed}"  # the release's data says so
    assumed = server.assumptions(arch, model.moe_method == "quark")
    notes.append("Modelled vLLM server: " + ", ".join(assumed) + ".")

    return Decision(
        arch=arch.name,
        backend=backend,
        activation=model.activation.name,
        activation_params={k: float(v) for k, v in model.activation.params.items()},
        act_quant=final.act_quant,
        tp=par.ranks,
        ep=par.use_ep,
        hidden=g.hidden,
        hidden_padded=g.hidden_padded,
        intermediate=g.intermediate,
        intermediate_per_rank=g.intermediate_per_rank,
        intermediate_per_rank_padded=g.intermediate_per_rank_padded,
        num_experts=g.num_experts,
        experts_per_rank=g.experts_per_rank,
        top_k=geo.top_k,
        layout=final.layout,
        scale_pad_byte=0x01 if model.moe_method == "quark" else 0x00,
        runtime_env=dict(final.runtime_env),
        gate_mode=final.gate_mode,
        is_shuffled=final.is_shuffled,
        candidates=tuple(candidates),
        notes=tuple(notes),
        options={
            "vllm_release": rel.version,
            "aiter": target.aiter,
            "requested_act_quant": target.act_quant,
            "forced_backend": target.backend,
            "selector": walk.selector,
            "converter": converter_of(model, rel),
            "vllm_backend": walk.pick,
            "vllm_expert_class": walk.cls,
            "vllm_raises": raises,
            "vllm_hidden_padded": vg.hidden_padded if vg else None,
            "vllm_intermediate_padded": vg.intermediate_per_rank_padded if vg else None,
            "producible": producible,
            "kernel_act": final.kernel_act,
            "alignment_rule": g.rule,
            "hidden_pad": g.hidden_padded - g.hidden,
            "intermediate_pad": g.intermediate_per_rank_padded - g.intermediate_per_rank,
            "quark_literal_deinterleave": server.quark_literal_deinterleave,
            "kernel_layout": kernel_layout,
            "serving_kernel": kernel,
            "requested_layout": target.layout,
            "moe_weight": target.moe_weight,
            "vllm_int4_requant": walk.int4,
            "vllm_runtime_env": vllm_env,
        },
        parallel=par,
    )


SERVER_ACT = {"fp8": "fp8_per_tensor_static", "mxfp4": "mxfp4", "bf16": "null"}


def _override_note(model: MoEModel, target: Target, release: Release) -> str | None:
    """The server option an --act-quant request stands for (gpt-oss and Quark methods)."""
    if model.moe_method not in ("gpt_oss_mxfp4", "quark") or target.act_quant == "auto":
        return None
    model_key, selected = _model_key(model)
    if not selected or (target.act_quant == "bf16" and model_key is None):
        return None
    text = (f"--act-quant {target.act_quant} is the server's --quantization-config.moe.activation "
            f"{SERVER_ACT[target.act_quant]}")
    if model_key is not None and ACT_OVERRIDE.get(target.act_quant) != model_key:
        text += (f"; it overrides the checkpoint's declared {KEY_TEXT[model_key]} activations "
                 f"({release.label} logs a warning and serves the override)")
    return text + "."


def _int4_ctx(model: MoEModel, target: Target, arch: Arch, release: Release) -> Ctx:
    """What _use_k3_situ_int4_gfx942 reads, for the note saying why it does not apply."""
    return Ctx(arch=arch, aiter=target.aiter, server=Server(), quark_checkpoint=False,
               activation=model.activation.name, act_key=None, routing=model.routing,
               num_local_experts=model.geometry.num_experts, moe_weight=target.moe_weight,
               release=release)


def _kernel_layout(target: Target, arch: Arch, backend: str, final: KernelFormat) -> str:
    """The EMULATION layout mxfp4conv writes: ``--layout``, or for ``auto`` hopper_mma where
    mxfp4conv's Triton kernel serves the layer on Hopper (sm90, bf16 activations)."""
    if backend != "EMULATION":
        if target.layout != "auto":
            raise OracleError(
                f"--layout {target.layout} chooses the layout of mxfp4conv's EMULATION format, but this "
                f"target is served by {backend}, whose layout is fixed; drop --layout, or pass "
                "--backend emulation.")
        return "identity"
    if target.layout != "auto":
        return target.layout
    return "hopper_mma" if arch.name == "sm90" and final.kernel_act == "bf16" else "identity"


def _k3_minimum(model: MoEModel) -> int | None:
    """Kimi-K3's min_moe_intermediate_per_partition (any export of a K3 model: SiTU)."""
    if "min_moe_intermediate_per_partition" in model.extra:
        return int(model.extra["min_moe_intermediate_per_partition"])
    if model.family == "kimi_k3" or model.activation.name == "situ":
        return K3_MIN_INTERMEDIATE_PER_PARTITION
    return None


def vllm_literal_w13_rows(intermediate: int) -> list[int]:
    """Row order vLLM's converter G feeds to GU16 when it de-interleaves rows that are
    already ``[gate; up]`` (Quark w_mxfp4): canonical rows 0::2, then 1::2."""
    rows = range(2 * intermediate)
    return list(rows[0::2]) + list(rows[1::2])
