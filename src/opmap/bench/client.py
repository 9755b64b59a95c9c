"""The load client: streaming requests to an OpenAI-compatible endpoint (/v1/completions or
/v1/chat/completions), open loop or closed loop, every request timed by event.

Open loop (specs carry ``scheduled_s``): one scheduler sends each request at its time, whatever the server
does: a slow server makes requests wait in its queue (TTFT grows), never the sends (no coordinated omission).
The scheduler's own lag (actual send - scheduled, s) is kept per request; the connection pool holds a
connection for every request in flight, so a send never waits for a free connection. Closed loop
(``concurrency`` C): C workers, each sending its next request when its last one ends.

HTTP/1.1 with keep-alive through aiohttp (a ClientSession whose TCPConnector holds as many connections as the
load keeps in flight: C for a closed loop, no cap for an open loop); each response body is read as it arrives
(``readany``: what the socket has delivered so far, stamped once) and fed to the SSE parser (opmap.bench.sse);
an event is timed by the read that completed its data line, not by the later one holding the empty line that
dispatches it (a proxy sending each line as its own packet can hold that line back for a delayed ACK).
The client's own ceiling (benchmarks/bench_loadgen.py, figures in benchmarks/README.md): about 370 us of
client CPU per 25-token request, 1.6x what a hand-written asyncio transport spent; httpx spent 1.9 ms.

A request's fate is one of records.STATUSES; a failing request is recorded and the run goes on. An endpoint
that cannot be reached at all (``/v1/models`` fails to connect) is an OpmapError before anything is sent.
SIGINT / SIGTERM stop the run: nothing more is sent, requests in flight are cancelled (counted, not recorded)
and the records so far come back, marked interrupted.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

from opmap.bench.records import BenchResult, RequestRecord, RequestSpec, usage_counts
from opmap.bench.response import ERROR_BODY_BYTES, Stream, is_stream, read_body
from opmap.bench.sse import StreamLimit
from opmap.errors import OpmapError

APIS = ("completions", "chat")
PROGRESS_EVERY_S = 0.1  # progress callbacks at most this often: a bar redrawn per request costs the client
# The most read of an answer that is not an event stream (an error, a redirect, an HTML page): past it the
# connection is dropped rather than read to its end (a small body is read whole, so its connection is reused).
NON_STREAM_BODY_BYTES = 64 << 10
# The most read of /v1/models (OpenRouter's list of some 300 models with their metadata is about 0.5 MB): a longer
# answer is not a model list, and is refused before anything is sent.
MODELS_BODY_BYTES = 8 << 20
STOP_CHECK_S = 0.05  # the open loop waits on the stop event past this (a task each); shorter waits just sleep
REQUEST_HEADERS = {"content-type": "application/json", "accept": "text/event-stream", "user-agent": "opmap-bench",
                   "accept-encoding": "identity"}
# An idle keep-alive connection is dropped by the client after this (s): below the servers' own idle limit
# (uvicorn's timeout_keep_alive, used by vLLM and transformers serve, defaults to 5 s; llama.cpp's httplib: 5 s),
# so a request never goes out on a connection the server is closing at that moment (aiohttp does not retry a
# POST whose connection closed before any answer: it would be counted as dropped).
KEEPALIVE_S = 4.0


def endpoint_root(base_url: str) -> str:
    """The server's root from a base URL given with or without ``/v1`` (and trailing slashes)."""
    u = base_url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise OpmapError(f"endpoint {base_url!r} is not an http:// or https:// URL: give the server's base, such "
                         "as http://localhost:8000 or http://localhost:8000/v1")
    if u.endswith("/v1"):
        u = u[:-3]
    return u


