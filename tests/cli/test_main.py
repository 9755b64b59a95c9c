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


# -- every numeric option of every command: NaN, infinities, negatives and absurd sizes refused in one line ------

# What each command needs before its options are read (the option checks come first, so nothing is built).
REQUIRED = {"analyze": ["gpt2"], "profile": ["gpt2"], "quality": ["gpt2", "--dtype", "int8"], "plan": ["gpt2"],
            "sweep": ["gpt2"], "serve": ["gpt2"], "fit": ["--models", "gpt2", "-H", "h100-sxm"],
            "compare": ["a", "b"], "report": ["no-such-folder"], "bench": ["http://127.0.0.1:9", "--model", "m"],
            "tune": ["gpt2"]}


def _numeric_options():
    """(command path, option, 'int' | 'float') for every int or float option of every registered command, read
    from the command functions' signatures: a new option is covered the day it is added."""
    import inspect
    import typing

    from opmap.cli import app

    def commands(typer_app, prefix):
        for c in typer_app.registered_commands:
            yield [*prefix, c.name or c.callback.__name__], c.callback
        for g in typer_app.registered_groups:
            yield from commands(g.typer_instance, [*prefix, g.name])

    out = []
    for path, fn in commands(app, []):
        hints = typing.get_type_hints(fn)
        for name, default in inspect.signature(fn).parameters.items():
            kind = {int: "int", float: "float"}.get(next((t for t in typing.get_args(hints[name]) if t is not
                                                          type(None)), hints[name]))
            decls = [d for d in getattr(default.default, "param_decls", None) or () if d.startswith("--")]
            if kind:
                out.append((" ".join(path), decls[0] if decls else "--" + name.replace("_", "-"), kind))
    return out


NUMERIC = _numeric_options()


def test_the_numeric_options_are_found():
    # a floor, so that a broken introspection cannot pass the test below by finding nothing
    assert len(NUMERIC) >= 45 and ("serve", "--slo-ttft", "float") in NUMERIC and ("analyze", "--tp", "int") in NUMERIC


@pytest.mark.parametrize("command,option,kind", NUMERIC)
def test_every_numeric_option_refuses_nan_inf_negative_and_absurd(refused, command, option, kind):
    bad = ["nan", "inf", "-inf", "-1"] if kind == "float" else ["-1", str(2**63)]
    for value in bad:
        line = refused(*command.split(), *REQUIRED[command], f"{option}={value}", needle=option)
        assert "must be" in line and ("got" in line), line


@pytest.mark.parametrize("command,option", [
    ("analyze", "--batch"), ("analyze", "--seq"), ("analyze", "--tp"), ("analyze", "--kv-len"),
    ("profile", "--iters"), ("plan", "--devices"), ("sweep", "--repeats"), ("serve", "--requests"),
    ("serve", "--slo-tpot"), ("fit", "--slo-p99"), ("fit", "--power-budget"), ("report", "--max-mb"),
    ("compare", "--alpha"), ("quality", "--batch"), ("bench", "--concurrency"), ("bench", "--timeout"),
])
def test_zero_is_refused_where_it_means_nothing(refused, command, option):
    assert refused(command, *REQUIRED[command], f"{option}=0", needle=option).endswith("(got 0)")


def test_an_out_path_with_escape_sequences_is_printed_as_the_name_written(cli, refused, tmp_path):
    """--out $'o\\e[2Jx' (a clear screen) and one holding an OSC 8 link: the "wrote" line shows each path with
    the escapes visible (Python's repr, quoted), and that name, read back, is the file written; before, the
    escapes were removed, naming a folder that does not exist. A refusal names the folder the same way."""
    import ast
    from pathlib import Path

    for name in ("o\x1b[2Jx", "p\x1b]8;;http://evil\x1b\\q", "r\nwrote /etc/passwd"):
        out = tmp_path / name
        rc, stdout, err = cli("serve", "gpt2", "--service-time", "fixed:10", "--arrival", "poisson:5",
                              "--requests", 20, "--policy", "none", "--no-store", "--out", out)
        assert rc == 0, err
        assert "\x1b" not in stdout + err
        (line,) = [x for x in stdout.splitlines() if x.startswith("wrote ")]
        first = line[len("wrote "):].split(", ")[0]
        assert first.startswith("'") and Path(ast.literal_eval(first)) == out / "serve.json"
        assert (out / "serve.json").is_file()
    (tmp_path / "f\x1b[2Jg").write_text("a file")
    line = refused("serve", "gpt2", "--service-time", "fixed:10", "--requests", 20, "--no-store",
                   "--out", tmp_path / "f\x1b[2Jg", needle="it exists and is not a folder")
    assert repr(str(tmp_path / "f\x1b[2Jg")) in line


def test_the_collector_pauses_for_an_analysis_and_freezes_what_it_left():
    """collector_paused: the cyclic collector off inside, on after, with what the block made and kept moved to the
    permanent generation (the first collection after it does not walk a DeepSeek-R1 graph again)."""
    import gc

    from opmap.cli.common import collector_paused

    assert gc.isenabled()
    before = gc.get_freeze_count()
    try:
        with collector_paused():
            assert not gc.isenabled()
            kept = [[i] for i in range(1000)]  # 1,001 tracked containers
        assert gc.isenabled() and gc.get_freeze_count() >= before + len(kept) + 1
    finally:
        gc.unfreeze()
