"""A user's model file (opmap.workloads.user): whatever its import or its factory raises, sys.exit included, is
one OpmapError; a file that exits is a failure, never a silent success."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from opmap.errors import OpmapError
from opmap.workloads import load_user

SRC = str(Path(__file__).resolve().parents[2] / "src")
GOOD = "import torch\ndef f():\n    return torch.nn.Linear(4, 4), (torch.zeros(2, 4),)\n"


@pytest.mark.parametrize("source,needle", [
    ("import sys\nsys.exit(0)\n", "importing {p} called sys.exit(0); a model file must"),
    ("import sys\nsys.exit('bye')\n", "importing {p} called sys.exit('bye')"),
    ("raise SystemExit(3)\n", "importing {p} called sys.exit(3)"),
    ("import sys\ndef f():\n    sys.exit(0)\n", "{p}:f() on device 'meta' called sys.exit(0)"),
    ("import sys\ndef f():\n    sys.exit()\n", "{p}:f() on device 'meta' called sys.exit(None)"),
    ("class Boom(BaseException):\n    pass\ndef f():\n    raise Boom('first\\nsecond')\n",
     "{p}:f() on device 'meta' failed: Boom: first"),
    ("class Boom(BaseException):\n    pass\nraise Boom()\n", "importing {p} failed: Boom"),
])
def test_exit_or_base_exception_is_an_error(tmp_path, source, needle):
    p = tmp_path / "model.py"
    p.write_text(source)
    with pytest.raises(OpmapError) as e:
        load_user(f"{p}:f")
    assert needle.format(p=p) in str(e.value) and "\n" not in str(e.value)


def test_a_failed_import_leaves_no_module_behind(tmp_path):
    p = tmp_path / "model.py"
    p.write_text("raise ValueError('broken')\n")
    before = set(sys.modules)
    with pytest.raises(OpmapError, match="importing .* failed: ValueError: broken"):
        load_user(f"{p}:f")
    assert {m for m in set(sys.modules) - before if m.startswith("opmap_user_")} == set()


def test_a_good_file_still_loads(tmp_path):
    p = tmp_path / "model.py"
    p.write_text(GOOD)
    w = load_user(f"{p}:f")
    assert w.batch == 2 and sum(x.numel() for x in w.module.parameters()) == 4 * 4 + 4  # weight + bias


@pytest.mark.parametrize("source", ["import sys\nsys.exit(0)\n", "import sys\ndef f():\n    sys.exit(0)\n"])
def test_the_cli_exits_2_not_0(tmp_path, source):
    """`opmap analyze model.py:f` with a file that calls sys.exit(0) ended with status 0 and no output: the
    caller took it for a success. Now: status 2, one line."""
    p = tmp_path / "model.py"
    p.write_text(source)
    env = {**os.environ, "PYTHONPATH": SRC, "OPMAP_GRAPH_CACHE": "0"}
    r = subprocess.run([sys.executable, "-m", "opmap.cli", "analyze", f"{p}:f", "--out", str(tmp_path / "out")],
                       env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "called sys.exit(0)" in lines[0], (r.returncode, r.stderr)
    assert lines[0].startswith("opmap: error: ") and not (tmp_path / "out").exists()
