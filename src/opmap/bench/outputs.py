"""A run's files: bench.json (the spec, the endpoint, the figures) and requests.parquet (one row per request),
built in memory so the command writes them as one atomic set (opmap.report.outputs.write_set).

requests.parquet columns (times in s from the run's start): idx, warmup, status, error, http_status,
scheduled_s (null in a closed loop), sent_s, first_token_s, end_s, token_times_s (a list: every text event's
arrival), input_tokens_asked, output_tokens_asked, usage_prompt_tokens, usage_completion_tokens, events,
usage_error (why a usage count was set aside), token_times_dropped (text events past the times kept), response_id
(the server's id of the completion: its chunks' "id"). DuckDB
writes it (no pyarrow needed): the rows go through a JSON Lines file into ``COPY ... (FORMAT parquet)``, read with
an object size limit above the longest row written (DuckDB's default maximum_object_size, 16 MB, refused a row of
two million event times, 36 MB).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from opmap.bench.records import BenchResult
from opmap.record import key
from opmap.tags import Tags

if TYPE_CHECKING:
    from opmap.bench.imports import Imported, ImportedSpec
    from opmap.bench.launch import LaunchedServer
    from opmap.bench.metrics import BenchFigures
    from opmap.bench.server_metrics import ServerSeries

SCHEMA_VERSION = 1
PARQUET_COLUMNS = {
    "idx": "BIGINT", "warmup": "BOOLEAN", "status": "VARCHAR", "error": "VARCHAR", "http_status": "INTEGER",
    "scheduled_s": "DOUBLE", "sent_s": "DOUBLE", "first_token_s": "DOUBLE", "end_s": "DOUBLE",
    "token_times_s": "DOUBLE[]", "input_tokens_asked": "BIGINT", "output_tokens_asked": "BIGINT",
    "usage_prompt_tokens": "BIGINT", "usage_completion_tokens": "BIGINT", "events": "BIGINT",
    "usage_error": "VARCHAR", "token_times_dropped": "BIGINT", "response_id": "VARCHAR"}
JSON_OBJECT_BYTES = 16 << 20  # DuckDB's read_json default maximum_object_size; raised to the longest row


def _aiohttp_version() -> str:
    """The installed aiohttp's version (from its metadata: the package itself is not imported here)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aiohttp")
    except PackageNotFoundError:
        return "(not installed)"


def client_version() -> dict[str, str]:
    """The client that measured: opmap's version, its transport, Python's version."""
    import platform

    from opmap import __version__

    return {"opmap": __version__, "transport": f"aiohttp {_aiohttp_version()} (HTTP/1.1 keep-alive)",
            "python": platform.python_version()}


@dataclass(frozen=True)
class Endpoint:
    """bench.json's ``endpoint``: the URL and API asked, the model named, what /v1/models reported (``server_info``:
    its metadata and the server's version; None for an imported run, and not written) and the server header."""

    base_url: str
    api: str
    model: str
    server_models: tuple[str, ...]
    server_header: str | None
    server_info: dict[str, Any] | None = field(default=None, metadata=key(omit="none"))


@dataclass(frozen=True)
class Client:
    """bench.json's ``client`` of a run opmap measured: opmap's version, its transport, Python's version, the loop,
    the client's options (their keys in its place) and the host it ran on (None: not recorded, not written)."""

    opmap: str
    transport: str
    python: str
    mode: str
    concurrency: int | None
    options: dict[str, Any] = field(metadata=key(flatten=True))
    host: dict[str, Any] | None = field(default=None, metadata=key(omit="none"))


@dataclass(frozen=True)
class ToolClient:
    """bench.json's ``client`` of an imported run: the tool that measured, its version and its loop."""

    tool: str
    tool_version: str | None
    mode: str
    concurrency: int | None


@dataclass(frozen=True)
class RunState:
    """bench.json's ``run``: when it started (s since the epoch), how long it took (s), whether it was interrupted,
    the requests in flight at the stop and those recorded."""

    started_unix_s: float
    wall_s: float
    interrupted: bool
    in_flight_at_stop: int
    recorded: int


@dataclass(frozen=True)
class BenchFile:
    """bench.json: schema_version, kind, the workload spec, the endpoint, the client, how the run went, the figures
    (their keys in place), and where set the launched server, the server's metrics and the imported file."""

    RECORD: ClassVar[tuple[Any, ...]] = ("schema_version", "kind", ...)
    schema_version: ClassVar[int] = SCHEMA_VERSION
    kind: ClassVar[str] = "bench"
    spec: dict[str, Any] | ImportedSpec  # the load as the command asked it, or as an imported file states it
    endpoint: Endpoint
    client: Client | ToolClient
    run: RunState
    figures: BenchFigures = field(metadata=key(flatten=True))
    launched: LaunchedServer | None = field(default=None, metadata=key(omit="none"))
    server_metrics: ServerSeries | None = field(default=None, metadata=key(omit="none"))
    imported: Imported | None = field(default=None, metadata=key(omit="none"))


