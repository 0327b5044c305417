"""Conformance: mxfp4conv's statement of vLLM 0.33.0's MoE decision against vLLM 0.33.0 itself.

For every case of ``matrix.cases()`` the real ``Mxfp4MoEMethod`` / ``GptOssMxfp4MoEMethod`` /
``QuarkOCP_MX_MoEMethod`` of the ``vllm==0.33.0`` wheel is built on an emulated platform
(``vllm033.harness``; the stubs it installs are listed in ``vllm033/stubs.py`` and
``vllm033/worker.py`` and printed by ``test_stubs_listed``) and its backend pick (or the error
it raises) is compared with ``decide()``.
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest

from conformance.matrix import cases, vllm_case
from mxfp4conv.errors import OracleError
from mxfp4conv.oracle import decide
from vllm033.harness import require_vllm, run_probe

PROBE = "tests/vllm033/probe_moe.py:probe"
CASES = cases()


@pytest.fixture(scope="module")
def vllm_results() -> dict[str, dict]:
    src = require_vllm()
    groups = defaultdict(list)
    for c in CASES:
        groups[c.platform].append(c)

    def run(platform):
        found = run_probe(platform, PROBE, [vllm_case(c) for c in groups[platform]], src=src)
        return {c.id: r for c, r in zip(groups[platform], found)}

    out: dict[str, dict] = {}
    with ThreadPoolExecutor(2) as pool:
        for part in pool.map(run, list(groups)):
            out.update(part)
    return out


def test_matrix_size():
    assert len(CASES) >= 300
    assert len({c.id for c in CASES}) == len(CASES)


# The first slice compared: cases whose backend statement is modelled for 0.33.0 already.
BACKEND_CASES = [c for c in CASES if c.platform in ("gfx950", "gfx942", "sm100")
                 and c.model_name in ("k3", "dsv4") and c.target.act_quant == "auto"]


@pytest.mark.parametrize("case", BACKEND_CASES, ids=lambda c: c.id)
def test_backend(case, vllm_results):
    got = vllm_results[case.id]
    assert "traceback" not in got, got
    try:
        mine = decide(case.model, case.target).options["vllm_backend"]
    except OracleError as e:
        mine = f"refused: {e}"
    assert mine == got.get("backend"), (case.id, got)
