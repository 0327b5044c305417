"""Exit statuses of the command-line shell: 0 success, 1 bad input, 2 usage."""

import subprocess
import sys

import pytest
import typer

from mxfp4conv import cli


def run(*args):
    return subprocess.run([sys.executable, "-m", "mxfp4conv", *args], capture_output=True, text=True)


def test_version_and_help_exit_zero():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("mxfp4conv ")
    r = run("--help")
    assert r.returncode == 0
    for name in cli.COMMANDS:
        assert name in r.stdout


def test_usage_error_exits_two():
    r = run("inspect")  # missing SOURCE
    assert r.returncode == 2
    assert "Traceback" not in r.stderr


def test_bad_input_exits_one_with_one_paragraph(tmp_path):
    r = run("inspect", str(tmp_path / "nowhere"))
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    assert "nowhere" in r.stderr


def test_typer_exit_code_is_propagated(monkeypatch):
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