def bench_file(result: BenchResult, figures: BenchFigures, spec: dict[str, Any] | ImportedSpec, *,
               launched: LaunchedServer | None = None, host: dict[str, Any] | None = None,
               imported: Imported | None = None) -> BenchFile:
    """bench.json of a run (opmap.bench.metrics.summarize's figures): one opmap measured, with the server's
    metadata, its /metrics series, the client's host and the server it launched; or one ``imported`` from another
    tool's file (its client is the tool)."""
    endpoint = Endpoint(result.base_url, result.api, result.model, tuple(result.server_models), result.server_header,
                        None if imported is not None else result.server_info)
    if imported is not None:
        client: Client | ToolClient = ToolClient(imported.tool, imported.version, imported.mode, imported.concurrency)
    else:
        v = client_version()
        client = Client(v["opmap"], v["transport"], v["python"], result.mode, result.concurrency, result.options, host)
    run = RunState(result.started_unix_s, result.wall_s, result.interrupted, result.in_flight_at_stop,
                   len(result.records))
    return BenchFile(spec, endpoint, client, run, figures, launched, result.server_metrics, imported)


def _row_json(r) -> str:
    """One request's row of requests.parquet as a JSON Lines line (PARQUET_COLUMNS, in order)."""
    return json.dumps({
        "idx": r.index, "warmup": r.warmup, "status": r.status, "error": r.error, "http_status": r.http_status,
        "scheduled_s": r.scheduled_s, "sent_s": r.sent_s, "first_token_s": r.first_token_s, "end_s": r.end_s,
        "token_times_s": list(r.token_times_s), "input_tokens_asked": r.input_tokens_asked,
        "output_tokens_asked": r.output_tokens_asked, "usage_prompt_tokens": r.usage_prompt_tokens,
        "usage_completion_tokens": r.usage_completion_tokens, "events": r.events, "usage_error": r.usage_error,
        "token_times_dropped": r.token_times_dropped, "response_id": r.response_id}, allow_nan=False)


def requests_parquet(result: BenchResult) -> bytes:
    """requests.parquet's bytes: the records sorted by index (see the module docstring)."""
    import duckdb

    with tempfile.TemporaryDirectory(prefix="opmap-bench-") as d:
        src, dst = Path(d) / "rows.jsonl", Path(d) / "requests.parquet"  # SQL literals below: quotes doubled
        longest = 0
        with open(src, "w") as f:
            for r in sorted(result.records, key=lambda r: r.index):
                line = _row_json(r)
                longest = max(longest, len(line))
                f.write(line)
                f.write("\n")
        s_src, s_dst = str(src).replace("'", "''"), str(dst).replace("'", "''")
        cols = ", ".join(f"'{k}': '{v}'" for k, v in PARQUET_COLUMNS.items())
        con = duckdb.connect(":memory:")
        try:
            if result.records:
                size = max(JSON_OBJECT_BYTES, 2 * longest)
                con.execute(f"COPY (SELECT * FROM read_json('{s_src}', format='newline_delimited', "
                            f"maximum_object_size={size}, columns={{{cols}}})) TO '{s_dst}' (FORMAT parquet)")
            else:  # no request recorded: an empty table with the columns
                decl = ", ".join(f"{k} {v}" for k, v in PARQUET_COLUMNS.items())
                con.execute(f"CREATE TABLE t ({decl})")
                con.execute(f"COPY t TO '{s_dst}' (FORMAT parquet)")
        finally:
            con.close()
        return dst.read_bytes()


def bench_tags(body: dict[str, Any]) -> Tags:
    """The store tags of a bench.json body: the model as /v1/models reports it (workload), the endpoint
    (hardware: the server is what the URL reaches), phase bench, the load (parallelism), the server, the workload
    spec and the client version (an imported run's: the tool and its version)."""
    e = body.get("endpoint") if isinstance(body.get("endpoint"), dict) else {}
    s = body.get("spec") if isinstance(body.get("spec"), dict) else {}
    c = body.get("client") if isinstance(body.get("client"), dict) else {}
    served = e.get("server_models") or []
    load = f"open loop {s.get('arrival')}" if s.get("arrival") else f"closed loop c={s.get('concurrency')}"
    return Tags("bench", workload=served[0] if len(served) == 1 else e.get("model"), hardware=e.get("base_url"),
                phase="bench", precision=None, parallelism=load, endpoint=e.get("base_url"),
                server=e.get("server_header"), model=e.get("model"), served_models=tuple(served), api=e.get("api"),
                workload_spec=f"{load}, {e.get('api')}, input {s.get('input_len')}, output {s.get('output_len')}, "
                              f"requests {s.get('requests')}, duration {s.get('duration_s')}, warmup "
                              f"{s.get('warmup')}, seed {s.get('seed')}",
                client_version=c.get("opmap") or (" ".join(str(x) for x in (c.get("tool"), c.get("tool_version")) if x)
                                                  or None))  # an imported run (bench --from): the tool that measured
