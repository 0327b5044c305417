"""What a new user meets first: mistyped paths and names, the arch names people type, exit
statuses, the serve command after a conversion, and what a finished output looks like."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from checkpoint_fixtures import run_cli, synth  # noqa: F401
from console import mxfp4conv
from mxfp4conv.oracle.arch import resolve_arch


def one_paragraph(rc, err, want_rc=1):
    assert rc == want_rc, err
    assert "Traceback" not in err and "\n\n" not in err.strip(), err
    return " ".join(err.split())


def test_a_missing_directory_is_never_looked_up_on_the_hub(tmp_path, capsys, monkeypatch):
    import mxfp4conv.checkpoint.source as source

    def no_hub(*a, **k):
        raise AssertionError("looked up on the hub")

    monkeypatch.setattr(source, "_open_hub", no_hub)
    monkeypatch.chdir(tmp_path)
    for name in ("no-such-dir", "demo-k3", "./demo", "~/nothing-here"):
        rc, out, err = run_cli(["inspect", name], capsys)
        flat = one_paragraph(rc, err)
        assert flat == (f"error: {name}: no such directory. Pass a checkpoint directory, or a hub repo id of the "
                        f"form org/name[@revision]."), flat


def test_verify_against_the_wrong_source_says_so_in_one_sentence(synth, tmp_path, capsys):
    out = tmp_path / "OUT"
    assert run_cli(["convert", synth("gpt_oss"), out, "--arch", "sm90", "-q"], capsys)[0] == 0
    rc, _, err = run_cli(["verify", out, "--source", synth("kimi_k3"), "-q"], capsys)
    flat = one_paragraph(rc, err)
    assert flat == (f"error: {out} is gpt_oss (w_mxfp4) for sm90, the source is kimi_k3 (w_mxfp4): verify it "
                    f"against {synth('gpt_oss')}.")
    # the same family, another geometry: the differing fields, not the sections' dicts
    rc, _, err = run_cli(["verify", out, "--source", synth("gpt_oss", hidden=512), "-q"], capsys)
    flat = one_paragraph(rc, err)
    assert "hidden is 256 in the output, 512 for this source" in flat and len(flat) < 700, flat


@pytest.mark.parametrize("name,arch", [
    ("gh200", "sm90"), ("h800", "sm90"), ("h20", "sm90"), ("sm_90a", "sm90"), ("SM90A", "sm90"), ("sm90a", "sm90"),
    ("b300", "sm100"), ("gb300", "sm100"), ("sm103", "sm100"), ("sm_103a", "sm100"), ("sm_100f", "sm100"),
    ("mi308x", "gfx942"), ("MI300A", "gfx942"), ("mi355x", "gfx950"), ("sm_120a", "sm120")])
def test_arch_names_people_type(name, arch):
    assert resolve_arch(name) == arch


@pytest.mark.parametrize("typed,suggested,never", [
    ("gh20", ["gh200", "h20", "h200"], ["gb200"]),
    ("gb20", ["gb200", "b200", "gb300"], ["gh200"]),
    ("mi308", ["mi308x", "mi300x", "mi300a", "mi325x"], ["mi350x", "mi355x"]),
])
def test_arch_suggestions_stay_within_one_arch(capsys, synth, typed, suggested, never):
    rc, _, err = run_cli(["plan", synth("kimi_k3"), "--arch", typed], capsys)
    assert rc == 2
    said = re.search(r"Did you mean ([^?]*)\?", " ".join(err.split())).group(1)
    names = re.findall(r"'([^']+)'", said)
    assert set(names) <= set(suggested) and names[0] == suggested[0], names
    assert not set(names) & set(never)
    assert len({resolve_arch(n) for n in names}) == 1


def test_capability_10_3_decides_as_10_0_in_vllms_moe_code():
    """sm103 (B300, GB300) is an alias of sm100: vLLM's MXFP4 MoE selection asks for the 10.x
    family or has_device_capability(100), never for exactly 10.0 or 10.3 (it does elsewhere:
    attention and dense GEMMs of some models)."""
    from vllm_code.harness import require_vllm, versions

    exact = re.compile(r"is_device_capability\(\s*(100|103|\(\s*10\s*,\s*[03]\s*\))\s*\)")
    for version in versions():
        root = require_vllm(version)
        files = [*(root / "vllm/model_executor/layers/fused_moe").rglob("*.py"),
                 *(root / "vllm/model_executor/layers/quantization").rglob("*mxfp4*.py")]
        assert len(files) > 20, root
        hits = [f"{f.relative_to(root)}: {m.group(0)}" for f in files for m in exact.finditer(f.read_text())]
        assert hits == [], (version, hits)


def test_bad_option_values_are_usage_errors_with_a_suggestion(tmp_path, capsys, synth):
    rc, _, err = run_cli(["example", "kimi", tmp_path / "x"], capsys)
    assert rc == 2 and "Did you mean 'kimi_k3'?" in err and not (tmp_path / "x").exists()
    rc, _, err = run_cli(["example", "quark", tmp_path / "x", "--scheme", "w_mxfp4_a_fp9"], capsys)
    assert rc == 2 and "Did you mean 'w_mxfp4_a_fp8'" in err
    out = tmp_path / "OUT"
    assert run_cli(["convert", synth("kimi_k3"), out, "--arch", "gfx950", "-q"], capsys)[0] == 0
    for command in (["verify", out], ["convert", synth("kimi_k3"), tmp_path / "o2", "--arch", "gfx950"]):
        rc, _, err = run_cli([*command, "--workers", "0"], capsys)
        assert rc == 2 and "--workers" in err, (command, err)


def test_convert_and_inspect_end_with_the_serve_command(synth, tmp_path, capsys):
    out = tmp_path / "OUT"
    rc, stdout, _ = run_cli(["convert", synth("kimi_k3"), out, "--arch", "mi355x", "--tp", "2", "--ep"], capsys)
    assert rc == 0
    env = json.loads((out / "mxfp4conv.json").read_text())["runtime_env"]
    assert env["VLLM_ROCM_USE_AITER"] == "1"
    want = (" ".join(f"{k}={v}" for k, v in sorted(env.items()))
            + f" vllm serve {out} --load-format mxfp4conv --tensor-parallel-size 2 --enable-expert-parallel")
    assert stdout.splitlines()[-1].strip() == want
    rc, stdout, _ = run_cli(["inspect", out], capsys)
    assert rc == 0 and want in stdout
    # the whole server layout: data parallel and the placement asked
    rc, stdout, _ = run_cli(["convert", synth("kimi_k3"), tmp_path / "dp", "--arch", "gfx950", "--tp", "2", "--dp", "2",
                             "--ep", "--placement", "round_robin", "--json"], capsys)
    assert rc == 0 and json.loads(stdout)["serve"].endswith(
        f"vllm serve {tmp_path / 'dp'} --load-format mxfp4conv --tensor-parallel-size 2 --data-parallel-size 2 "
        f"--enable-expert-parallel --expert-placement-strategy round_robin")
    rc, stdout, _ = run_cli(["convert", synth("kimi_k3"), tmp_path / "h", "--arch", "h200", "--json"], capsys)
    assert json.loads(stdout)["serve"] == f"vllm serve {tmp_path / 'h'} --load-format mxfp4conv"
    # experts the vLLM plugin does not load: how to load them with mxfp4conv.runtime
    rc, stdout, _ = run_cli(["convert", synth("compressed_tensors"), tmp_path / "ct", "--arch", "sm90"], capsys)
    assert rc == 0 and "vllm serve" not in stdout
    assert f"load_moe_layers('{tmp_path / 'ct'}', rank=0)" in stdout and "pip install -e '.[runtime]'" in stdout


def test_progress_lines_never_name_a_finished_shard_as_being_written(synth, tmp_path):
    r = mxfp4conv("convert", synth("kimi_k3"), tmp_path / "OUT", "--arch", "gfx950", "--shard-size", "2MB")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    finished: set[str] = set()
    for line in lines:
        m = re.match(r"finished (\S+)$", line)
        if m:
            finished.add(m.group(1))
        writing = re.search(r"now writing (.*)$", line)
        if writing:
            assert not set(writing.group(1).split(", ")) & finished, (line, lines)
    assert len(finished) > 1 and lines[-1].startswith(f"converted {len(finished)} shards into")
    r = mxfp4conv("inspect", synth("gpt_oss", num_shards=2))
    assert "(2 shards)" in r.stdout
    one = tmp_path / "one"
    assert mxfp4conv("convert", synth("kimi_k3"), one, "--arch", "gfx950").returncode == 0
    r = mxfp4conv("inspect", one)
    assert f"{one}  (1 shard)" in r.stdout


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_example_makes_an_ordinary_folder(tmp_path, capsys, mask):
    old = os.umask(mask)
    try:
        rc, _, err = run_cli(["example", "kimi_k3", tmp_path / "demo"], capsys)
    finally:
        os.umask(old)
    assert rc == 0, err
    assert stat.S_IMODE((tmp_path / "demo").stat().st_mode) == 0o777 & ~mask
    for p in (tmp_path / "demo").iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~mask, p


def _bf16_resave(src: Path, dst: Path) -> None:
    """DeepSeek-V4 as a transformers re-save writes it: experts dequantised to BF16, no scales,
    config.json still declaring expert_dtype "fp4"."""
    from mxfp4conv.checkpoint.source import open_source
    from mxfp4conv.convert.writer import TensorSpec, write_safetensors

    s = open_source(str(src))
    dst.mkdir()
    (dst / "config.json").write_bytes((src / "config.json").read_bytes())
    tensors, weight_map = [], {}
    for name in s.tensor_names():
        info = s.tensor_info(name)
        if ".experts." in name and name.endswith(".scale"):
            continue
        if ".experts." in name:  # I8 [n, k/2] -> BF16 [n, k]
            shape = (info.shape[0], info.shape[1] * 2)
            data = bytes(2 * shape[0] * shape[1])
            tensors.append((TensorSpec(name, "BF16", shape), [data]))
        else:
            tensors.append((TensorSpec(name, info.dtype, tuple(info.shape)), [s.read_range(info.shard, info.begin, info.nbytes)]))
        weight_map[name] = "model.safetensors"
    write_safetensors(dst / "model.safetensors", tensors, {"format": "pt"})


def test_dequantised_deepseek_v4_experts_are_called_bf16(synth, tmp_path, capsys):
    dst = tmp_path / "resaved"
    _bf16_resave(synth("deepseek_v4"), dst)
    for command in (["inspect", dst], ["convert", dst, tmp_path / "o", "--arch", "gfx950"]):
        rc, _, err = run_cli(command, capsys)
        flat = one_paragraph(rc, err)
        assert "the routed experts are BF16, not MXFP4" in flat and 'declares expert_dtype "fp4"' in flat, flat
        assert "download" not in flat and "missing" not in flat
