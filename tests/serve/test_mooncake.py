"""Mooncake traces (opmap.serve.mooncake) read by ``--arrival trace:FILE``: rows copied from Mooncake's published
traces round-trip into the requests and their prompts' shared blocks, the prefix hits they give follow the shared
hash ids (512 tokens each), and a malformed row is refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from opmap.errors import OpmapError
from opmap.serve import TableCost, make_requests, simulate
from opmap.serve.arrivals import parse_trace
from opmap.serve.mooncake import MOONCAKE_BLOCK
from opmap.serve.policies import Engine

# github.com/kvcache-ai/Mooncake FAST25-release/traces/conversation_trace.jsonl (commit a2a4b18), its first 4 rows:
# all at t = 0, sharing their first 512-token block (hash id 0)
CONVERSATION = [
    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": list(range(0, 14))},
    {"timestamp": 0, "input_length": 7322, "output_length": 490, "hash_ids": [0, *range(14, 28)]},
    {"timestamp": 0, "input_length": 7236, "output_length": 794, "hash_ids": [0, *range(28, 42)]},
    {"timestamp": 0, "input_length": 2290, "output_length": 316, "hash_ids": [0, *range(42, 46)]},
]
# Mooncake FAST25-release/README.md (commit 40ea55f): two samples sharing their first 12 blocks (ids 46 .. 57)
README = [
    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [*range(46, 58), 2353, 2354]},
    {"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [*range(46, 58), 2366]},
]


def _write(tmp_path, rows, name="trace.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def _cost():
    """prefill 1 ms per prompt token, decode 0.1 ms a step; an unlimited KV cache."""
    return TableCost([1000], [1.0], [1], [0, 1000], [[1e-4, 1e-4]])


def test_mooncake_rows_round_trip(tmp_path):
    """Arrival = timestamp / 1000 s, lengths as given; each prompt a 512-token segment per hash id, the last one the
    prompt's remainder: 6758 = 13 x 512 + 102."""
    p = _write(tmp_path, list(reversed(README)) + CONVERSATION)  # unsorted: sorted by arrival on load
    reqs = make_requests(f"trace:{p}", "trace", "trace")
    assert reqs.arrival_s.tolist() == [0, 0, 0, 0, 27.482, 30.535]
    rows = CONVERSATION + README
    assert reqs.input_len.tolist() == [r["input_length"] for r in rows]
    assert reqs.output_len.tolist() == [r["output_length"] for r in rows]
    assert reqs.prompt.source == "mooncake"
    for r, segs in zip(rows, reqs.prompt.segments, strict=True):
        assert [h for h, _ in segs] == r["hash_ids"]
        assert sum(n for _, n in segs) == r["input_length"]
        assert all(n == MOONCAKE_BLOCK for _, n in segs[:-1])
    assert reqs.prompt.segments[0][-1] == (13, 6758 - 13 * 512)


def test_the_readme_samples_share_twelve_blocks():
    """The second sample finds the first's 12 shared blocks cached: 12 x 512 = 6144 tokens (384 KV blocks of 16,
    under its (6472 - 1) // 16 = 404); the first finds none."""
    data = "\n".join(json.dumps(r) for r in README)
    cols = parse_trace(data)
    assert cols["arrival_s"].tolist() == [27.482, 30.535]
    from opmap.serve.arrivals import Requests
    from opmap.serve.mooncake import mooncake_prompts

    reqs = Requests(cols["arrival_s"], cols["input_len"], cols["output_len"], "mooncake",
                    mooncake_prompts(cols["hash_ids"], cols["input_len"]))
    res = simulate(reqs, Engine(), _cost())
    assert res.prefix_hit_tokens.tolist() == [0, 12 * 512]
    assert res.engine.prefix_cache.hit_rate == pytest.approx(6144 / (6955 + 6472))


def test_the_conversation_rows_share_their_first_block(tmp_path):
    """All four at t = 0 share hash id 0: the first computes it, the three others find its 512 tokens cached (the
    first's blocks are cached as its chunk is scheduled, as vLLM V1 caches them in allocate_slots): hit rate
    3 x 512 / (6758 + 7322 + 7236 + 2290)."""
    reqs = make_requests(f"trace:{_write(tmp_path, CONVERSATION)}", "trace", "trace")
    res = simulate(reqs, Engine(), _cost())
    assert res.prefix_hit_tokens.tolist() == [0, 512, 512, 512]
    assert res.engine.prefix_cache.hit_rate == pytest.approx(3 * 512 / (6758 + 7322 + 7236 + 2290))
    assert np.all(res.first_s > 0)


@pytest.mark.parametrize("row,match", [
    ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": "0,1"}', "not a list of block ids"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1.5]}', "not an integer id"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, -3]}', "not an integer id"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, true]}', "not an integer id"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1, 2]}', "more than its 2 blocks"),
    ('{"timestamp": 0, "input_length": 600, "hash_ids": [0]}', "no output_length"),
    ('{"timestamp": -5, "input_length": 600, "output_length": 5, "hash_ids": [0]}', "timestamp"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": []}', "input_length"),
    ('{"arrival_s": 0.5, "input_len": 10}', "not a Mooncake row"),
])
def test_a_malformed_row_is_refused_in_one_line(tmp_path, row, match):
    good = json.dumps(CONVERSATION[3])
    with pytest.raises(OpmapError, match=match) as e:
        make_requests(f"trace:{_write(tmp_path, [good, row])}", "trace", "trace")
    assert "\n" not in str(e.value) and "row 2" in str(e.value)


def test_a_mooncake_trace_gives_its_own_prompt_lengths(tmp_path):
    with pytest.raises(OpmapError, match="--input-len trace"):
        make_requests(f"trace:{_write(tmp_path, CONVERSATION)}", "512", "trace")


def test_a_row_with_fewer_ids_than_blocks_keeps_the_rest_its_own(tmp_path):
    """1200 tokens, one id: its first 512 tokens are that block's, the other 688 its own (never shared)."""
    rows = [{"timestamp": 0, "input_length": 1200, "output_length": 1, "hash_ids": [7]},
            {"timestamp": 5000, "input_length": 1200, "output_length": 1, "hash_ids": [7]}]
    reqs = make_requests(f"trace:{_write(tmp_path, rows)}", "trace", "trace")
    assert reqs.prompt.segments[0] == ((7, 512), (-2, 688))
    assert simulate(reqs, Engine(), _cost()).prefix_hit_tokens.tolist() == [0, 512]
