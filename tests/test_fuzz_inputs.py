"""Fuzzing every file format opmap reads: a seeded generator mutates a valid file of each format (values swapped
for NaN, inf, negatives, huge numbers, wrong types; keys dropped; bytes truncated, flipped or replaced by binary
junk) and hands it to the reader opmap uses for that format. Each reader must either accept the input or refuse
it with one OpmapError line; any other exception is a traceback a user would see, and a read that takes longer
than HANG_S is a hang. Thousands of inputs in all, each under its own timer (SIGALRM).

The readers are the ones the commands call (the same functions, not copies), so a format's refusal here is
the refusal the command prints as ``opmap: error: ...`` with exit status 2 (checked for a sample through the
CLI in test_a_sample_through_the_cli)."""

from __future__ import annotations

import copy
import json
import math
import random
import signal
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from opmap.errors import OpmapError

HANG_S = 5.0  # a reader that parses a few kB for longer than this is hung (the slowest valid read here: ~50 ms)
SEED = 20261204

# Values a careless user or an attacker puts where a number or a name belongs.
NASTY = [float("nan"), float("inf"), float("-inf"), -1, 0, -0.0, 1e30, -1e30, 2**64, 1.9, 1e-300, True, False,
         None, "", "1", "abc", "nan", "1e400", "[/b]", "\x1b[2J", "</script>", [], [1, 2], {}, {"a": 1}]
HUGE_TOKEN = "__OPMAP_FUZZ_1E400__"  # written as the bare JSON literal 1e400 (parses to inf in Python)


class Hang(Exception):
    pass


def _alarm(_signum, _frame):
    raise Hang()


def _leaves(tree, path=()):
    """Every (path, value) of a JSON-like tree, containers included."""
    yield path, tree
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _leaves(v, (*path, i))


def _set(tree, path, value):
    if not path:
        return value
    node = tree
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return tree


def _delete(tree, path):
    node = tree
    for p in path[:-1]:
        node = node[p]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    elif isinstance(node, list) and node:
        node.pop(path[-1])
    return tree


def mutate_tree(tree, rng: random.Random):
    """One to three structural edits: a value swapped for a nasty one (or 1e400), a key dropped, a list emptied."""
    t = copy.deepcopy(tree)
    for _ in range(rng.randint(1, 3)):
        spots = list(_leaves(t))
        path, _value = rng.choice(spots)
        r = rng.random()
        if r < 0.7 or not path:
            t = _set(t, path, HUGE_TOKEN if rng.random() < 0.08 else copy.deepcopy(rng.choice(NASTY)))
        elif r < 0.9:
            t = _delete(t, path)
        else:
            t = _set(t, path, [])
    return t


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Byte-level damage: truncation, flipped bytes, inserted junk, a binary file, an empty file."""
    r = rng.random()
    if r < 0.3:
        return data[: rng.randrange(len(data) + 1)]
    if r < 0.6:
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if r < 0.8:
        i = rng.randrange(len(data) + 1)
        return data[:i] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 32))) + data[i:]
    if r < 0.95:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 512)))
    return b""


def dump_json(tree) -> bytes:
    return json.dumps(tree, allow_nan=True).replace(f'"{HUGE_TOKEN}"', "1e400").encode()


def dump_toml(tree) -> bytes:
    """TOML text of a mutated tree: values TOML cannot hold (None) are written as strings; nan/inf as TOML's own."""
    import tomli_w

    def clean(v):
        if v is None:
            return "null"
        if v == HUGE_TOKEN:
            return float("inf")
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, list):
            vs = [clean(x) for x in v]
            return vs if len({type(x) for x in vs}) <= 1 else [str(x) for x in vs]
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 2**63:
            return float(v)
        return v

    return tomli_w.dumps(clean(tree) if isinstance(tree, dict) else {"value": clean(tree)}).encode()


def check_reader(name: str, read: Callable[[Path], object], seeds: list[bytes], parse: Callable[[bytes], object],
                 dump: Callable[[object], bytes], n: int, tmp: Path) -> dict:
    """Feed ``n`` mutated inputs to ``read``; returns counts and the first failures (tracebacks and hangs)."""
    rng = random.Random(f"{SEED}:{name}")
    accepted = refused = 0
    failures: list[str] = []
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i in range(n):
            seed = rng.choice(seeds)
            if rng.random() < 0.75:
                data = dump(mutate_tree(parse(seed), rng))
            else:
                data = mutate_bytes(seed, rng)
            path = tmp / f"{name}-{i}"
            path.write_bytes(data)
            signal.setitimer(signal.ITIMER_REAL, HANG_S)
            try:
                read(path)
                accepted += 1
            except OpmapError as e:
                msg = str(e)
                if not msg or "\n" in msg or "Traceback" in msg:
                    failures.append(f"{name}: refusal not one line: {msg!r} for {data[:200]!r}")
                refused += 1
            except Hang:
                failures.append(f"{name}: hang over {HANG_S} s for {data[:200]!r}")
            except Exception as e:  # noqa: BLE001 - any other exception is the traceback a user would see
                failures.append(f"{name}: {type(e).__name__}: {e} for {data[:200]!r}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            path.unlink()
    finally:
        signal.signal(signal.SIGALRM, old)
    return {"accepted": accepted, "refused": refused, "failures": failures}


def _nan_free(x) -> bool:
    return not (isinstance(x, float) and not math.isfinite(x))


__all__ = ["check_reader", "dump_json", "dump_toml", "mutate_bytes", "mutate_tree", "tomllib", "pytest"]
