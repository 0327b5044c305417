"""plan's output estimate, convert --json and the non-terminal output, through the console script."""

import io
import json

import pytest

from console import mxfp4conv
from mxfp4conv.convert.progress import Progress


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli-convert") / "demo-k3"
    assert mxfp4conv("example", "kimi_k3", out).returncode == 0
    return out


@pytest.mark.parametrize("arch, tp", [("gfx950", 2), ("sm90", 1)])
def test_plan_predicts_the_output_size_convert_writes(demo, tmp_path, arch, tp):
    r = mxfp4conv("plan", demo, "--arch", arch, "--tp", tp, "--json")
    assert r.returncode == 0, r.stderr
    est = json.loads(r.stdout)["output"]
    r = mxfp4conv("convert", demo, tmp_path / "out", "--arch", arch, "--tp", tp, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert est["bytes"] == index["metadata"]["total_size"]
    assert est["shards"] == len(res["shards"]) == len(set(index["weight_map"].values()))
    src_index = json.loads((demo / "model.safetensors.index.json").read_text())
    assert est["source_bytes"] == src_index["metadata"]["total_size"]
    assert est["estimated_seconds"] > 0
    assert res["out"] == str(tmp_path / "out") and res["kept"] == []
    assert res["target"]["arch"] == arch and res["runtime_env"] == json.loads(
        (tmp_path / "out" / "mxfp4conv.json").read_text())["runtime_env"]


def test_plan_text_shows_size_time_and_whole_env_lines_when_piped(demo):
    env = json.loads(mxfp4conv("plan", demo, "--arch", "gfx950", "--json").stdout)["runtime_env"]
    assert len(" ".join(f"{k}={v}" for k, v in env.items())) > 40
    r = mxfp4conv("plan", demo, "--arch", "gfx950", env={"COLUMNS": "40"})
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("Server environment:")]
    assert line.split(": ", 1)[1].split() == [f"{k}={v}" for k, v in env.items()]
    (size,) = [ln for ln in r.stdout.splitlines() if ln.startswith("Output: ")]
    assert "convert takes about" in size and "(source " in size


def test_convert_final_line_counts_shards_in_english(demo, tmp_path):
    r = mxfp4conv("convert", demo, tmp_path / "one", "--arch", "gfx950")
    assert r.returncode == 0 and f"converted 1 shard into {tmp_path / 'one'}" in r.stderr
    r = mxfp4conv("convert", demo, tmp_path / "many", "--arch", "gfx950", "--shard-size", "100KB")
    n = len(json.loads((tmp_path / "many" / "model.safetensors.index.json").read_text())["weight_map"])
    assert r.returncode == 0 and n > 1
    shards = len(list((tmp_path / "many").glob("model-*.safetensors")))
    assert f"converted {shards} shards into" in r.stderr


def test_plain_progress_line_says_the_total_is_for_the_whole_conversion():
    out = io.StringIO()
    bar = Progress(3_000_000_000, "lines", stream=out)
    bar.describe("model-00001-of-00005.safetensors")
    bar.advance(1_500_000_000)
    bar.line()
    text = out.getvalue().strip()
    assert text.startswith("50% done: 1.50 of 3.00 GB in all")
    assert text.endswith("now writing model-00001-of-00005.safetensors")


def test_inspect_of_a_converted_checkpoint_prints_the_env_line_whole(demo, tmp_path):
    out = tmp_path / "out"
    assert mxfp4conv("convert", demo, out, "--arch", "gfx950", "-q").returncode == 0
    env = json.loads((out / "mxfp4conv.json").read_text())["runtime_env"]
    r = mxfp4conv("inspect", out, env={"COLUMNS": "40"})
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if "server env:" in ln]
    assert line.split("server env: ", 1)[1].split() == [f"{k}={v}" for k, v in env.items()]
