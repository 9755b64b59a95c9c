"""One streamed answer as the load client reads it (opmap.bench.client): whether a response is an event stream,
a bounded read of a body that is not, and ``Stream``, the body fed as it arrives (the SSE parser, opmap.bench.sse),
each text event stamped with the read that completed it, the usage the server sent, and the request's outcome."""

from __future__ import annotations

from typing import Any

from opmap.bench.sse import STREAM_TYPES, SSEParser, media_type, read_chunk

ERROR_BODY_BYTES = 300  # the part of an HTTP error's body kept in a record
# The event times kept per request (twice the longest output served models take today, 128k tokens, one event a
# token); text events past it are counted, not timed, so a stream of millions of events stays one bounded record.
MAX_TIMES_KEPT = 1 << 18


def is_stream(resp) -> bool:
    """Whether an answer is read as an event stream: a 2xx status and an event-stream content-type (or none)."""
    return 200 <= resp.status < 300 and media_type(resp.headers.get("content-type")) in STREAM_TYPES


async def read_body(resp, limit: int) -> tuple[bytes, bool]:
    """(the first bytes of a body, whether that is all of it): read to its end when it holds at most ``limit``
    bytes; past that the connection is closed (the rest is never read, nor held)."""
    if resp.content_length is not None and resp.content_length > limit:
        resp.close()
        return b"", False
    got = bytearray()
    while chunk := await resp.content.read(limit + 1 - len(got)):
        got += chunk
        if len(got) > limit:
            resp.close()
            return bytes(got[:limit]), False
    return bytes(got), True


class Stream:
    """One response's body read as it arrives (``feed``, with the time of each read): the arrival of each event
    carrying text (s from the run's start; the first MAX_TIMES_KEPT, the rest counted in ``dropped``), the usage
    values as sent, the events seen; the first bytes kept for an HTTP error's message."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.parser = SSEParser()
        self.first: float | None = None
        self.times: list[float] = []
        self.dropped = 0
        self.usage_prompt: Any = None  # as sent: usage_counts judges them when the record is made
        self.usage_completion: Any = None
        self.events = 0
        self.finished = False
        self.result: tuple[str, str] | None = None  # set at [DONE] or an error event; the rest is not read
        self.head = b""
        self.response_id = ""  # the first id the server's chunks carry

    def feed(self, data: bytes, t: float) -> None:
        if len(self.head) < ERROR_BODY_BYTES:
            self.head += data[:ERROR_BODY_BYTES - len(self.head)]
        if self.result is not None:
            return
        for ev in self.parser.feed(data, t - self.t0):
            self.events += 1
            if ev.event == "error":  # an SSE error event (TGI), whatever its data holds
                self.result = ("stream_error", ev.data[:200])
                return
            c = read_chunk(ev.data)
            if c.done:
                self.result = ("ok", "")
                return
            if c.error is not None:
                self.result = ("stream_error", c.error)
                return
            if c.usage is not None:
                self._usage(c.usage)
            if c.id and not self.response_id:
                self.response_id = c.id
            if c.text:  # timed by the read that completed its data, not by the one that dispatched it
                if self.first is None:
                    self.first = ev.at
                if len(self.times) < MAX_TIMES_KEPT:
                    self.times.append(ev.at)
                else:
                    self.dropped += 1
            if c.finish_reason is not None:
                self.finished = True

    def outcome(self, http_status: int, headers) -> tuple[str, str]:
        """(status, error) of a response that ended: http_error for a status >= 400 or a redirect; stream_error
        for an answer that is not an event stream (an HTML page, a JSON body); ok at [DONE] (or at the body's end
        after a finish_reason); stream_error at an error event; dropped at an end before either."""
        head = self.head.decode("utf-8", errors="replace").strip()
        if http_status >= 400:
            return "http_error", f"HTTP {http_status}: " + head
        if 300 <= http_status < 400:
            where = (headers.get("location") or "nowhere (no location given)")[:200]
            return "http_error", (f"redirect {http_status} to {where} (opmap does not follow redirects: give the "
                                  "URL of the server itself)")
        if (kind := media_type(headers.get("content-type"))) not in STREAM_TYPES or not 200 <= http_status < 300:
            return "stream_error", (f"the answer is {kind or 'untyped'} (HTTP {http_status}), not an event stream: "
                                    f"{head[:120]!r}")
        if self.result is not None:
            return self.result
        self.parser.close()
        if self.finished:
            return "ok", ""
        return "dropped", "the stream ended before [DONE] or a finish_reason"

    def _usage(self, u: dict[str, Any]) -> None:
        p, c = u.get("prompt_tokens"), u.get("completion_tokens")
        if p is not None:
            self.usage_prompt = p
        if c is not None:
            self.usage_completion = c
