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
