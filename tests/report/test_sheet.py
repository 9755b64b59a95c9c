"""The analysis sheet's files: written as a set, with ordinary permissions."""

from __future__ import annotations

import os
import stat

from opmap.report.sheet import write_set


def test_written_files_are_readable_by_others_modulo_umask(tmp_path):
    old = os.umask(0o022)
    try:
        paths = write_set(tmp_path / "out", {"a.json": "{}\n", "b.csv": "x\n"})
    finally:
        os.umask(old)
    for p in paths:
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, (p, oct(p.stat().st_mode))
    old = os.umask(0o077)
    try:
        paths = write_set(tmp_path / "private", {"a.json": "{}\n"})
    finally:
        os.umask(old)
    assert stat.S_IMODE(paths[0].stat().st_mode) == 0o600