def request_body(spec: RequestSpec, model: str, api: str, ignore_eos: bool,
                 extra: dict[str, Any] | None = None) -> bytes:
    """The JSON body of one streaming request (``max_tokens`` as asked; ``ignore_eos``: vLLM's and SGLang's
    extension, so the output runs to max_tokens)."""
    body: dict[str, Any] = {"model": model, "max_tokens": spec.max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}, "temperature": 0.0}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    if ignore_eos:
        body["ignore_eos"] = True
    if extra:
        body.update(extra)
    return json.dumps(body, allow_nan=False).encode()


def run_load(base_url: str, model: str, specs: Iterable[RequestSpec], *, api: str = "completions",
             concurrency: int | None = None, timeout_s: float = 600.0, ignore_eos: bool = True,
             progress: Callable[[int, int | None], None] | None = None, duration_s: float | None = None,
             total: int | None = None, extra_body: dict[str, Any] | None = None,
             connect_timeout_s: float = 10.0, api_key: str | None = None, metrics_url: str | None = None,
             metrics_interval_s: float = 1.0) -> BenchResult:
    """Send ``specs`` to ``base_url`` and time them; returns the run's records.

    ``concurrency``: closed loop with that many requests in flight; None: open loop, each spec sent at its
    ``scheduled_s``. ``duration_s``: stop sending once that many seconds have passed (open loop: no spec
    scheduled after it is sent); requests in flight still finish. ``timeout_s``: the limit on one request, from
    its send to its stream's end (s). ``progress(done, total)``: called as requests end (at most every 0.1 s,
    and once at the end). ``total``: the number of specs when ``specs`` is a lazy iterator (for progress).
    ``api_key``: sent as ``Authorization: Bearer`` (never recorded). ``metrics_url``: the server's Prometheus
    page, scraped every ``metrics_interval_s`` while the run lasts (opmap.bench.server_metrics); None: not scraped."""
    if api not in APIS:
        raise OpmapError(f"--api {api!r}: accepted: {', '.join(APIS)}")
    root = endpoint_root(base_url)
    if total is None and hasattr(specs, "__len__"):
        total = len(specs)  # type: ignore[arg-type]
    run = _Run(root, model, api, concurrency, timeout_s, ignore_eos, progress, duration_s, total, extra_body,
               connect_timeout_s)
    if api_key:
        run.headers = {**REQUEST_HEADERS, "authorization": f"Bearer {api_key}"}
    run.metrics_url, run.metrics_interval_s = metrics_url, metrics_interval_s
    return asyncio.run(run.main(iter(specs)))


MODEL_INFO_KEPT = 8  # models of /v1/models whose metadata a run keeps
MODEL_INFO_FIELDS = ("id", "max_model_len", "owned_by", "root", "created")  # vLLM's and SGLang's ModelCard fields


def _model_info(m: dict) -> dict[str, str | int | float]:
    """The scalar metadata of one /v1/models entry (strings cut to 200 characters)."""
    out: dict[str, str | int | float] = {}
    for k in MODEL_INFO_FIELDS:
        v = m.get(k)
        if isinstance(v, str):
            out[k] = v[:200]
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = v
    return out


