"""Outputs unchanged (issue 36's evidence): run a fixed set of opmap commands, keep their predicted figures, and
compare them with a recording made before a structural change.

    python benchmarks/outputs_unchanged.py record DIR     # before: writes DIR/<case>.json, one per command
    python benchmarks/outputs_unchanged.py diff DIR       # after: exit 1 and a per-command summary on any change
    ... [--only NAME[,NAME]] [--jobs 2] [--warm-cache]

Each command runs in its own process (``python -m opmap.cli``, the sources on PYTHONPATH as set by the caller)
with ``--no-store`` and ``--out`` (or ``--json``) into a temp folder; what it writes (every ``*.json``) and its
stdout are normalised: what is not a prediction is dropped (timestamps, run ids, host and machine names, paths,
measured timings and everything under a ``measured`` key), the temp folder's path is replaced by ``<OUT>``. Floats
are kept as JSON writes them (repr: byte-identical or changed). The graph capture cache is a fresh temp folder per
run (``XDG_CACHE_HOME``), so every prediction is made by the code under test, unless ``--warm-cache``.

The table (rich) lists each command, its wall time and status (recorded, same, CHANGED, FAILED); the results go to
benchmarks/results/outputs_unchanged.json. About 3 minutes on a 2-core machine with ``--jobs 2``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SCHEMA_VERSION, machine, now_iso, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "examples" / "tiny-llama.json")  # a Hugging Face config.json: 2 layers, hidden 128
SERVE = ["--requests", "120", "--input-len", "256", "--output-len", "32", "--arrival", "poisson:20"]

# name -> the command's arguments after ``opmap``; "{out}" is the command's temp folder
CASES: dict[str, list[str]] = {
    "analyze-zoo-decode-tp2-bf16": ["analyze", "llama-3-8b", "--phase", "decode", "--kv-len", "512", "--batch", "8",
                                    "--tp", "2", "--dtype", "bf16", "--out", "{out}"],
    "analyze-zoo-train-pp2-dp2-fp8": ["analyze", "llama-3-8b", "--phase", "train", "--seq", "256", "--pp", "2",
                                      "--dp", "2", "--global-batch", "8", "--dtype", "fp8", "--out", "{out}"],
    "analyze-moe-decode-ep2-dp2": ["analyze", "mixtral-8x7b", "--phase", "decode", "--kv-len", "256", "--batch", "16",
                                   "--ep", "2", "--dp", "2", "--tp", "2", "--out", "{out}"],
    "analyze-hf-decode-tp2-fp8": ["analyze", TINY, "--phase", "decode", "--kv-len", "128", "--batch", "4",
                                  "--tp", "2", "--dtype", "fp8", "--out", "{out}"],
    "analyze-hf-train-pp2-dp2-bf16": ["analyze", TINY, "--phase", "train", "--seq", "128", "--pp", "2", "--dp", "2",
                                      "--tp", "2", "--sp", "--global-batch", "8", "--recompute", "selective",
                                      "--out", "{out}"],
    "plan-zoo-train": ["plan", "llama-3-8b", "--devices", "8", "--seq", "256", "--rows", "0", "--out", "{out}"],
    "plan-hf-prefill": ["plan", TINY, "--devices", "4", "--phase", "prefill", "--seq", "128", "--rows", "0",
                        "--out", "{out}"],
    "sweep-zoo-decode-tp2": ["sweep", "llama-3-8b", "--phase", "decode", "--batch", "1,8", "--seq", "256",
                             "--tp", "2", "--json", "--out", "{out}"],
    "sweep-hf-prefill-pp2-fp8": ["sweep", TINY, "--batch", "1,4", "--seq", "64,128", "--pp", "2", "--dtype", "fp8",
                                 "--json", "--out", "{out}"],
    "serve-engine": ["serve", TINY, *SERVE, "--policy", "engine", "--out", "{out}"],
    "serve-none": ["serve", TINY, *SERVE, "--policy", "none", "--out", "{out}"],
    "serve-static": ["serve", TINY, *SERVE, "--policy", "static:8", "--out", "{out}"],
    "serve-dynamic": ["serve", TINY, *SERVE, "--policy", "dynamic:8,5", "--out", "{out}"],
    "serve-continuous": ["serve", TINY, *SERVE, "--policy", "continuous", "--out", "{out}"],
    "serve-chunked": ["serve", TINY, *SERVE, "--policy", "chunked:128", "--out", "{out}"],
    "serve-zoo-tp2-find-capacity": ["serve", "llama-3-8b", "--tp", "2", *SERVE, "--find-capacity",
                                    "--out", "{out}"],
    "serve-zoo-disaggregate": ["serve", "llama-3-8b", *SERVE, "--disaggregate", "1:1", "--out", "{out}"],
    "fit-small": ["fit", "--models", TINY, "--hardware", "h100-sxm,a100", "--devices", "1", "--requests", "200",
                  "--devices-budget", "2", "--out", "{out}"],
    "bench-predict": ["bench", "--launch", TINY, "--arrival", "poisson:20", "--requests", "12", "--input-len", "16",
                      "--output-len", "8", "--predict", "--hardware", "h100-sxm", "--min-duration", "0",
                      "--min-queries", "0", "--threads", "1", "--out", "{out}"],
    "profile-cpu-predicted": ["profile", TINY, "--device", "cpu", "--hardware", "h100-sxm", "--seq", "64",
                              "--warmup", "1", "--iters", "2", "--profile-iters", "1", "--out", "{out}"],
}

# cases whose outputs mix measurements with predictions: only these files' top-level keys are kept (the
# predictions, their inputs and the cost table priced), and the stdout (a measured report) is not compared
KEEP: dict[str, dict[str, tuple[str, ...]]] = {
    # the prediction's figures replay the measured send times: only the cost table priced and the inputs compare
    "bench-predict": {"bench_predict.json": ("assumptions", "cost", "policy", "workload")},
    "profile-cpu-predicted": {"profile.json": ("assumptions", "fusion", "kernels", "layer_types", "memory", "nodes",
                                               "phase", "totals", "uncounted")},
}

# keys whose value is not a prediction: dropped wherever they appear (exact names)
DROP_KEYS = {
    "timestamp", "created", "created_at", "started", "started_at", "finished_at", "date", "time_utc", "when",
    "run_id", "id", "run", "host", "hostname", "machine", "node", "pid", "path", "paths", "out", "out_dir", "model_dir",
    "files", "wall_s", "elapsed_s", "duration_s", "took_s", "python", "torch", "version", "opmap_version",
    "git", "commit", "cache", "cache_key", "graph_hash", "launched", "measured", "measurement", "probe", "overhead",
    "samples", "samples_s", "points_per_s", "trace", "torch_trace", "requests_ok", "usage_check", "server",
}
# keys dropped by pattern: measured timings and host facts
DROP_RE = re.compile(r"(^measured_|_measured$|^meas_|^wall|^elapsed|timestamp|_at$|^host_|_path$|_dir$|^started)")
# within stdout: lines that carry a measurement, a time of day or a path
STDOUT_DROP = re.compile(r"(measured|launched|stopped the server|wrote |took |elapsed|\bwall\b|pid \d|probe|"
                         r"\d\d:\d\d:\d\d|/tmp/|overhead|p50|p95|p99|cpu_busy|calibrat)", re.I)


def normalise(x: Any, out: str) -> Any:
    """``x`` without what is not a prediction (module docstring); strings with the temp folder's path made
    ``<OUT>`` and the checkout's ``<ROOT>`` (worktrees compare alike)."""
    if isinstance(x, dict):
        return {k: normalise(v, out) for k, v in x.items() if k not in DROP_KEYS and not DROP_RE.search(k)}
    if isinstance(x, list):
        return [normalise(v, out) for v in x]
    if isinstance(x, str):
        return x.replace(out, "<OUT>").replace(str(ROOT), "<ROOT>")
    return x


