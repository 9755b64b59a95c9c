"""The load client against small local servers: the null streaming server (opmap.bench.nullserver) where a
test is about the client's own timing, and servers imitating one failure each (bench_servers.py)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
from bench_servers import FaultServer, HostileServer
from launched_server import oversubscribed
from line_proxy import BlockingClient, LineProxy

from opmap.bench.client import MODELS_BODY_BYTES, endpoint_root, request_body, run_load
from opmap.bench.metrics import summarize
from opmap.bench.nullserver import NullConfig, NullServer, ThreadServer
from opmap.bench.records import PROMPT_SLACK_TOKENS, PROMPT_TOKENS_PER_ASKED, USAGE_SLACK_TOKENS, RequestSpec
from opmap.bench.sse import MAX_EVENT_BYTES
from opmap.errors import OpmapError


def closed(n: int, out: int = 4) -> list[RequestSpec]:
    return [RequestSpec(i, None, "one two three", 3, out) for i in range(n)]


def scheduled(times, out: int = 4) -> list[RequestSpec]:
    return [RequestSpec(i, float(t), "one two three", 3, out) for i, t in enumerate(times)]


def test_base_url_with_or_without_v1():
    assert endpoint_root("http://h:8000/v1/") == "http://h:8000"
    assert endpoint_root("http://h:8000") == "http://h:8000"
    with pytest.raises(OpmapError, match="http:// or https://"):
        endpoint_root("h:8000")


def test_request_body_streams_with_usage_and_ignore_eos():
    import json

    b = json.loads(request_body(RequestSpec(0, None, "p", 1, 5), "m", "chat", True))
    assert b["stream"] and b["stream_options"] == {"include_usage": True} and b["ignore_eos"]
    assert b["messages"] == [{"role": "user", "content": "p"}] and b["max_tokens"] == 5
    assert "ignore_eos" not in json.loads(request_body(RequestSpec(0, None, "p", 1, 5), "m", "completions", False))


def test_open_loop_sends_keep_their_schedule_while_the_server_is_saturated():
    """A server that serves one request at a time, 25 ms each, offered one every 10 ms: the queue grows by 15 ms a
    request, so TTFT grows along the run (p99 far above the service time), while every send stays on its
    schedule (an open loop does not wait for the server: no coordinated omission)."""
    n, gap, service = 30, 0.010, 0.025
    specs = scheduled(np.arange(1, n + 1) * gap, out=1)
    with ThreadServer(NullServer(NullConfig(first_token_s=service, serialize=True))) as port:
        res = run_load(f"http://127.0.0.1:{port}", "null", specs)
        waited = run_load(f"http://127.0.0.1:{port}", "null", specs[:12], concurrency=1)  # sends wait for answers
    recs = sorted(res.records, key=lambda r: r.index)
    assert all(r.ok for r in recs) and len(recs) == n
    ttft = np.array([r.first_token_s - r.sent_s for r in recs])
    lag = np.array([r.sent_s - r.scheduled_s for r in recs])
    lag_waited = np.array([r.sent_s - r.scheduled_s for r in sorted(waited.records, key=lambda r: r.index)])
    # queueing theory of this deterministic queue: request k waits k x (service - gap) = 15 ms x k
    assert ttft[-1] > 0.6 * (n - 1) * (service - gap) + service
    assert np.percentile(ttft, 99) > 10 * service
    # a send that waited for the server (coordinated omission) would lag k x 15 ms at the k-th request; these
    # sends lag the scheduler's hiccups only (a machine this loaded stalls a process tens of ms now and then)
    waiting = np.arange(n) * (service - gap)
    assert np.median(lag) < 0.02 and lag[-10:].mean() < 0.25 * waiting[-10:].mean()
    # the same check catches a loop that waits: its last sends lag about 11 x 15 ms
    assert lag_waited[-3:].mean() > 0.5 * waiting[9:12].mean()
    assert res.mode == "open" and res.options["peak_in_flight"] > 5


def test_the_figures_match_the_servers_own_pacing():
    """The null server waits 40 ms before the first token and 10 ms between the 6 tokens: TTFT cannot be under
    40 ms (the wait starts after the send), TPOT and ITL sit at 10 ms and e2e at 40 + 5 x 10 = 90 ms, plus the
    loopback and the loops' wake-ups (a few ms on a loaded machine)."""
    with ThreadServer(NullServer(NullConfig(first_token_s=0.04, token_s=0.01))) as port:
        res = run_load(f"http://127.0.0.1:{port}", "null", closed(10, out=6), concurrency=2)
    lat = summarize(res.records, min_duration_s=0, min_queries=0).latency
    assert 0.04 <= lat.ttft.p50_s < 0.07
    assert 0.009 <= lat.tpot.p50_s < 0.016 and 0.008 <= lat.itl.p50_s < 0.016
    assert 0.09 <= lat.e2e.p50_s < 0.13


