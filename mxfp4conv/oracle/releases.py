"""The vLLM releases the oracle models: the decision is a function of the release.

Only vLLM 0.33.0 (November 2026) is modelled; its facts (backends, gates, priority lists,
round-up rules, converter branches, server environment) live in ``backends``, ``roundup``
and ``formats``. ``--vllm`` names the release; a manifest records it and the loader refuses
a manifest decided for another one.
"""

from __future__ import annotations

from mxfp4conv.errors import OracleError

RELEASES = {"0.33": "0.33.0"}  # release -> the exact version whose code was modelled
DEFAULT_RELEASE = "0.33"


def resolve_release(value: str | None) -> str:
    """Canonical release ('0.33') for ``value`` ('0.33', '0.33.0', 'v0.33'; None = newest)."""
    if value is None:
        return DEFAULT_RELEASE
    raw = str(value).strip().lower().removeprefix("v")
    key = ".".join(raw.split("+")[0].split(".")[:2])
    if key not in RELEASES or (raw.count(".") >= 2 and raw != RELEASES[key]):
        known = ", ".join(f"{r} ({v})" for r, v in RELEASES.items())
        raise OracleError(
            f"Unknown --vllm release {value!r}: mxfp4conv models vLLM {known}. Pass --vllm "
            f"{DEFAULT_RELEASE}, or check another release against vLLM's own code with the "
            "conformance suite (tests/conformance) before relying on a plan for it.")
    return key


def release_version(release: str) -> str:
    return RELEASES[resolve_release(release)]
