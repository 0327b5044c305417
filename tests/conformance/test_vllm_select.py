"""Conformance: mxfp4conv's statement of each vLLM release's MoE decision against that release.

For every release of ``harness.versions()`` (0.33.0 and 0.34.0; ``MXFP4CONV_VLLM_VERSIONS``
names others, or wheel paths) and every case of ``matrix.cases()``, the real
``Mxfp4MoEMethod`` / ``GptOssMxfp4MoEMethod`` / ``QuarkOCP_MX_MoEMethod`` of that wheel is
built on an emulated platform
(``vllm_code.harness``; the stubs it installs are listed in ``vllm_code/stubs.py`` and
``vllm_code/worker.py`` and printed by ``test_stubs_listed``) and its backend pick and expert
class (or the error it raises), ``maybe_roundup_sizes`` and the environment it writes are
compared with ``decide()`` for the release mxfp4conv models for it (``Target.vllm``). The weight
converters are compared in ``test_vllm_convert``; ``python -m conformance.report`` prints the
disagreements of both as a table.
"""

from __future__ import annotations

import pytest

from conformance.compare import probe_all, selection_rows
from conformance.matrix import cases, for_release
from vllm_code.harness import require_vllm, versions

CASES = cases()
VERSIONS = versions()


@pytest.fixture(scope="module", params=VERSIONS)
def vllm_results(request) -> tuple[str, dict[str, dict]]:
    src = require_vllm(request.param)
    return request.param, probe_all(src, CASES, STUBS_USED)


STUBS_USED: dict[str, dict[str, str]] = {}


def test_stubs_listed(vllm_results):
    """Every stand-in the runs used is named with its reason (printed with -s)."""
    for platform, used in sorted(STUBS_USED.items()):
        assert used and all(isinstance(v, str) and v for v in used.values()), platform
        print(f"{platform}: " + "; ".join(f"{k} ({v})" for k, v in sorted(used.items())))
    assert "aiter" in STUBS_USED["gfx950"] and "amdsmi" in STUBS_USED["gfx950"]
    assert "aiter" not in STUBS_USED["sm90"] and "flashinfer" in STUBS_USED["sm90"]


def test_matrix_size():
    assert len(CASES) >= 300
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_matches_vllm(case, vllm_results):
    version, results = vllm_results
    rows = selection_rows(for_release(case, version), results[case.id])
    assert not rows, "\n".join(f"{case.id} [vLLM {version}] {f}: mxfp4conv {a!r}, vLLM {b!r}" for f, a, b in rows)
