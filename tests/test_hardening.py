"""Each hostile input found by fuzzing: a clear error (or a warning where the input is legal
but suspicious), the source unchanged, nothing half-written under a final name."""

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from checkpoint_fixtures import copy_of, load_index, rewrite_header, run_cli, save_index, synth, tree_digest  # noqa: F401
from mxfp4conv.errors import CheckpointError, Mxfp4convError

SHARD = "model-00002-of-00002.safetensors"
ARCH = ["--arch", "gfx950"]


def one_paragraph_error(rc, out, err, *needles):
    flat = " ".join(err.split())
    assert rc == 1, (rc, out, err)
    assert err.startswith("error:") and "Traceback" not in err and "\n\n" not in err.strip(), err
    for n in needles:
        assert n in flat, (n, flat)


def edit_config(root: Path, fn) -> None:
    p = root / "config.json"
    cfg = json.loads(p.read_text())
    fn(cfg)
    p.write_text(json.dumps(cfg))


def text_cfg(cfg):
    return cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg


@pytest.fixture
def k3(synth, tmp_path):
    return copy_of(synth("kimi_k3"), tmp_path / "src")


def digest(root: Path) -> dict:
    """tree_digest, with special files (FIFOs, directories put in place of files) by kind."""
    special = {p.relative_to(root).as_posix(): p.stat().st_mode for p in root.rglob("*")
               if not p.is_symlink() and not p.is_file() and not p.is_dir()}
    regular = {}
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            regular[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            regular[rel] = p.read_bytes()
        elif p.is_dir():
            regular[rel] = "dir"
    return {**regular, **special}


def refused_everywhere(root, tmp_path, capsys, *needles):
    """inspect and convert both refuse ``root`` with one paragraph; the source is unchanged
    and convert leaves no output directory."""
    before = digest(root)
    rc, out, err = run_cli(["inspect", root], capsys)
    one_paragraph_error(rc, out, err)
    problems_and_error = " ".join((out + err).split())  # inspect lists problems, then fails
    assert all(n in problems_and_error for n in needles), (needles, problems_and_error)
    rc, out, err = run_cli(["convert", root, tmp_path / "out", *ARCH], capsys)
    one_paragraph_error(rc, out, err, *needles)
    assert not (tmp_path / "out").exists()
    assert digest(root) == before


# ---- absurd sizes: refused up front, no hang ------------------------------------------------

@pytest.mark.parametrize("key, value", [("n_routed_experts", 2 ** 64), ("num_experts", 1e308),
                                        ("moe_intermediate_size", 2 ** 40), ("hidden_size", 10 ** 30),
                                        ("num_experts_per_tok", 2 ** 63), ("first_k_dense_replace", 2 ** 62)])
def test_absurd_sizes_are_refused_quickly(k3, tmp_path, capsys, key, value):
    synonyms = [("num_experts", "n_routed_experts"), ("num_experts_per_token", "num_experts_per_tok")]

    def fn(cfg):
        tc = text_cfg(cfg)
        for group in synonyms:
            if key in group:
                for k in group:
                    tc.pop(k, None)
        tc[key] = value
    edit_config(k3, fn)
    t0 = time.monotonic()
    refused_everywhere(k3, tmp_path, capsys, "config.json", repr(key), "whole number")
    assert time.monotonic() - t0 < 60


# ---- invalid config values ---------------------------------------------------------------

@pytest.mark.parametrize("family, key, value, needle", [
    ("kimi_k3", "hidden_act", -1, "'hidden_act' is -1"),
    ("kimi_k3", "hidden_act", "nonsense", "'hidden_act' is 'nonsense'"),
    ("deepseek_v4", "swiglu_limit", -1, "'swiglu_limit' is -1"),
    ("deepseek_v4", "swiglu_limit", "abc", "'swiglu_limit' is 'abc'"),
    ("gpt_oss", "swiglu_limit", 0, "'swiglu_limit' is 0"),
    ("kimi_k3", "num_experts_per_tok", 1.5, "'num_experts_per_tok' is 1.5"),
    ("kimi_k3", "num_experts_per_tok", "abc", "'num_experts_per_tok' is 'abc'"),
    ("kimi_k3", "moe_intermediate_size", -1, "'moe_intermediate_size' is -1"),
    ("kimi_k3", "activation_situ_beta", True, "'activation_situ_beta' is True"),
    ("quark", "num_experts_per_tok", None, "lacks"),
])
def test_bad_config_values_are_refused(synth, tmp_path, capsys, family, key, value, needle):
    root = copy_of(synth(family), tmp_path / "src")

    def fn(cfg):
        tc = text_cfg(cfg)
        if value is None:
            for k in ("num_experts_per_tok", "num_experts_per_token", "experts_per_token"):
                tc.pop(k, None)
        else:
            if key == "num_experts_per_tok":
                tc.pop("num_experts_per_token", None)
            tc[key] = value
    edit_config(root, fn)
    refused_everywhere(root, tmp_path, capsys, "config.json", needle)


def test_infinity_in_config_is_refused_and_never_written(synth, tmp_path, capsys):
    root = copy_of(synth("deepseek_v4"), tmp_path / "src")
    cfg = (root / "config.json").read_text().replace('"swiglu_limit": 10.0', '"swiglu_limit": Infinity')
    assert "Infinity" in cfg
    (root / "config.json").write_text(cfg)
    refused_everywhere(root, tmp_path, capsys, "config.json", "Infinity")


@pytest.mark.parametrize("edit, needle", [
    (lambda qc: qc.update(exclude=[1]), "'exclude' is [1]"),
    (lambda qc: qc.update(exclude=["re:("]), "not a valid regular expression"),
    (lambda qc: qc.update(layer_quant_config=[]), "'layer_quant_config' is []"),
    (lambda qc: qc.update(global_quant_config={"weight": ["fp4"]}), "'weight' is ['fp4']"),
    (lambda qc: qc["global_quant_config"]["weight"].update(dtype=["fp4"]), "weight dtype ['fp4']"),
])
def test_bad_quark_quant_config_is_refused(synth, tmp_path, capsys, edit, needle):
    root = copy_of(synth("quark"), tmp_path / "src")
    edit_config(root, lambda cfg: edit(cfg["quantization_config"]))
    refused_everywhere(root, tmp_path, capsys, "config.json", needle)


def test_bad_kimi_config_groups_is_refused(k3, tmp_path, capsys):
    def fn(cfg):
        qc = cfg.get("quantization_config") or text_cfg(cfg)["quantization_config"]
        qc["config_groups"] = 1
    edit_config(k3, fn)
    refused_everywhere(k3, tmp_path, capsys, "config_groups")


def test_text_config_of_the_wrong_type_is_refused(k3, tmp_path, capsys):
    edit_config(k3, lambda cfg: cfg.update(text_config=[1, 2], model_type="other"))
    refused_everywhere(k3, tmp_path, capsys, "config.json")


# ---- JSON nested 1,000 deep anywhere --------------------------------------------------------

DEEP = "[" * 1000 + "]" * 1000


@pytest.mark.parametrize("where", ["config", "index", "header", "metadata"])
def test_deep_json_is_a_clear_error(k3, tmp_path, capsys, where):
    if where == "config":
        (k3 / "config.json").write_text('{"a": ' + DEEP + "}")
    elif where == "index":
        (k3 / "model.safetensors.index.json").write_text('{"weight_map": {}, "metadata": ' + DEEP + "}")
    else:
        p = k3 / SHARD
        raw = p.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = raw[8:8 + n].rstrip()
        extra = f'"__deep__": {DEEP}' if where == "header" else f'"__metadata__": {{"x": {DEEP}}}'
        hb = b"{" + extra.encode() + b"," + header[1:]
        hb += b" " * (-len(hb) % 8)
        p.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
    refused_everywhere(k3, tmp_path, capsys, "nest")


# ---- shard headers: duplicates, __metadata__, dtype ------------------------------------------

def _dup_header_key(root):
    p = root / SHARD
    raw = p.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    name = next(k for k in h if k != "__metadata__")
    text = json.dumps(h)
    entry = json.dumps({name: h[name]})[1:-1]
    hb = ("{" + entry + ", " + text[1:]).encode()
    p.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
    return name


def test_duplicate_header_keys_are_refused(k3, tmp_path, capsys):
    name = _dup_header_key(k3)
    refused_everywhere(k3, tmp_path, capsys, SHARD, f"{name!r} appears twice")


@pytest.mark.parametrize("meta", [[], "x", 0, {"a": 1}])
def test_metadata_not_a_string_map_is_refused(k3, tmp_path, capsys, meta):
    rewrite_header(k3 / SHARD, lambda h: h.update(__metadata__=meta))
    refused_everywhere(k3, tmp_path, capsys, SHARD, "__metadata__")


def test_list_dtype_is_refused(k3, tmp_path, capsys):
    def fn(h):
        name = next(k for k in h if k != "__metadata__")
        h[name]["dtype"] = ["U8"]
    rewrite_header(k3 / SHARD, fn)
    refused_everywhere(k3, tmp_path, capsys, SHARD, "unknown dtype ['U8']")


# ---- index against shards: what inspect calls an error, convert refuses ---------------------

def test_tensor_missing_from_weight_map_is_refused(k3, tmp_path, capsys):
    index = load_index(k3)
    name = next(n for n, s in index["weight_map"].items() if s == SHARD and "norm" in n)
    del index["weight_map"][name]
    save_index(k3, index)
    refused_everywhere(k3, tmp_path, capsys, "not in the index")


def test_duplicate_weight_map_keys_are_refused(k3, tmp_path, capsys):
    text = (k3 / "model.safetensors.index.json").read_text()
    index = json.loads(text)
    name, shard = next(iter(index["weight_map"].items()))
    entry = json.dumps({name: shard})[1:-1]
    (k3 / "model.safetensors.index.json").write_text(text.replace('"weight_map": {', '"weight_map": {' + entry + ", ", 1))
    rc, out, err = run_cli(["inspect", k3], capsys)
    assert rc == 1 and "listed more than once" in out.replace("\n", " ") or "listed more than once" in " ".join(out.split())
    rc, out, err = run_cli(["convert", k3, tmp_path / "out", *ARCH], capsys)
    one_paragraph_error(rc, out, err, "listed more than once")
    assert not (tmp_path / "out").exists()


# ---- files that are not what they claim -------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_fifo_or_directory_in_place_of_a_shard(k3, tmp_path, capsys, kind):
    (k3 / SHARD).unlink()
    os.mkfifo(k3 / SHARD) if kind == "fifo" else (k3 / SHARD).mkdir()
    refused_everywhere(k3, tmp_path, capsys, SHARD, "FIFO" if kind == "fifo" else "a directory", "not a file")


def test_sidecar_symlink_leaving_the_source_is_refused(k3, tmp_path, capsys):
    outside = tmp_path / "secret.txt"
    outside.write_text("not yours")
    (k3 / "tokenizer.json").symlink_to(outside)
    rc, out, err = run_cli(["convert", k3, tmp_path / "out", *ARCH], capsys)
    one_paragraph_error(rc, out, err, "tokenizer.json", "symbolic link leading outside")
    assert not (tmp_path / "out").exists()


def test_fifo_sidecar_is_refused_without_blocking(k3, tmp_path, capsys):
    os.mkfifo(k3 / "notes.txt")
    rc, out, err = run_cli(["convert", k3, tmp_path / "out", *ARCH], capsys)
    one_paragraph_error(rc, out, err, "notes.txt", "FIFO")
    assert not (tmp_path / "out").exists()


def test_unreadable_sidecar_blames_the_source(k3, tmp_path, capsys, monkeypatch):
    import builtins

    import mxfp4conv.convert.run as run

    real_open = builtins.open

    def fake_open(path, mode="r", *a, **k):
        if str(path).endswith("generation_config.json") and "r" in mode and str(k3) in str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, mode, *a, **k)
    monkeypatch.setattr(run, "open", fake_open, raising=False)
    rc, out, err = run_cli(["convert", k3, tmp_path / "out", *ARCH], capsys)
    one_paragraph_error(rc, out, err, str(k3 / "generation_config.json"), "this file of the source",
                        "Permission denied")
    assert str(tmp_path / "out") not in " ".join(err.split()).split("generation_config.json")[0]


