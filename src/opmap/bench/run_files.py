"""A bench run read back from the folder ``opmap bench --out DIR`` wrote (bench.json and requests.parquet,
opmap.bench.outputs): the records and how the run went, as the client returned them, for what reads measured
runs after the fact (``opmap calibrate --from-bench``).

Both files are parsed, never executed, and bounded: bench.json by ``BENCH_JSON_BYTES``, requests.parquet by
``PARQUET_BYTES`` (read by DuckDB; a row's columns are checked against the names and types the writer uses).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opmap.bench.outputs import PARQUET_COLUMNS
from opmap.bench.records import STATUSES, BenchResult, RequestRecord
from opmap.errors import OpmapError
from opmap.safeio import read_json_object

BENCH_JSON_BYTES = 64 << 20
PARQUET_BYTES = 2 << 30


@dataclass(frozen=True)
class Launched:
    """What a run's launched server was started with (bench.json's ``launched.settings``, opmap.bench.launch
    .LaunchSettings), the settings a stack fit reads: the config, the dtype, the tokens a step, the KV page (tokens)
    and pool (blocks, tokens). A setting the file lacks, or holds as another type, is None."""

    config: str | None
    dtype: str | None
    max_batch_tokens: int | None
    page_tokens: int | None
    kv_blocks: int | None
    kv_tokens: int | None

    @classmethod
    def of(cls, v: Any) -> Launched | None:
        """The settings of bench.json's ``launched`` block ``v``; None where there is none (a run against a URL)."""
        if not isinstance(v, dict) or not v:
            return None
        s = v.get("settings") if isinstance(v.get("settings"), dict) else {}

        def text(k: str) -> str | None:
            return s[k] if isinstance(s.get(k), str) else None

        def count(k: str) -> int | None:
            x = s.get(k)
            return x if isinstance(x, int) and not isinstance(x, bool) else None

        return cls(text("config"), text("dtype"), count("max_batch_tokens"), count("page_tokens"),
                   count("kv_blocks"), count("kv_tokens"))


@dataclass(frozen=True)
class BenchRun:
    """A run folder: its records (``result``), bench.json as written (``body``) and where it was read from."""

    folder: Path
    result: BenchResult
    body: dict[str, Any]

    @property
    def concurrency(self) -> int | None:
        return self.result.concurrency

    @property
    def launched(self) -> Launched | None:
        """The launched server's settings (bench.json's ``launched``; None for a run against a URL)."""
        return Launched.of(self.body.get("launched"))

    def label(self) -> str:
        if self.result.mode == "closed":
            return f"{self.folder.name} (closed loop c={self.result.concurrency})"
        return f"{self.folder.name} (open loop {self.body.get('spec', {}).get('arrival')})"


def _records(path: Path) -> tuple[RequestRecord, ...]:
    import duckdb

    if not path.is_file() or path.is_symlink():
        raise OpmapError(f"{path}: no requests.parquet (a folder `opmap bench --out DIR` wrote holds one)")
    if path.stat().st_size > PARQUET_BYTES:
        raise OpmapError(f"{path} is over {PARQUET_BYTES} bytes: not a bench run's request table")
    con = duckdb.connect(":memory:")
    try:
        cur = con.execute("SELECT * FROM read_parquet(?)", [str(path)])
        names = [d[0] for d in cur.description]
        if names not in (list(PARQUET_COLUMNS), list(PARQUET_COLUMNS)[:-1]):  # runs written before response_id
            raise OpmapError(f"{path}: columns {names} are not a bench run's ({', '.join(PARQUET_COLUMNS)})")
        rows = cur.fetchall()
    except duckdb.Error as e:
        raise OpmapError(f"cannot read {path}: {str(e).splitlines()[0][:200]}") from None
    finally:
        con.close()
    out = []
    for row in rows:
        r = dict(zip(names, row))
        if r["status"] not in STATUSES:
            raise OpmapError(f"{path}: request {r['idx']} has status {r['status']!r}; accepted: {', '.join(STATUSES)}")
        out.append(RequestRecord(int(r["idx"]), r["scheduled_s"], float(r["sent_s"]), r["first_token_s"],
                                 tuple(r["token_times_s"] or ()), float(r["end_s"]), int(r["input_tokens_asked"]),
                                 int(r["output_tokens_asked"]), r["usage_prompt_tokens"], r["usage_completion_tokens"],
                                 int(r["events"]), r["status"], r["error"] or "", r["http_status"], bool(r["warmup"]),
                                 r["usage_error"] or "", int(r["token_times_dropped"] or 0),
                                 r.get("response_id") or ""))
    return tuple(out)


def read_run(folder: str | Path) -> BenchRun:
    """The run in ``folder`` (bench.json + requests.parquet); one OpmapError line when it is not one."""
    folder = Path(folder)
    if not folder.is_dir():
        raise OpmapError(f"{folder}: not a folder; --from-bench takes folders `opmap bench --out DIR` wrote")
    body = read_json_object(folder / "bench.json", BENCH_JSON_BYTES, "bench.json",
                            f"{folder / 'bench.json'} holds no JSON object: not a bench run's")
    if body.get("kind") != "bench":
        raise OpmapError(f"{folder / 'bench.json'} is not a bench run's (its kind is {body.get('kind')!r})")
    e, c, run = (body.get(k) if isinstance(body.get(k), dict) else {} for k in ("endpoint", "client", "run"))
    mode = c.get("mode")
    if mode not in ("open", "closed"):
        raise OpmapError(f"{folder / 'bench.json'}: client.mode {mode!r}; accepted: open, closed")
    conc = c.get("concurrency")
    if mode == "closed" and not (isinstance(conc, int) and conc >= 1):
        raise OpmapError(f"{folder / 'bench.json'}: a closed loop needs client.concurrency >= 1, got {conc!r}")
    result = BenchResult(_records(folder / "requests.parquet"), str(e.get("base_url", "")), str(e.get("model", "")),
                         str(e.get("api", "completions")), mode, conc if mode == "closed" else None,
                         float(run.get("started_unix_s") or 0.0), float(run.get("wall_s") or 0.0),
                         bool(run.get("interrupted")))
    return BenchRun(folder, result, body)
