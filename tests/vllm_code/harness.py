"""Run a vLLM release's own Python code on an emulated platform, in a child process.

vLLM is never imported into the test process: each call starts one worker process for one
platform, which puts the pure-Python files of a ``vllm`` wheel on ``sys.path``,
installs the stubs of ``stubs.STUBS`` (plus the platform's own, ``PLATFORM_STUBS``), makes
vLLM's platform detection answer the requested GPU, runs a *probe* function once per case
and sends the results back as JSON.

API (all importable without vLLM)::

    from tests.vllm_code.harness import PLATFORMS, require_vllm, run_probe

    src = require_vllm()            # vLLM 0.33.0's extracted tree; pytest.skip(...) if unavailable
    src = require_vllm("0.34.0")    # another release (VERSIONS), or a wheel file's path
    results = run_probe("gfx950", "tests/vllm_code/probe_moe.py:probe", cases, src=src)

- ``PLATFORMS``: ``gfx942``, ``gfx950``, ``gfx1250`` (ROCm, emulated through a fake amdsmi),
  ``sm90``, ``sm100``, ``sm120`` (CUDA, capability pinned), ``cpu`` (vLLM's CPU platform, x86 with
  AMX) and ``cpu-noamx``.
- ``run_probe(platform, probe, cases, src=None, env=None, timeout=600)``: ``probe`` is
  ``"path/to/file.py:function"`` (relative to the repository root or absolute); the worker
  calls ``function(case)`` for every JSON-able ``case`` dict and returns its JSON-able
  result, or ``{"raised": ExceptionType, "message": str}`` when it raised. ``env`` is set
  before vLLM is imported; a probe may set per-case variables itself (see ``probe_moe``).
  ``packages`` adds (True) or removes (False) optional stubbed packages (``quark``,
  ``flashinfer``, ``deep_gemm``, ``aiter``; see ``worker.OPTIONAL_STUBS``).
  Every result list carries the stub set in ``results.stubs``.
- ``vllm_source(version)``: the extracted tree of that release or the reason it cannot be had
  (``VllmUnavailable``); ``require_vllm(version)`` turns that into a pytest skip. ``version``
  is a release number (``0.33.0``, the default, ``0.34.0``: ``VERSIONS`` lists those the suite
  runs against) or the path of a ``vllm-*.whl`` (a release not modelled yet).
- ``source_version(src)``: the version of an extracted tree (from its wheel's name).
- ``flashinfer_source()`` / ``require_flashinfer()``: FlashInfer's Python files (``FLASHINFER_VERSION``,
  from the wheel cache, fetched with ``pip download --no-deps`` when missing), for the probes that
  run vLLM's TRTLLM conversion with FlashInfer's own functions (``flashinfer_cpu``).
- ``versions()``: the releases a run checks (``VERSIONS``, or ``$MXFP4CONV_VLLM_VERSIONS``).

Wheels: ``$MXFP4CONV_WHEEL_CACHE`` (default ``~/.cache/mxfp4conv-wheels``) holds
``vllm-<version>-*.whl``; when one is missing it is fetched with
``pip download --no-deps vllm==<version>`` (240-340 MB; a line on stderr says so; set
``MXFP4CONV_NO_WHEEL_DOWNLOAD=1`` to skip instead). Its ``*.py`` files are extracted once next
to it (``vllm-<version>-py/``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VLLM_RELEASE = "0.33.0"  # the default release of the suite
VERSIONS = ("0.33.0", "0.34.0")  # the releases the conformance suite runs against


def versions() -> tuple[str, ...]:
    """The releases (or wheel paths) a run checks: ``$MXFP4CONV_VLLM_VERSIONS`` (comma-separated
    versions or ``vllm-*.whl`` paths: a release not modelled yet), else ``VERSIONS``."""
    raw = os.environ.get("MXFP4CONV_VLLM_VERSIONS", "")
    return tuple(v.strip() for v in raw.split(",") if v.strip()) or VERSIONS
HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
WORKER = HERE / "worker.py"

# name -> (vLLM platform kind, device detail)
PLATFORMS: dict[str, dict] = {
    "gfx942": {"kind": "rocm", "gcn_arch": "gfx942"},
    "gfx950": {"kind": "rocm", "gcn_arch": "gfx950"},
    "gfx1250": {"kind": "rocm", "gcn_arch": "gfx1250"},
    "sm90": {"kind": "cuda", "capability": [9, 0]},
    "sm100": {"kind": "cuda", "capability": [10, 0]},
    "sm120": {"kind": "cuda", "capability": [12, 0]},
    "cpu": {"kind": "cpu", "amx": True},
    "cpu-noamx": {"kind": "cpu", "amx": False},
}


class VllmUnavailable(RuntimeError):
    pass


class ProbeResults(list):
    """The per-case results of one worker run, with the stubs that run used."""

    stubs: dict[str, str]


def cache_dir() -> Path:
    return Path(os.environ.get("MXFP4CONV_WHEEL_CACHE",
                               Path.home() / ".cache" / "mxfp4conv-wheels")).expanduser()


def _cached_wheel(dist: str, version: str, size: str) -> Path:
    """The cached ``dist==version`` wheel, fetched with ``pip download --no-deps`` when missing."""
    d = cache_dir()
    pattern = f"{dist.replace('-', '_')}-{version}-*.whl"
    found = sorted(d.glob(pattern))
    if found:
        return found[0]
    if os.environ.get("MXFP4CONV_NO_WHEEL_DOWNLOAD"):
        raise VllmUnavailable(
            f"the {dist}=={version} wheel is not in {d} and MXFP4CONV_NO_WHEEL_DOWNLOAD is set")
    d.mkdir(parents=True, exist_ok=True)
    print(f"mxfp4conv tests: downloading the {dist}=={version} wheel ({size}) into {d} "
          "for the vLLM conformance tests (MXFP4CONV_NO_WHEEL_DOWNLOAD=1 skips them)", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "-q", "-d", str(d), f"{dist}=={version}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise VllmUnavailable(f"pip download of {dist}=={version} failed: {e}") from None
    found = sorted(d.glob(pattern))
    if r.returncode or not found:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        raise VllmUnavailable(f"pip download of {dist}=={version} failed: {tail[0]}")
    return found[0]


def _wheel(version: str) -> Path:
    if version.endswith(".whl"):
        path = Path(version).expanduser().resolve()
        if not path.is_file():
            raise VllmUnavailable(f"{path} is not a file")
        return path
    return _cached_wheel("vllm", version, "240-340 MB")


def _extracted(wheel: Path, package: str, out: Path) -> Path:
    """``out`` holding the ``package/**/*.py`` files of ``wheel``, extracted once (atomically)."""
    if (out / ".complete").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith(package + "/") and name.endswith(".py"):
                    z.extract(name, tmp)
    except zipfile.BadZipFile as e:
        raise VllmUnavailable(f"{wheel} is not a readable wheel ({e}); delete it to refetch") from None
    (tmp / ".complete").write_text(wheel.name + "\n")
    try:
        tmp.rename(out)
    except OSError:  # another process finished first
        if not (out / ".complete").exists():
            raise
    return out


def wheel_version(wheel: Path) -> str:
    """``vllm-0.34.0-cp38-abi3-...whl`` -> ``0.34.0``."""
    return wheel.name.split("-")[1]


def vllm_source(version: str = VLLM_RELEASE) -> Path:
    """Directory holding ``vllm/`` (the wheel's Python files), extracted once."""
    wheel = None
    if version.endswith(".whl"):
        wheel = _wheel(version)
        version = wheel_version(wheel)
    out = cache_dir() / f"vllm-{version}-py"
    if (out / ".complete").exists():
        return out
    return _extracted(wheel or _wheel(version), "vllm", out)


def source_version(src: Path) -> str:
    """The vLLM version of an extracted tree (``vllm_source``'s result)."""
    return wheel_version(Path((Path(src) / ".complete").read_text().strip()))


def require_vllm(version: str = VLLM_RELEASE) -> Path:
    """``vllm_source(version)``, or skip the calling test with the reason."""
    import pytest

    try:
        return vllm_source(version)
    except VllmUnavailable as e:
        pytest.skip(f"vLLM {version} conformance needs its wheel: {e}")


def run_probe(platform: str, probe: str, cases: list[dict], *, src: Path | None = None,
              env: dict[str, str] | None = None, packages: dict[str, bool] | None = None,
              timeout: float = 600) -> ProbeResults:
    """Results of ``probe(case)`` for each case, computed by vLLM's code on ``platform``."""
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; known: {', '.join(PLATFORMS)}")
    path, _, func = probe.rpartition(":")
    path = str((REPO / path).resolve()) if not os.path.isabs(path) else path
    src = src or vllm_source()
    with tempfile.TemporaryDirectory() as tmp:
        request = Path(tmp) / "request.json"
        answer = Path(tmp) / "answer.json"
        request.write_text(json.dumps({
            "src": str(src), "platform": platform, "spec": {**PLATFORMS[platform], "packages": packages or {}},
            "probe_path": path, "probe_func": func, "cases": cases, "answer": str(answer),
        }))
        child_env = {**os.environ, **(env or {}), "PYTHONPATH": str(HERE)}
        r = subprocess.run([sys.executable, str(WORKER), str(request)], capture_output=True,
                           text=True, timeout=timeout, env=child_env, cwd=tmp)
        if r.returncode or not answer.exists():
            raise RuntimeError(f"vLLM worker for {platform} failed (exit {r.returncode}):\n"
                               + "\n".join((r.stderr or r.stdout).splitlines()[-30:]))
        data = json.loads(answer.read_text())
    out = ProbeResults(data["results"])
    out.stubs = data["stubs"]
    return out


# FlashInfer for vLLM's TRTLLM weight conversion on CPU (``flashinfer_cpu``). vLLM 0.33.0 pins
# flashinfer-python 0.7.2.post1; 0.34.0 pins 0.7.3, which the package index here lacks, so both
# releases' converters run with 0.7.2.post1's functions.
FLASHINFER_VERSION = "0.7.2.post1"


def flashinfer_source(version: str = FLASHINFER_VERSION) -> Path:
    """Directory holding ``flashinfer/`` (the wheel's Python files), extracted once into the wheel
    cache; the wheel is fetched with ``pip download --no-deps`` when missing (62 MB)."""
    out = cache_dir() / f"flashinfer-{version}-py"
    if (out / ".complete").exists():
        return out
    return _extracted(_cached_wheel("flashinfer-python", version, "62 MB"), "flashinfer", out)


def require_flashinfer(version: str = FLASHINFER_VERSION) -> Path:
    """``flashinfer_source(version)``, or skip the calling test with the reason."""
    import pytest

    try:
        return flashinfer_source(version)
    except VllmUnavailable as e:
        pytest.skip(f"vLLM's TRTLLM conversion on CPU needs FlashInfer's Python code: {e}")
