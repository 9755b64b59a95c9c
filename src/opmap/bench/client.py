"""The load client: streaming requests to an OpenAI-compatible endpoint (/v1/completions or
/v1/chat/completions), open loop or closed loop, every request timed by event.

Open loop (specs carry ``scheduled_s``): one scheduler sends each request at its time, whatever the server
does: a slow server makes requests wait in its queue (TTFT grows), never the sends (no coordinated omission).
The scheduler's own lag (actual send - scheduled, s) is kept per request; the connection pool holds a
connection for every request in flight, so a send never waits for a free connection. Closed loop
(``concurrency`` C): C workers, each sending its next request when its last one ends.

httpx.AsyncClient over HTTP/1.1 with keep-alive. A request's fate is one of records.STATUSES; a failing request
is recorded and the run goes on. An endpoint that cannot be reached at all (``/v1/models`` fails to connect)
is an OpmapError before anything is sent. SIGINT / SIGTERM stop the run: nothing more is sent, requests in
flight are cancelled (counted, not recorded) and the records so far come back, marked interrupted.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

from opmap.bench.records import BenchResult, RequestRecord, RequestSpec
from opmap.bench.sse import SSEParser, read_chunk
from opmap.errors import OpmapError

APIS = ("completions", "chat")
PROGRESS_EVERY_S = 0.1  # progress callbacks at most this often: a bar redrawn per request costs the client
ERROR_BODY_BYTES = 300  # the part of an HTTP error's body kept in a record


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
    return json.dumps(body).encode()


def run_load(base_url: str, model: str, specs: Iterable[RequestSpec], *, api: str = "completions",
             concurrency: int | None = None, timeout_s: float = 600.0, ignore_eos: bool = True,
             progress: Callable[[int, int | None], None] | None = None, duration_s: float | None = None,
             total: int | None = None, extra_body: dict[str, Any] | None = None,
             connect_timeout_s: float = 10.0) -> BenchResult:
    """Send ``specs`` to ``base_url`` and time them; returns the run's records.

    ``concurrency``: closed loop with that many requests in flight; None: open loop, each spec sent at its
    ``scheduled_s``. ``duration_s``: stop sending once that many seconds have passed (open loop: no spec
    scheduled after it is sent); requests in flight still finish. ``timeout_s``: the limit on one request, from
    its send to its stream's end (s). ``progress(done, total)``: called as requests end (at most every 0.1 s,
    and once at the end). ``total``: the number of specs when ``specs`` is a lazy iterator (for progress)."""
    if api not in APIS:
        raise OpmapError(f"--api {api!r}: accepted: {', '.join(APIS)}")
    root = endpoint_root(base_url)
    if total is None and hasattr(specs, "__len__"):
        total = len(specs)  # type: ignore[arg-type]
    run = _Run(root, model, api, concurrency, timeout_s, ignore_eos, progress, duration_s, total, extra_body,
               connect_timeout_s)
    return asyncio.run(run.main(iter(specs)))


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
        self.url = root + ("/v1/chat/completions" if api == "chat" else "/v1/completions")
        self.concurrency, self.timeout_s, self.ignore_eos = concurrency, timeout_s, ignore_eos
        self.progress, self.duration_s, self.total = progress, duration_s, total
        self.extra_body, self.connect_timeout_s = extra_body, connect_timeout_s
        self.records: list[RequestRecord] = []
        self.tasks: set[asyncio.Task] = set()
        self.stop: asyncio.Event | None = None  # made on the loop (main)
        self.cancelled = 0
        self.interrupted = False
        self.peak_in_flight = 0
        self.in_flight = 0
        self.pool = 0
        self._last_progress = 0.0

    async def main(self, specs) -> BenchResult:
        import httpx

        self.stop = asyncio.Event()
        fds = _fd_limit()
        if self.concurrency is not None:
            self.pool = self.concurrency
        else:
            self.pool = max(1, min(self.total or fds, fds - 64))
        limits = httpx.Limits(max_connections=self.pool, max_keepalive_connections=self.pool)
        timeout = httpx.Timeout(self.timeout_s, connect=min(self.connect_timeout_s, self.timeout_s), pool=None)
        async with httpx.AsyncClient(limits=limits, timeout=timeout, http2=False, trust_env=False) as client:
            models, server = await self._models(client)
            handlers = self._signals()
            started_unix = time.time()
            self.t0 = time.perf_counter()
            try:
                if self.concurrency is None:
                    await self._open(client, specs)
                else:
                    await self._closed(client, specs)
            finally:
                wall = time.perf_counter() - self.t0
                self._unsignal(handlers)
        self._report_progress(force=True)
        cancelled = self.cancelled
        return BenchResult(tuple(self.records), self.root, self.model, self.api,
                           "open" if self.concurrency is None else "closed", self.concurrency, started_unix, wall,
                           self.interrupted, cancelled, tuple(models), server,
                           {"timeout_s": self.timeout_s, "ignore_eos": self.ignore_eos, "duration_s": self.duration_s,
                            "pool_connections": self.pool, "peak_in_flight": self.peak_in_flight,
                            "extra_body": self.extra_body or {}})

    async def _models(self, client) -> tuple[list[str], str | None]:
        """The model ids ``/v1/models`` lists, and the server's ``Server`` header; OpmapError when the endpoint
        cannot be reached (nothing listens, no route, DNS)."""
        import httpx

        try:
            r = await client.get(self.root + "/v1/models", timeout=min(self.connect_timeout_s, self.timeout_s))
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise OpmapError(f"cannot reach {self.root}: {_why(e)} (is the server up, and is the URL its base, "
                             "such as http://host:8000?)") from None
        except httpx.HTTPError as e:
            raise OpmapError(f"{self.root}/v1/models did not answer: {_why(e)}") from None
        ids: list[str] = []
        if r.status_code == 200:
            try:
                data = r.json().get("data") or []
                ids = [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id") is not None]
            except (ValueError, AttributeError):
                ids = []
        return ids, r.headers.get("server")

    def _signals(self) -> list[int]:
        loop = asyncio.get_running_loop()
        done = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._interrupt)
                done.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or not POSIX
                pass
        return done

    def _unsignal(self, sigs: list[int]) -> None:
        loop = asyncio.get_running_loop()
        for sig in sigs:
            loop.remove_signal_handler(sig)

    def _interrupt(self) -> None:
        """Stop: send nothing more and cancel what is in flight (the records so far are kept)."""
        self.interrupted = True
        self.stop.set()
        self._unsignal([signal.SIGINT, signal.SIGTERM])  # a second Ctrl-C is Python's own
        self.cancelled = self.in_flight
        for t in list(self.tasks):
            t.cancel()

    def _spawn(self, client, spec: RequestSpec) -> None:
        task = asyncio.create_task(self._one(client, spec))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _open(self, client, specs) -> None:
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
            if delay > 0:
                try:
                    await asyncio.wait_for(self.stop.wait(), delay)
                    break  # stopped while waiting
                except TimeoutError:
                    pass
            self._spawn(client, spec)
        await self._drain()

    async def _closed(self, client, specs) -> None:
        async def worker() -> None:
            for spec in specs:  # one iterator shared by the workers (one thread: no race)
                if self.stop.is_set() or (self.duration_s is not None and
                                          time.perf_counter() - self.t0 > self.duration_s):
                    return
                await self._one(client, spec)

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

    async def _one(self, client, spec: RequestSpec) -> None:
        """Send one request, read its stream, append its record (also on failure)."""
        import httpx

        clock, t0 = time.perf_counter, self.t0
        body = request_body(spec, self.model, self.api, self.ignore_eos, self.extra_body)
        st = _Stream()
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        sent = clock() - t0
        status, error, http_status = "ok", "", None
        try:
            async with asyncio.timeout(self.timeout_s):
                async with client.stream("POST", self.url, content=body,
                                         headers={"content-type": "application/json",
                                                  "accept": "text/event-stream"}) as resp:
                    http_status = resp.status_code
                    if resp.status_code >= 400:
                        status = "http_error"
                        error = f"HTTP {resp.status_code}: " + (await _head(resp)).strip()
                    else:
                        status, error = await st.read(resp, clock, t0)
        except TimeoutError:
            status, error = "timeout", f"no end of stream within {self.timeout_s:g} s"
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            status, error = "connect_error", _why(e)
        except httpx.TimeoutException as e:
            status, error = "timeout", _why(e)
        except httpx.HTTPError as e:
            status, error = "dropped", _why(e)
        finally:
            self.in_flight -= 1
        end = clock() - t0
        self.records.append(RequestRecord(
            spec.index, spec.scheduled_s, sent, st.first, tuple(st.times), end, spec.input_tokens, spec.max_tokens,
            st.usage_prompt, st.usage_completion, st.events, status, error, http_status, spec.warmup))
        self._report_progress()

    def _report_progress(self, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.perf_counter()
        if force or now - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = now
            self.progress(len(self.records), self.total)


class _Stream:
    """One response's stream read event by event: the arrival of each event carrying text (s from the run's
    start), the usage counts, the events seen."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.times: list[float] = []
        self.usage_prompt: int | None = None
        self.usage_completion: int | None = None
        self.events = 0

    async def read(self, resp, clock, t0: float) -> tuple[str, str]:
        """(status, error) of the stream: ok at [DONE] (or at its end after a finish_reason), stream_error at
        an error event, dropped at an end before either."""
        parser = SSEParser()
        finished = False
        outcome = None
        async for raw in resp.aiter_raw():
            if outcome is not None:
                continue  # read to the body's end, so the connection goes back to the pool (keep-alive)
            now = clock() - t0
            for ev in parser.feed(raw):
                self.events += 1
                c = read_chunk(ev.data)
                if c.done:
                    outcome = ("ok", "")
                    break
                if c.error is not None:
                    outcome = ("stream_error", c.error)
                    break
                if c.usage is not None:
                    self._usage(c.usage)
                if c.text:
                    if self.first is None:
                        self.first = now
                    self.times.append(now)
                if c.finish_reason is not None:
                    finished = True
        if outcome is not None:
            return outcome
        parser.close()
        if finished:
            return "ok", ""
        return "dropped", "the stream ended before [DONE] or a finish_reason"

    def _usage(self, u: dict[str, Any]) -> None:
        p, c = u.get("prompt_tokens"), u.get("completion_tokens")
        if isinstance(p, int) and not isinstance(p, bool):
            self.usage_prompt = p
        if isinstance(c, int) and not isinstance(c, bool):
            self.usage_completion = c


async def _head(resp) -> str:
    """The first ERROR_BODY_BYTES of a response's body, as text."""
    got = b""
    async for b in resp.aiter_raw():
        got += b
        if len(got) >= ERROR_BODY_BYTES:
            break
    return got[:ERROR_BODY_BYTES].decode("utf-8", errors="replace")


def _why(e: BaseException) -> str:
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__
