"""SSE parsing (the WHATWG event-stream rules) and the OpenAI chunks it carries: each expected value is what the
format's rules say for the bytes written beside it."""

from __future__ import annotations

from opmap.bench.sse import SSEParser, read_chunk


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
