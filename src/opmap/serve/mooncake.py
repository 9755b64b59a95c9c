"""Mooncake's trace format (``--arrival trace:FILE`` reads it when its rows carry ``hash_ids``).

The format, as Mooncake publishes its traces (github.com/kvcache-ai/Mooncake, FAST25-release/README.md and
FAST25-release/traces/conversation_trace.jsonl, commit a2a4b18; mooncake_trace.jsonl at d21da17): JSON Lines, one
object per request::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ..., 2353, 2354]}

``timestamp``: the arrival, ms since the trace's first request (requests may share one); ``input_length`` and
``output_length``: tokens; ``hash_ids``: one id per 512-token block of the prompt (``ceil(input_length / 512)`` of
them, the last one the prompt's partial tail), equal ids at the same place meaning equal blocks (the prefix two
prompts share). The ids are remapped integers, consecutive from 0, no text. Here each id is a 512-token segment of
the prompt (opmap.serve.prefix); a row with fewer ids than blocks has the rest as its own text.

Parsed, never executed: each row checked (a number in range, an integer list), one line naming the row and field
on anything else; the file's size is bounded where it is read (opmap.safeio.LIMIT_TRACE_BYTES).
"""

from __future__ import annotations

import numpy as np

from opmap.errors import OpmapError
from opmap.serve.prefix import Prompts
from opmap.validate import Rule, shown

MOONCAKE_BLOCK = 512  # tokens per hash id (the Mooncake traces' README; Dynamo's datagen --block-size default)
MOONCAKE_ACCEPTED = ("Mooncake JSONL rows {\"timestamp\": ms, \"input_length\": N, \"output_length\": N, "
                     "\"hash_ids\": [int, ...]} (at most ceil(input_length / 512) ids)")
MAX_HASH_ID = 2**63 - 1


def is_mooncake(row: dict) -> bool:
    """A row in Mooncake's format (its hash_ids or its timestamp, and no arrival_s)."""
    return "arrival_s" not in row and ("hash_ids" in row or "timestamp" in row)


def _ids(v, field: str, n_tokens: int) -> tuple[int, ...]:
    if not isinstance(v, list):
        raise OpmapError(f"{field} is {shown(v)}, not a list of block ids: accepted: {MOONCAKE_ACCEPTED}")
    most = -(-n_tokens // MOONCAKE_BLOCK)
    if len(v) > most:
        raise OpmapError(f"{field} has {len(v)} ids for {n_tokens} tokens, more than its {most} blocks of "
                         f"{MOONCAKE_BLOCK}: accepted: {MOONCAKE_ACCEPTED}")
    for x in v:
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_HASH_ID:
            raise OpmapError(f"{field} holds {shown(x)}, not an integer id from 0 to 2**63 - 1: "
                             f"accepted: {MOONCAKE_ACCEPTED}")
    return tuple(v)


def mooncake_columns(rows: list[dict], origin: str, arrival_rule: Rule, length_rule: Rule) -> dict[str, np.ndarray]:
    """The columns of Mooncake rows, sorted by arrival (stable): arrival_s (the timestamp / 1000), input_len,
    output_len (int64) and hash_ids (an object array of tuples)."""
    arr, inp, out, ids = [], [], [], []
    ms_rule = arrival_rule.but(hi=arrival_rule.hi * 1e3, unit="ms")
    for i, r in enumerate(rows):
        where = f"trace file {origin}: row {i + 1}"
        if not is_mooncake(r):
            raise OpmapError(f"{where} is not a Mooncake row (no timestamp or hash_ids), unlike row 1: "
                             f"accepted: {MOONCAKE_ACCEPTED}")
        for k in ("timestamp", "input_length", "output_length"):
            if k not in r:
                raise OpmapError(f"{where} has no {k}: accepted: {MOONCAKE_ACCEPTED}")
        arr.append(ms_rule.check(r["timestamp"], f"{where}: timestamp") / 1e3)
        n = int(length_rule.check(r["input_length"], f"{where}: input_length"))
        inp.append(n)
        out.append(int(length_rule.check(r["output_length"], f"{where}: output_length")))
        ids.append(_ids(r.get("hash_ids", []), f"{where}: hash_ids", n))
    order = np.argsort(np.asarray(arr, dtype=np.float64), kind="stable")
    hid = np.empty(len(ids), dtype=object)
    hid[:] = ids
    return {"arrival_s": np.asarray(arr, dtype=np.float64)[order], "input_len": np.asarray(inp, np.int64)[order],
            "output_len": np.asarray(out, np.int64)[order], "hash_ids": hid[order]}


def mooncake_prompts(hash_ids: np.ndarray, input_len: np.ndarray) -> Prompts:
    """Each request's prompt: a 512-token segment per hash id (the last the prompt's remainder), then its own text
    where the ids stop short of the prompt."""
    segs = []
    for i, (hs, n) in enumerate(zip(hash_ids.tolist(), input_len.tolist(), strict=True)):
        s, left = [], n
        for h in hs:
            k = min(MOONCAKE_BLOCK, left)
            s.append((h, k))
            left -= k
        if left:
            s.append((-(i + 2), left))
        segs.append(tuple(s))
    return Prompts(tuple(segs), "mooncake")
