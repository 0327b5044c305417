"""verify --source with several workers: same verdict and the same first error as one worker,
bounded chunks, and progress output."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from checkpoint_fixtures import patch_tensor_byte
from mxfp4conv.checkpoint.synthetic import make_checkpoint
from mxfp4conv.convert.progress import Progress
from mxfp4conv.convert.run import convert
from mxfp4conv.convert.verify import VerifyError, verify
from mxfp4conv.oracle.decision import Target


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    d = tmp_path_factory.mktemp("k3")
    src = make_checkpoint("kimi_k3", d / "src", hidden=128, intermediate=128, num_experts=8, num_layers=2)
    out = d / "out"
    convert(str(src), out, Target(arch="gfx950", tp=2), progress="none", workers=2, chunk_bytes=30_000)
    return src, out


@pytest.mark.parametrize("workers", [1, 4])
def test_worker_counts_agree_on_a_good_checkpoint(k3, workers):
    src, out = k3
    rep = verify(out, str(src), workers=workers)
    assert rep.ok and rep.bytes_compared > 0
    assert rep.to_json() == verify(out, str(src), workers=1).to_json()


def test_first_error_in_checkpoint_order_whatever_the_workers(k3, tmp_path):
    import shutil

    src, out = k3
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    m = json.loads((bad / "mxfp4conv.json").read_text())
    first, last = m["moe"]["layers"][0], m["moe"]["layers"][-1]
    patch_tensor_byte(bad, f"{last}.experts.rank0.w2_weight", 5, 0x10)  # later in order ...
    patch_tensor_byte(bad, f"{first}.experts.rank1.w13_weight", 4000, 0x10)  # ... than this one
    errors = []
    for workers in (1, 3):
        with pytest.raises(VerifyError) as ei:
            verify(bad, str(src), workers=workers)
        errors.append((ei.value.cls, str(ei.value), ei.value.where))
    assert errors[0] == errors[1]
    assert errors[0][2]["tensor"] == f"{first}.experts.rank1.w13_weight"
    assert errors[0][2]["layer"] == first and errors[0][2]["rank"] == 1


def test_progress_lines_are_periodic_and_end_at_100_percent():
    buf = io.StringIO()
    bar = Progress(3_000_000_000, "lines", stream=buf, every=0.0, label="verifying")
    for _ in range(3):
        bar.advance(1_000_000_000)
    bar.close()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 4 and lines[0].startswith("33% done: 1.00 of 3.00 GB")
    assert lines[-1].startswith("100% done: 3.00 of 3.00 GB")


def test_cli_verify_reports_progress_without_a_terminal(k3):
    src, out = k3
    r = subprocess.run([sys.executable, "-m", "mxfp4conv", "verify", str(out), "--source", str(src),
                        "--workers", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "100% done:" in r.stderr
    r = subprocess.run([sys.executable, "-m", "mxfp4conv", "verify", str(out), "--source", str(src), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr == ""
