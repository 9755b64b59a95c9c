"""Servers that imitate exactly one failure each, for the client's error handling (a real endpoint cannot be
made to fail on cue): an HTTP 500, a connection dropped mid-stream, an error object mid-stream, a server that
never answers; and hostile ones (HostileServer): an event nested 100,000 deep, absurd usage counts, a line of
many megabytes, millions of events, a redirect, an HTML page, an endless /v1/models. Each answers /v1/models as
a healthy server would (but ``huge-models``); ``every``: only every k-th request fails (the others stream
normally), so a test sees failures counted per request while the run goes on."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from opmap.bench.nullserver import STREAM_HEAD, NullConfig, NullServer, _chunk, _token_event

SSE_ERROR = b"event: error\ndata: Request failed during generation: out of memory\n\n"


class FaultServer(NullServer):
    """``mode``: "500", "drop" (two tokens, then the connection closes), "error" (two tokens, then an error
    event, then [DONE]), "stall" (two tokens, then nothing: the stream stays open), "sse-error" (an
    ``event: error`` SSE event, as TGI sends), "hang" (the request is read and never answered) or "strict" (a
    field it does not know, ignore_eos, refused with a 422 as transformers serve refuses it: "Unexpected fields
    in the request"; a request without it streams normally)."""

    def __init__(self, mode: str, every: int = 1, cfg: NullConfig | None = None) -> None:
        super().__init__(cfg or NullConfig())
        self.mode, self.every, self.posts = mode, every, 0

    async def route(self, method, path, body, writer):
        if method == "POST" and path.startswith("/v1/") and self.mode == "strict":
            if "ignore_eos" not in json.loads(body):
                return await super().route(method, path, body, writer)
            self.posts += 1
            detail = json.dumps({"detail": "Unexpected fields in the request: {'ignore_eos'}"}).encode()
            writer.write(b"HTTP/1.1 422 Unprocessable Entity\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(detail), detail))
            return await writer.drain()
        if method == "POST" and path.startswith("/v1/"):
            self.posts += 1
            if self.posts % self.every == 0:
                return await self.fail(writer)
        return await super().route(method, path, body, writer)

    async def fail(self, writer):
        if self.mode == "500":
            body = b'{"error": {"message": "internal error", "type": "server_error"}}'
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
        elif self.mode in ("drop", "error", "stall"):
            writer.write(STREAM_HEAD)
            for _ in range(2):
                writer.write(_token_event(False, "null", " tok", None))
            await writer.drain()
            if self.mode == "stall":
                await asyncio.sleep(3600)
            if self.mode == "drop":
                writer.transport.abort()  # no terminating chunk: the stream is cut
                raise ConnectionResetError("dropped on purpose")
            writer.write(_chunk(json.dumps({"error": {"message": "KV cache exhausted", "code": 500}}).encode()))
            writer.write(_chunk(b"[DONE]") + b"0\r\n\r\n")
            await writer.drain()
        elif self.mode == "sse-error":
            writer.write(STREAM_HEAD + b"%x\r\n%s\r\n" % (len(SSE_ERROR), SSE_ERROR) + b"0\r\n\r\n")
            await writer.drain()
        elif self.mode == "hang":
            await asyncio.sleep(3600)


TEXT_EVENT = b'data: {"choices": [{"index": 0, "text": " t", "finish_reason": null}]}\n\n'
HTML = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>Please sign in.</body></html>\n"
WRITE_BYTES = 1 << 16  # one write (and one HTTP chunk) of a long answer
LINE_WRITE_BYTES = 1 << 12  # one write of a long line: a client that re-scans its pending line per read pays


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class HostileServer(FaultServer):
    """A server answering every ``every``-th POST with one hostile answer; ``arg`` sizes it:
    - "deep": two tokens, then one event whose JSON is nested ``arg`` (default 100,000) arrays deep, then [DONE];
    - "usage": two tokens, then a usage chunk holding ``arg`` (a dict: prompt_tokens, completion_tokens), [DONE];
    - "long-line": ``data: `` and then ``arg`` bytes without a line end, in writes of LINE_WRITE_BYTES (a line
      trickled as a slow server or proxy sends it), then the event's end and [DONE] (it stops when the client
      closes the connection);
    - "many": ``arg`` text events (one token each, 64 KiB a write), usage (``arg`` completion tokens), [DONE];
    - "redirect": HTTP 307 to http://127.0.0.1:9/v1/completions (the location an auth proxy would send);
    - "html": a 200 answer of type text/html (a sign-in page, as a proxy in front of a server answers);
    - "huge-models": GET /v1/models answered with ``arg`` = (bytes, framing) sent, then nothing (the connection
      stays open): framing "length" says a content-length of 4 GB, "chunked" says no length; POSTs stream
      normally."""

    def __init__(self, mode: str, arg: Any = None, every: int = 1, cfg: NullConfig | None = None) -> None:
        super().__init__(mode, every, cfg)
        self.arg = arg
        self.closed_early = 0  # answers the client stopped reading (the connection closed under the writes)

    async def route(self, method, path, body, writer):
        if self.mode == "huge-models" and method == "GET" and path.rstrip("/") == "/v1/models":
            size, framing = self.arg
            body = b'{"data": [' + b" " * (size - 10)
            if framing == "chunked":
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
                for i in range(0, size, WRITE_BYTES):
                    writer.write(http_chunk(body[i:i + WRITE_BYTES]))
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                             % (4 << 30) + body)
            await writer.drain()
            return await asyncio.sleep(3600)
        if self.mode == "huge-models":
            return await NullServer.route(self, method, path, body, writer)
        return await super().route(method, path, body, writer)

    async def fail(self, writer):
        try:
            await getattr(self, "_" + self.mode.replace("-", "_"))(writer)
        except ConnectionError:
            self.closed_early += 1
            raise

    async def _head_and_tokens(self, writer):
        writer.write(STREAM_HEAD)
        for _ in range(2):
            writer.write(_token_event(False, "null", " tok", None))

    async def _end(self, writer, usage: dict | None = None):
        if usage is not None:
            writer.write(_chunk(json.dumps({"choices": [], "usage": usage}).encode()))
        writer.write(_chunk(b"[DONE]") + b"0\r\n\r\n")
        await writer.drain()

    async def _deep(self, writer):
        n = self.arg or 100_000
        await self._head_and_tokens(writer)
        writer.write(_chunk(b'{"choices": [{"index": 0, "text": ' + b"[" * n + b"]" * n + b"}]}"))
        await self._end(writer)

    async def _usage(self, writer):
        await self._head_and_tokens(writer)
        await self._end(writer, self.arg)

    async def _long_line(self, writer):
        writer.write(STREAM_HEAD + http_chunk(b"data: "))
        left, piece = self.arg, b"x" * LINE_WRITE_BYTES
        while left > 0:
            writer.write(http_chunk(piece[:left]))
            left -= LINE_WRITE_BYTES
            await writer.drain()
        writer.write(http_chunk(b"\n\n"))
        await self._end(writer)

    async def _many(self, writer):
        writer.write(STREAM_HEAD)
        per = WRITE_BYTES // len(TEXT_EVENT)
        left = self.arg
        while left > 0:
            writer.write(http_chunk(TEXT_EVENT * min(per, left)))
            left -= per
            await writer.drain()
        await self._end(writer, {"prompt_tokens": 3, "completion_tokens": self.arg})

    async def _redirect(self, writer):
        writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:9/v1/completions\r\n"
                     b"content-length: 0\r\n\r\n")
        await writer.drain()

    async def _html(self, writer):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: %d\r\n\r\n%s"
                     % (len(HTML), HTML))
        await writer.drain()