def _fd_limit() -> int:
    """The open-file limit, raised to its hard limit where allowed (an open loop holds a socket per request)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            want = 65536 if hard == resource.RLIM_INFINITY else hard
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
                soft = want
            except (ValueError, OSError):
                pass
        return soft
    except ImportError:  # not POSIX
        return 512


class _Run:
    """One run's state on the event loop (single-threaded: no locks needed)."""

    def __init__(self, root, model, api, concurrency, timeout_s, ignore_eos, progress, duration_s, total,
                 extra_body, connect_timeout_s):
        self.root, self.model, self.api = root, model, api
        self.path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
        self.concurrency, self.timeout_s, self.ignore_eos = concurrency, timeout_s, ignore_eos
        self.progress, self.duration_s, self.total = progress, duration_s, total
        self.extra_body, self.connect_timeout_s = extra_body, connect_timeout_s
        self.records: list[RequestRecord] = []
        self.tasks: set[asyncio.Task] = set()
        self.stop: asyncio.Event | None = None  # made on the loop (main)
        self.cancelled = 0
        self.ignore_eos_refused: str | None = None  # the server's refusal of ignore_eos, when it refused it
        self.headers = REQUEST_HEADERS
        self.interrupted = False
        self.stop_signal = 0  # which signal stopped the run (the exit status says it: 128 + its number)
        self.peak_in_flight = 0
        self.in_flight = 0
        self.session = None
        self.opened = 0  # sockets made (connections opened, failed attempts included)
        self.post_url = self.url(self.path)
        self._last_progress = 0.0
        self.metrics_url: str | None = None
        self.metrics_interval_s = 1.0
        self.server_info: dict[str, Any] = {}  # /v1/models' metadata, /version's version

    async def main(self, specs) -> BenchResult:
        self.stop = asyncio.Event()
        _fd_limit()
        self.t0 = time.perf_counter()
        self.session = self._session()
        try:
            models, server = await self._models()
            handlers = self._signals()
            started_unix = time.time()
            self.t0 = time.perf_counter()
            scraping, done = self._scrape()
            try:
                if self.concurrency is None:
                    await self._open(specs)
                else:
                    await self._closed(specs)
            finally:
                wall = time.perf_counter() - self.t0
                self._unsignal(handlers)
                done.set()
                series = await scraping if scraping is not None else None
        finally:
            await self.session.close()
        self._report_progress(force=True)
        return BenchResult(tuple(self.records), self.root, self.model, self.api,
                           "open" if self.concurrency is None else "closed", self.concurrency, started_unix, wall,
                           self.interrupted, self.cancelled, tuple(models), server,
                           {"timeout_s": self.timeout_s, "ignore_eos": self.ignore_eos,
                            "ignore_eos_refused": self.ignore_eos_refused, "duration_s": self.duration_s,
                            "connections_opened": self.opened, "peak_in_flight": self.peak_in_flight,
                            "extra_body": self.extra_body or {}}, self.stop_signal, series, self.server_info)

    def _scrape(self) -> tuple[asyncio.Task | None, asyncio.Event]:
        """The /metrics scraper's task (None when not asked for) and the event that stops it."""
        done = asyncio.Event()
        if not self.metrics_url:
            return None, done
        from opmap.bench.server_metrics import Scraper

        return asyncio.ensure_future(Scraper(self.session, self.metrics_url, self.metrics_interval_s,
                                             self.t0).run(done)), done

    def _session(self):
        """The aiohttp session: a connection per request in flight (``limit``: C in a closed loop; 0, no cap, in
        an open loop, so a send never waits for a free connection), kept alive KEEPALIVE_S when idle; each request
        limited to ``timeout_s`` from its send to its body's end (aiohttp's total timeout, not rounded up to a
        whole second: ``timeout_ceil_threshold``), its socket's connect to the connect timeout; the request
        headers set once for the session (merging them per request costs the client); no cookies, no
        decompression, no redirects; sockets counted as they are made (``connections_opened``)."""
        import aiohttp

        def make_socket(addr_info) -> socket.socket:
            family, type_, proto, _, _ = addr_info
            self.opened += 1
            return socket.socket(family=family, type=type_, proto=proto)

        connector = aiohttp.TCPConnector(limit=self.concurrency or 0, limit_per_host=0,
                                         keepalive_timeout=KEEPALIVE_S, socket_factory=make_socket,
                                         timeout_ceil_threshold=math.inf)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=self._connect_s())
        return aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self.headers,
                                     auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                                     raise_for_status=False)

    def _connect_s(self) -> float:
        return min(self.connect_timeout_s, self.timeout_s)

    async def _models(self) -> tuple[list[str], str | None]:
        """The model ids ``/v1/models`` lists, and the server's ``Server`` header; OpmapError when the endpoint
        cannot be reached (nothing listens, no route, DNS) or does not answer."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self._connect_s() * 3, sock_connect=self._connect_s())
        try:
            async with self.session.get(self.url("/v1/models"), headers={"accept": "application/json"},
                                        timeout=timeout, allow_redirects=False) as resp:
                status, server = resp.status, resp.headers.get("server")
                got, whole = await read_body(resp, MODELS_BODY_BYTES)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
            raise OpmapError(f"cannot reach {self.root}: {_why(e)} (is the server up, and is the URL its base, "
                             "such as http://host:8000?)") from None
        except (aiohttp.ClientError, TimeoutError) as e:
            raise OpmapError(f"{self.root}/v1/models did not answer: {_why(e)}") from None
        except OSError as e:
            raise OpmapError(f"cannot reach {self.root}: {_why(e)}") from None
        if not whole:
            raise OpmapError(f"{self.root}/v1/models answered more than {MODELS_BODY_BYTES} bytes: not a model list "
                             "(is the URL an OpenAI-compatible server's base?)")
        ids: list[str] = []
        if status == 200:
            try:
                data = json.loads(got).get("data") or []
                ids = [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id") is not None]
                self.server_info["models"] = [_model_info(m) for m in data[:MODEL_INFO_KEPT] if isinstance(m, dict)]
            except (ValueError, AttributeError):
                ids = []
        await self._version()
        return ids, server

    async def _version(self) -> None:
        """The server's version where it says it: vLLM's and SGLang's ``GET /version`` ({"version": "0.9.1"});
        a server without it (an error, a page, no answer within a second) leaves it unsaid."""
        import aiohttp

        try:
            async with self.session.get(self.url("/version"), headers={"accept": "application/json"},
                                        timeout=aiohttp.ClientTimeout(total=1.0), allow_redirects=False) as resp:
                got, whole = await read_body(resp, 64 << 10)
                if resp.status != 200 or not whole:
                    return
            v = json.loads(got).get("version")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, AttributeError, RecursionError):
            return
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            self.server_info["version"] = str(v)[:100]

    def url(self, path: str):
        """The URL of ``path`` under the endpoint's root (a yarl URL, parsed once); OpmapError for a root without
        a host or with a port that is not a number from 0 to 65535."""
        from yarl import URL

        try:
            u = URL(self.root + path)
            ok = bool(u.host) and u.port is not None
        except ValueError:
            ok = False
        if not ok:
            raise OpmapError(f"endpoint {self.root!r} is not an http:// or https:// URL with a host and a port from "
                             "0 to 65535 (such as http://localhost:8000)")
        return u

    def _signals(self) -> list[int]:
        loop = asyncio.get_running_loop()
        done = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._interrupt, sig)
                done.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or not POSIX
                pass
        return done

    def _unsignal(self, sigs: list[int]) -> None:
        loop = asyncio.get_running_loop()
        for sig in sigs:
            loop.remove_signal_handler(sig)

    def _interrupt(self, sig: int = signal.SIGINT) -> None:
        """Stop: send nothing more and cancel what is in flight (the records so far are kept)."""
        self.interrupted, self.stop_signal = True, int(sig)
        self.stop.set()
        self._unsignal([signal.SIGINT, signal.SIGTERM])  # a second Ctrl-C is Python's own
        self.cancelled = self.in_flight
        for t in list(self.tasks):
            t.cancel()

    def _spawn(self, spec: RequestSpec) -> None:
        task = asyncio.create_task(self._one(spec))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _open(self, specs) -> None:
        clock, t0 = time.perf_counter, self.t0
        for spec in specs:
            if self.stop.is_set():
                break
            if spec.scheduled_s is None:
                raise OpmapError(f"request {spec.index} has no send time: an open-loop run needs scheduled_s on "
                                 "every spec (or give a concurrency for a closed loop)")
            if self.duration_s is not None and spec.scheduled_s > self.duration_s:
                break
            delay = t0 + spec.scheduled_s - clock()
            if delay > STOP_CHECK_S:  # a long wait ends early on a stop
                try:
                    await asyncio.wait_for(self.stop.wait(), delay)
                    break  # stopped while waiting
                except TimeoutError:
                    pass
            elif delay > 0:
                await asyncio.sleep(delay)
                if self.stop.is_set():
                    break
            self._spawn(spec)
        await self._drain()

    async def _closed(self, specs) -> None:
        async def worker() -> None:
            for spec in specs:  # one iterator shared by the workers (one thread: no race)
                if self.stop.is_set() or (self.duration_s is not None and
                                          time.perf_counter() - self.t0 > self.duration_s):
                    return
                await self._one(spec)

        workers = [asyncio.create_task(worker()) for _ in range(self.concurrency)]
        for w in workers:
            self.tasks.add(w)
            w.add_done_callback(self.tasks.discard)
        await asyncio.gather(*workers, return_exceptions=True)
        for w in workers:
            if not w.cancelled() and w.exception() is not None:
                raise w.exception()

    async def _drain(self) -> None:
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    async def _one(self, spec: RequestSpec) -> None:
        """Send one request, read its stream, append its record (also on failure). A server that refuses the
        ignore_eos field (a 400 or 422 naming it: transformers serve checks every field) gets this request again
        without it, and so does every later one (the run's options say so)."""
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            for _ in range(2):
                ignore_eos = self.ignore_eos
                sent, st, status, error, http_status = await self._exchange(spec, ignore_eos)
                if not (ignore_eos and status == "http_error" and http_status in (400, 422)
                        and "ignore_eos" in error):
                    break
                self.ignore_eos, self.ignore_eos_refused = False, error[:200]
        finally:
            self.in_flight -= 1
        end = time.perf_counter() - self.t0
        prompt, completion, usage_error = usage_counts(st.usage_prompt, st.usage_completion, spec.input_tokens,
                                                       spec.max_tokens)
        self.records.append(RequestRecord(
            spec.index, spec.scheduled_s, sent, st.first, tuple(st.times), end, spec.input_tokens, spec.max_tokens,
            prompt, completion, st.events, status, error, http_status, spec.warmup, usage_error, st.dropped,
            st.response_id))
        self._report_progress()

    async def _exchange(self, spec: RequestSpec, ignore_eos: bool):
        """One request on the wire: (sent_s, its stream, status, error, HTTP status). The body is read to its
        end (after [DONE] too), so the connection goes back to the pool for the next request."""
        import aiohttp

        body = request_body(spec, self.model, self.api, ignore_eos, self.extra_body)
        st = Stream(self.t0)
        clock, feed = time.perf_counter, st.feed
        sent = clock() - self.t0
        error, http_status = "", None
        try:
            async with self.session.post(self.post_url, data=body, allow_redirects=False) as resp:
                http_status = resp.status
                if is_stream(resp):
                    read = resp.content.readany
                    while data := await read():
                        feed(data, clock())
                else:  # an error, a redirect, a page: its head kept, the rest of a long body not read
                    st.head = (await read_body(resp, NON_STREAM_BODY_BYTES))[0][:ERROR_BODY_BYTES]
                status, error = st.outcome(http_status, resp.headers)
        except StreamLimit as e:  # leaving the block unread drops the connection (aiohttp: the payload is not at eof)
            status, error = "stream_error", str(e)
        except RecursionError:  # a safety net: read_chunk answers JSON nested too deep; nothing else should recurse
            status, error = "stream_error", "a stream event nested deeper than the client reads"
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
            status, error = "connect_error", _why(e)
        except TimeoutError:
            status, error = "timeout", f"no end of stream within {self.timeout_s:g} s"
        except aiohttp.ClientError as e:  # the connection closed before the response ended, or not HTTP/1.x
            status, error = "dropped", _why(e)
        except OSError as e:
            status, error = "connect_error", _why(e)
        return sent, st, status, error, http_status

    def _report_progress(self, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.perf_counter()
        if force or now - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = now
            self.progress(len(self.records), self.total)


def _why(e: BaseException) -> str:
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__