# ---- the output path --------------------------------------------------------------------------

def test_output_below_a_file(k3, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    rc, out, err = run_cli(["convert", k3, tmp_path / "afile" / "x", *ARCH], capsys)
    one_paragraph_error(rc, out, err, "cannot create the output directory", "is not a directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_parent_of_out(k3, tmp_path, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        rc, out, err = run_cli(["convert", k3, parent / "out", *ARCH], capsys)
    finally:
        parent.chmod(0o700)
    one_paragraph_error(rc, out, err, "cannot create the output directory")


def test_read_only_parent_of_out_as_any_user(k3, tmp_path, capsys, monkeypatch):
    def deny(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(Path, "mkdir", deny)
    rc, out, err = run_cli(["convert", k3, tmp_path / "ro" / "out", *ARCH], capsys)
    one_paragraph_error(rc, out, err, "cannot create the output directory", "Permission denied")


@pytest.mark.parametrize("where", ["/proc/ex", "afile/x"])
def test_example_into_an_impossible_place(tmp_path, capsys, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    rc, out, err = run_cli(["example", "kimi_k3", where], capsys)
    one_paragraph_error(rc, out, err, where, "cannot create the example directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_second_convert_into_one_out_is_refused(k3, tmp_path, capsys):
    from mxfp4conv.convert.run import output_lock

    out = tmp_path / "out"
    out.mkdir()
    with output_lock(out):
        rc, o, err = run_cli(["convert", k3, out, *ARCH, "--force"], capsys)
    one_paragraph_error(rc, o, err, "another mxfp4conv convert is writing into this output directory")
    assert sorted(p.name for p in out.iterdir()) == []  # the refused one wrote nothing, the holder's lock is gone
    rc, o, err = run_cli(["convert", k3, out, *ARCH, "--force"], capsys)  # free again
    assert rc == 0, err


def test_force_removes_stale_files_of_an_earlier_output(synth, tmp_path, capsys):
    a = copy_of(synth("kimi_k3"), tmp_path / "a")
    (a / "tokenizer.json").write_text("{}")
    (a / "sub").mkdir()
    (a / "sub" / "extra.txt").write_text("old")
    out = tmp_path / "out"
    assert run_cli(["convert", a, out, *ARCH, "--tp", "2"], capsys)[0] == 0
    (out / "mine.txt").write_text("a file the user put there")
    b = copy_of(synth("kimi_k3"), tmp_path / "b")
    rc, _, err = run_cli(["convert", b, out, *ARCH, "--force"], capsys)
    assert rc == 0, err
    assert not (out / "tokenizer.json").exists() and not (out / "sub" / "extra.txt").exists()
    assert (out / "mine.txt").read_text() == "a file the user put there"  # not ours: kept
    assert run_cli(["verify", out, "--source", b], capsys)[0] == 0


def test_ctrl_c_says_rerun_with_resume(k3, tmp_path, capsys, monkeypatch):
    import mxfp4conv.convert.run as run

    real = run.unit_tasks
    calls = []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(run, "unit_tasks", interrupted)
    out = tmp_path / "out"
    rc, o, err = run_cli(["convert", k3, out, *ARCH, "--tp", "2", "--shard-size", "100KB"], capsys)
    assert rc == 130 and "interrupted; rerun with --resume" in " ".join(err.split()) and "Traceback" not in err
    assert not any(p.name.endswith(".partial") for p in out.iterdir())
    monkeypatch.setattr(run, "unit_tasks", real)
    rc, o, err = run_cli(["convert", k3, out, *ARCH, "--tp", "2", "--shard-size", "100KB", "--resume"], capsys)
    assert rc == 0, err
    assert run_cli(["verify", out, "--source", k3], capsys)[0] == 0


def test_ctrl_c_in_a_real_process(synth, tmp_path):
    src = synth("kimi_k3", num_layers=6)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "mxfp4conv", "convert", str(src), str(out), *ARCH,
                             "--tp", "8", "--shard-size", "50KB", "--workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out.exists() and any(out.glob("model-*"))):
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    if proc.poll() is not None:
        pytest.skip("the conversion finished before it could be interrupted")
    proc.send_signal(2)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the conversion finished before the signal arrived")
    assert proc.returncode == 130 and "interrupted; rerun with --resume" in " ".join(err.split()), err
    assert "Traceback" not in err


# ---- manifests with null / NaN / wrong types ---------------------------------------------------

@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from mxfp4conv.checkpoint.synthetic import make_checkpoint
    from mxfp4conv.convert import convert
    from mxfp4conv.oracle import Target

    base = tmp_path_factory.mktemp("hardening-conv")
    src = make_checkpoint("deepseek_v4", base / "src")
    convert(str(src), base / "out", Target(arch="cpu", tp=2), progress="none")
    return base / "out"


@pytest.mark.parametrize("edit", [
    lambda m: m["moe"].update(experts_per_rank=None),
    lambda m: m["moe"].update(hidden="256"),
    lambda m: m["target"].update(tp=None),
    lambda m: m["target"].update(activation_params={"swiglu_limit": None}),
    lambda m: m["moe"].update(layers=None),
    lambda m: m["layout"].update(w13=None),
    lambda m: m.update(target=[]),
    lambda m: m["moe"].update(num_experts=2 ** 70, experts_per_rank=2 ** 70),
])
def test_manifest_with_wrong_types(converted, tmp_path, capsys, edit):
    from mxfp4conv.runtime import load_moe_layers

    out = copy_of(converted, tmp_path / "c")
    m = json.loads((out / "mxfp4conv.json").read_text())
    edit(m)
    (out / "mxfp4conv.json").write_text(json.dumps(m))
    for cmd in (["verify", out], ["verify", out, "--json"], ["plan", out, "--arch", "cpu", "--tp", "2"]):
        rc, o, err = run_cli(cmd, capsys)
        assert "Traceback" not in err and rc in (0, 1), (cmd, err)
    rc, o, err = run_cli(["verify", out], capsys)
    one_paragraph_error(rc, o, err, "mxfp4conv.json")
    rc, o, err = run_cli(["inspect", out], capsys)
    assert rc == 1 and "Traceback" not in err
    with pytest.raises(CheckpointError, match="mxfp4conv.json"):
        load_moe_layers(out, rank=0)


def test_manifest_with_nan(converted, tmp_path, capsys):
    from mxfp4conv.runtime import load_moe_layers

    out = copy_of(converted, tmp_path / "c")
    text = (out / "mxfp4conv.json").read_text()
    (out / "mxfp4conv.json").write_text(text.replace('"top_k": 2', '"top_k": NaN'))
    rc, o, err = run_cli(["verify", out], capsys)
    one_paragraph_error(rc, o, err, "mxfp4conv.json", "NaN")
    with pytest.raises(Mxfp4convError, match="NaN"):
        load_moe_layers(out, rank=0)


# ---- scale plausibility ---------------------------------------------------------------------

def _numeric_cast_scales(root: Path) -> None:
    """What compressed-tensors 0.20 writes with scale_dtype float8_e8m0fnu: each exponent code
    cast numerically to e8m0 (code c stored as round(log2 c) + 127)."""
    from safetensors.torch import load_file, save_file

    for shard in sorted(root.glob("model-*.safetensors")):
        t = load_file(shard)
        for n in [n for n in t if n.endswith(".weight_scale")]:
            codes = t[n].view(torch.uint8).float().clamp_min(1)
            t[n] = codes.to(torch.float8_e8m0fnu).view(torch.uint8).view(t[n].dtype)
        save_file(t, str(shard), metadata={"format": "pt"})
    index = load_index(root)
    save_index(root, index)


def test_numerically_cast_scales_are_reported(k3, tmp_path, capsys):
    _numeric_cast_scales(k3)
    rc, out, err = run_cli(["inspect", k3, "--json"], capsys)
    probs = [p for p in json.loads(out)["problems"] if "implausible" in p["message"]]
    assert len(probs) == 1 and probs[0]["severity"] == "warning" and "0x86" in probs[0]["message"]
    rc, out, err = run_cli(["convert", k3, tmp_path / "out", *ARCH], capsys)
    assert rc == 0 and "warning: the expert scales are implausible" in " ".join(err.split())


@pytest.mark.parametrize("family", ["kimi_k3", "deepseek_v4", "quark", "gpt_oss"])
def test_real_scale_distributions_raise_no_alarm(synth, family, capsys):
    rc, out, err = run_cli(["inspect", synth(family), "--json"], capsys)
    assert not [p for p in json.loads(out)["problems"] if "implausible" in p["message"]]


@pytest.mark.parametrize("dist", ["normal-0.02", "student-t-3", "outlier-rows", "zero-blocks"])
def test_magnitude_check_on_realistic_weights(dist):
    """Scales the codec writes for weight distributions real models have, including heavy tails,
    a few huge rows and all-zero blocks: never implausible; the numerically cast ones always."""
    from mxfp4conv.checkpoint.checks import magnitude_warning
    from mxfp4conv.codec import quantize_mxfp4

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 1024, generator=g) * 0.02
    if dist == "student-t-3":
        x = torch.distributions.StudentT(3.0).sample((512, 1024)) * 0.01
    elif dist == "outlier-rows":
        x[:8] *= 500
    elif dist == "zero-blocks":
        x[: 300] = 0
    _, s = quantize_mxfp4(x)
    hist = torch.bincount(s.reshape(-1), minlength=256).tolist()
    assert magnitude_warning(hist) is None
    cast = s.float().clamp_min(1).to(torch.float8_e8m0fnu).view(torch.uint8)
    if dist != "zero-blocks":
        assert magnitude_warning(torch.bincount(cast.reshape(-1), minlength=256).tolist())


# ---- inspect says how much it sampled -----------------------------------------------------------

def test_inspect_says_it_sampled(synth, capsys):
    root = synth("kimi_k3", num_layers=4)
    rc, out, _ = run_cli(["inspect", root, "--json"], capsys)
    scan = json.loads(out)["scale_scan"]
    assert rc == 0 and scan["mode"] == "sample" and 0 < scan["bytes_read"] < scan["bytes_total"]
    rc, out, _ = run_cli(["inspect", root], capsys)
    flat = " ".join(out.split())
    assert "sampled" in flat and "--full scans them all" in flat
    rc, out, _ = run_cli(["inspect", root, "--json", "--full"], capsys)
    scan = json.loads(out)["scale_scan"]
    assert scan["mode"] == "full" and scan["bytes_read"] == scan["bytes_total"]


# ---- found by the long fuzz run -------------------------------------------------------------

def test_shard_name_too_long_for_the_file_system_is_refused(k3, tmp_path, capsys):
    index = load_index(k3)
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = "x" * 300 + ".safetensors"
    save_index(k3, index)
    refused_everywhere(k3, tmp_path, capsys, "not a usable file name")


@pytest.mark.parametrize("archs", ["DeepseekV3ForCausalLM", {"a": 1}, [["KimiK3ForCausalLM"]], 7])
def test_architectures_not_a_list_of_names_is_no_crash(synth, tmp_path, capsys, archs):
    root = copy_of(synth("kimi_k3"), tmp_path / "src")
    edit_config(root, lambda c: c.update(architectures=archs))
    rc, out, err = run_cli(["inspect", root], capsys)
    assert rc in (0, 1) and "Traceback" not in err, err
    if rc == 1:
        one_paragraph_error(rc, out, err)
