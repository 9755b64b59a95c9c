"""Server-sent events (the WHATWG HTML "event stream" format) parsed incrementally, and the OpenAI streaming
chunks they carry read into what a load client needs.

The format (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation): lines
end with CRLF, LF or CR; a line starting with ':' is a comment; ``field: value`` (one space after the colon
dropped); several ``data`` lines of one event are joined with LF; an empty line dispatches the event; an event
with no data field is not dispatched; a partial event at the end of the stream is discarded; ``event``, ``id``
and ``retry`` are read and kept (event) or ignored.

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


class SSEParser:
    """Feed bytes as they arrive (``feed``); get back the events they complete. UTF-8 is decoded per line, so
    a multi-byte character split across reads is whole when decoded.

    ``feed(chunk, at)``: ``at`` is the time the chunk arrived; each event carries the ``at`` of the chunk that
    completed its last data line, not of the one holding the empty line that dispatches it: the event's data
    was whole then. (A proxy may send each line as its own packet, and the empty line can come tens of ms after
    the data: Nagle's algorithm on the proxy waiting for the client's delayed ACK.)"""

    def __init__(self) -> None:
        self._buf = b""
        self._skip_lf = False  # the last read ended with CR: an LF starting the next read belongs to it
        self._data: list[str] = []
        self._event = ""
        self._now: float | None = None  # the ``at`` of the chunk being parsed
        self._data_at: float | None = None  # the ``at`` of the chunk that completed the last data line

    def feed(self, chunk: bytes, at: float | None = None) -> list[Event]:
        self._now = at
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        buf = self._buf + chunk
        if b"\r" in buf:
            self._skip_lf = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        return self._lines(lines)

    def _lines(self, lines: list[bytes]) -> list[Event]:
        out: list[Event] = []
        for raw in lines:
            if not raw:
                if self._data:
                    out.append(Event("\n".join(self._data), self._event or "message", self._data_at))
                self._data, self._event = [], ""
                continue
            if raw[:6] == b"data: ":  # the common line, without the general field parsing
                self._data.append(raw[6:].decode("utf-8", errors="replace"))
                self._data_at = self._now
            else:
                self._field(raw.decode("utf-8", errors="replace"))
        return out

    def _field(self, line: str) -> None:
        if line[0] == ":":
            return  # a comment (servers send ': ping' to keep a connection open)
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._data_at = self._now
        elif name == "event":
            self._event = value
        # id and retry: not needed by a load client; other fields: ignored, as the format says

    def close(self) -> bool:
        """The stream ended: a partial event (data lines without their closing empty line, or a line without
        its end) is discarded, as the format says. Returns whether anything was discarded."""
        pending = bool(self._buf) or bool(self._data)
        self._buf, self._skip_lf, self._data, self._event = b"", False, [], ""
        return pending


class Chunk(NamedTuple):
    """What one OpenAI streaming event carries. ``text``: the generated text in it ("" when none: a role-only
    or finish-only chunk, a usage chunk); ``usage``: the usage object when present; ``finish_reason``: set on
    the chunk that ends a choice; ``error``: the error message of an error chunk (or a chunk that is not a JSON
    object); ``done``: the ``[DONE]`` sentinel."""

    text: str = ""
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None
    done: bool = False


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
    if type(d) is not dict:
        return Chunk(error=f"a stream event that is not a JSON object: {data[:80]!r}")
    if "error" in d and d["error"] is not None or d.get("object") == "error":
        e = d.get("error")
        msg = e.get("message") if isinstance(e, dict) else (e if isinstance(e, str) else d.get("message"))
        return Chunk(error=str(msg or d)[:200])
    usage = d.get("usage")
    if type(usage) is not dict:
        usage = None
    choices = d.get("choices")
    if not choices or type(choices) is not list or type(choices[0]) is not dict:
        return Chunk(usage=usage)
    c = choices[0]
    text = c.get("text")
    if text is None:
        delta = c.get("delta")
        if type(delta) is not dict:
            delta = {}
        text = (delta.get("content") or "") + (delta.get("reasoning_content") or delta.get("reasoning") or "")
    return Chunk(text if type(text) is str else "", usage, c.get("finish_reason"))
