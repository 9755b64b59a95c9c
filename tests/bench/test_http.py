"""The lean HTTP/1.1 transport (opmap.bench.http) against canned responses written by a raw socket server: each
framing (chunked, Content-Length, until close), a response cut at every byte, keep-alive reuse, a stale
keep-alive connection retried, and the origin parsed from a URL."""

from __future__ import annotations

import asyncio
import time

import pytest

from opmap.bench.http import HTTPClosed, HTTPProtocolError, Origin, Pool
from opmap.errors import OpmapError

CHUNKED = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nserver: canned\r\n\r\n"
           b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\ntrailer: x\r\n\r\n")


def exchange(responses: list[bytes], n: int = 1, pieces: int = 1, close_after: bool = False,
             stale_second: bool = False):
    """Run ``n`` requests through a Pool against a server that answers the k-th request with responses[k],
    written in ``pieces`` writes (each flushed); ``close_after``: it closes each connection after answering;
    ``stale_second``: it closes a connection on its second request, unanswered (an idle keep-alive connection
    the server dropped just as the client reused it). Returns (bodies, statuses, headers, connections opened,
    requests the server read)."""
    async def main():
        seen = []

        async def handle(reader, writer):
            try:
                mine = 0
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    seen.append(head)
                    mine += 1
                    if stale_second and mine == 2:
                        break
                    resp = responses[len(seen) - 1]
                    step = max(1, -(-len(resp) // pieces))
                    for i in range(0, len(resp), step):
                        writer.write(resp[i:i + step])
                        await writer.drain()
                        await asyncio.sleep(0)
                    if close_after:
                        break
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool(Origin.parse(f"http://127.0.0.1:{port}"), time.perf_counter)
        bodies, statuses, headers = [], [], []
        try:
            for _ in range(n):
                got: list[bytes] = []
                st, h = await pool.request("POST", "/v1/x", b"{}", {}, lambda b, t: got.append(b))
                bodies.append(b"".join(got))
                statuses.append(st)
                headers.append(h)
                await asyncio.sleep(0.01)  # a closed connection is seen closed before the next request
        finally:
            pool.close()
            server.close()
        return bodies, statuses, headers, pool.opened, len(seen)

    return asyncio.run(main())


def test_chunked_with_extensions_and_trailers():
    bodies, st, h, opened, _ = exchange([CHUNKED] * 3, n=3)
    assert bodies == [b"hello, world"] * 3 and st == [200] * 3 and h[0]["server"] == "canned"
    assert opened == 1  # keep-alive: one connection for the three requests


@pytest.mark.parametrize("pieces", [2, 7, len(CHUNKED)])
def test_a_response_cut_anywhere_reads_the_same(pieces):
    bodies, *_ = exchange([CHUNKED], pieces=pieces)
    assert bodies == [b"hello, world"]


def test_content_length_and_connection_close_framing():
    fixed = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\noops"
    bodies, st, _, opened, _ = exchange([fixed, fixed], n=2)
    assert bodies == [b"oops"] * 2 and st == [500, 500] and opened == 1
    until_close = b"HTTP/1.0 200 OK\r\n\r\nall of it"
    bodies, st, _, opened, _ = exchange([until_close, until_close], n=2, close_after=True)
    assert bodies == [b"all of it"] * 2 and opened == 2  # HTTP/1.0: a connection per request


def test_a_stale_keep_alive_connection_is_retried_on_a_new_one():
    """The second request goes out on the kept connection, which the server closes unanswered: it goes out
    again, once, on a new connection (3 requests read by the server, 2 answered)."""
    bodies, st, _, opened, served = exchange([CHUNKED, b"", CHUNKED], n=2, stale_second=True)
    assert bodies == [b"hello, world"] * 2 and opened == 2 and served == 3


def test_a_connection_closed_by_the_server_is_not_reused():
    bodies, st, _, opened, served = exchange([CHUNKED, CHUNKED], n=2, close_after=True)
    assert bodies == [b"hello, world"] * 2 and opened == 2 and served == 2


def test_a_cut_response_and_a_non_http_answer_raise():
    cut = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel"
    with pytest.raises(HTTPClosed):
        exchange([cut], close_after=True)
    with pytest.raises(HTTPProtocolError, match="not an HTTP/1.x status line"):
        exchange([b"SSH-2.0-OpenSSH\r\n\r\n"])
    with pytest.raises(HTTPProtocolError, match="not hexadecimal"):
        exchange([b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"])


def test_origin_from_a_url():
    o = Origin.parse("https://example.com/api")
    assert (o.scheme, o.host, o.port, o.base_path, o.host_header) == ("https", "example.com", 443, "/api",
                                                                       "example.com")
    assert Origin.parse("http://[::1]:8000").host_header == "[::1]:8000"
    with pytest.raises(OpmapError, match="port"):
        Origin.parse("http://h:99999")
