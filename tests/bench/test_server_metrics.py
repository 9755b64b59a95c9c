"""The server's /metrics scraped during a load run (opmap.bench.server_metrics). The exposition texts are written by
prometheus_client itself, the library vLLM and SGLang export through, with the engines' metric and label names
(vllm/v1/metrics/loggers.py @ 005a810b: labels model_name and engine; python/sglang/srt/metrics/collector.py @
93d04878); the expected values are the ones each test sets, combined by hand (counts summed over engines, usage the
busiest engine's). The live runs use the session's real ``transformers serve`` (it has no /metrics) and a real
Prometheus exporter (prometheus_client's own HTTP server) beside the null streaming endpoint: the stand-in for a
vLLM server, which does not run on this CPU machine."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server  # noqa: E402

from opmap.bench.client import run_load  # noqa: E402
from opmap.bench.nullserver import NullConfig, NullServer, ThreadServer  # noqa: E402
from opmap.bench.records import RequestSpec  # noqa: E402
from opmap.bench.server_metrics import collect, parse  # noqa: E402


def _vllm_registry(running=(3, 5), waiting=(0, 2), usage=(0.25, 0.6), preempt=(1, 4), queries=(1000, 500),
                   hits=(600, 100), blocks=4096, old_name=False):
    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    g_run = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels, registry=reg)
    g_wait = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, registry=reg)
    name = "vllm:gpu_cache_usage_perc" if old_name else "vllm:kv_cache_usage_perc"
    g_kv = Gauge(name, "KV-cache usage. 1 means 100 percent usage.", labels, registry=reg)
    c_pre = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels, registry=reg)
    c_q = Counter("vllm:prefix_cache_queries", "Prefix cache queries.", labels, registry=reg)
    c_h = Counter("vllm:prefix_cache_hits", "Prefix cache hits.", labels, registry=reg)
    for e in (0, 1):
        lab = ("m", str(e))
        g_run.labels(*lab).set(running[e])
        g_wait.labels(*lab).set(waiting[e])
        g_kv.labels(*lab).set(usage[e])
        c_pre.labels(*lab).inc(preempt[e])
        c_q.labels(*lab).inc(queries[e])
        c_h.labels(*lab).inc(hits[e])
    info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                 ["block_size", "num_gpu_blocks", "engine"], registry=reg)
    info.labels("16", str(blocks), "0").set(1)
    return reg


def test_a_vllm_page_two_engines_summed_and_the_busiest_usage():
    sc = parse(generate_latest(_vllm_registry()).decode())
    assert sc.engine == "vllm" and sc.num_gpu_blocks == 4096
    assert sc.values == {"running": 3 + 5, "waiting": 0 + 2, "kv_usage": 0.6, "preemptions": 1 + 4,
                         "prefix_queries": 1000 + 500, "prefix_hits": 600 + 100}


def test_vllm_before_0_9_named_the_kv_usage_gpu_cache_usage_perc():
    sc = parse(generate_latest(_vllm_registry(old_name=True)).decode())
    assert sc.values["kv_usage"] == 0.6


def test_an_sglang_page():
    reg = CollectorRegistry()
    labels = ["model_name"]
    for name, v in (("sglang:num_running_reqs", 12), ("sglang:num_queue_reqs", 7), ("sglang:token_usage", 0.83),
                    ("sglang:cache_hit_rate", 0.41)):
        Gauge(name, name, labels, registry=reg).labels("m").set(v)
    sc = parse(generate_latest(reg).decode())
    assert sc.engine == "sglang"
    assert sc.values == {"running": 12, "waiting": 7, "kv_usage": 0.83, "prefix_hit_rate": 0.41}


def test_a_page_that_is_not_prometheus_text_is_refused():
    with pytest.raises(ValueError):
        parse("<html><body>Not Found</body></html>")


def test_series_collected_in_order_and_the_status_says_what_happened():
    page = parse(generate_latest(_vllm_registry()).decode())
    s = collect("u", 1.0, [(0.0, page, ""), (1.0, None, "HTTP 503"), (2.0, page, "")])
    assert s.status == "scraped" and s.times_s == (0.0, 2.0) and s.series["running"] == (8, 8)
    s = collect("u", 1.0, [(0.0, page, ""), (1.0, None, "HTTP 503")])
    assert s.status == "failed" and "HTTP 503" in s.detail
    s = collect("u", 1.0, [(0.0, None, "u answered HTTP 404"), (1.0, None, "u answered HTTP 404")])
    assert s.status == "absent" and s.detail == "u answered HTTP 404" and s.series == {}
    other = parse("# TYPE up gauge\nup 1\n")  # Prometheus text, none of the engines' names
    s = collect("u", 1.0, [(0.0, other, "")])
    assert s.status == "absent" and "none of vLLM's or SGLang's" in s.detail


def _specs(n, out=8):
    return [RequestSpec(i, 0.05 * i, "hello " * 8, 8, out) for i in range(n)]


def test_a_live_exporter_is_scraped_through_the_run():
    """A real Prometheus HTTP server whose gauge a thread moves while the run lasts: every value it set is seen in
    order, the times rise by about the interval, and the last scrape is taken after the run ended."""
    reg = _vllm_registry()
    g = Gauge("vllm:num_requests_waiting_x", "moved by the test", registry=reg)  # a series nobody watches
    running = reg._names_to_collectors["vllm:num_requests_running"]
    server, thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    port = server.server_address[1]
    stop = threading.Event()

    def move():
        k = 0
        while not stop.is_set():
            k += 1
            running.labels("m", "0").set(100 + k)
            g.set(k)
            time.sleep(0.05)

    mover = threading.Thread(target=move, daemon=True)
    mover.start()
    try:
        with ThreadServer(NullServer(NullConfig(first_token_s=0.05, token_s=0.05))) as null_port:
            res = run_load(f"http://127.0.0.1:{null_port}", "null", _specs(10), metrics_url=
                           f"http://127.0.0.1:{port}/metrics", metrics_interval_s=0.2)
    finally:
        stop.set()
        mover.join()
        server.shutdown()
    s = res.server_metrics
    assert s.status == "scraped" and s.engine == "vllm" and s.num_gpu_blocks == 4096
    assert len(s.times_s) >= 4 and all(b > a for a, b in zip(s.times_s, s.times_s[1:]))
    assert s.times_s[-1] >= res.wall_s - 0.05  # the last scrape follows the run's end
    run = s.series["running"]
    assert all(v > 105 for v in run) and list(run) == sorted(run)  # the thread's values, rising (engine 1 adds 5)
    assert s.series["prefix_hits"] == (700,) * len(s.times_s)


def test_a_server_without_metrics_is_recorded_as_absent_and_the_run_goes_on(server):
    res = run_load(server.base_url, server.model_id, _specs(2, out=4), metrics_url=f"{server.base_url}/metrics",
                   metrics_interval_s=0.5)
    assert sum(r.status == "ok" for r in res.records) == 2
    s = res.server_metrics
    assert s.status == "absent" and "HTTP 404" in s.detail and s.series == {}


def test_no_metrics_url_no_scrape():
    with ThreadServer(NullServer(NullConfig())) as port:
        res = run_load(f"http://127.0.0.1:{port}", "null", _specs(2))
    assert res.server_metrics is None


def test_opmap_bench_records_and_prints_the_server_metrics(opmap_cli, tmp_path):
    reg = _vllm_registry()
    server, _ = start_http_server(0, addr="127.0.0.1", registry=reg)
    try:
        with ThreadServer(NullServer(NullConfig(first_token_s=0.02, token_s=0.01))) as port:
            rc, out, err = opmap_cli("bench", f"http://127.0.0.1:{port}", "--model", "null", "--concurrency", 2,
                                     "--requests", 6, "--input-len", 8, "--output-len", 8, "--no-store", "--out",
                                     tmp_path, "--metrics-url", f"http://127.0.0.1:{server.server_address[1]}/metrics",
                                     "--metrics-interval", 0.1)
    finally:
        server.shutdown()
    assert rc == 0, err
    body = __import__("json").loads((tmp_path / "bench.json").read_text())
    m = body["server_metrics"]
    assert m["status"] == "scraped" and m["engine"] == "vllm" and m["num_gpu_blocks"] == 4096
    assert set(m["series"]["kv_usage"]) == {0.6} and len(m["times_s"]) >= 2
    line = " ".join(out.split())
    assert "server metrics (vllm, 4096 KV blocks;" in line and "KV cache in use, peak 60%" in line
    assert "running, peak 8" in line and "preemptions 0 during the run" in line


def test_the_default_scrapes_the_endpoints_metrics_and_says_when_there_are_none(opmap_cli, tmp_path):
    with ThreadServer(NullServer(NullConfig())) as port:
        rc, out, err = opmap_cli("bench", f"http://127.0.0.1:{port}", "--model", "null", "--requests", 2,
                                 "--input-len", 8, "--output-len", 4, "--no-store", "--out", tmp_path)
    assert rc == 0, err
    m = __import__("json").loads((tmp_path / "bench.json").read_text())["server_metrics"]
    assert m["url"] == f"http://127.0.0.1:{port}/metrics" and m["status"] == "absent"
    assert "server metrics: absent" in " ".join(out.split())


@pytest.mark.parametrize("value", ["ftp://x/metrics", "metrics"])
def test_a_bad_metrics_url_is_one_line(opmap_cli, value):
    rc, out, err = opmap_cli("bench", "http://127.0.0.1:9", "--model", "m", "--metrics-url", value)
    assert rc == 2 and "--metrics-url" in err and "accepted: auto, none" in err
