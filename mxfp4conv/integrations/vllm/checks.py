"""Does a converted checkpoint fit the live vLLM layer, and how is it loaded into it?

``check_layer`` compares one MoE layer of the manifest with the ``EngineFacts`` of the vLLM
layer it lands in and returns a ``LayerPlan``; any mismatch is refused with one paragraph naming
the manifest's value and the server's. Plain data in, plain data out: no vLLM import.

The vLLM release a manifest records does not bind: the live checks here (backend pick, padded
sizes, activation) decide whether the checkpoint fits, and for ``kernel_ready`` bytes the engine
itself judges them at load (``judge``: a canary layer converted by the live vLLM, and every
converted parameter checked afterwards). A checkpoint from another release is loaded with one
log line saying so.

Load modes:
- ``kernel_ready``: the checkpoint holds the bytes vLLM's own conversion produces for the backend
  vLLM picked (AITER layouts); vLLM's conversion is skipped and its kernel built on them.
- ``vllm_transforms``: the checkpoint holds identity bytes and vLLM's backend transforms them
  itself (CPU prepack, EMULATION, triton_kernels swizzles), or a layout vLLM's converter
  cannot be handed ready-made (triton_kernels objects): the bytes, brought back to the identity
  layout with the layouts' inverses, are loaded as vLLM's weight loader would leave them and
  vLLM's usual ``process_weights_after_loading`` runs.
- ``mxfp4conv_kernel``: a CUDA target written in mxfp4conv's own format for its kernel (EMULATION,
  identity or hopper_mma; ``serving_kernel`` ``mxfp4conv`` in the manifest: sm90's default, or
  ``--layout`` elsewhere): the layer runs mxfp4conv's Triton MoE kernel in place of vLLM's pick.
  On other NVIDIA targets the default output keeps vLLM's pick (``vllm_transforms``, or
  ``kernel_ready`` where mxfp4conv writes its converted layout).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from mxfp4conv.errors import RuntimeInputError
from mxfp4conv.integrations.vllm.facts import METHODS, EngineFacts
from mxfp4conv.integrations.vllm.weights import KERNEL_READY
from mxfp4conv.runtime.experts import WEIGHT_KINDS

MXFP4CONV_FORMAT = "EMULATION"  # the backend name of mxfp4conv's own format
# what mxfp4conv's Triton kernel reads
OWN_LAYOUTS = ("identity", "hopper_mma_w", "hopper_mma_w_rot", "hopper_mma_w_xor", "hopper_mma_s")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerPlan:
    prefix: str  # the manifest's (checkpoint) module prefix
    mode: str  # kernel_ready | vllm_transforms | mxfp4conv_kernel
    rank: int  # the manifest rank this worker reads
    # EPLB with redundant experts: the logical experts of this worker's physical slots, gathered
    # from the ranks that hold them; None: the manifest rank as written
    experts: tuple[int, ...] | None = None


def release_of(version: str) -> str:
    """'0.33.0' -> '0.33' (a release is what the oracle models; patch versions share it)."""
    parts = str(version).split("+")[0].split(".")
    return ".".join(parts[:2])


def manifest_release(manifest: dict[str, Any]) -> str | None:
    """The vLLM release a manifest was decided for, when it records one."""
    value = manifest.get("vllm")
    if isinstance(value, dict):
        value = value.get("release") or value.get("version")
    if value is None:
        value = manifest.get("target", {}).get("vllm")
    return None if value is None else release_of(str(value))


def manifest_vllm_backend(manifest: dict[str, Any]) -> str:
    """The backend vLLM's oracle picks for the manifest's target (what the server must pick)."""
    t = manifest["target"]
    return str((t.get("options") or {}).get("vllm_backend") or t["backend"])


def _stored_layouts(manifest: dict[str, Any]) -> dict[str, str]:
    layout = manifest.get("layout") or {}
    return {k: str(layout.get(k, "identity")) for k in WEIGHT_KINDS}


def _refuse(where: str, prefix: str, facts: EngineFacts, what: str, ours: Any, theirs: Any, fix: str) -> RuntimeInputError:
    return RuntimeInputError(
        f"{where}: MoE layer {prefix!r} was converted for {what + ' ' if what else ''}{ours}, but this vLLM server "
        f"(layer {facts.layer!r}, vLLM {facts.vllm_release}, {facts.arch}) has {theirs}. {fix}"
    )


def _runs_mxfp4conv_kernel(target: dict[str, Any], written: str) -> bool:
    """mxfp4conv's own format, meant for its kernel: the manifest's ``serving_kernel`` says so (an
    EMULATION format that vLLM's own EMULATION backend serves says ``vllm``); manifests that predate
    it ran mxfp4conv's kernel for every EMULATION format on CUDA."""
    kernel = (target.get("options") or {}).get("serving_kernel")
    return written == MXFP4CONV_FORMAT and (kernel is None or kernel == "mxfp4conv")


def check_layer(manifest: dict[str, Any], facts: EngineFacts, prefix: str, where: str) -> LayerPlan:
    """Refuse unless the manifest's layer ``prefix`` fits the live layer; say how to load it."""
    t, moe = manifest["target"], manifest["moe"]

    def refuse(what, ours, theirs, fix):
        return _refuse(where, prefix, facts, what, ours, theirs, fix)

    if facts.method not in METHODS:
        raise refuse("vLLM's MXFP4 MoE methods", "(" + ", ".join(METHODS) + ")", f"quant method {facts.method}",
                     "Serve it with the quantization vLLM picks for the source checkpoint (do not pass --quantization).")
    if str(t["arch"]).lower() != facts.arch:
        raise refuse("arch", t["arch"], f"a {facts.arch} device",
                     f"Serve it on {t['arch']}, or convert the source again with --arch {facts.arch}.")
    rank, experts = _check_layout(manifest, facts, prefix, where)
    picked = manifest_vllm_backend(manifest)
    if facts.backend != picked:
        raise refuse("the MoE backend vLLM picks there,", picked, f"vLLM's oracle picking {facts.backend}",
                     "Serve it with the settings it was converted for (the manifest's runtime_env, --moe-backend), "
                     f"or convert the source again for this server (`mxfp4conv plan` shows why vLLM picks {facts.backend}).")
    activation = str(t["activation"]).lower()
    if activation != facts.activation:
        raise refuse("activation", activation, f"activation {facts.activation}",
                     "The checkpoint's config and the converted experts disagree; convert the source again.")

    stored = _stored_layouts(manifest)
    written = str(t["backend"])
    identity = all(v == "identity" for v in stored.values())
    if _runs_mxfp4conv_kernel(t, written) and facts.platform == "cuda" and all(v in OWN_LAYOUTS for v in stored.values()):
        mode = "mxfp4conv_kernel"
        if "serving_kernel" not in (t.get("options") or {}) and facts.arch != "sm90":
            log.warning("%s: %s was converted by an mxfp4conv that wrote its own format for %s by default: "
                        "mxfp4conv's Triton kernel replaces vLLM's %s here, which is not measured on %s. "
                        "Convert the source again to keep vLLM's kernel.", where, prefix, facts.arch,
                        facts.backend, facts.arch)
    elif not identity and written == facts.backend and (facts.method, written, activation == "situ") in KERNEL_READY:
        mode = "kernel_ready"
    else:  # identity bytes, or a layout vLLM's converter cannot be handed: undone at load, vLLM converts
        mode = "vllm_transforms"

    release = manifest_release(manifest)
    if release is not None and release != release_of(facts.vllm_release):
        judged = ("the live vLLM converts a canary layer and must agree with the bytes"
                  if mode == "kernel_ready" else "this vLLM converts the bytes (or mxfp4conv's kernel runs them)")
        log.info("%s: %s was decided for vLLM %s and is served by vLLM %s: %s; the backend, sizes and activation "
                 "checked here agree", where, prefix, release, facts.vllm_release, judged)
    if mode != "mxfp4conv_kernel":
        geometry = (("hidden size (padded)", moe["hidden_padded"], facts.hidden_padded),
                    ("intermediate size per rank (padded)", moe["intermediate_per_rank_padded"], facts.intermediate_padded),
                    ("experts per rank", len(experts) if experts else moe["experts_per_rank"], facts.local_experts))
        for what, ours, theirs in geometry:
            if int(ours) != theirs:
                raise refuse(what, ours, f"{what} {theirs} in vLLM's parameters",
                             "vLLM rounds sizes up for the backend it picks; convert the source again for this server.")
    if activation == "situ" and mode == "kernel_ready":
        _check_situv2(manifest, facts, stored, refuse)
    if experts is not None and mode == "mxfp4conv_kernel":
        raise refuse("", "mxfp4conv's own kernel", "EPLB with redundant experts",
                     "mxfp4conv's kernel is loaded by its runtime rank by rank, without redundant copies; serve "
                     "without redundant experts, or convert for vLLM's own backend (--backend PICK) so that the "
                     "plugin gathers the copies into vLLM's parameters.")
    return LayerPlan(prefix=prefix, mode=mode, rank=rank, experts=experts)


def server_layout(facts: EngineFacts) -> str:
    """The live server's layout in the words of ``MoeParallel.describe``."""
    server = f"tp {facts.server_tp} x dp {facts.dp_size}" + (f" x pcp {facts.pcp_size}" if facts.pcp_size > 1 else "")
    if facts.use_ep:
        moe = f"EP over {facts.ep_size} ranks, {facts.placement} placement"
    else:
        moe = f"MoE tensor parallel over {facts.tp_size} rank{'s' if facts.tp_size != 1 else ''}"
    return f"{server}{' with expert parallel' if facts.use_ep else ''} (MoE: {moe})"


def _serve_command(par) -> str:
    flags = [f"--tensor-parallel-size {par.tp}"] + ([f"--data-parallel-size {par.dp}"] if par.dp > 1 else [])
    if par.use_ep:
        flags.append("--enable-expert-parallel")
        if par.placement == "round_robin":
            flags.append("--expert-placement-strategy round_robin")
            if par.dp > 1:
                flags.append(f"--all2all-backend {par.all2all}")
    return " ".join(flags)


def _convert_flags(facts: EngineFacts) -> str:
    flags = [f"--tp {facts.server_tp}"] + ([f"--dp {facts.dp_size}"] if facts.dp_size > 1 else [])
    if facts.use_ep:
        flags.append("--ep")
        if facts.placement == "round_robin":
            flags.append("--placement round_robin")
    return " ".join(flags)


def _check_layout(manifest: dict[str, Any], facts: EngineFacts, prefix: str, where: str) -> int:
    """The manifest's MoE rank for this worker; refuses a layout other than the manifest's (one
    paragraph naming both) and EPLB's redundant experts. A server whose tp / dp differ but whose
    MoE layers are laid out the same (tp 4 against dp 2 x tp 2 without EP) reads the same bytes."""
    from mxfp4conv.runtime.loader import parallel_layout

    par = parallel_layout(manifest)
    head = f"{where}: MoE layer {prefix!r} (vLLM layer {facts.layer!r}, vLLM {facts.vllm_release})"
    num_experts = int(manifest["moe"]["num_experts"])
    if facts.global_experts and facts.global_experts != num_experts:
        redundant = facts.global_experts - (facts.logical_experts or num_experts)
        if facts.enable_eplb and redundant > 0 and (facts.logical_experts or num_experts) == num_experts:
            return _eplb_rank(par, facts, head, redundant)
        raise RuntimeInputError(
            f"{head}: the layer holds {facts.global_experts} experts, the checkpoint {num_experts}. Convert the "
            f"source again for this model.")
    moe_same = (par.use_ep == facts.use_ep and par.ranks == facts.parallel_size
                and (not par.use_ep or par.placement == facts.placement))
    rank = facts.parallel_rank
    if moe_same and 0 <= rank < par.ranks and facts.expert_ids and tuple(par.experts(rank)) != facts.expert_ids:
        moe_same = False  # same sizes, other experts on this rank
    if moe_same and not 0 <= rank < par.ranks:
        raise RuntimeInputError(
            f"{head}: this worker is MoE rank {rank}, but the checkpoint ({par.describe()}) holds ranks "
            f"0..{par.ranks - 1}. Check the server's parallel configuration.")
    if not moe_same:
        raise RuntimeInputError(
            f"{head}: the checkpoint was converted for {par.describe()}, but this server runs "
            f"{server_layout(facts)}; MoE rank {rank} here holds "
            f"{'experts ' + _few(facts.expert_ids) if facts.use_ep else 'a 1/' + str(facts.tp_size) + ' slice of every expert'}"
            f", the checkpoint's rank {rank} "
            f"{'experts ' + _few(tuple(par.experts(rank))) if par.use_ep and rank < par.ranks else 'another share'}. "
            f"Serve it with {_serve_command(par)}, or convert the source again with {_convert_flags(facts)}.")
    if (par.tp, par.dp) != (facts.server_tp, facts.dp_size):
        log.info("%s: converted for %s, served with %s: the MoE layers are laid out the same, MoE rank %d "
                 "reads the same bytes", where, par.describe(), server_layout(facts), rank)
    return rank, None


def _eplb_rank(par, facts: EngineFacts, head: str, redundant: int) -> tuple[int, tuple[int, ...]]:
    """EPLB with redundant experts: vLLM's initial placement (E + R physical experts placed
    linearly, physical p holding logical p, then (p - E) mod E) over the checkpoint's EP ranks,
    each worker's physical slots filled with the logical experts' bytes from the ranks holding them."""
    from mxfp4conv.format.parallel import eplb_initial_logical

    rank = facts.ep_rank
    if not (facts.use_ep and par.use_ep and par.placement == "linear" and par.ranks == facts.ep_size):
        raise RuntimeInputError(
            f"{head}: the server runs EPLB with {redundant} redundant experts over {server_layout(facts)}, but the "
            f"checkpoint was converted for {par.describe()}; EPLB's initial placement needs the checkpoint's expert "
            f"parallel ranks, linear placement. Serve it with {_serve_command(par)} --enable-eplb, or convert the "
            f"source again with {_convert_flags(facts)} --placement linear.")
    physical = facts.global_experts
    per = physical // facts.ep_size
    mine = tuple(range(rank * per, (rank + 1) * per))
    if physical % facts.ep_size or (facts.expert_ids and facts.expert_ids != mine):
        raise RuntimeInputError(
            f"{head}: EPLB places {physical} physical experts over {facts.ep_size} ranks in a way other than "
            f"vLLM's initial linear placement (rank {rank} holds physical experts "
            f"{_few(facts.expert_ids)}); serve the source checkpoint with vLLM's own loader.")
    return rank, eplb_initial_logical(par, physical, rank)


def _few(ids: tuple[int, ...]) -> str:
    return ",".join(map(str, ids)) if len(ids) <= 8 else ",".join(map(str, ids[:4])) + ",..," + str(ids[-1])


def _check_situv2(manifest, facts: EngineFacts, stored: dict[str, str], refuse) -> None:
    """The SiTUv2 mode the bytes were written for (the runtime's reading of the manifest) must be
    the one vLLM's AITER ops run."""
    from mxfp4conv.runtime.act_quant import served_act_quant
    from mxfp4conv.runtime.situv2 import ENV

    env = {str(k): str(v) for k, v in (manifest.get("runtime_env") or {}).items()}
    _, want = served_act_quant(manifest["target"], env, stored, "the manifest")
    if want is not None and facts.situv2 != want:
        pinned = f" ({ENV}={env[ENV]})" if ENV in env else ""
        raise refuse("SiTUv2 mode", f"{want}{pinned} (w13 layout {stored['w13']})",
                     f"SiTUv2 mode {facts.situv2}" if facts.situv2 else "no AITER SiTUv2 MoE",
                     f"Set {ENV} as the manifest's runtime_env says (the plugin applies it before the model "
                     "is built), or convert the source again for this mode.")
