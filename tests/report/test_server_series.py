"""The server-metrics figure of a measured run (opmap.report.dashboard.server_series): bench.json's series against
the run's time, the KV usage fraction drawn as a percentage; and the dashboard page of a stored bench run that
scraped a live Prometheus exporter holds it."""

from __future__ import annotations

import re

from opmap.report.dashboard import server_series


def _metrics(status="scraped"):
    return {"status": status, "url": "http://h/metrics", "engine": "vllm", "times_s": [0.0, 1.0, 2.0],
            "series": {"running": [1, 4, 2], "waiting": [0, 3, None], "kv_usage": [0.1, 0.55, 0.3]}}


def test_the_series_against_time_kv_as_percent():
    f = server_series({"server_metrics": _metrics()})
    by = {t.name: t for t in f.data}
    assert list(by) == ["requests running", "requests waiting", "KV cache in use (%)"]
    assert by["requests running"].x == (0.0, 1.0, 2.0) and by["requests waiting"].y == (0, 3, None)
    assert by["KV cache in use (%)"].y == (10.0, 55.00000000000001, 30.0)  # 0.55 x 100 in binary floating point


def test_no_figure_without_scrapes():
    assert server_series({"server_metrics": _metrics("absent")}) is None
    assert server_series({}) is None and server_series(None) is None


def test_the_report_of_a_stored_bench_run_draws_them(tmp_path, capsys):
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    from opmap.bench.nullserver import NullConfig, NullServer, ThreadServer
    from opmap.cli import main

    def opmap_cli_runner(*args):
        rc = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return rc, " ".join(out.split()), err

    reg = CollectorRegistry()
    Gauge("vllm:num_requests_running", "running", ["model_name", "engine"], registry=reg).labels("m", "0").set(3)
    srv, _ = start_http_server(0, addr="127.0.0.1", registry=reg)
    store = tmp_path / "runs.duckdb"
    try:
        with ThreadServer(NullServer(NullConfig(first_token_s=0.05))) as port:
            rc, out, err = opmap_cli_runner("bench", f"http://127.0.0.1:{port}", "--model", "null", "--requests", 4,
                                            "--output-len", 4, "--store", store, "--metrics-url",
                                            f"http://127.0.0.1:{srv.server_address[1]}/metrics",
                                            "--metrics-interval", 0.1)
    finally:
        srv.shutdown()
    assert rc == 0, err
    run_id = re.search(r"recorded as run (\S+)", out).group(1)
    rc, out, err = opmap_cli_runner("report", run_id, "--store", store, "--out", tmp_path / "r.html")
    assert rc == 0, err
    assert "Server metrics during the measured run" in (tmp_path / "r.html").read_text()
