"""opmap.report.bench_text: the line of what a server's /metrics said during a run, and the error lines."""

from __future__ import annotations

from types import SimpleNamespace

from rich.console import Console

from opmap.report.bench_text import print_errors, server_metrics_line


def _scraped(**series) -> dict:
    return {"status": "scraped", "engine": "vllm", "url": "http://127.0.0.1:8000/metrics", "times_s": [0.0, 1.0, 2.0],
            "num_gpu_blocks": 4096, "series": series}


def test_peaks_and_counter_deltas():
    # peaks: max of the gauges, the missing scrape (None) skipped; counters: last - first over the run
    line = server_metrics_line(_scraped(kv_usage=[0.1, None, 0.5, 0.3], running=[3, 8, 5], waiting=[0, 2, 1],
                                        preemptions=[2, 5, 9], prefix_hits=[100, 160]))
    assert line == ("server metrics (vllm, 4096 KV blocks; 3 scrapes of http://127.0.0.1:8000/metrics): "
                    "KV cache in use, peak 50%; running, peak 8; waiting, peak 2; preemptions 7 during the run; "
                    "prefix-cache hit tokens 60 during the run")


def test_a_counter_seen_once_has_no_delta_and_markup_is_escaped():
    line = server_metrics_line({**_scraped(preemptions=[4]), "engine": "[bold]x[/bold]", "num_gpu_blocks": None})
    assert line == ("server metrics (\\[bold]x\\[/bold]; 3 scrapes of http://127.0.0.1:8000/metrics): "
                    "no watched series")


def test_not_scraped_says_why():
    assert server_metrics_line({"status": "unreachable", "detail": "connection refused"}) == \
        "server metrics: unreachable (connection refused)"


def test_errors_by_kind_with_the_first_reason_and_all_failed():
    c = Console(record=True, width=200)
    f = SimpleNamespace(errors=(("http", 3), ("timeout", 0), ("stream", 1)),
                        error_examples=(("http", "500 [red]boom[/red]"),), all_failed=True,
                        requests=SimpleNamespace(measured=4))
    print_errors(c, f)
    text = c.export_text()
    assert "errors: http 3, stream 1\n" in text  # the kinds with none left out
    assert "  http: 500 [red]boom[/red]\n" in text  # a server's text printed as text, not markup
    assert "every one of the 4 measured requests failed: exit status 1" in text


def test_no_errors_prints_nothing():
    c = Console(record=True)
    print_errors(c, SimpleNamespace(errors=(("http", 0),), error_examples=(), all_failed=False))
    assert c.export_text() == ""
