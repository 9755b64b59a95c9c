"""Server-sent events (the WHATWG HTML "event stream" format) parsed incrementally, and the OpenAI streaming
chunks they carry read into what a load client needs.

The format (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation): lines
end with CRLF, LF or CR; a line starting with ':' is a comment; ``field: value`` (one space after the colon
dropped); several ``data`` lines of one event are joined with LF; an empty line dispatches the event; an event
with no data field is not dispatched; a partial event at the end of the stream is discarded; ``event``, ``id``
and ``retry`` are read and kept (event) or ignored. The parser is linear in the bytes fed, and no line or event
may pass MAX_EVENT_BYTES (StreamLimit: the request fails, the rest of its stream unread).

OpenAI streams (/v1/completions and /v1/chat/completions with ``stream: true``): each event's data is a JSON
chunk, the last is the literal ``[DONE]``; with ``stream_options.include_usage`` a chunk with ``usage`` (and
usually ``choices: []``) precedes it. An error may arrive mid-stream as ``{"error": {...}}`` (vLLM, OpenAI) or
``{"object": "error", "message": ...}``. One chunk may carry several tokens' text (a server that merges
tokens): the client times chunks, and counts tokens from usage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Event:
    """One dispatched event: its ``data`` (the data lines joined with LF), its ``event`` type ("message"
    when none was given) and ``at``: the time passed to ``SSEParser.feed`` with the bytes that completed its
    last data line (None when none was passed)."""

    data: str
    event: str = "message"
    at: float | None = None


# No line of a stream (its field name, colon and value) and no event's data (its data lines joined) may be longer
# than this: a token's chunk is under 1 KB, and a whole 128k-token answer sent as one event (about 0.5 MB of text,
# up to 6x that with JSON escapes) fits. A hostile or broken server that sends more is one failed request (its
# connection dropped), not a client holding the line in memory while it grows.
MAX_EVENT_BYTES = 8 << 20


STREAM_TYPES = ("text/event-stream", "")  # the media type of an event stream; "": a server that sends no type


def media_type(content_type: str | None) -> str:
    """The media type of a content-type header, lower case, without its parameters ("" for none)."""
    return (content_type or "").partition(";")[0].strip().lower()


class StreamLimit(ValueError):
    """A stream broke a limit the client holds every stream to (MAX_EVENT_BYTES): the request fails with this
    reason and the rest of the stream is not read (the parser is not fed again). ``events``: the events the read
    completed before the line or event that broke it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.events: list[Event] = []


class SSEParser:
    """Feed bytes as they arrive (``feed``); get back the events they complete. UTF-8 is decoded per line, so
    a multi-byte character split across reads is whole when decoded.

    ``feed(chunk, at)``: ``at`` is the time the chunk arrived; each event carries the ``at`` of the chunk that
    completed its last data line, not of the one holding the empty line that dispatches it: the event's data
    was whole then. (A proxy may send each line as its own packet, and the empty line can come tens of ms after
    the data: Nagle's algorithm on the proxy waiting for the client's delayed ACK.)

    Linear in the bytes fed: each read is scanned once for line ends, and the unfinished line's pieces are kept
    as they came and joined once, when its end arrives (a line trickled in 4 KiB reads used to be re-joined and
    re-split on every read: 10 MB took 6 s). StreamLimit when a line (without its end) or an event's data (its
    data lines' values joined with LF) passes ``max_bytes``."""

    def __init__(self, max_bytes: int = MAX_EVENT_BYTES) -> None:
        self.max_bytes = max_bytes
        self._line: list[bytes] = []  # the pieces of the line whose end has not arrived yet
        self._line_bytes = 0
        self._skip_lf = False  # the last read ended with CR: an LF starting the next read belongs to it
        self._data: list[str] = []
        self._data_bytes = 0  # the event's data so far, as joined (LFs between its lines included)
        self._event = ""
        self._now: float | None = None  # the ``at`` of the chunk being parsed
        self._data_at: float | None = None  # the ``at`` of the chunk that completed the last data line

    def feed(self, chunk: bytes, at: float | None = None) -> list[Event]:
        self._now = at
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if not chunk:
            return []
        if b"\r" in chunk:  # a CRLF split across reads: the CR ends this one, its LF is skipped at the next
            self._skip_lf = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = chunk.split(b"\n")
        rest = lines.pop()
        out: list[Event] = []
        try:
            if lines:
                if self._line:
                    lines[0] = b"".join(self._line) + lines[0]
                    self._line, self._line_bytes = [], 0
                self._lines(lines, out)
            if rest:
                self._hold(rest)
        except StreamLimit as e:
            e.events = out
            raise
        return out

    def _hold(self, piece: bytes) -> None:
        self._line_bytes += len(piece)
        if self._line_bytes > self.max_bytes:
            raise self._too_long()
        self._line.append(piece)

    def _too_long(self) -> StreamLimit:
        return StreamLimit(f"a stream line longer than {self.max_bytes} bytes (the client's limit on one line or "
                           "event): the rest of the stream was not read")

    def _lines(self, lines: list[bytes], out: list[Event]) -> None:
        limit = self.max_bytes
        for raw in lines:
            if not raw:
                if self._data:
                    out.append(Event("\n".join(self._data), self._event or "message", self._data_at))
                self._data, self._data_bytes, self._event = [], 0, ""
            elif len(raw) > limit:
                raise self._too_long()
            elif raw[:6] == b"data: " and not self._data:  # the common line, an event's first: no field parsing
                self._data_bytes = len(raw) - 6
                self._data.append(raw[6:].decode("utf-8", errors="replace"))
                self._data_at = self._now
            else:
                self._field(raw)

    def _add_data(self, value: bytes) -> None:
        self._data_bytes += len(value) + (1 if self._data else 0)
        if self._data_bytes > self.max_bytes:
            raise StreamLimit(f"a stream event whose data is longer than {self.max_bytes} bytes (the client's limit "
                              "on one event): the rest of the stream was not read")
        self._data.append(value.decode("utf-8", errors="replace"))
        self._data_at = self._now

    def _field(self, raw: bytes) -> None:
        if raw[:1] == b":":
            return  # a comment (servers send ': ping' to keep a connection open)
        name, sep, value = raw.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._add_data(value)
        elif name == b"event":
            self._event = value.decode("utf-8", errors="replace")
        # id and retry: not needed by a load client; other fields: ignored, as the format says

    def close(self) -> bool:
        """The stream ended: a partial event (data lines without their closing empty line, or a line without
        its end) is discarded, as the format says. Returns whether anything was discarded."""
        pending = bool(self._line) or bool(self._data)
        self._line, self._line_bytes, self._skip_lf = [], 0, False
        self._data, self._data_bytes, self._event = [], 0, ""
        return pending


