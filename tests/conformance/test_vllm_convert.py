"""Conformance of the weight layouts: what each vLLM release's own converter leaves in memory
against what mxfp4conv's layout recipe for that release writes, byte for byte (the releases of
``harness.versions()``: 0.33.0 and 0.34.0).

For every distinct (arch, checkpoint family / MoE method, backend, activation and SiTUv2 mode,
tensor-parallel size class) of the conformance matrix where mxfp4conv writes vLLM's pick
itself, ``probe_convert`` runs vLLM's ``process_weights_after_loading`` on a tiny layer (two
experts, H = I = 256, seeded bytes; ``vllm_code/tiny_layer.py``) on the emulated platform. The
test then:

- checks that vLLM picked the backend ``decide()`` names;
- puts the same canonical bytes through mxfp4conv's recipe (``get_layout(name).forward``) and
  compares them with the four tensors vLLM keeps (w13, w13 scale, w2, w2 scale), in memory
  order;
- lists the AITER functions vLLM called with their arguments (recorded by the stand-ins);
- checks that the environment vLLM writes while converting is in the manifest's.

Where mxfp4conv states that vLLM's converter raises, the test runs it and checks that it does;
where it states that vLLM converts the canonical bytes itself on NVIDIA (FlashInfer CUTLASS,
CUTLASS W4A4: Python over stubbed library calls), that it converts without raising.

What stands in, and why (see ``probe_convert``): AITER's shuffles are answered by
``mxfp4conv.shuffle.aiter`` (proven against AITER's own vectors in ``test_aiter_golden.py``),
so the comparison proves vLLM's call sequence and pre-processing (gate/up row moves, views,
which function with which flags for which tensor) against mxfp4conv's recipe. aiter's gfx1250
``shuffle_scale_moe`` has no reimplementation as a function: its stand-in returns its input,
the test checks that input and the arguments, and its bytes are proven by the golden vectors
in ``tests/data/triton_kernels``. triton_kernels (``StridedLayout``, ``CDNA4MXScaleLayout``) runs
for real from the wheel.

Not compared byte for byte: the CUDA and CPU converters (Marlin's ``gptq_marlin_repack``,
FlashInfer's shuffles, DeepGEMM, CUTLASS, Humming and the CPU backend's prepacking are compiled
code or absent packages); vLLM converts the canonical bytes there itself, or mxfp4conv writes
its own format, and ``plan`` says which. Biases are not compared. The comparison itself is
``convert_compare.converter_rows`` (the report prints its rows for any wheel).
"""

from __future__ import annotations

import pytest

from conformance.convert_compare import converter_cases, converter_rows, probe_converters
from conformance.matrix import release_of
from vllm_code.harness import require_vllm, versions

VERSIONS = versions()
SELECTED = {v: converter_cases(release_of(v)[0]) for v in VERSIONS}
PARAMS = [pytest.param(v, c, d, r, id=f"{v}-{c.id}") for v in VERSIONS for c, d, r in SELECTED[v]]


_CONVERTED: dict[str, dict] = {}


def converted(version: str) -> dict[str, dict]:
    if version not in _CONVERTED:
        _CONVERTED[version] = probe_converters(require_vllm(version), SELECTED[version])
    return _CONVERTED[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_selection_covers_every_rocm_backend_mxfp4conv_writes(version):
    selected = SELECTED[version]
    written = {d.backend for _, d, _ in selected if d is not None}
    assert {"AITER_MXFP4_BF16", "AITER_TRITON_MXFP4_BF16", "AITER_MXFP4_MXFP4",
            "AITER_TRITON_MXFP4_MXFP4", "AITER_MXFP4_FP8", "TRITON_UNFUSED", "TRITON",
            "EMULATION"} <= written, written
    assert {c.target.arch for c, d, _ in selected if d is not None} >= {"gfx942", "gfx950", "gfx1250"}
    assert any(d is None for _, d, _ in selected)  # at least one converter that raises


def test_selection_runs_an_nvidia_converter_vllm_keeps():
    """Somewhere (0.34: Quark on sm90 and sm100) vLLM converts the canonical bytes itself."""
    assert any(d is not None and not c.target.arch.startswith("gfx")
               for v in VERSIONS for c, d, _ in SELECTED[v])


@pytest.mark.parametrize("version,case,d,refused", PARAMS)
def test_converter_matches_recipe(version, case, d, refused):
    rows = converter_rows(case, d, refused, converted(version)[case.id])
    assert not rows, "\n".join(f"{case.id} [vLLM {version}] {f}: mxfp4conv {a!r}, vLLM {b!r}" for f, a, b in rows)
