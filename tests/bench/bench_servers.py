"""Servers that imitate exactly one failure each, for the client's error handling (a real endpoint cannot be
made to fail on cue): an HTTP 500, a connection dropped mid-stream, an error object mid-stream, a server that
never answers. Each answers /v1/models as a healthy server would; ``every``: only every k-th request fails
(the others stream normally), so a test sees failures counted per request while the run goes on."""

from __future__ import annotations

import asyncio
import json

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
