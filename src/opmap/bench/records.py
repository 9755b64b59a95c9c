"""The values a load run is made of: what to send (RequestSpec), what happened to one request (RequestRecord)
and the whole run (BenchResult). Frozen dataclasses; every time is in seconds relative to the run's start (the
client's monotonic clock when the run began), so a record's fields can be subtracted directly."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# What became of a request: ok (the stream ended with [DONE] or a finish_reason), http_error (a status >= 400),
# stream_error (an error object in the stream, or a chunk that is not JSON), dropped (the connection closed
# before the stream ended), timeout (the per-request limit passed), connect_error (no connection was made).
STATUSES = ("ok", "http_error", "stream_error", "dropped", "timeout", "connect_error")


@dataclass(frozen=True)
class RequestSpec:
    """One request to send. ``scheduled_s``: its send time (s from the run's start) in an open loop, None in a
    closed loop (sent when a slot frees). ``input_tokens`` / ``max_tokens``: the lengths asked (tokens);
    ``warmup``: sent, but kept out of the figures."""

    index: int
    scheduled_s: float | None
    prompt: str
    input_tokens: int
    max_tokens: int
    warmup: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RequestRecord:
    """What one request did. Times (s from the run's start): ``sent_s`` just before the request was written,
    ``first_token_s`` the first event carrying text, ``token_times_s`` the arrival of every event carrying text
    (an event may carry several tokens: count them from usage, time them by event), ``end_s`` when the stream
    ended or failed. ``usage_*``: the server's own counts (None where it sent no usage). ``events``: the data
    events received (usage-only and finish chunks included)."""

    index: int
    scheduled_s: float | None
    sent_s: float
    first_token_s: float | None
    token_times_s: tuple[float, ...]
    end_s: float
    input_tokens_asked: int
    output_tokens_asked: int
    usage_prompt_tokens: int | None
    usage_completion_tokens: int | None
    events: int
    status: str
    error: str = ""
    http_status: int | None = None
    warmup: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["token_times_s"] = list(self.token_times_s)
        return d

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class BenchResult:
    """A run: its records (in completion order), the endpoint asked, what ``/v1/models`` reported, and how the
    run went. ``started_unix_s``: wall-clock time of the run's start (s since the epoch); ``wall_s``: its length
    (s); ``interrupted``: stopped by Ctrl-C (or a signal) before every request was sent and answered;
    ``in_flight_at_stop``: requests sent and still unanswered when it stopped (not in ``records``);
    ``mode``: "open" (sends follow scheduled_s) or "closed" (``concurrency`` requests in flight)."""

    records: tuple[RequestRecord, ...]
    base_url: str
    model: str
    api: str
    mode: str
    concurrency: int | None
    started_unix_s: float
    wall_s: float
    interrupted: bool = False
    in_flight_at_stop: int = 0
    server_models: tuple[str, ...] = ()
    server_header: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "model": self.model, "api": self.api, "mode": self.mode,
                "concurrency": self.concurrency, "started_unix_s": self.started_unix_s, "wall_s": self.wall_s,
                "interrupted": self.interrupted, "in_flight_at_stop": self.in_flight_at_stop,
                "server_models": list(self.server_models), "server_header": self.server_header,
                "options": dict(self.options), "records": [r.to_dict() for r in self.records]}
