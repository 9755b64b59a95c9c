"""requests.parquet as the run's writer makes it (opmap.bench.outputs), read back with DuckDB."""

from __future__ import annotations

import duckdb

from opmap.bench.outputs import requests_parquet
from opmap.bench.records import BenchResult, RequestRecord


def test_a_request_of_two_million_event_times_is_written_whole(tmp_path):
    """One record of 2,000,000 event times (a 36 MB JSON row: past DuckDB's default maximum_object_size, 16 MB,
    which it enforces from 32 MB on; a 3-million-event run lost its bench.json and parquet to it) beside an
    ordinary one: both rows come back, every time and the new columns (usage_error, token_times_dropped) as
    written. The client keeps at most 262,144 times per request; the writer does not rely on it."""
    n = 2_000_000
    times = tuple(1.0 + i * 1.2345678901234567e-06 for i in range(n))
    big = RequestRecord(0, None, 0.0, times[0], times, times[-1] + 1e-3, 3, n, 3, None, n + 2, "ok",
                        usage_error="usage completion_tokens -1 is not a count", token_times_dropped=7)
    small = RequestRecord(1, None, 0.5, 0.6, (0.6, 0.7), 0.8, 3, 2, 3, 2, 4, "ok")
    result = BenchResult((small, big), "http://127.0.0.1:1", "m", "completions", "closed", 1, 0.0, 1.0)
    path = tmp_path / "requests.parquet"
    path.write_bytes(requests_parquet(result))
    rows = duckdb.connect().execute(
        f"SELECT idx, len(token_times_s), token_times_s[1], token_times_s[-1], usage_completion_tokens, usage_error, "
        f"token_times_dropped FROM read_parquet('{path}') ORDER BY idx").fetchall()
    assert rows == [(0, n, times[0], times[-1], None, "usage completion_tokens -1 is not a count", 7),
                    (1, 2, 0.6, 0.7, 2, "", 0)]


def test_bench_json_is_the_bench_file_record_key_for_key():
    """bench.json's shape, key for key as opmap.bench.outputs.bench_body and the command wrote it before it was
    declared (a stable output): a measured run's client with its options and host in place, the endpoint with the
    server's metadata, the figures' keys at the top, the launched server last; an imported run's client the tool,
    no server metadata, its ``imported`` block last."""
    import json
    from pathlib import Path

    from opmap.bench import imports
    from opmap.bench.import_formats import read_result
    from opmap.bench.metrics import summarize
    from opmap.bench.outputs import bench_file
    from opmap.record import record

    recs = (RequestRecord(0, None, 0.0, 0.1, (0.1, 0.2), 0.25, 8, 2, 8, 2, 3, "ok"),)
    res = BenchResult(recs, "http://x:1", "m", "completions", "closed", 1, 1.7e9, 0.3, server_models=("m",),
                      options={"timeout_s": 60.0, "ignore_eos": True}, server_info={"version": "1"})
    spec = {"arrival": None, "concurrency": 1, "requests": 1}
    d = record(bench_file(res, summarize(recs, min_duration_s=0, min_queries=0), spec, host={"name": "h"}))
    figures = ["requests", "latency", "cdf", "throughput", "rate", "goodput", "errors", "error_examples",
               "usage_check", "scheduler_lag", "validity", "samples"]
    assert list(d) == ["schema_version", "kind", "spec", "endpoint", "client", "run", *figures]
    assert d["schema_version"] == 1 and d["kind"] == "bench" and d["spec"] == spec
    assert list(d["endpoint"]) == ["base_url", "api", "model", "server_models", "server_header", "server_info"]
    assert list(d["client"]) == ["opmap", "transport", "python", "mode", "concurrency", "timeout_s", "ignore_eos",
                                 "host"]
    assert d["run"] == {"started_unix_s": 1.7e9, "wall_s": 0.3, "interrupted": False, "in_flight_at_stop": 0,
                        "recorded": 1}
    data = Path(__file__).parent / "data" / "vllm_serve.json"
    run = read_result(data, None, 0)
    d = json.loads(json.dumps(record(bench_file(imports.as_result(run), imports.figures(run, 0.0, 0),
                                                imports.spec(run), imported=run))))
    assert list(d) == ["schema_version", "kind", "spec", "endpoint", "client", "run", *figures, "imported"]
    assert list(d["endpoint"]) == ["base_url", "api", "model", "server_models", "server_header"]
    assert list(d["client"]) == ["tool", "tool_version", "mode", "concurrency"]
    assert list(d["spec"]) == ["arrival", "concurrency", "requests", "duration_s", "warmup", "input_len",
                               "output_len", "seed", "api", "imported_from"]
    assert list(d["imported"]) == ["tool", "format", "tool_version", "format_source", "file", "sha256",
                                   "granularity", "requests_in_file", "notes"]
    assert d["imported"]["format"] == "vllm" and d["spec"]["imported_from"] == "vllm bench serve"
