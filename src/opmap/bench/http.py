"""A lean HTTP/1.1 client on asyncio's own transports, for the load client's hot path: keep-alive connections
in a pool (one per request in flight, reused when idle), the response body handed over as it arrives.

Why not httpx: against a null server on this machine httpx's AsyncClient drove 348 requests/s at 64
connections with 25 streamed tokens each (1.9 ms of client CPU per request: its pool scans every connection per
request, and each SSE event climbs ~10 async layers, httpx -> httpcore -> h11); a load client must stay well
above the servers it measures (benchmarks/bench_loadgen.py). Here a response is parsed in the transport's
``data_received`` callback: one callback per network read, each read timestamped once.

What it speaks: HTTP/1.1 requests with a Content-Length body; responses framed by Transfer-Encoding: chunked,
Content-Length, or the connection's close; ``Connection: close`` honoured; http and https (the default TLS
context, the host name checked). No redirects, proxies, compression (Accept-Encoding: identity is sent) or
HTTP/2: an inference endpoint needs none of them.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from opmap.errors import OpmapError

MAX_HEAD_BYTES = 64 * 1024  # a response head larger than this is not a server's


class HTTPClosed(ConnectionError):
    """The connection closed before the response ended (``got_bytes``: whether any of it had arrived)."""

    def __init__(self, msg: str, got_bytes: bool) -> None:
        super().__init__(msg)
        self.got_bytes = got_bytes


class ConnectTimeout(OSError):
    """No connection within the connect timeout (an OSError, as a refused connection is)."""


class HTTPProtocolError(ConnectionError):
    """The response is not HTTP/1.x as framed above."""


@dataclass(frozen=True)
class Origin:
    """Where requests go: scheme, host, port and the base path (a URL's path before /v1, without its slash)."""

    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> Origin:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise OpmapError(f"endpoint {url!r} is not an http:// or https:// URL with a host")
        try:
            port = u.port or (443 if u.scheme == "https" else 80)
        except ValueError:
            raise OpmapError(f"endpoint {url!r}: the port is not a number from 0 to 65535") from None
        return cls(u.scheme, u.hostname, port, u.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


class _Conn(asyncio.Protocol):
    """One connection; at most one request on it at a time. The response is parsed as bytes arrive:
    ``on_data(bytes, t)`` gets the body (chunk framing removed) with the read's time, ``done`` completes with the
    status, headers and whether the connection may be reused."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.done: asyncio.Future | None = None
        self.on_data: Callable[[bytes, float], None] | None = None

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            if self._mode == "close" and self._state == "body":
                self._finish(reusable=False)
            else:
                self.done.set_exception(HTTPClosed(f"the connection closed mid-response ({exc or 'EOF'})",
                                                   self._got))

    def data_received(self, data: bytes) -> None:
        if self.done is None or self.done.done():
            return  # nothing asked: bytes after a response's end are not ours
        self._got = True
        try:
            self._feed(data)
        except HTTPProtocolError as e:
            self.done.set_exception(e)
            self.abort()

    def eof_received(self):
        return False  # close the transport: connection_lost follows

    # -- one exchange
    def send(self, payload: bytes, on_data: Callable[[bytes, float], None]) -> asyncio.Future:
        self.done = asyncio.get_running_loop().create_future()
        self.on_data = on_data
        self._buf = b""
        self._state, self._mode, self._left, self._got = "head", "", 0, False
        self._status, self._headers, self._keep = 0, {}, True
        self.transport.write(payload)
        return self.done

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _feed(self, data: bytes) -> None:
        now = self.clock()
        buf = self._buf + data if self._buf else data
        self._buf = b""
        if self._state == "head":
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise HTTPProtocolError(f"a response head over {MAX_HEAD_BYTES} bytes")
                self._buf = buf
                return
            self._head(buf[:end].decode("latin-1"))
            buf = buf[end + 4:]
            if self._state == "end":
                self._finish(self._keep)
                return
        if self._mode == "chunked":
            self._chunks(buf, now)
        elif self._mode == "length":
            take = buf[:self._left]
            self._left -= len(take)
            if take:
                self.on_data(take, now)
            if self._left == 0:
                self._finish(self._keep)
        elif buf:  # until close
            self.on_data(buf, now)

    def _head(self, head: str) -> None:
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HTTPProtocolError(f"not an HTTP/1.x status line: {lines[0][:60]!r}")
        self._status = int(parts[1])
        h: dict[str, str] = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            h[k.strip().lower()] = v.strip()
        self._headers = h
        self._keep = parts[0] != "HTTP/1.0" and "close" not in h.get("connection", "").lower()
        self._state = "body"
        if "chunked" in h.get("transfer-encoding", "").lower():
            self._mode = "chunked"
        elif "content-length" in h:
            try:
                self._left = int(h["content-length"])
            except ValueError:
                raise HTTPProtocolError(f"content-length {h['content-length'][:20]!r} is not a number") from None
            self._mode = "length"
            if self._left == 0:
                self._state = "end"
        elif self._status in (204, 304) or 100 <= self._status < 200:
            self._state = "end"
        else:
            self._mode, self._keep = "close", False

    def _chunks(self, buf: bytes, now: float) -> None:
        """Chunked framing removed: every complete chunk's payload in this read, handed over at once."""
        out = []
        pos, n = 0, len(buf)
        while pos < n:
            if self._left > 0:  # inside a chunk's payload
                take = buf[pos:pos + self._left]
                out.append(take)
                self._left -= len(take)
                pos += len(take)
                if self._left == 0:
                    self._left = -2  # its CRLF is next
                continue
            if self._left < 0:  # a payload's CRLF (possibly split over reads)
                skip = min(-self._left, n - pos)
                pos += skip
                self._left += skip
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                self._buf = buf[pos:]
                break
            if self._state == "trailers":
                if eol == pos:  # the empty line ending the trailers
                    if out:
                        self.on_data(b"".join(out), now)
                    self._finish(self._keep)
                    return
                pos = eol + 2
                continue
            size_text = buf[pos:eol]
            if b";" in size_text:  # chunk extensions: ignored
                size_text = size_text.split(b";", 1)[0]
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HTTPProtocolError(f"a chunk size that is not hexadecimal: {size_text[:20]!r}") from None
            pos = eol + 2
            if size == 0:
                self._state = "trailers"
            elif pos + size + 2 <= n and buf[pos + size:pos + size + 2] == b"\r\n":  # the whole chunk is here
                out.append(buf[pos:pos + size])
                pos += size + 2
            else:
                self._left = size
        if out:
            self.on_data(b"".join(out), now)

    def _finish(self, reusable: bool) -> None:
        self._state = "end"
        self._keep = reusable
        if not self.done.done():
            self.done.set_result((self._status, self._headers, reusable))


class Pool:
    """Keep-alive connections to one origin: an idle one is reused, else a new one is opened (so an open loop
    never waits for a connection). ``clock``: the time each read is stamped with."""

    def __init__(self, origin: Origin, clock: Callable[[], float], connect_timeout_s: float = 10.0) -> None:
        self.origin, self.clock, self.connect_timeout_s = origin, clock, connect_timeout_s
        self.idle: list[_Conn] = []
        self.opened = 0
        self._ssl = None
        if origin.scheme == "https":
            import ssl

            self._ssl = ssl.create_default_context()

    async def _open(self) -> _Conn:
        loop = asyncio.get_running_loop()
        o = self.origin
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self.clock), o.host, o.port, ssl=self._ssl,
                                       server_hostname=o.host if self._ssl else None), self.connect_timeout_s)
        except TimeoutError:
            raise ConnectTimeout(f"no connection to {o.host}:{o.port} within {self.connect_timeout_s:g} s") from None
        self.opened += 1
        return conn

    def _head(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        lines = [f"{method} {self.origin.base_path}{path} HTTP/1.1", f"host: {self.origin.host_header}",
                 "accept-encoding: identity", f"content-length: {len(body)}",
                 *(f"{k}: {v}" for k, v in headers.items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    async def request(self, method: str, path: str, body: bytes, headers: dict[str, str],
                      on_data: Callable[[bytes, float], None]) -> tuple[int, dict[str, str]]:
        """Send one request and deliver its body to ``on_data`` as it arrives; (status, headers) at its end.
        A reused connection the server had closed (no byte of the response came back) is retried once on a new
        one. Raises OSError (connect: refused, ConnectTimeout, DNS), HTTPClosed, HTTPProtocolError; a cancelled or
        failed exchange closes its connection."""
        payload = self._head(method, path, body, headers)
        for attempt in (0, 1):
            conn = None
            while self.idle and conn is None:
                c = self.idle.pop()
                conn = None if c.closed else c
            reused = conn is not None
            if conn is None:
                conn = await self._open()
            ok = False
            try:
                status, hdrs, reusable = await conn.send(payload, on_data)
                ok = True
            except HTTPClosed as e:
                if reused and not e.got_bytes and attempt == 0:
                    continue  # a stale keep-alive connection: once more on a new one
                raise
            finally:
                if not ok:
                    conn.abort()
            if reusable and not conn.closed:
                self.idle.append(conn)
            else:
                conn.abort()
            return status, hdrs
        raise AssertionError("unreachable")

    def close(self) -> None:
        for c in self.idle:
            c.abort()
        self.idle.clear()