class Chunk(NamedTuple):
    """What one OpenAI streaming event carries. ``text``: the generated text in it ("" when none: a role-only
    or finish-only chunk, a usage chunk); ``usage``: the usage object when present; ``finish_reason``: set on
    the chunk that ends a choice; ``error``: the error message of an error chunk (or a chunk that is not a JSON
    object); ``done``: the ``[DONE]`` sentinel; ``id``: the completion's id as the server names it (its logs
    and traces use it; "" where the chunk has none)."""

    text: str = ""
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None
    done: bool = False
    id: str = ""


DONE = Chunk(done=True)


_decode = json.JSONDecoder().raw_decode  # json.loads without its two whitespace scans: one call per token


def read_chunk(data: str) -> Chunk:
    """The meaning of one event's data: ``[DONE]``, an error, or a completion / chat chunk (text from
    ``choices[0].text`` or ``choices[0].delta.content``, a reasoning model's ``reasoning_content`` included)."""
    if data[:1] != "{":
        if data.strip() == "[DONE]":
            return DONE
        data = data.strip()
    try:
        d, end = _decode(data)
        if end != len(data) and data[end:].strip():
            raise ValueError("extra data after the JSON value")
    except ValueError:
        return Chunk(error=f"a stream event that is not JSON: {data[:80]!r}")
    except RecursionError:  # the C decoder counts its depth against Python's recursion limit; real chunks: ~5
        return Chunk(error=f"a stream event nested deeper than the JSON reader goes: {data[:80]!r}")
    if type(d) is not dict:
        return Chunk(error=f"a stream event that is not a JSON object: {data[:80]!r}")
    if "error" in d and d["error"] is not None or d.get("object") == "error":
        e = d.get("error")
        msg = e.get("message") if isinstance(e, dict) else (e if isinstance(e, str) else d.get("message"))
        return Chunk(error=str(msg)[:200] if msg else data[:200])  # the raw text: a repr of d could recurse
    usage = d.get("usage")
    if type(usage) is not dict:
        usage = None
    rid = d.get("id")
    rid = rid[:200] if type(rid) is str else ""
    choices = d.get("choices")
    if not choices or type(choices) is not list or type(choices[0]) is not dict:
        return Chunk(usage=usage, id=rid)
    c = choices[0]
    text = c.get("text")
    if text is None:
        delta = c.get("delta")
        if type(delta) is not dict:
            delta = {}
        text = (delta.get("content") or "") + (delta.get("reasoning_content") or delta.get("reasoning") or "")
    return Chunk(text if type(text) is str else "", usage, c.get("finish_reason"), id=rid)
