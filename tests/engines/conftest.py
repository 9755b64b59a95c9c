"""Fixtures for the engine-preset tests: run ``opmap`` in-process, as tests/cli does."""

from __future__ import annotations

import pytest

from opmap.cli import main


@pytest.fixture
def cli(capsys):
    """``cli(*args)`` runs ``opmap ARGS`` in-process: (exit status, stdout, stderr)."""
    def run(*args):
        rc = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return rc, out, err

    return run


@pytest.fixture
def refused(cli):
    """``refused(*args, needle=...)``: exit status 2, one line on stderr holding ``needle``, no traceback."""
    def run(*args, needle: str):
        rc, out, err = cli(*args)
        lines = [x for x in err.splitlines() if x.strip()]
        assert rc == 2 and len(lines) == 1 and needle in lines[0], (rc, err)
        assert "Traceback" not in err + out
        return lines[0]

    return run
