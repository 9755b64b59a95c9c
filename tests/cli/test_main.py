"""The entry point: registration of the command groups, usage errors, ``python -m opmap.cli``, lazy imports."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_bare_calls_show_help(cli):
    rc, out, _ = cli()
    assert rc == 0 and all(c in out for c in ("analyze", "quality", "profile", "calibrate", "models", "hardware"))
    rc, out, _ = cli("hardware")
    assert rc == 0 and "list" in out and "show" in out


def test_usage_errors_are_one_line_exit_2(refused):
    refused("analyze", needle="Missing argument 'model'. (see: opmap analyze --help)")
    refused("analyze", "gpt2", "--bogus", needle="No such option: --bogus")
    refused("nope", needle="No such command")


def test_python_dash_m_and_no_heavy_imports_for_help():
    code = ("import sys, runpy; sys.argv = ['opmap', '--help']\n"
            "try:\n    runpy.run_module('opmap.cli', run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "heavy = [m for m in ('torch', 'opmap.analyze', 'opmap.measure') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert "Usage: opmap" in r.stdout and "calibrate" in r.stdout


@pytest.mark.parametrize("command", [("analyze", "gpt2"), ("profile", "gpt2"), ("quality", "gpt2", "--dtype", "int8")])
def test_unwritable_out_fails_before_the_build(tmp_path, refused, fail_if_called, command):
    fail_if_called("opmap.workloads.load_workload")
    fail_if_called("opmap.calibrate.calibrate")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    refused(*command, "--out", blocker / "out", needle=f"cannot create output folder {blocker / 'out'}")
    refused(*command, "--out", blocker, needle=f"cannot write into {blocker}: it exists and is not a folder")


def test_help_texts_survive_rich_markup(cli):
    """Square brackets in a help text are rich markup unless escaped: --fusion-plan's JSON example shows."""
    rc, out, _ = cli("analyze", "--help")
    flat = " ".join(x.strip("│ ").strip() for x in out.splitlines())
    assert rc == 0 and '{"kernels": [[node ids], ...]}' in " ".join(flat.split()), out


def test_version(cli):
    import platform

    import torch

    from opmap import __version__

    rc, out, err = cli("--version")
    assert rc == 0 and not err
    assert out.strip() == f"opmap {__version__}, torch {torch.__version__}, python {platform.python_version()}"
