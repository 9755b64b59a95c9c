"""opmap bench against the null streaming server (opmap.bench.nullserver: the client's behaviour, not a
model's figures), and against nothing at all; its run in the store, compare, memo and report."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from opmap.bench.nullserver import NullConfig, NullServer, ThreadServer

BENCH_TESTS = Path(__file__).parents[1] / "bench"  # bench_servers.py: the hostile test servers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_id(out: str) -> str:
    return re.search(r"recorded as run (\S+)", out).group(1)


def test_bench_writes_bench_json_and_parquet_and_records_the_run(tmp_path, cli):
    import duckdb

    store = tmp_path / "runs.duckdb"
    with ThreadServer(NullServer(NullConfig(token_s=0.001))) as port:
        rc, out, err = cli("bench", f"http://127.0.0.1:{port}/v1", "--model", "null", "--arrival", "constant:200",
                           "--requests", 30, "--warmup", 3, "--input-len", 12, "--output-len", 5, "--out",
                           tmp_path / "o", "--store", store)
    assert rc == 0, err
    assert "ttft" in out and "MLPerf-style validity: INVALID" in out and "send lag" in out
    d = json.loads((tmp_path / "o" / "bench.json").read_text())
    assert d["schema_version"] == 1 and d["kind"] == "bench" and d["spec"]["arrival"] == "constant:200"
    assert d["endpoint"]["server_models"] == ["null"] and d["endpoint"]["server_header"] == "opmap-null"
    assert (d["requests"]["measured"], d["requests"]["warmup"], d["requests"]["ok"]) == (30, 3, 30)
    assert d["usage_check"]["output_mismatches"] == 0 and d["usage_check"]["input_mismatches"] == 0
    assert d["rate"]["offered_per_s"] == pytest.approx(200)  # 30 sends 5 ms apart
    con = duckdb.connect()
    rows = con.execute("SELECT count(*), count(scheduled_s), sum(warmup::INT), min(len(token_times_s)), "
                       "max(len(token_times_s)), bool_and(status = 'ok'), sum(usage_completion_tokens) "
                       f"FROM read_parquet('{tmp_path / 'o' / 'requests.parquet'}')").fetchone()
    assert rows == (33, 33, 3, 5, 5, True, 165)
    from opmap.store import show_run

    run = show_run(_run_id(out), store)
    assert run.kind == "bench"
    t = run.tags
    assert t["endpoint"] == f"http://127.0.0.1:{port}" and t["served_models"] == ["null"]
    assert "open loop constant:200" in t["workload_spec"] and t["client_version"]
    n = duckdb.connect(str(store), read_only=True).execute(
        "SELECT count(*) FROM samples WHERE run_id = ? AND metric = 'ttft_s'", [run.id]).fetchone()[0]
    assert n == 30


def test_a_dead_endpoint_is_one_line_exit_2_and_nothing_written(tmp_path, refused):
    refused("bench", f"http://127.0.0.1:{_free_port()}", "--model", "m", "--out", tmp_path / "o", "--no-store",
            needle="cannot reach http://127.0.0.1")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args,needle", [
    (["--arrival", "poisson:1", "--concurrency", "2"], "give one"),
    (["--arrival", "burst:1"], "constant:RATE"),
    (["--api", "embeddings"], "accepted: completions, chat"),
    (["--requests", "0"], "--requests must be an integer"),
    (["--slo-ttft", "-5"], "--slo-ttft must be a number > 0 and <= 86400000 ms"),
    (["--output-len", "uniform:5,2"], "length"),
    # finite but absurd (opmap.validate.CEILINGS); before, each was taken as it was
    (["--timeout", "1e300"], "--timeout must be a number > 0 and <= 604800 s (one week at most) (got 1e+300)"),
    (["--duration", "1e300"], "--duration must be a number > 0 and <= 604800 s (one week at most) (got 1e+300)"),
    (["--min-duration", "1e300"], "--min-duration must be a number from 0 to 604800 s (one week at most)"),
    (["--slo-tpot", "1e308"], "--slo-tpot must be a number > 0 and <= 86400000 ms (one day at most) (got 1e+308)"),
    (["--arrival", "constant:1e300"], "RATE must be a number > 0 and <= 1000000 requests/s (got 1e+300)"),
    (["--arrival", "poisson:1e300"], "RATE must be a number > 0 and <= 1000000 requests/s (got 1e+300)"),
])
def test_bad_input_is_refused_before_any_request(refused, args, needle):
    refused("bench", f"http://127.0.0.1:{_free_port()}", "--model", "m", "--no-store", *args, needle=needle)


def test_a_url_that_is_not_http_is_refused(refused):
    refused("bench", "localhost:8000", "--model", "m", "--no-store", needle="not an http:// or https:// URL")


def test_compare_memo_and_report_on_bench_runs(tmp_path, cli):
    store = tmp_path / "runs.duckdb"
    common = ("--model", "null", "--concurrency", 2, "--requests", 24, "--output-len", 4, "--store", store)
    ids = {}
    for name, first in (("fast", 0.002), ("slow", 0.03)):
        with ThreadServer(NullServer(NullConfig(first_token_s=first))) as port:
            rc, out, err = cli("bench", f"http://127.0.0.1:{port}", *common)
            assert rc == 0, err
            ids[name] = _run_id(out)
    rc, out, err = cli("compare", ids["fast"], ids["slow"], "--store", store)
    assert rc == 1, err  # a regression: TTFT 2 ms -> 30 ms, 24 requests a side
    assert "regression" in out and "ttft" in out
    rc, out, err = cli("compare", ids["fast"], ids["slow"], "--store", store, "--json")
    r = json.loads(out)
    ttft = next(m for m in r["metrics"] if m["metric"] == "ttft")
    assert ttft["verdict"] == "regression" and ttft["p"] < 1e-6 and ttft["rel"] > 2
    with ThreadServer(NullServer(NullConfig())) as port:
        rc, out, err = cli("bench", f"http://127.0.0.1:{port}", *common[:-4], "--output-len", 6, "--store", store)
    other = _run_id(out)
    rc, out, err = cli("compare", ids["fast"], other, "--store", store)
    assert rc == 2 and "not the same load" in err
    rc, out, err = cli("memo", ids["slow"], "--store", store)
    assert rc == 0 and "measured load INVALID" in out, err
    rc, out, err = cli("report", ids["slow"], "--store", store, "--out", tmp_path / "r.html")
    assert rc == 0 and "Measured latency CDFs" in (tmp_path / "r.html").read_text(), err


def test_a_closed_loop_for_a_duration_and_a_trace_open_loop(tmp_path, cli):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"arrival_s": {0.01 * i}, "input_len": {5 + i}, "output_len": 3}}\n'
                             for i in range(1, 13)))
    with ThreadServer(NullServer(NullConfig(first_token_s=0.01))) as port:
        rc, out, err = cli("bench", f"http://127.0.0.1:{port}", "--model", "null", "--concurrency", 2, "--duration",
                           0.3, "--output-len", 2, "--out", tmp_path / "d", "--no-store")
        assert rc == 0, err
        d = json.loads((tmp_path / "d" / "bench.json").read_text())
        assert 10 < d["requests"]["measured"] < 80 and 0.25 < d["requests"]["window_s"] < 0.6  # ~12 ms a request
        rc, out, err = cli("bench", f"http://127.0.0.1:{port}", "--model", "null", "--arrival", f"trace:{trace}",
                           "--input-len", "trace", "--output-len", "trace", "--out", tmp_path / "t", "--no-store")
    assert rc == 0, err
    t = json.loads((tmp_path / "t" / "bench.json").read_text())
    assert t["requests"]["measured"] == 12 and t["requests"]["input_tokens"] == sum(5 + i for i in range(1, 13))
    assert t["rate"]["offered_per_s"] == pytest.approx(100)  # 12 rows 10 ms apart


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_stop_signal_writes_what_was_measured_and_exits_128_plus_its_number(tmp_path, cli, signame):
    """Ctrl-C (SIGINT) or SIGTERM mid-run: what was measured is printed, written and recorded, and the exit status is
    128 + the signal's number, as every opmap command (130, 143; bench exited 130 for SIGTERM too)."""
    import os
    import signal
    import threading

    import duckdb

    sig = getattr(signal, signame)
    server, quit_ = NullServer(NullConfig(first_token_s=0.02)), threading.Event()

    def stop_once_answering() -> None:  # the signal lands mid-run, not in the start-up (imports, /v1/models)
        while server.requests < 8 and not quit_.wait(0.01):
            pass
        if not quit_.is_set():
            os.kill(os.getpid(), sig)

    with ThreadServer(server) as port:
        killer = threading.Thread(target=stop_once_answering, daemon=True)
        killer.start()
        try:
            rc, out, err = cli("bench", f"http://127.0.0.1:{port}", "--model", "null", "--arrival", "constant:40",
                               "--requests", 80, "--out", tmp_path / "o", "--no-store")
        finally:
            quit_.set()
            killer.join(5)
    assert rc == 128 + int(sig), err
    d = json.loads((tmp_path / "o" / "bench.json").read_text())
    assert d["run"]["interrupted"] and "interrupted" in d["validity"]["reason"] and "interrupted:" in out
    n = duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{tmp_path / 'o' / 'requests.parquet'}')"
                                 ).fetchone()[0]
    assert n == d["run"]["recorded"] and 5 < n < 80