def kept(body: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The parts of ``body`` named by ``keys`` (``a/b``: key b under a)."""
    out: dict[str, Any] = {}
    for k in keys:
        top, _, sub = k.partition("/")
        if top in body:
            out[k] = body[top].get(sub) if sub and isinstance(body[top], dict) else body[top]
    return out


def run_case(name: str, args: list[str], cache: str | None) -> dict[str, Any]:
    """Run one command; its normalised outputs (file name -> JSON, and ``stdout`` lines) and its wall time."""
    with tempfile.TemporaryDirectory(prefix=f"ou-{name}-") as tmp:
        out = os.path.join(tmp, "out")
        argv = [sys.executable, "-m", "opmap.cli", *[a.replace("{out}", out) for a in args], "--no-store"]
        env = dict(os.environ, COLUMNS="160", NO_COLOR="1", TERM="dumb")
        if cache is not None:
            env["XDG_CACHE_HOME"] = cache
        t0 = time.perf_counter()
        p = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - t0
        files: dict[str, Any] = {}
        keep = KEEP.get(name)
        if p.returncode == 0:
            for f in sorted(Path(out).rglob("*.json")) if os.path.isdir(out) else []:
                rel = str(f.relative_to(out))
                if f.name in ("trace.json", "torch_trace.json") or (keep is not None and rel not in keep):
                    continue  # measured
                body = json.loads(f.read_text())
                files[rel] = normalise(kept(body, keep[rel]) if keep is not None else body, out)
            stdout = "" if keep is not None else p.stdout
            if "--json" in args:  # the JSON on stdout is one of the outputs
                files["<stdout>"] = normalise(json.loads(stdout), out)
                stdout = ""
            text = stdout.replace(out, "<OUT>").replace(str(ROOT), "<ROOT>")
            lines = [s.rstrip() for s in text.splitlines() if not STDOUT_DROP.search(s)]
            files["<stdout lines>"] = lines
        return {"name": name, "argv": ["opmap", *args], "rc": p.returncode, "wall_s": wall,
                "stderr_tail": p.stderr[-2000:] if p.returncode else "", "outputs": files}


def differences(old: Any, new: Any, where: str = "", acc: list[str] | None = None, limit: int = 8) -> list[str]:
    """Where ``new`` differs from ``old`` (JSON paths with both values), the first ``limit``."""
    acc = [] if acc is None else acc
    if len(acc) >= limit:
        return acc
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new), key=str):
            if k not in new or k not in old:
                acc.append(f"{where}/{k}: {'removed' if k not in new else 'added'}")
            else:
                differences(old[k], new[k], f"{where}/{k}", acc, limit)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            differences(a, b, f"{where}[{i}]", acc, limit)
    elif old != new or type(old) is not type(new):
        acc.append(f"{where}: {json.dumps(old)[:120]} -> {json.dumps(new)[:120]}")
    return acc[:limit]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("record", "diff"))
    ap.add_argument("dir", type=Path)
    ap.add_argument("--only", help="comma-separated case names (default: all)")
    ap.add_argument("--jobs", type=int, default=2, help="commands run at once (default 2)")
    ap.add_argument("--warm-cache", action="store_true", help="use the user's graph capture cache")
    a = ap.parse_args(argv)
    names = list(CASES) if not a.only else [n for n in a.only.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}", file=sys.stderr)
        return 2
    if a.mode == "diff" and not a.dir.is_dir():
        print(f"{a.dir} holds no recording (run `record {a.dir}` first)", file=sys.stderr)
        return 2
    a.dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ou-cache-") as cache:
        with ThreadPoolExecutor(max(1, a.jobs)) as pool:
            results = list(pool.map(lambda n: run_case(n, CASES[n], None if a.warm_cache else cache), names))
    rows, bad = [], 0
    for r in results:
        path = a.dir / f"{r['name']}.json"
        if r["rc"] != 0:
            r["status"], r["changes"] = "FAILED", [f"exit {r['rc']}: {r['stderr_tail'].strip()[-300:]}"]
        elif a.mode == "record":
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(r["outputs"], indent=1, sort_keys=True, allow_nan=False) + "\n")
            os.replace(tmp, path)
            r["status"], r["changes"] = "recorded", []
        elif not path.is_file():
            r["status"], r["changes"] = "NO RECORDING", [f"{path} missing"]
        else:
            old = json.loads(path.read_text())
            new = json.loads(json.dumps(r["outputs"], sort_keys=True, allow_nan=False))
            r["changes"] = differences(old, new)
            r["status"] = "CHANGED" if r["changes"] else "same"
        bad += r["status"] not in ("recorded", "same")
        rows.append({k: r[k] for k in ("name", "argv", "rc", "wall_s", "status", "changes")})
    total = time.perf_counter() - t0
    _table(rows, a.mode, total)
    write_json("outputs_unchanged", {"schema_version": SCHEMA_VERSION, "when": now_iso(), "machine": machine(),
                                     "mode": a.mode, "dir": str(a.dir), "total_s": total, "rows": rows})
    return 1 if bad else 0


def _table(rows: list[dict[str, Any]], mode: str, total: float) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"outputs_unchanged {mode}: {len(rows)} commands, {total:.0f} s")
    for c in ("command", "wall s", "status", "first changes"):
        t.add_column(c)
    for r in rows:
        colour = {"same": "green", "recorded": "cyan"}.get(r["status"], "red")
        t.add_row(r["name"], f"{r['wall_s']:.1f}", f"[{colour}]{r['status']}[/]", "\n".join(r["changes"][:4]))
    Console().print(t)


if __name__ == "__main__":
    sys.exit(main())
