"""The server's own view of a load run: its Prometheus ``/metrics`` scraped at an interval while the requests run
(issue 39), kept as time series beside the client's records (KV cache usage, requests running and waiting,
preemptions, prefix-cache hits, the KV pool's size in blocks).

The names are the engines' own (``WATCHED``), each cited to the file that defines it: vLLM's V1 engine
(vllm/v1/metrics/loggers.py @ 005a810bc40faa25b8870fbc8559c3462581eee3: ``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc`` before 0.9),
``vllm:num_preemptions``, ``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits`` (counters: exposed with a
``_total`` suffix), ``vllm:cache_config_info`` (an info gauge whose ``num_gpu_blocks`` label is the pool size)) and
SGLang's (python/sglang/srt/metrics/collector.py @ 93d04878cfb9b08645fae7b11bd340ee33b34acf:
``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``, ``sglang:cache_hit_rate``). A
data-parallel server labels each engine (``engine="0"``...): counts and counters are summed over engines, a usage
fraction keeps the busiest engine's (the one that preempts first).

The exposition text is parsed by prometheus_client's parser (text only, nothing executed), each answer bounded
(``MAX_BODY_BYTES``). A server without ``/metrics`` (``transformers serve``, a proxy) is recorded as such: the run
goes on, its series empty, the status saying why. Times are seconds from the run's start, as the records' are.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

MAX_BODY_BYTES = 4 << 20  # a vLLM /metrics answer is tens of kB (histograms per engine); past this: not metrics
MAX_SAMPLES = 200_000  # scrapes x series kept; a day-long run at 1 s is 86,400 scrapes of a few series
DEFAULT_INTERVAL_S = 1.0
STATUSES = ("scraped", "absent", "failed", "off")


@dataclass(frozen=True)
class Watched:
    """A series kept: opmap's name, the exporter's sample name, how engines combine, and what it means."""

    name: str
    sample: str
    combine: str  # sum | max
    what: str


WATCHED = (
    Watched("running", "vllm:num_requests_running", "sum", "requests in the engine's batches (vLLM)"),
    Watched("waiting", "vllm:num_requests_waiting", "sum", "requests waiting to be scheduled (vLLM)"),
    Watched("kv_usage", "vllm:kv_cache_usage_perc", "max", "KV cache blocks in use, fraction (vLLM)"),
    Watched("kv_usage", "vllm:gpu_cache_usage_perc", "max", "KV cache blocks in use, fraction (vLLM < 0.9)"),
    Watched("preemptions", "vllm:num_preemptions_total", "sum", "preemptions so far, cumulative (vLLM)"),
    Watched("prefix_queries", "vllm:prefix_cache_queries_total", "sum", "prompt tokens looked up (vLLM)"),
    Watched("prefix_hits", "vllm:prefix_cache_hits_total", "sum", "prompt tokens found cached (vLLM)"),
    Watched("running", "sglang:num_running_reqs", "sum", "requests running (SGLang)"),
    Watched("waiting", "sglang:num_queue_reqs", "sum", "requests in the waiting queue (SGLang)"),
    Watched("kv_usage", "sglang:token_usage", "max", "KV token pool in use, fraction (SGLang)"),
    Watched("prefix_hit_rate", "sglang:cache_hit_rate", "max", "prefix cache hit rate (SGLang)"),
)
SERIES = tuple(dict.fromkeys(w.name for w in WATCHED))  # opmap's names, in order
INFO_BLOCKS = ("vllm:cache_config_info", "num_gpu_blocks")  # the info gauge and its label holding the pool size


@dataclass(frozen=True)
class Scrape:
    """One answer of ``/metrics``, parsed: the watched series' values (opmap's names), the engine the names
    belong to (vllm, sglang or "" when none of the watched names is there) and the KV pool in blocks."""

    values: dict[str, float]
    engine: str
    num_gpu_blocks: int | None


@dataclass(frozen=True)
class ServerSeries:
    """The run's scrapes: ``times_s`` (s from the run's start) and one tuple of values per series name (None where
    a scrape lacked it); ``status``: scraped, absent (no /metrics: 404, or an answer that is not Prometheus text),
    failed (it answered before, then stopped) or off (not asked for); ``detail``: why, for any but scraped."""

    url: str
    status: str
    interval_s: float
    engine: str
    num_gpu_blocks: int | None
    times_s: tuple[float, ...]
    series: dict[str, tuple[float | None, ...]]
    detail: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"url": self.url, "status": self.status, "detail": self.detail, "interval_s": self.interval_s,
                "engine": self.engine, "num_gpu_blocks": self.num_gpu_blocks, "times_s": list(self.times_s),
                "series": {k: list(v) for k, v in self.series.items()}}


def off(url: str = "") -> ServerSeries:
    return ServerSeries(url, "off", 0.0, "", None, (), {}, "not asked for (--metrics-url none)")


def parse(text: str) -> Scrape:
    """The watched series of one exposition text (Prometheus text format 0.0.4). ValueError when it is not one."""
    from prometheus_client.parser import text_string_to_metric_families

    by_sample: dict[str, list[float]] = {}
    blocks = None
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == INFO_BLOCKS[0] and INFO_BLOCKS[1] in s.labels:
                try:
                    blocks = (blocks or 0) + int(s.labels[INFO_BLOCKS[1]])
                except ValueError:
                    pass
            by_sample.setdefault(s.name, []).append(float(s.value))
    values: dict[str, float] = {}
    engine = ""
    for w in WATCHED:
        got = by_sample.get(w.sample)
        if not got or w.name in values:  # the first name present wins (vLLM's current name before its old one)
            continue
        values[w.name] = sum(got) if w.combine == "sum" else max(got)
        engine = engine or w.sample.split(":")[0]
    return Scrape(values, engine, blocks)


def collect(url: str, interval_s: float, scrapes: Iterable[tuple[float, Scrape | None, str]]) -> ServerSeries:
    """The series of ``scrapes`` ((time s, parsed answer or None, why not)), in order."""
    times: list[float] = []
    rows: list[dict[str, float]] = []
    engine, blocks, first_error, answered, last_error = "", None, "", False, ""
    for t, sc, why in scrapes:
        if sc is None:
            first_error = first_error or why
            last_error = why
            continue
        answered, last_error = True, ""
        times.append(t)
        rows.append(sc.values)
        engine = engine or sc.engine
        blocks = sc.num_gpu_blocks if sc.num_gpu_blocks is not None else blocks
    names = [n for n in SERIES if any(n in r for r in rows)]
    series = {n: tuple(r.get(n) for r in rows) for n in names}
    if not answered:
        status, detail = "absent", first_error or "no scrape was made"
    elif not names:
        status, detail = "absent", "the server's /metrics names none of vLLM's or SGLang's series"
    elif last_error:
        status, detail = "failed", f"stopped answering: {last_error}"
    else:
        status, detail = "scraped", ""
    return ServerSeries(url, status, interval_s, engine, blocks, tuple(times), series, detail)


class Scraper:
    """Scrapes ``url`` every ``interval_s`` on the client's event loop until ``stop`` is set, with the client's
    aiohttp session; one scrape more once stopped (the state the run ended in)."""

    def __init__(self, session, url: str, interval_s: float, t0: float) -> None:
        self.session, self.url, self.interval_s, self.t0 = session, url, interval_s, t0
        self.scrapes: list[tuple[float, Scrape | None, str]] = []

    async def once(self) -> None:
        import aiohttp

        t = time.perf_counter() - self.t0
        try:
            timeout = aiohttp.ClientTimeout(total=max(2.0, self.interval_s))
            async with self.session.get(self.url, timeout=timeout, allow_redirects=False,
                                        headers={"accept": "text/plain"}) as resp:
                if resp.status != 200:
                    self.scrapes.append((t, None, f"{self.url} answered HTTP {resp.status}"))
                    return
                body = await resp.content.read(MAX_BODY_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            self.scrapes.append((t, None, f"{self.url}: {type(e).__name__} {e}"[:300]))
            return
        if len(body) > MAX_BODY_BYTES:
            self.scrapes.append((t, None, f"{self.url} answered over {MAX_BODY_BYTES} bytes: not a metrics page"))
            return
        try:
            self.scrapes.append((t, parse(body.decode("utf-8", "replace")), ""))
        except (ValueError, TypeError, IndexError) as e:
            self.scrapes.append((t, None, f"{self.url} is not Prometheus text: {str(e)[:200]}"))

    async def run(self, stop: asyncio.Event) -> ServerSeries:
        while not stop.is_set() and len(self.scrapes) < MAX_SAMPLES:
            await self.once()
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)
            except TimeoutError:
                pass
        await self.once()
        return collect(self.url, self.interval_s, self.scrapes)
