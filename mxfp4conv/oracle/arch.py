"""Target architectures the oracle knows, with the facts vLLM's gates look at.

ROCm archs carry their CDNA version (``get_cdna_version``: gfx942 = 3, gfx950 = 4,
gfx1250 = 5); CUDA archs their compute capability; ``cpu`` is vLLM's CPU platform.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mxfp4conv.errors import OracleError


@dataclass(frozen=True)
class Arch:
    name: str
    platform: str  # "rocm" | "cuda" | "cpu"
    cdna: int | None = None  # ROCm only
    capability: tuple[int, int] | None = None  # CUDA only

    @property
    def is_rocm(self) -> bool:
        return self.platform == "rocm"

    @property
    def is_cuda(self) -> bool:
        return self.platform == "cuda"

    @property
    def is_cpu(self) -> bool:
        return self.platform == "cpu"

    @property
    def cuda_family(self) -> int | None:
        """vLLM's ``is_device_capability_family``: 100 for sm100/sm103, 120 for sm120/121."""
        if self.capability is None:
            return None
        return self.capability[0] * 10

    @property
    def on_gfx9(self) -> bool:
        return self.name in ("gfx90a", "gfx942", "gfx950")

    @property
    def on_gfx1x(self) -> bool:
        # RDNA3/4; vLLM's predicate excludes gfx1250, the only gfx12xx arch modelled here.
        return self.name.startswith("gfx1") and self.name != "gfx1250"

    @property
    def on_gfx950(self) -> bool:
        return self.name == "gfx950"

    @property
    def on_gfx1250(self) -> bool:
        return self.name == "gfx1250"

    def describe(self) -> str:
        if self.is_rocm:
            return f"{self.name} (ROCm, CDNA{self.cdna})"
        if self.is_cuda:
            major, minor = self.capability  # type: ignore[misc]
            return f"{self.name} (CUDA, compute capability {major}.{minor})"
        return f"{self.name} (CPU)"


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("gfx942", "rocm", cdna=3),
    Arch("gfx950", "rocm", cdna=4),
    Arch("gfx1250", "rocm", cdna=5),
    Arch("sm90", "cuda", capability=(9, 0)),
    Arch("sm100", "cuda", capability=(10, 0)),
    Arch("sm120", "cuda", capability=(12, 0)),
    Arch("cpu", "cpu"),
)}

# Product names. MoE backend selection in vLLM 0.33 / 0.34 asks a CUDA device for its capability
# family (10.x, 12.x), has_device_capability(100) or the set {10.0, 10.3}: capability 10.3 (B300,
# GB300) decides exactly as 10.0, so it is sm100 here, as the vLLM plugin names a live 10.x device.
ALIASES: dict[str, str] = {
    "mi300x": "gfx942", "mi300a": "gfx942", "mi308x": "gfx942", "mi325x": "gfx942",
    "mi350x": "gfx950", "mi355x": "gfx950",
    "h100": "sm90", "h200": "sm90", "h20": "sm90", "h800": "sm90", "gh200": "sm90",
    "b200": "sm100", "gb200": "sm100", "b300": "sm100", "gb300": "sm100", "sm103": "sm100",
}


def normalise(name: str) -> str:
    """``name`` as the tables spell it: lower case, and CUDA's ``sm_90a`` / ``sm_100f`` spellings
    (an underscore, the arch-specific ``a`` and family ``f`` suffixes) as ``sm90`` / ``sm100``."""
    key = (name or "").strip().lower().replace("-", "").replace(" ", "")
    m = re.fullmatch(r"sm_?(\d+)[af]?", key)
    return f"sm{m.group(1)}" if m else key


def platform_of(name: str) -> str | None:
    """The platform a (possibly mistyped) arch name points at, from how it starts."""
    key = normalise(name)
    if key.startswith(("gfx", "mi")):
        return "rocm"
    if key.startswith(("sm", "h", "b", "gb", "gh")):
        return "cuda"
    return "cpu" if key.startswith("cpu") else None


def names(platform: str | None = None) -> list[str]:
    """Every arch name and alias, of one platform if given."""
    return [n for n in [*ARCHS, *ALIASES] if platform is None or ARCHS[ALIASES.get(n, n)].platform == platform]


def resolve_arch(name: str) -> str:
    """Canonical arch name for ``name`` (case-insensitive; aliases such as mi355x, h200; sm_90a)."""
    key = normalise(name)
    key = ALIASES.get(key, key)
    if key not in ARCHS:
        known = ", ".join(ARCHS)
        aliases = ", ".join(f"{a} -> {c}" for a, c in ALIASES.items())
        raise OracleError(
            f"Unknown target arch {name!r}. Known archs: {known}; aliases: {aliases}. "
            "Pass one of them with --arch."
        )
    return key


def get_arch(name: str) -> Arch:
    return ARCHS[resolve_arch(name)]
