"""Command-line conventions, through the installed console script: exit statuses, help,
global flags anywhere, usage errors with suggestions, completion, logging."""

import json
import re
import subprocess

import pytest
import typer

from console import console_script, mxfp4conv
from mxfp4conv import cli


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "demo-k3"
    r = mxfp4conv("example", "kimi_k3", out)
    assert r.returncode == 0, r.stderr
    return out


def test_version_and_help_exit_zero():
    r = mxfp4conv("--version")
    assert r.returncode == 0 and r.stdout.startswith("mxfp4conv ")
    for flag in ("--help", "-h"):
        r = mxfp4conv(flag)
        assert r.returncode == 0
        for name in cli.COMMANDS:
            assert name in r.stdout


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_command_help_is_plain_text(command):
    r = mxfp4conv(command, "-h")
    assert r.returncode == 0 and r.stdout.startswith("Usage: mxfp4conv " + command)
    text = r.stdout
    if command not in ("example", "verify", "ranks"):  # those that take a SOURCE
        assert "org/name[@revision]" in " ".join(text.split())  # not eaten as markup
    for line in text.splitlines():  # flags show no value placeholder
        m = re.match(r"\s+(?:-\w, )?(--json|--force|--ep|--full|--quiet|--resume)\b(.*)", line)
        if m:
            assert not m.group(2).lstrip().startswith("<"), line


def test_missing_argument_exits_two():
    r = mxfp4conv("inspect")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "SOURCE" in r.stderr


@pytest.mark.parametrize("args, option, suggestion", [
    (["--arch", "mi355"], "--arch", "mi355x"),
    (["--arch", "gfx950", "--act-quant", "fp9"], "--act-quant", "fp8"),
    (["--arch", "gfx950", "--layout", "hoper_mma"], "--layout", "hopper_mma"),
    (["--arch", "gfx950", "--backend", "aiterr"], "--backend", "aiter"),
    (["--arch", "gfx950", "--tp", "0"], "--tp", None),
])
def test_bad_option_values_are_usage_errors(demo, args, option, suggestion):
    for command in ("plan", "convert"):
        extra = [demo.parent / f"out-{command}"] if command == "convert" else []
        r = mxfp4conv(command, demo, *extra, *args)
        assert r.returncode == 2, (command, r.stderr)
        assert option in r.stderr and "Traceback" not in r.stderr
        if suggestion:
            assert f"Did you mean '{suggestion}'" in r.stderr
    assert not (demo.parent / "out-convert").exists()


@pytest.mark.parametrize("args, option", [(["--workers", "0"], "--workers"),
                                          (["--shard-size", "five"], "--shard-size")])
def test_bad_convert_values_are_usage_errors(demo, tmp_path, args, option):
    r = mxfp4conv("convert", demo, tmp_path / "out", "--arch", "gfx950", *args)
    assert r.returncode == 2 and option in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_bad_input_exits_one_with_one_paragraph(tmp_path):
    r = mxfp4conv("inspect", tmp_path / "nowhere")
    assert r.returncode == 1 and r.stdout == ""
    # one paragraph, wrapped at 100 columns (a long path goes on a line of its own, unbroken)
    assert " ".join(r.stderr.split()).startswith("error: ") and "Traceback" not in r.stderr
    assert str(tmp_path / "nowhere") in r.stderr and len(r.stderr.strip().split("\n\n")) == 1


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_before_or_after_the_command(tmp_path, where):
    args = ["inspect", tmp_path / "nowhere"]
    args = ["--debug", *args] if where == "before" else [*args, "--debug"]
    r = mxfp4conv(*args)
    assert r.returncode == 1 and "Traceback" in r.stderr and "CheckpointError" in r.stderr


def test_verbose_logs_on_stderr_and_leaves_stdout_alone(demo):
    quiet = mxfp4conv("inspect", demo, "--json")
    loud = mxfp4conv("inspect", demo, "--json", "-v")
    assert quiet.returncode == loud.returncode == 0
    assert json.loads(loud.stdout) == json.loads(quiet.stdout)
    assert quiet.stderr == ""
    assert "INFO" in loud.stderr and str(demo) in loud.stderr


def test_revision_applies_to_hub_ids_only(demo):
    r = mxfp4conv("inspect", demo, "--revision", "main")
    assert r.returncode == 2 and "--revision" in r.stderr and "local directory" in r.stderr


def test_shell_completion_of_commands_and_arch():
    def complete(words):
        r = mxfp4conv(env={"_MXFP4CONV_COMPLETE": "complete_bash", "COMP_WORDS": " ".join(words),
                           "COMP_CWORD": str(len(words) - 1)})
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert complete(["mxfp4conv", "pl"]) == ["plan"]
    assert set(complete(["mxfp4conv", "plan", "x", "--arch", "mi35"])) == {"mi350x", "mi355x"}
    # typer finds the shell among the process's parents, so run it under bash as a user would (the "; exit"
    # keeps bash from exec-ing it): under no shell (a detached job) it prints "Shell  not supported."
    r = subprocess.run(["bash", "-c", '"$0" --show-completion; exit $?', console_script()],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "_MXFP4CONV_COMPLETE=complete_bash" in r.stdout, r.stderr


def test_typer_exit_code_is_propagated():
    @cli.app.command("exit-three", hidden=True)
    def _exit_three():
        raise typer.Exit(3)

    try:
        with pytest.raises(SystemExit) as info:
            cli.main(["exit-three"])
        assert info.value.code == 3
    finally:
        cli.app.registered_commands = [
            c for c in cli.app.registered_commands if c.name != "exit-three"
        ]


def test_global_flags_are_moved_in_front_of_the_command():
    assert cli.hoist_global_flags(["plan", "x", "--debug", "-vv"]) == ["--debug", "-v", "-v", "plan", "x"]
    assert cli.hoist_global_flags(["plan", "--", "--debug"]) == ["plan", "--", "--debug"]


def test_option_choices_are_the_oracles():
    from mxfp4conv.commands import options
    from mxfp4conv.oracle.select import ACT_QUANTS, KERNEL_LAYOUT_CHOICES

    assert options.LAYOUTS == tuple(KERNEL_LAYOUT_CHOICES)
    assert options.ACT_QUANTS == tuple(ACT_QUANTS)
    from mxfp4conv.oracle.backends import MOE_WEIGHTS
    assert options.MOE_WEIGHTS == tuple(MOE_WEIGHTS)
