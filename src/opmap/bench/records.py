"""The values a load run is made of: what to send (RequestSpec), what happened to one request (RequestRecord)
and the whole run (BenchResult). Frozen dataclasses; every time is in seconds relative to the run's start (the
client's monotonic clock when the run began), so a record's fields can be subtracted directly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# What became of a request: ok (the stream ended with [DONE] or a finish_reason), http_error (a status >= 400, or
# a redirect: not followed), stream_error (an error object in the stream, a chunk that is not JSON or nested past
# the JSON reader's depth, a line or event over the client's limit, an answer that is not an event stream),
# dropped (the connection closed before the stream ended), timeout (the per-request limit passed), connect_error
# (no connection was made).
STATUSES = ("ok", "http_error", "stream_error", "dropped", "timeout", "connect_error")

# A server's usage count is taken when it is an integer from 0 to a plausible maximum: for completion_tokens the
# request's max_tokens plus USAGE_SLACK_TOKENS (a stop or special token a server may count past its cap, which an
# OpenAI-compatible server stops at), for prompt_tokens PROMPT_TOKENS_PER_ASKED times the tokens asked plus
# PROMPT_SLACK_TOKENS (a tokenizer that splits the prompt's words, a chat template's system prompt). Any other value
# (negative, 10^30, 2^62, a float, a string) is set aside with the reason (``usage_error``): the request's text
# events count its output and the asked length its prompt, and the run is INVALID saying so.
USAGE_SLACK_TOKENS = 64
PROMPT_TOKENS_PER_ASKED = 4
PROMPT_SLACK_TOKENS = 8192


def _shown(v: Any) -> str:
    """A usage value as an error message shows it: a number's repr, else its JSON type (a string may be long)."""
    if v is None or isinstance(v, (bool, int, float)):
        return repr(v)[:60]
    return f"a {type(v).__name__}"


def usage_counts(prompt: Any, completion: Any, input_asked: int, max_tokens: int) -> tuple[int | None, int | None,
                                                                                           str]:
    """(prompt_tokens, completion_tokens, why set aside) of a server's usage values as sent (None: not sent):
    each count kept when plausible (see USAGE_SLACK_TOKENS), else None with the reason in the third item."""
    why = []
    out: list[int | None] = []
    for name, v, hi, rule in (
            ("prompt_tokens", prompt, PROMPT_TOKENS_PER_ASKED * input_asked + PROMPT_SLACK_TOKENS,
             f"{PROMPT_TOKENS_PER_ASKED} x the {input_asked} asked + {PROMPT_SLACK_TOKENS}"),
            ("completion_tokens", completion, max_tokens + USAGE_SLACK_TOKENS,
             f"max_tokens {max_tokens} + {USAGE_SLACK_TOKENS}")):
        if v is None or (type(v) is int and 0 <= v <= hi):
            out.append(v)
        else:
            out.append(None)
            why.append(f"usage {name} {_shown(v)} is not a count from 0 to {hi} ({rule})")
    return out[0], out[1], "; ".join(why)


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


@dataclass(frozen=True)
class RequestRecord:
    """What one request did. Times (s from the run's start): ``sent_s`` just before the request was written,
    ``first_token_s`` the first event carrying text, ``token_times_s`` the arrival of every event carrying text
    (an event may carry several tokens: count them from usage, time them by event), ``end_s`` when the stream
    ended or failed. ``usage_*``: the server's own counts (None where it sent none, or an implausible one:
    ``usage_error`` says which and why, see usage_counts). ``events``: the data events received (usage-only and
    finish chunks included). ``token_times_dropped``: text events past the client's cap on the times kept per
    request (their count is kept, their times are not). ``response_id``: the server's id of the completion."""

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
    usage_error: str = ""
    token_times_dropped: int = 0
    response_id: str = ""  # the server's id for the completion (its chunks' "id"), "" where it sent none

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class BenchResult:
    """A run: its records (in completion order), the endpoint asked, what ``/v1/models`` reported, and how the
    run went. ``started_unix_s``: wall-clock time of the run's start (s since the epoch); ``wall_s``: its length
    (s); ``interrupted``: stopped by Ctrl-C (or a signal) before every request was sent and answered;
    ``in_flight_at_stop``: requests sent and still unanswered when it stopped (not in ``records``);
    ``stop_signal``: the signal that stopped it (0: none), for the exit status (128 + its number);
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
    stop_signal: int = 0  # the signal that stopped it (SIGINT 2, SIGTERM 15); 0: it was not stopped
    # the server's /metrics scraped during the run (opmap.bench.server_metrics.ServerSeries); None: not asked
    server_metrics: Any = None
    server_info: dict[str, Any] = field(default_factory=dict)  # /v1/models' metadata ("models") and "version"