@pytest.fixture
def hostile(monkeypatch):
    """tests/bench/bench_servers.py's HostileServer (the bench tests' folder is not a package)."""
    monkeypatch.syspath_prepend(str(BENCH_TESTS))
    from bench_servers import HostileServer

    return HostileServer


def test_a_run_in_which_every_request_failed_exits_1_and_is_written_and_recorded(tmp_path, cli, hostile):
    """Every answer a 307: the run is printed (the redirect named, with where it points), written and recorded
    as any run, and exits 1 (it used to exit 0, each request "ended before [DONE]")."""
    store = tmp_path / "runs.duckdb"
    with ThreadServer(hostile("redirect")) as port:
        rc, out, err = cli("bench", f"http://127.0.0.1:{port}", "--model", "null", "--concurrency", 1, "--requests",
                           3, "--out", tmp_path / "o", "--store", store)
    assert rc == 1, err
    assert "every one of the 3 measured requests failed" in out and "Traceback" not in out + err
    assert "redirect 307 to http://127.0.0.1:9/v1/completions (opmap does not follow redirects" in out
    d = json.loads((tmp_path / "o" / "bench.json").read_text())
    assert d["errors"]["http_error"] == 3 and d["error_examples"]["http_error"].startswith("redirect 307 to")
    assert (tmp_path / "o" / "requests.parquet").is_file()
    from opmap.store import show_run

    assert show_run(_run_id(out), store).kind == "bench"


def test_a_run_with_some_requests_failed_exits_0_and_names_the_failure(tmp_path, cli, hostile):
    with ThreadServer(hostile("html", every=2)) as port:
        rc, out, err = cli("bench", f"http://127.0.0.1:{port}", "--model", "null", "--concurrency", 1, "--requests",
                           4, "--no-store")
    assert rc == 0, err
    assert "errors: stream_error 2" in out and "the answer is text/html (HTTP 200), not an event stream" in out


def test_an_endless_model_list_is_one_line_exit_2_and_nothing_sent(tmp_path, refused, hostile):
    from opmap.bench.client import MODELS_BODY_BYTES

    server = hostile("huge-models", (MODELS_BODY_BYTES + (1 << 20), "chunked"))
    with ThreadServer(server) as port:
        refused("bench", f"http://127.0.0.1:{port}", "--model", "m", "--out", tmp_path / "o", "--no-store",
                needle=f"/v1/models answered more than {MODELS_BODY_BYTES} bytes")
    assert server.posts == 0 and not (tmp_path / "o").exists()
