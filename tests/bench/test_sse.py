"""SSE parsing (the WHATWG event-stream rules) and the OpenAI chunks it carries: each expected value is what the
format's rules say for the bytes written beside it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from opmap.bench.sse import MAX_EVENT_BYTES, Event, SSEParser, StreamLimit, read_chunk


def events(*reads: bytes) -> list[str]:
    p = SSEParser()
    out = []
    for r in reads:
        out += [e.data for e in p.feed(r)]
    return out


def test_multi_line_data_is_joined_with_lf_and_comments_are_skipped():
    assert events(b": ping\ndata: a\ndata: b\n\n") == ["a\nb"]
    assert events(b"data:x\n\n") == ["x"]  # no space after the colon: nothing dropped
    assert events(b"data:  two\n\n") == [" two"]  # only the first space is dropped
    assert events(b"data\n\n") == [""]  # a field name alone: an empty data line


def test_line_endings_crlf_cr_and_a_cr_lf_split_across_reads():
    assert events(b"data: a\r\n\r\ndata: b\r\rdata: c\n\n") == ["a", "b", "c"]
    # CR at the end of one read, its LF at the start of the next: one line end, not two (no empty event)
    assert events(b"data: a\r", b"\ndata: b\r\n\r\n") == ["a\nb"]


def test_events_split_at_every_byte_give_the_same_events():
    stream = b'data: {"x": 1}\n\n: c\ndata: y\ndata: z\n\ndata: [DONE]\n\n'
    assert events(*[stream[i:i + 1] for i in range(len(stream))]) == ['{"x": 1}', "y\nz", "[DONE]"]


def test_a_multibyte_character_split_across_reads_is_whole():
    raw = "data: é€\n\n".encode()
    cut = raw.index("€".encode()) + 1  # inside the 3-byte euro sign
    assert events(raw[:cut], raw[cut:]) == ["é€"]


def test_an_event_without_data_is_not_dispatched_and_a_partial_event_is_discarded():
    p = SSEParser()
    assert p.feed(b"event: ping\n\n") == []
    assert p.feed(b"data: partial\n") == []
    assert p.close() is True  # the last event never got its empty line
    assert p.close() is False


def test_event_type_is_kept():
    p = SSEParser()
    (e,) = p.feed(b"event: error\ndata: boom\n\n")
    assert (e.event, e.data) == ("error", "boom")


def test_done_usage_only_chunk_and_text_chunks():
    assert read_chunk("[DONE]").done
    c = read_chunk('{"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}')
    assert (c.text, c.usage["completion_tokens"], c.done, c.error) == ("", 3, False, None)
    c = read_chunk('{"choices": [{"index": 0, "text": " a b", "finish_reason": "length"}]}')
    assert (c.text, c.finish_reason) == (" a b", "length")
    chat = read_chunk('{"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": null}]}')
    assert chat.text == "hi"
    role = read_chunk('{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}')
    assert role.text == ""  # a role-only chunk carries no token: not a first token
    reasoning = read_chunk('{"choices": [{"delta": {"reasoning_content": "think"}}]}')
    assert reasoning.text == "think"


def test_errors_mid_stream():
    assert read_chunk('{"error": {"message": "KV cache full", "code": 500}}').error == "KV cache full"
    assert read_chunk('{"object": "error", "message": "bad", "code": 400}').error == "bad"
    assert "not JSON" in read_chunk("{truncated").error
    assert "not a JSON object" in read_chunk("[1, 2]").error
    assert "not JSON" in read_chunk('{"a": 1} trailing').error  # one JSON value, nothing after it
    ok = read_chunk(' {"error": null, "choices": [{"text": "z"}]} ')  # "error": null is no error
    assert (ok.text, ok.error) == ("z", None)


# --- the reader under hostile input: a property test over generated streams, and time and memory bounds ----------

ENDINGS = (b"\n", b"\r\n", b"\r")
ALPHABET = "ab {}[]\":,é€😀\n"  # one- to four-byte UTF-8, JSON punctuation, LF (a data value's LF: several data lines)


def _text(rng, n: int) -> str:
    return "".join(ALPHABET[i] for i in rng.integers(0, len(ALPHABET), n))


def _stream(rng, sizes) -> tuple[bytes, list[tuple[str, str]], list[int]]:
    """A stream of events whose data have these sizes (characters), with every kind of line the format has:
    comments, event types, data split over several data lines, 'data:' with and without its space, each line
    ended by LF, CRLF or CR at random. Returns (bytes, the events as (type, data), each event's data bytes and
    longest line, for the limit)."""
    out, want, sizes_bytes = [], [], []

    def line(b: bytes) -> None:
        end = ENDINGS[rng.integers(0, 3)]
        if not b and end == b"\n" and out and out[-1].endswith(b"\r"):
            end = b"\r\n"  # CR then an empty line ended by LF is one CRLF, not two line ends: not this stream
        out.append(b + end)

    for n in sizes:
        data = _text(rng, n)
        kind = "message"
        if rng.random() < 0.3:
            line(b": ping")
        if rng.random() < 0.3:
            kind = "error" if rng.random() < 0.5 else "update"
            line(b"event: " + kind.encode())
        longest = 0
        for part in data.split("\n"):
            v = part.encode()
            head = b"data:" if v[:1] != b" " and rng.random() < 0.5 else b"data: "
            line(head + v)
            longest = max(longest, len(head) + len(v))
        line(b"")
        want.append((kind, data))
        sizes_bytes.append((len(data.encode()), longest))
    return b"".join(out), want, sizes_bytes


def _parse(p: SSEParser, reads) -> list[tuple[str, str]]:
    return [(e.event, e.data) for r in reads for e in p.feed(r)]


def test_generated_streams_come_out_exactly_as_sent_at_every_split():
    """Events of 0 to 300 characters, 0 to 40 of them, every line ending, comments and event types: the same
    events come out whether the stream arrives whole, a byte at a time, or cut in two at every byte."""
    rng = np.random.default_rng(34)
    for count in (0, 1, 2, 5, 40):
        sizes = rng.integers(0, 300, count) if count > 2 else [0, 1][:count]
        raw, want, _ = _stream(rng, sizes)
        assert _parse(SSEParser(), [raw]) == want
        assert _parse(SSEParser(), [raw[i:i + 1] for i in range(len(raw))]) == want
        cuts = range(len(raw) + 1) if len(raw) < 3000 else rng.integers(0, len(raw) + 1, 300)
        for i in cuts:
            assert _parse(SSEParser(), [raw[:i], raw[i:]]) == want, (count, i)


def test_a_line_or_event_over_the_limit_is_refused_and_the_events_before_it_come_out():
    """With a 1,000-byte limit: data of exactly the limit passes, one byte more is StreamLimit, and every event
    before the one over it came out, whatever the reads."""
    limit = 1000
    rng = np.random.default_rng(7)
    for trial in range(60):
        sizes = list(rng.integers(0, 400, rng.integers(0, 6))) + [int(rng.integers(limit - 8, limit + 400))]
        raw, want, measure = _stream(rng, sizes)
        over = next((i for i, (data, longest) in enumerate(measure) if data > limit or longest > limit), None)
        step = int(rng.integers(1, 700))
        p, got = SSEParser(max_bytes=limit), []
        try:
            for i in range(0, len(raw), step):
                got += [(e.event, e.data) for e in p.feed(raw[i:i + step])]
        except StreamLimit as e:
            got += [(x.event, x.data) for x in e.events]
            assert over is not None and got == want[:over], trial
            assert str(limit) in str(e)
        else:
            assert over is None and got == want, trial
    exact = SSEParser(max_bytes=limit)
    assert exact.feed(b"data:" + b"x" * (limit - 5) + b"\n\n") == [Event("x" * (limit - 5))]  # a line of the limit
    assert exact.feed(b"data:" + b"x" * (limit - 5) + b"\ndata:" + b"y" * (limit - (limit - 5) - 1 - 5) + b"\n\n")
    with pytest.raises(StreamLimit, match="longer than 1000 bytes"):
        SSEParser(max_bytes=limit).feed(b"data:" + b"x" * (limit - 4))  # no line end yet: over all the same
    with pytest.raises(StreamLimit, match="data is longer than 1000 bytes"):  # two lines, joined: 1,001
        SSEParser(max_bytes=limit).feed(b"data:" + b"x" * 500 + b"\ndata:" + b"y" * 500 + b"\n\n")


def test_nesting_at_any_depth_is_a_chunk_or_an_error_never_an_exception():
    """JSON nested 1 to 100,000 deep, in the text, the usage and an error: read_chunk answers a Chunk each time:
    up to 900 deep the chunk as read (text "": the text is not a string; an error chunk's message: its raw text),
    from 5,000 deep an error naming the nesting (Python's JSON reader stops at its recursion limit, 1,000)."""
    for depth in (1, 10, 100, 900, 5000, 100_000):
        for value in ("[" * depth + "]" * depth, '{"a": ' * depth + "1" + "}" * depth):
            text = read_chunk(f'{{"choices": [{{"text": {value}}}]}}')
            usage, error = read_chunk(f'{{"choices": [], "usage": {value}}}'), read_chunk(f'{{"error": {value}}}')
            if depth <= 900:
                assert (text.text, text.error, usage.error) == ("", None, None)
                assert error.error == f'{{"error": {value}}}'[:200]
            else:
                assert all("nested deeper" in c.error for c in (text, usage, error)), depth


def _timed_feed(p: SSEParser, raw: bytes, read: int, deadline: float, tries: int = 1) -> tuple[float, list]:
    """Feed ``raw`` in reads of ``read`` bytes to ``p`` (then, on a retry, to a fresh parser of its limit);
    (seconds, events); fails once every one of ``tries`` attempts ran past ``deadline`` (s): a loaded host's stall
    can slow one attempt, a quadratic parser slows them all."""
    for attempt in range(tries):
        q = p if attempt == 0 else SSEParser(max_bytes=p.max_bytes)
        t0, events, late = time.perf_counter(), [], False
        for i in range(0, len(raw), read):
            events += q.feed(raw[i:i + read])
            if (i // read) % 256 == 0 and time.perf_counter() - t0 > deadline:
                late = True
                break
        if not late:
            return time.perf_counter() - t0, events
    pytest.fail(f"parsing {len(raw) / 1e6:g} MB took over {deadline:.3g} s, {tries} times")


def test_parsing_is_linear_in_the_bytes_fed():
    """One 50 MB line arriving in 4 KiB reads (a slow server's trickle), against the same shape at 5 MB in the same
    run: linear work takes about 10x as long (allowed: 40x, a loaded 2-core host); the reader that re-joined its
    pending line on every read took 100x (5 MB 2.1 s, 10 MB 6.2 s). Also 10 MB of 50-byte events (200,000)
    against 1 MB of them."""
    big, small = 50_000_000, 5_000_000

    def line(n: int) -> bytes:
        return b"data: " + b"x" * n + b"\n\n"

    p = SSEParser(max_bytes=64 << 20)
    base = min(_timed_feed(SSEParser(max_bytes=64 << 20), line(small), 4096, 30)[0] for _ in range(3))
    t, events = _timed_feed(p, line(big), 4096, max(40 * base, 0.5), tries=3)
    assert len(events) == 1 and len(events[0].data) == big
    assert t < max(40 * base, 0.5)
    ev = b'data: {"choices": [{"index": 0, "text": " t"}]}\n\n'
    many = ev * (big // 5 // len(ev))
    base = min(_timed_feed(SSEParser(), many[:len(many) // 10], 4096, 30)[0] for _ in range(3))
    t, events = _timed_feed(SSEParser(), many, 4096, max(40 * base, 1.0), tries=3)
    assert len(events) == len(many) // len(ev) and events[-1].data == ev[6:-2].decode()


def test_memory_stays_bounded_by_the_limit_whatever_the_stream_sends():
    """tracemalloc's peak while a 50 MB line arrives in 64 KiB reads: under the limit it costs its own bytes
    three times (the pieces and their join, then the value and its decoded text: 150 MB; the reader that
    re-joined per read, 200 MB); over an 8 MiB limit it costs the limit, not the line (8.5 MB; that reader held
    all 50 MB, 200 MB)."""
    import tracemalloc

    raw = b"data: " + b"x" * 50_000_000 + b"\n\n"
    for limit, bound in ((64 << 20, 3.5 * len(raw)), (MAX_EVENT_BYTES, 2 * MAX_EVENT_BYTES)):
        p = SSEParser(max_bytes=limit)
        tracemalloc.start()
        try:
            for i in range(0, len(raw), 1 << 16):
                p.feed(raw[i:i + (1 << 16)])
        except StreamLimit:
            assert limit == MAX_EVENT_BYTES
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < bound, (limit, peak)


def test_an_event_is_timed_by_the_read_that_completed_its_data_not_by_its_dispatch():
    """A proxy may send each line as its own packet: the empty line that dispatches an event can come long after
    its data. The event carries the ``at`` of the read that completed its last data line (the general ``data:``
    field path too), not of the empty line's read; a line completed by a later read is timed by that read."""
    p = SSEParser()
    assert p.feed(b"data: one\n", 1.0) == []
    assert [(e.data, e.at) for e in p.feed(b"\n", 2.0)] == [("one", 1.0)]
    assert p.feed(b"data:two\ndata: thr", 3.0) == []
    assert p.feed(b"ee\n", 4.0) == []  # the second data line ends here
    assert [(e.data, e.at) for e in p.feed(b"\r\n: ping\n\ndata: four\n\n", 5.0)] == [("two\nthree", 4.0),
                                                                                    ("four", 5.0)]
    assert SSEParser().feed(b"data: x\n\n")[0].at is None  # no time given


def test_a_chunk_carries_the_servers_completion_id():
    from opmap.bench.sse import read_chunk

    assert read_chunk('{"id": "cmpl-7f3", "choices": [{"text": "a"}]}').id == "cmpl-7f3"
    assert read_chunk('{"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3}}').id == "chatcmpl-1"
    assert read_chunk('{"id": 12, "choices": [{"text": "a"}]}').id == ""  # not a string: not kept
    assert read_chunk('{"choices": [{"text": "a"}]}').id == ""
