"""Long measured commands (profile, sweep --measure) show a progress bar with the time left on stderr, and --json
puts the result alone on stdout: run as a user runs them, in a subprocess whose stderr is a terminal (a pseudo-
terminal) and whose stdout is a pipe."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def run_on_a_terminal(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """``opmap ARGS`` with stderr on a pseudo-terminal (drained as it is written) and stdout on a pipe: (exit
    status, stdout, what the terminal received)."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(SRC), "TERM": "xterm", "COLUMNS": "160"}
    proc = subprocess.Popen([sys.executable, "-m", "opmap.cli", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    seen = bytearray()

    def drain():
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    out, _ = proc.communicate(timeout=600)
    reader.join(timeout=30)
    os.close(master)
    return proc.returncode, out.decode(), seen.decode(errors="replace")


def _target(kind: str, tmp_path: Path) -> list[str]:
    if kind == "zoo":
        return []
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    return [str(tmp_path / "config.json")]


@pytest.mark.parametrize("kind", ["zoo", "hf-config"])
def test_profile_progress_goes_to_stderr_and_json_alone_to_stdout(tmp_path, kind):
    pytest.importorskip("transformers")
    from opmap.calibrate import to_toml

    v = lambda x: {"value": x, "kind": "measured", "source": "test profile"}  # noqa: E731
    (tmp_path / "hw.toml").write_text(to_toml({
        "name": "testcpu", "display_name": "test cpu", "vendor": "test", "device_type": "cpu",
        "matrix_peak_flops_per_s": {"fp32": v(5e10)}, "vector_peak_flops_per_s": {"fp32": v(5e9)},
        "memory_bytes": v(64e9), "memory_bandwidth_bytes_per_s": v(1e10), "launch_overhead_s": v(3e-6)}))
    target = _target(kind, tmp_path) or ["resnet50", "--image-size", "32"]
    shape = ["--seq", "16"] if kind == "hf-config" else []
    rc, out, term = run_on_a_terminal(["profile", *target, *shape, "--hardware", str(tmp_path / "hw.toml"),
                                       "--iters", "20", "--profile-iters", "2", "--warmup", "1", "--json",
                                       "--no-store", "--out", str(tmp_path / "p")], tmp_path)
    assert rc == 0, term
    d = json.loads(out)  # stdout holds profile.json and nothing else (the "wrote" line went to stderr)
    assert d["kind"] == "profile" and d["latency"]["n"] == 20
    assert d == json.loads((tmp_path / "p" / "profile.json").read_text())
    # the bar, its steps (warm-up 1 + timed 20 + profiled 2 = 23) and its time left; which stage's name shows depends
    # on when the bar refreshes (10 a second): a fast run can pass "timed iterations" between two refreshes
    assert "left" in term and "23/23" in term and "wrote " in term


@pytest.mark.parametrize("kind", ["zoo", "hf-config"])
def test_sweep_measure_progress_goes_to_stderr_and_json_alone_to_stdout(tmp_path, session_calibration, kind):
    pytest.importorskip("transformers")
    target = _target(kind, tmp_path) or ["gpt2"]
    rc, out, term = run_on_a_terminal(["sweep", *target, "--measure", "--batch", "1,2", "--seq", "8", "--repeats",
                                       "3", "--hardware", session_calibration, "--json", "--no-store"], tmp_path)
    assert rc == 0, term
    d = json.loads(out)
    assert len(d["points"]) == 2 and all(p["dtype"] == "fp32" for p in d["points"])
    # the bar's final state (2 of 2 points, the time left) is always drawn when it stops; a point's label ("seq 8,
    # batch N") shows only if a refresh (10 a second) falls while that point runs: a fast point can pass between two
    # refreshes (the clean-clone run of 2026-12-07 drew "sweeping 0/1" then "2/2")
    assert "left" in term and "2/2" in term and "opmap sweep" not in out