def test_ttft_through_a_line_per_chunk_proxy_agrees_with_an_independent_client():
    """The null server sends its first token FIRST_MS after the request; a proxy that sends each SSE line as its
    own packet, the response head with the first line, and leaves Nagle's algorithm on (LineProxy) makes the
    empty line that ends each event wait for the client's delayed ACK (40 ms and more on Linux) while the
    event's data line arrived at once. run_load's TTFT p50 is within 15% of a blocking http.client's (which reads
    the same stream line by line) on the same requests through the same proxy, in alternate blocks; both at
    least FIRST_MS, as the server paces it. (Timed at the event's dispatch, run_load read 60 ms against 20.)"""
    first_s, n, block = 0.020, 24, 6
    seen = []
    with ThreadServer(NullServer(NullConfig(first_token_s=first_s, token_s=0.002))) as up, \
            LineProxy(up, nodelay=False, hold_head=True) as port:
        url = f"http://127.0.0.1:{port}"
        for _ in range(3):
            ours, theirs = [], []
            for _ in range(n // block):
                res = run_load(url, "null", closed(block, out=8), concurrency=1)
                assert all(r.ok and r.usage_completion_tokens == 8 for r in res.records)
                ours += [r.first_token_s - r.sent_s for r in res.records]
                c = BlockingClient(url, "null")
                try:
                    theirs += [c.send("one two three", 8)[0] for _ in range(block)]
                finally:
                    c.close()
            ratio = float(np.median(ours) / np.median(theirs))
            seen.append((round(1e3 * float(np.median(ours)), 1), round(1e3 * float(np.median(theirs)), 1)))
            if 0.85 <= ratio <= 1.15:
                break
    print("TTFT p50 ms (run_load, independent) per attempt:", seen)
    assert min(ours) >= first_s and min(theirs) >= first_s
    busy = oversubscribed()
    if busy and 0.67 < ratio < 1.5 and not 0.85 <= ratio <= 1.15:  # 3x, as a late stamp reads, is never noise
        pytest.skip(f"{busy}; TTFT p50 ms (run_load, independent) seen: {seen}")
    assert 0.85 <= ratio <= 1.15, seen


def test_an_api_key_goes_as_a_bearer_token():
    server = NullServer(NullConfig())
    with ThreadServer(server) as port:
        res = run_load(f"http://127.0.0.1:{port}", "null", closed(1), concurrency=1, api_key="sk-test")
    assert res.records[0].ok and "authorization: Bearer sk-test" in server.last_head
    assert "content-type: application/json" in server.last_head  # the body's type, not aiohttp's octet-stream
    assert "sk-test" not in repr(res)  # every field of the result, its records and options


def test_closed_loop_holds_its_concurrency():
    with ThreadServer(NullServer(NullConfig(first_token_s=0.02))) as port:
        res = run_load(f"http://127.0.0.1:{port}/v1", "null", closed(12), concurrency=3)
    assert len(res.records) == 12 and all(r.ok for r in res.records)
    assert res.options["peak_in_flight"] == 3 and res.options["connections_opened"] == 3
    assert res.server_models == ("null",) and res.server_header == "opmap-null"


def test_an_idle_connection_is_dropped_before_the_servers_keep_alive_limit(monkeypatch):
    """Servers close a connection idle for 5 s (uvicorn's timeout_keep_alive); the client drops its own idle ones
    sooner (KEEPALIVE_S), so no request goes out on a connection being closed. Three sends 0.15 s apart: with the
    limit at 0.05 s each gets a new connection (the /v1/models one, then 3); at the default 4 s, one is reused."""
    import opmap.bench.client as client

    with ThreadServer(NullServer(NullConfig())) as port:
        kept = run_load(f"http://127.0.0.1:{port}", "null", scheduled([0.15, 0.3, 0.45]))
        monkeypatch.setattr(client, "KEEPALIVE_S", 0.05)
        dropped = run_load(f"http://127.0.0.1:{port}", "null", scheduled([0.15, 0.3, 0.45]))
    assert all(r.ok for r in kept.records + dropped.records)
    assert kept.options["connections_opened"] == 1 and dropped.options["connections_opened"] == 4


def test_merged_events_are_timed_by_event_and_counted_by_usage():
    with ThreadServer(NullServer(NullConfig(tokens_per_event=4))) as port:
        res = run_load(f"http://127.0.0.1:{port}", "null", closed(2, out=16), concurrency=1, api="chat")
    r = res.records[0]
    assert len(r.token_times_s) == 4 and r.usage_completion_tokens == 16 and r.usage_prompt_tokens == 3
    assert r.events == 6  # 4 text events, the usage chunk, [DONE]


def test_http_500_counted_per_request_and_the_run_goes_on():
    with ThreadServer(FaultServer("500", every=2)) as port:
        res = run_load(f"http://127.0.0.1:{port}", "null", closed(8), concurrency=2)
    st = sorted(r.status for r in res.records)
    assert st == ["http_error"] * 4 + ["ok"] * 4
    bad = next(r for r in res.records if r.status == "http_error")
    assert bad.http_status == 500 and "internal error" in bad.error and bad.first_token_s is None


def test_a_stream_dropped_mid_way_is_counted_with_what_arrived():
    with ThreadServer(FaultServer("drop", every=3)) as port:
        res = run_load(f"http://127.0.0.1:{port}", "null", closed(6), concurrency=1)
    dropped = [r for r in res.records if r.status == "dropped"]
    assert len(dropped) == 2 and sum(r.ok for r in res.records) == 4
    assert all(len(r.token_times_s) == 2 and r.usage_completion_tokens is None for r in dropped)


def test_an_error_event_mid_stream_is_a_stream_error():
    with ThreadServer(FaultServer("error")) as port:
        res = run_load(f"http://127.0.0.1:{port}", "null", closed(2), concurrency=1)
    assert [r.status for r in res.records] == ["stream_error"] * 2
    assert res.records[0].error == "KV cache exhausted"


def test_an_sse_error_event_is_a_stream_error():
    with ThreadServer(FaultServer("sse-error")) as port:
        res = run_load(f"http://127.0.0.1:{port}", "null", closed(1), concurrency=1)
    assert res.records[0].status == "stream_error" and "out of memory" in res.records[0].error


def test_a_server_that_refuses_ignore_eos_gets_the_requests_without_it():
    """transformers serve answers a field it does not know with a 422: the run goes on without the field."""
    server = FaultServer("strict")
    with ThreadServer(server) as port:
        res = run_load(f"http://127.0.0.1:{port}", "null", closed(6), concurrency=2)
    assert all(r.ok for r in res.records) and len(res.records) == 6
    assert "Unexpected fields" in res.options["ignore_eos_refused"] and res.options["ignore_eos"] is False
    assert 1 <= server.posts <= 2  # the requests in flight when the refusal came, once each


def test_a_server_that_never_answers_hits_the_timeout_and_the_run_ends():
    t = time.perf_counter()
    with ThreadServer(FaultServer("hang")) as port:
        res = run_load(f"http://127.0.0.1:{port}", "null", closed(3), concurrency=3, timeout_s=0.5)
    assert [r.status for r in res.records] == ["timeout"] * 3
    assert all(0.45 < r.end_s - r.sent_s < 1.5 for r in res.records)
    assert time.perf_counter() - t < 5


def test_a_stream_that_stalls_mid_way_hits_the_timeout_with_what_arrived():
    """The limit runs from the send to the body's end, not only to the response's head: a server that sends
    two tokens and then nothing is a timeout at timeout_s (not rounded up to a whole second), its tokens kept."""
    with ThreadServer(FaultServer("stall")) as port:
        res = run_load(f"http://127.0.0.1:{port}", "null", closed(2), concurrency=2, timeout_s=0.4)
    assert [r.status for r in res.records] == ["timeout"] * 2
    assert all(len(r.token_times_s) == 2 and 0.38 < r.end_s - r.sent_s < 0.9 for r in res.records)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_endpoint_is_one_error_before_anything_is_sent():
    with pytest.raises(OpmapError, match="cannot reach http://127.0.0.1"):
        run_load(f"http://127.0.0.1:{_free_port()}", "m", closed(1), concurrency=1)


def test_ctrl_c_keeps_what_was_measured():
    """SIGINT a third of the way through a 1.5 s open loop: the run stops at once, marked interrupted, with the
    requests that ended kept and the ones in flight counted."""
    with ThreadServer(NullServer(NullConfig(first_token_s=0.05))) as port:
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        t = time.perf_counter()
        try:
            res = run_load(f"http://127.0.0.1:{port}", "null", scheduled(np.arange(1, 61) * 0.025))
        finally:
            timer.cancel()
    assert res.interrupted and time.perf_counter() - t < 1.4  # 1.5 s had it run to its end
    assert 5 < len(res.records) < 60 and all(r.ok for r in res.records)
    assert res.in_flight_at_stop >= 1


# --- a hostile or broken server costs the request it answers, never the run ----------------------------------------

def _url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def test_an_event_nested_100000_deep_fails_that_request_and_the_run_goes_on():
    """Every other answer carries, after two tokens, one event of JSON nested 100,000 arrays deep (it used to
    raise RecursionError out of the run: nothing written or recorded)."""
    with ThreadServer(HostileServer("deep", every=2)) as port:
        res = run_load(_url(port), "null", closed(6), concurrency=2)
    assert sorted(r.status for r in res.records) == ["ok"] * 3 + ["stream_error"] * 3
    bad = [r for r in res.records if not r.ok]
    assert all("nested deeper" in r.error and len(r.token_times_s) == 2 for r in bad)


ASKED_IN, ASKED_OUT = 3, 4  # closed(): three prompt words asked, max_tokens 4


@pytest.mark.parametrize("usage,why", [
    ({"prompt_tokens": 3, "completion_tokens": 10 ** 30}, "completion_tokens 1000000000000000000000000000000"),
    ({"prompt_tokens": 3, "completion_tokens": -537}, "completion_tokens -537"),
    ({"prompt_tokens": 3, "completion_tokens": 2 ** 62}, "completion_tokens 4611686018427387904"),
    ({"prompt_tokens": 3, "completion_tokens": ASKED_OUT + USAGE_SLACK_TOKENS + 1}, "completion_tokens 69"),
    ({"prompt_tokens": 3, "completion_tokens": "4"}, "completion_tokens a str"),
    ({"prompt_tokens": 3, "completion_tokens": 4.0}, "completion_tokens 4.0"),
    ({"prompt_tokens": -1, "completion_tokens": 4}, "prompt_tokens -1"),
])
def test_an_implausible_usage_count_is_set_aside_and_the_run_says_so(usage, why):
    """Every other answer (two tokens) reports this usage. The count is set aside with its reason, the request's
    two text events count its output (the asked 3 its prompt), and the run is INVALID saying so (10^30 used to
    end the run in an OverflowError; -537 and 2^62 were trusted: -537 ktok/s, 9.46e+05 Ptok/s, VALID)."""
    with ThreadServer(HostileServer("usage", usage, every=2)) as port:
        res = run_load(_url(port), "null", closed(4), concurrency=1)
    bad = [r for r in res.records if r.usage_error]
    assert len(bad) == 2 and all(r.ok for r in res.records)
    assert all(why in r.usage_error and "is not a count from 0 to" in r.usage_error for r in bad)
    s = summarize(res.records, min_duration_s=0, min_queries=0)
    prompt_bad = why.startswith("prompt")
    assert s.requests.output_tokens == 2 * ASKED_OUT + 2 * (4 if prompt_bad else 2)
    assert s.requests.input_tokens == 4 * ASKED_IN  # the usage's 3 twice, the asked 3 twice
    assert s.usage_check.implausible == 2 and s.validity.verdict == "INVALID"
    assert "2 of 4 ok requests reported implausible usage counts" in s.validity.reason


def test_usage_counts_at_the_stated_maximum_are_taken():
    """The largest plausible counts (records.usage_counts: max_tokens + 64 out, 4 x asked + 8192 in) are kept."""
    most = {"prompt_tokens": PROMPT_TOKENS_PER_ASKED * ASKED_IN + PROMPT_SLACK_TOKENS,
            "completion_tokens": ASKED_OUT + USAGE_SLACK_TOKENS}
    with ThreadServer(HostileServer("usage", most)) as port:
        (r,) = run_load(_url(port), "null", closed(1), concurrency=1).records
    assert (r.usage_prompt_tokens, r.usage_completion_tokens, r.usage_error) == (3 * 4 + 8192, 4 + 64, "")


def test_a_line_over_the_limit_fails_that_request_and_drops_its_connection():
    """Every other answer sends one line three times the client's limit, in 4 KiB writes: that request fails at
    the limit, its connection closed under the server's writes (the rest never read), the others are ok."""
    server = HostileServer("long-line", 3 * MAX_EVENT_BYTES, every=2)
    t = time.perf_counter()
    with ThreadServer(server) as port:
        res = run_load(_url(port), "null", closed(4), concurrency=1, timeout_s=60)
    bad = [r for r in res.records if not r.ok]
    assert len(bad) == 2 and all(r.status == "stream_error" for r in bad)
    assert all(f"a stream line longer than {MAX_EVENT_BYTES} bytes" in r.error for r in bad)
    assert server.closed_early == 2 and time.perf_counter() - t < 20


@pytest.mark.parametrize("mode,status,http,needle", [
    ("redirect", "http_error", 307, "redirect 307 to http://127.0.0.1:9/v1/completions (opmap does not follow "
                                    "redirects"),
    ("html", "stream_error", 200, "the answer is text/html (HTTP 200), not an event stream: '<!DOCTYPE html>"),
])
def test_a_redirect_or_a_page_is_named_for_what_it_is(mode, status, http, needle):
    """Not "the stream ended before [DONE]": a 307 names its location, a 200 HTML page its type and first bytes."""
    with ThreadServer(HostileServer(mode, every=2)) as port:
        res = run_load(_url(port), "null", closed(4), concurrency=1)
    bad = [r for r in res.records if not r.ok]
    assert len(bad) == 2 and all((r.status, r.http_status) == (status, http) and needle in r.error for r in bad)


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_an_endless_model_list_is_refused_at_its_limit(framing):
    """/v1/models answering 4 GB (or a chunked body with no end): one OpmapError once the limit is passed, before
    anything is sent; the client held no more than the limit (it used to read on: 3.6 GB in 30 s)."""
    t = time.perf_counter()
    server = HostileServer("huge-models", (MODELS_BODY_BYTES + (1 << 20), framing))
    with ThreadServer(server) as port, pytest.raises(OpmapError, match=f"more than {MODELS_BODY_BYTES} bytes"):
        run_load(_url(port), "null", closed(1), concurrency=1, connect_timeout_s=5)
    assert time.perf_counter() - t < 10 and server.posts == 0


def test_a_stream_of_many_events_keeps_a_bounded_record(monkeypatch):
    """5,000 text events in one answer with the cap on times kept at 1,000: the record holds 1,000 times and counts
    the 4,000 others (a 3-million-event answer used to make a record requests.parquet could not hold)."""
    import opmap.bench.response as response

    monkeypatch.setattr(response, "MAX_TIMES_KEPT", 1000)
    with ThreadServer(HostileServer("many", 5000)) as port:
        (r,) = run_load(_url(port), "null", closed(1, out=5000), concurrency=1).records
    assert r.ok and (len(r.token_times_s), r.token_times_dropped, r.events) == (1000, 4000, 5002)
    assert r.usage_completion_tokens == 5000
