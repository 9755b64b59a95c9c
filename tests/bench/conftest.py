"""Fixtures for the bench tests: ONE real ``transformers serve`` (a 2-layer random-weight Llama, 0.93M parameters,
started in 10-20 s on 2 cores) shared by every test that needs a server, a local hardware profile for
``--predict --hardware local``, and an in-process ``opmap`` runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from launched_server import TINY_CONFIG_PATH, pid_alive


@pytest.fixture(scope="session")
def tiny_config() -> Path:
    """The repository's own examples/tiny-llama.json, the file the README's `bench --launch` names."""
    return TINY_CONFIG_PATH


@pytest.fixture(scope="session")
def server(tiny_config):
    """The session's one real server; at the end of the session it must be stopped and its folder gone."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from opmap.bench.launch import launch_server

    with launch_server(str(tiny_config)) as s:
        yield s
    assert not pid_alive(s.pid), f"the server (pid {s.pid}) outlived its launch_server block"
    assert not s.model_dir.exists()


@pytest.fixture(scope="session")
def local_hw(session_calibration) -> str:
    """``--hardware`` for this machine's CPU: the session's own quick calibration (tests/conftest.py), never a
    profile the user's machine cached (one calibrated under another load made predictions 48x off)."""
    return session_calibration


@pytest.fixture
def opmap_cli(capsys):
    """``opmap_cli(*args)`` runs ``opmap ARGS`` in-process: (exit status, stdout, stderr)."""
    from opmap.cli import main

    def run(*args):
        rc = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return rc, out, err

    return run
