"""A line-per-chunk HTTP/1.1 reverse proxy and an independent streaming client, for the bench's TTFT tests.

``LineProxy``: a small real asyncio TCP proxy in front of one upstream server. Each client connection gets its
own upstream connection (keep-alive on both); a request is forwarded as read; a chunked response (an SSE stream)
is de-chunked and every line of its body (through its LF) is written to the client as its own HTTP chunk, one
``write`` and ``drain`` each, as ingress proxies that flush per line do. The proxy timestamps each request: when
its head arrived and when the first body line carrying generated text left for the client (``times``), so its
own TTFT of every stream is known.

``BlockingClient``: a second, minimal client (http.client on one keep-alive connection with TCP_NODELAY, as
http.client sets it; the body read line by line): the independent measure of the same requests' TTFT.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time
from urllib.parse import urlparse

from opmap.bench.nullserver import ThreadServer


class LineProxy:
    """``with LineProxy(upstream_port) as port:`` a proxy on 127.0.0.1:port in a daemon thread. ``times``: per
    request (head arrived, first text line written) in time.perf_counter seconds; ``nodelay``: TCP_NODELAY on
    the client-facing socket (asyncio's default: on; False: Nagle left on, as a proxy without tcp_nodelay);
    ``hold_head``: a chunked response's head goes out with its body's first line (as proxies that write the
    head on the first body flush), not on its own.

    With Nagle on and the head held, the first line of each event leaves at once (nothing unacknowledged is in
    flight) and the empty line after it waits until the client acknowledges that line: on Linux, its delayed
    ACK, 40 ms and more. The event's data arrived on time; the line that dispatches it did not."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1", nodelay: bool = True,
                 hold_head: bool = False) -> None:
        self.upstream, self.host, self.nodelay, self.hold_head = upstream_port, host, nodelay, hold_head
        self.times: list[tuple[float, float | None]] = []
        self.port: int | None = None
        self._runner: ThreadServer | None = None

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        if not self.nodelay:
            cwriter.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
        ureader, uwriter = await asyncio.open_connection(self.host, self.upstream)
        try:
            while True:
                try:
                    head = await creader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                arrived = time.perf_counter()
                length = _content_length(head)
                body = await creader.readexactly(length) if length else b""
                uwriter.write(head + body)
                await uwriter.drain()
                first = await self._response(ureader, cwriter)
                self.times.append((arrived, first))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            return  # the client or the upstream closed, or the proxy stops
        finally:
            uwriter.close()
            cwriter.close()

    async def _response(self, ureader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> float | None:
        """Forward one response; the time its first text line was written (None: no text line)."""
        head = await ureader.readuntil(b"\r\n\r\n")
        chunked = b"transfer-encoding: chunked" in head.lower()
        held = b""
        if chunked and self.hold_head:
            held = head  # sent with the body's first line
        else:
            cwriter.write(head)
            await cwriter.drain()
        if not chunked:
            length = _content_length(head)
            if length:
                cwriter.write(await ureader.readexactly(length))
                await cwriter.drain()
            return None
        first, pending = None, b""
        while True:
            size = int((await ureader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                break
            data = (await ureader.readexactly(size + 2))[:size]
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                out = line + b"\n"
                cwriter.write(held + b"%x\r\n%s\r\n" % (len(out), out))
                held = b""
                await cwriter.drain()
                if first is None and _has_text(line):
                    first = time.perf_counter()
        if pending:
            cwriter.write(b"%x\r\n%s\r\n" % (len(pending), pending))
        while (await ureader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the end of the chunked body
            pass
        cwriter.write(held + b"0\r\n\r\n")
        await cwriter.drain()
        return first

    async def serve(self, host: str, port: int, ready=None) -> None:
        """Accept on host:port until cancelled (run by opmap.bench.nullserver.ThreadServer in its own thread)."""
        server = await asyncio.start_server(self._handle, host, port)
        if ready is not None:
            ready(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    def __enter__(self) -> int:
        self._runner = ThreadServer(self, self.host)
        self.port = self._runner.__enter__()
        return self.port

    def __exit__(self, *exc) -> None:
        self._runner.__exit__(*exc)

    def ttfts(self) -> list[float]:
        """The proxy's own TTFT (s) of each request that carried text: head arrived to first text line sent."""
        return [f - a for a, f in self.times if f is not None]


def _content_length(head: bytes) -> int:
    for h in head.split(b"\r\n")[1:]:
        k, _, v = h.partition(b":")
        if k.strip().lower() == b"content-length":
            return int(v.strip())
    return 0


def _has_text(line: bytes) -> bool:
    """A ``data:`` line of an OpenAI chunk whose first choice carries text."""
    if not line.startswith(b"data:"):
        return False
    try:
        ev = json.loads(line[5:])
    except ValueError:
        return False
    ch = ev.get("choices") if isinstance(ev, dict) else None
    if not ch or not isinstance(ch[0], dict):
        return False
    c = ch[0]
    return bool(c.get("text") or (c.get("delta") or {}).get("content"))


class BlockingClient:
    """Sequential streaming requests on one keep-alive connection (http.client), each timed by
    time.perf_counter from just before its request is written to the first ``data:`` line with text read back
    (the line, not the empty line after it that ends the event)."""

    def __init__(self, base_url: str, model: str) -> None:
        u = urlparse(base_url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        self.model = model

    def send(self, prompt: str, max_tokens: int) -> tuple[float, float, int]:
        """(TTFT s, e2e s, completion tokens from usage) of one /v1/completions request."""
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                           "stream_options": {"include_usage": True}})
        t0 = time.perf_counter()
        self.conn.request("POST", "/v1/completions", body, {"content-type": "application/json"})
        r = self.conn.getresponse()
        first, tokens = None, 0
        for line in r:
            line = line.strip()
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            if first is None and _has_text(line):
                first = time.perf_counter() - t0
            ev = json.loads(line[5:])
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
        return first, time.perf_counter() - t0, tokens

    def close(self) -> None:
        self.conn.close()
