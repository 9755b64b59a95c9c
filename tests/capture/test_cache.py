"""The capture cache: a zoo model at the same shapes is captured once; a hit gives the same analysis."""

from __future__ import annotations

import json

import pytest

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
    assert len(list(cache_on.glob("*.pkl"))) == 1

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


def test_an_unreadable_entry_is_a_miss(cache_on):
    cache_on.mkdir(parents=True)
    (cache_on / "abc.pkl").write_bytes(b"not a pickle")
    assert cache.load("abc") is None
    cache.store("abc", ("x", 1))
    assert cache.load("abc") == ("x", 1)
