"""The capture cache: a zoo model at the same shapes is captured once; a hit gives the same analysis."""

from __future__ import annotations

import json
import pickle

import pytest

from opmap.api import Shape, step_key
from opmap.capture import cache
from opmap.cli import main


@pytest.fixture
def cache_on(tmp_path, monkeypatch):
    monkeypatch.setenv("OPMAP_GRAPH_CACHE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "opmap" / "graphs"


def test_keys_follow_every_input(cache_on):
    base = {"model": "gpt2", "batch": 1, "seq": 32, "build_dtype": "bfloat16", "layout": "nchw", "overrides": []}
    assert cache.key(base) == cache.key(dict(base))
    for change in ({"seq": 64}, {"batch": 2}, {"build_dtype": "float32"}, {"overrides": [["h.*", "mlp"]]}):
        assert cache.key({**base, **change}) != cache.key(base)


def test_a_hit_skips_the_build_and_gives_the_same_analysis(cache_on, tmp_path, monkeypatch):
    args = ["analyze", "gpt2", "--seq", "32", "--hardware", "h100-sxm", "--rows", "1"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert len(list(cache_on.glob("*.json"))) == 1 and not list(cache_on.glob("*.pkl"))

    def no_build(*a, **k):
        raise AssertionError("a cached zoo model must not be built again")

    monkeypatch.setattr("opmap.workloads.load.build_zoo", no_build)
    # another device and precision of the same build dtype reuse the graph
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    first = json.loads((tmp_path / "a" / "analysis.json").read_text())
    again = json.loads((tmp_path / "b" / "analysis.json").read_text())
    assert first == again
    assert main([*args[:-4], "--hardware", "l4", "--dtype", "int8", "--rows", "1"]) == 0
    # bad input is still refused before any work, cache or not
    assert main([*args, "--fusion", "greedy"]) == 2


ARGS = ["analyze", "gpt2", "--seq", "32", "--hardware", "h100-sxm", "--rows", "1"]


def _entry(cache_on):
    (path,) = cache_on.glob("*.json")
    return path


def test_an_entry_is_data_a_planted_pickle_is_never_loaded(cache_on, tmp_path):
    """The old format (pickle) ran code on load: a .pkl planted where version 1 read its entry is never opened."""
    import pickle

    assert main([*ARGS, "--out", str(tmp_path / "a")]) == 0
    path = _entry(cache_on)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path.with_suffix(".pkl").write_bytes(pickle.dumps(Evil()))
    path.unlink()  # the JSON entry gone: the old code would have read the .pkl
    assert main([*ARGS, "--out", str(tmp_path / "b")]) == 0
    assert not marker.exists()
    assert json.loads(path.read_text().split("\n", 1)[0])["cache_version"] == cache.CACHE_VERSION


def _damage(kind: str, text: str) -> str:
    header, payload = text.split("\n", 1)
    h = json.loads(header)
    if kind == "truncated":
        return text[: len(text) // 2]
    if kind == "not json":
        return "\x80\x81 garbage"
    if kind == "hash":  # one byte of the payload changed, the header kept: the hash no longer matches
        return header + "\n" + payload.replace('"aten.', '"aten!', 1)
    if kind == "version":
        return json.dumps({**h, "cache_version": 1}) + "\n" + payload
    # a well-formed entry with a matching hash whose values have the wrong types: still a miss
    import hashlib

    body = json.loads(payload)
    body["graph"]["tensors"][3][0] = ["1", None]  # the fourth distinct tensor's shape
    body["workload"]["batch"] = True
    p = json.dumps(body, separators=(",", ":")).encode()
    return json.dumps({**h, "bytes": len(p), "sha256": hashlib.sha256(p).hexdigest()}) + "\n" + p.decode()


@pytest.mark.parametrize("kind", ["truncated", "not json", "hash", "version", "types"])
def test_a_damaged_entry_is_rebuilt_never_trusted(cache_on, tmp_path, kind):
    assert main([*ARGS, "--out", str(tmp_path / "a")]) == 0
    path = _entry(cache_on)
    good = path.read_text()
    path.write_text(_damage(kind, good))
    key = path.stem
    assert cache.load(key) is None
    assert main([*ARGS, "--out", str(tmp_path / "b")]) == 0  # captured again, same figures
    assert json.loads((tmp_path / "a" / "analysis.json").read_text()) == \
        json.loads((tmp_path / "b" / "analysis.json").read_text())
    assert path.read_text() == good  # and the entry rewritten whole


def test_a_training_step_round_trips_its_saved_activations(cache_on, tmp_path):
    args = ["analyze", "gpt2", "--seq", "32", "--phase", "train", "--microbatch", "1", "--global-batch", "2",
            "--recompute", "selective", "--rows", "1"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0  # from the cache
    first = json.loads((tmp_path / "a" / "analysis.json").read_text())
    again = json.loads((tmp_path / "b" / "analysis.json").read_text())
    assert first == again and first["phase"]["name"] == "train"
    # a well-formed entry under the training key without its saved activations (a decode entry's shape, its hash
    # recomputed): a miss, captured again, not a crash on the missing figures
    path = _entry(cache_on)
    body = json.loads(path.read_text().split("\n", 1)[1])
    body["saved"] = None
    _rewrite(path, body)
    assert main([*args, "--out", str(tmp_path / "c")]) == 0
    assert json.loads((tmp_path / "c" / "analysis.json").read_text()) == first


def _rewrite(path, body) -> None:
    """``path`` holding ``body`` under a header whose length and hash match it (only the type checks are left)."""
    import hashlib

    h = json.loads(path.read_text().split("\n", 1)[0])
    p = json.dumps(body, separators=(",", ":")).encode()
    path.write_bytes(json.dumps({**h, "bytes": len(p), "sha256": hashlib.sha256(p).hexdigest()}).encode() + b"\n" + p)


def test_an_unreadable_entry_is_a_miss(cache_on):
    from opmap.graph import OpGraph

    cache_on.mkdir(parents=True)
    (cache_on / "abc.json").write_bytes(b"not json")
    assert cache.load("abc") is None
    g = OpGraph((), 0, 0.0, 0, (), "meta")
    cache.store("abc", g, cache.CachedWorkload("x", 1, None, ()))
    assert cache.load("abc") == (g, cache.CachedWorkload("x", 1, None, ()))


class _Plant:
    """Unpickling this creates ``path``: the proof that a pickle was opened."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def test_a_pickle_where_version_1_read_its_entry_is_never_opened(cache_on, tmp_path, monkeypatch):
    """A malicious KEY.pkl at the exact path opmap's version-1 cache read for these inputs (and one at today's
    key), beside a torn KEY.json: analyze opens neither pickle, captures again, rewrites the entry, and its
    analysis equals a fresh capture's."""
    marker = tmp_path / "executed"
    args = ("gpt2", "bf16", "meta", Shape(1, 32), "nchw", ())
    k = step_key(*args)
    with monkeypatch.context() as m:  # the key version 1 computed for the same inputs
        m.setattr(cache, "CACHE_VERSION", 1)
        k_old = step_key(*args)
    cache_on.mkdir(parents=True)
    for name in {k_old, k}:
        (cache_on / f"{name}.pkl").write_bytes(pickle.dumps(_Plant(marker)))
    (cache_on / f"{k}.json").write_text('{"cache_version": ' + str(cache.CACHE_VERSION) + ', "key": "' + k + '"')
    cli = ["analyze", "gpt2", "--seq", "32", "--rows", "1", "--no-store"]
    assert main([*cli, "--out", str(tmp_path / "cached")]) == 0
    assert not marker.exists()
    assert cache.load(k) is not None  # the torn entry was replaced by a good one
    monkeypatch.setenv("OPMAP_GRAPH_CACHE", "0")
    assert main([*cli, "--out", str(tmp_path / "fresh")]) == 0
    assert json.loads((tmp_path / "cached" / "analysis.json").read_text()) == \
        json.loads((tmp_path / "fresh" / "analysis.json").read_text())
    assert not marker.exists()


def _small_entry(cache_on):
    """A stored entry for key 'abc' (an empty graph) and what ``load`` gives for it."""
    from opmap.graph import OpGraph

    g = OpGraph((), 0, 0.0, 0, (), "meta")
    cache.store("abc", g, cache.CachedWorkload("x", 1, None, ()))
    return cache_on / "abc.json", (g, cache.CachedWorkload("x", 1, None, ()))


@pytest.mark.parametrize("kind", ["link to /dev/zero", "link to a good entry", "fifo", "folder", "over the limit"])
def test_an_entry_that_is_not_a_bounded_regular_file_is_a_miss(cache_on, tmp_path, kind):
    """A name linked to /dev/zero made the old reader run out of memory (readline on an endless stream); a link to
    a valid entry was followed. Now each is a miss (no link followed, no FIFO blocking, nothing past the limit
    read), and the next store replaces it with a good entry."""
    import os

    from opmap.safeio import LIMIT_JSON_BYTES

    path, want = _small_entry(cache_on)
    good = tmp_path / "good.json"
    good.write_bytes(path.read_bytes())
    path.unlink()
    if kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "link to a good entry":
        path.symlink_to(good)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:  # a sparse file: its size is refused from fstat, nothing read
        with open(path, "wb") as f:
            f.truncate(LIMIT_JSON_BYTES + 1)
    assert cache.load("abc") is None
    assert cache.load_fields("abc", dict, ()) is None
    if kind == "folder":
        path.rmdir()
    cache.store("abc", *want[:1], cache.CachedWorkload("x", 1, None, ()))
    assert not path.is_symlink() and cache.load("abc") == want  # rewritten whole, in place of the bad entry


def test_analyze_rebuilds_an_entry_linked_to_dev_zero(cache_on, tmp_path):
    """The issue's reproduction: the graph-cache entry of an analyze run linked to /dev/zero ended in MemoryError;
    now it is a miss, the graph captured again and the entry rewritten as a regular file."""
    assert main([*ARGS, "--out", str(tmp_path / "a")]) == 0
    path = _entry(cache_on)
    good = path.read_bytes()
    path.unlink()
    path.symlink_to("/dev/zero")
    assert main([*ARGS, "--out", str(tmp_path / "b")]) == 0
    assert json.loads((tmp_path / "a" / "analysis.json").read_text()) == \
        json.loads((tmp_path / "b" / "analysis.json").read_text())
    assert not path.is_symlink() and path.read_bytes() == good
