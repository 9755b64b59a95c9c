"""``opmap compare A B --rerun N``: re-run the two recorded profile commands N more times each, interleaved
(A B A B ..., each in a fresh process), so the noise between runs is measured on this host, now, and a slow
drift of the machine falls on both sides alike.

Each re-run is the run's recorded command (``opmap profile ...``) without its output options (``--out``,
``--store``, ``--no-store``), recorded into the same store; it runs from the current folder, so a model file
named by a relative path must be reachable from here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from opmap.errors import OpmapError
from opmap.store.source import Run

MAX_RERUNS = 20
_DROP = ("--out", "--store")


def rerun_argv(run: Run) -> list[str]:
    """The arguments of ``run``'s recorded profile command, output options dropped."""
    command = run.tags.get("command")
    try:
        words = shlex.split(str(command or ""))
    except ValueError:
        words = []
    if run.kind != "profile" or len(words) < 3 or words[:2] != ["opmap", "profile"]:
        raise OpmapError(f"--rerun re-runs recorded `opmap profile` commands; run {run.id} ({run.kind}) has "
                         f"{'command ' + repr(command) if command else 'no recorded command'}")
    out, skip = [], False
    for w in words[1:]:
        if skip:
            skip = False
        elif w.split("=", 1)[0] in _DROP:
            skip = "=" not in w
        elif w != "--no-store":
            out.append(w)
    return out


def rerun(a: Run, b: Run, n: int, store: Path | None,
          progress: Callable[[str], None] | None = None) -> tuple[list[str], list[str]]:
    """Run A's and B's commands ``n`` times each, A B A B ...; returns (A's new run ids, B's new run ids)."""
    from opmap.store.db import default_path

    if not 1 <= n <= MAX_RERUNS:
        raise OpmapError(f"--rerun takes 1 to {MAX_RERUNS} re-runs a side, got {n}")
    store = store if store is not None else default_path()
    if store is None:
        raise OpmapError("--rerun records its runs in the store: recording is off (OPMAP_STORE=off)")
    argv = {a.id: rerun_argv(a), b.id: rerun_argv(b)}
    new: dict[str, list[str]] = {a.id: [], b.id: []}
    for i in range(n):
        for side, run in (("A", a), ("B", b)):
            if progress:
                progress(f"re-run {i + 1} of {n} of {side} ({run.id})")
            new[run.id].append(_one(run, argv[run.id], store))
    return new[a.id], new[b.id]


def _one(run: Run, argv: list[str], store: Path) -> str:
    """One re-run in a fresh process; the id of the run it recorded."""
    env = {**os.environ, "COLUMNS": "200"}  # one line per message: the run id is read from stdout
    p = subprocess.run([sys.executable, "-m", "opmap.cli", *argv, "--store", str(store)], capture_output=True,
                       text=True, env=env)
    if p.returncode != 0:
        last = next((x for x in reversed(p.stderr.splitlines()) if x.strip()), "no message")
        raise OpmapError(f"re-running run {run.id} (opmap {shlex.join(argv)}) failed with exit {p.returncode}: "
                         f"{last.strip()}")
    m = re.search(r"recorded as run (\S+)", p.stdout)
    if m is None:
        raise OpmapError(f"re-running run {run.id} recorded no run in {store}")
    return m.group(1)
