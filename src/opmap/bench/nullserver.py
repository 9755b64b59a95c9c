"""A null OpenAI-compatible streaming endpoint: it answers /v1/completions and /v1/chat/completions with
``max_tokens`` one-word tokens at once (or at the pace asked), no model behind it. Point ``opmap bench`` at it
to measure the client's own ceiling (requests/s and tokens/s it can drive on this machine): a server slower
than that ceiling is what a real run measures; one near it measures the client.

    python -m opmap.bench.nullserver --port 8000 [--first-token-ms 0] [--token-ms 0] [--serialize]

HTTP/1.1 with keep-alive on raw asyncio streams (no framework: its cost would be the server's, not the
client's). ``--serialize``: one request streams at a time, the others wait (a saturated single-slot server).
Usage counts: prompt tokens = whitespace-separated words of the prompt (or of the messages' contents),
completion tokens = the tokens sent.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import threading
from dataclasses import dataclass

DEFAULT_TOKENS = 16  # a request without max_tokens


@dataclass(frozen=True)
class NullConfig:
    """``first_token_s``: the wait before the first token (s); ``token_s``: between tokens (s);
    ``tokens_per_event``: tokens merged into one event (a server that batches its stream); ``serialize``: one
    stream at a time; ``model``: the id /v1/models lists."""

    first_token_s: float = 0.0
    token_s: float = 0.0
    tokens_per_event: int = 1
    serialize: bool = False
    model: str = "null"


def _response(status: str, body: bytes, ctype: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\nserver: opmap-null\r\n"
            "\r\n").encode() + body


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
               b"server: opmap-null\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    """One SSE event as one HTTP chunk."""
    ev = b"data: " + data + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(ev), ev)


@functools.lru_cache(maxsize=256)
def _token_event(chat: bool, model: str, text: str, finish: str | None) -> bytes:
    """One token's event, built once per kind (the server's own cost stays out of the client's ceiling)."""
    if chat:
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish}
        obj = "text_completion"
    return _chunk(json.dumps({"id": "null", "object": obj, "created": 0, "model": model,
                              "choices": [choice]}, allow_nan=False).encode())


def _prompt_words(req: dict) -> int:
    if "messages" in req:
        return sum(len(str(m.get("content", "")).split()) for m in req["messages"] if isinstance(m, dict))
    return len(str(req.get("prompt", "")).split())


class NullServer:
    """The server's request handling; ``serve(host, port)`` runs it on the current loop."""

    def __init__(self, cfg: NullConfig) -> None:
        self.cfg = cfg
        self.lock: asyncio.Lock | None = None
        self.requests = 0
        self.last_head = ""  # the last request's head (request line and headers), for tests

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                self.last_head = head.decode("latin-1")
                line, _, rest = self.last_head.partition("\r\n")
                method, path = (line.split(" ") + ["", ""])[:2]
                length = 0
                for h in rest.split("\r\n"):
                    k, _, v = h.partition(":")
                    if k.strip().lower() == "content-length":
                        length = int(v.strip())
                body = await reader.readexactly(length) if length else b""
                await self.route(method, path, body, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def route(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter) -> None:
        if method == "GET" and path.rstrip("/") == "/v1/models":
            writer.write(_response("200 OK", json.dumps(
                {"object": "list", "data": [{"id": self.cfg.model, "object": "model"}]}, allow_nan=False).encode()))
            await writer.drain()
            return
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            writer.write(_response("404 Not Found", b'{"error": {"message": "not found"}}'))
            await writer.drain()
            return
        req = json.loads(body)
        self.requests += 1
        if self.cfg.serialize:
            if self.lock is None:
                self.lock = asyncio.Lock()
            async with self.lock:
                await self.stream(req, path.endswith("chat/completions"), writer)
        else:
            await self.stream(req, path.endswith("chat/completions"), writer)

    async def stream(self, req: dict, chat: bool, writer: asyncio.StreamWriter) -> None:
        cfg = self.cfg
        n = int(req.get("max_tokens") or DEFAULT_TOKENS)
        per = max(1, cfg.tokens_per_event)
        writer.write(STREAM_HEAD)
        if cfg.first_token_s > 0:
            await writer.drain()
            await asyncio.sleep(cfg.first_token_s)
        sent = 0
        while sent < n:
            k = min(per, n - sent)
            sent += k
            writer.write(_token_event(chat, cfg.model, " tok" * k, "length" if sent == n else None))
            if cfg.token_s > 0 and sent < n:
                await writer.drain()
                await asyncio.sleep(cfg.token_s)
        usage = {"prompt_tokens": _prompt_words(req), "completion_tokens": n,
                 "total_tokens": _prompt_words(req) + n}
        writer.write(_chunk(json.dumps({"id": "null", "object": "text_completion", "created": 0,
                                        "model": cfg.model, "choices": [], "usage": usage},
                                       allow_nan=False).encode()))
        writer.write(_chunk(b"[DONE]") + b"0\r\n\r\n")
        await writer.drain()

    async def serve(self, host: str, port: int, ready=None) -> None:
        server = await asyncio.start_server(self.handle, host, port, backlog=4096)
        if ready is not None:
            ready(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()


class ThreadServer:
    """A NullServer (or a subclass) on its own event loop in a daemon thread, for tests:
    ``with ThreadServer(NullServer(cfg)) as port: ...``; stopped on exit."""

    def __init__(self, server: NullServer, host: str = "127.0.0.1") -> None:
        self.server, self.host = server, host
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> int:
        started = threading.Event()

        def ready(port: int) -> None:
            self.port = port
            started.set()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)  # this thread's own
            self._task = self._loop.create_task(self.server.serve(self.host, 0, ready))
            try:
                self._loop.run_until_complete(self._task)
            except (asyncio.CancelledError, Exception):
                pass
            finally:  # the connections' handlers too, so none is left pending on a closed loop
                pending = asyncio.all_tasks(self._loop)
                for t in pending:
                    t.cancel()
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                self._loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the null server did not start within 10 s")
        return self.port

    def __exit__(self, *exc) -> None:
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        if self._thread is not None:
            self._thread.join(10)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0: a free port, printed")
    ap.add_argument("--first-token-ms", type=float, default=0.0)
    ap.add_argument("--token-ms", type=float, default=0.0)
    ap.add_argument("--tokens-per-event", type=int, default=1)
    ap.add_argument("--serialize", action="store_true")
    ap.add_argument("--model", default="null")
    a = ap.parse_args(argv)
    cfg = NullConfig(a.first_token_ms / 1e3, a.token_ms / 1e3, a.tokens_per_event, a.serialize, a.model)

    def ready(port: int) -> None:
        print(f"listening on {a.host}:{port}", flush=True)

    try:
        asyncio.run(NullServer(cfg).serve(a.host, a.port, ready))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
