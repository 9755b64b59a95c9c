"""opmap serve with shared prefixes: --prefix-share R [--prefix-groups G] and a Mooncake trace reach serve.json's
prefix_cache and the terminal; bad input is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TINY = str(Path(__file__).resolve().parents[2] / "examples" / "tiny-llama.json")  # a Hugging Face config.json


@pytest.mark.parametrize("model", [TINY, "gpt2"])
def test_prefix_share_reaches_serve_json(tmp_path, cli, model):
    """100 prompts of 900 tokens, R = 0.9, G = 4 (request i in group i mod 4), a KV cache that holds them all: the
    first request of each group computes its whole prompt, the 96 others find floor(810 / 16) x 16 = 800 tokens
    cached: hit rate 96 x 800 / (100 x 900) = 0.8533."""
    rc, out, err = cli("serve", model, "--requests", 100, "--input-len", 900, "--output-len", 16, "--arrival",
                       "poisson:20", "--prefix-share", 0.9, "--prefix-groups", 4, "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "serve.json").read_text())
    pc = d["prefix_cache"]
    assert (pc["hit_tokens"], pc["prompt_tokens"], pc["kv_block"]) == (96 * 800, 100 * 900, 16)
    assert pc["hit_rate"] == pytest.approx(96 * 800 / (100 * 900))
    assert d["assumptions"]["prefix"] == "share:0.9,groups:4"
    assert "prefix cache (share:0.9,groups:4): hit rate 85.3%" in " ".join(out.split())


def test_a_mooncake_trace_is_served_with_its_prefixes(tmp_path, cli):
    """Rows in Mooncake's format (FAST25-release/README.md's two samples, sharing 12 blocks of 512): the second
    finds 6144 tokens cached (the tiny Llama config's 1024 positions stretched by rope scaling)."""
    rows = [{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [*range(46, 58), 2353, 2354]},
            {"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [*range(46, 58), 2366]}]
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc, out, err = cli("serve", TINY, "--arrival", f"trace:{trace}", "--input-len", "trace", "--output-len",
                       "trace", "--allow-long-context", "--out", tmp_path / "o")
    assert rc == 0, err
    pc = json.loads((tmp_path / "o" / "serve.json").read_text())["prefix_cache"]
    assert pc["hit_tokens"] == 6144 and pc["prompts"] == "mooncake"


def test_without_the_options_serve_json_has_no_prefix_cache(tmp_path, cli):
    rc, _, err = cli("serve", TINY, "--requests", 20, "--input-len", 64, "--output-len", 8, "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "serve.json").read_text())
    assert "prefix_cache" not in d and "prefix" not in d["assumptions"]


@pytest.mark.parametrize("args,needle", [
    (["--prefix-share", 1.5], "--prefix-share must be a number from 0 to 1"),
    (["--prefix-share", "nan"], "--prefix-share"),
    (["--prefix-groups", 3], "give --prefix-share too"),
    (["--prefix-share", 0.5, "--prefix-groups", 0], "--prefix-groups"),
    (["--prefix-share", 0.5, "--policy", "continuous"], "use --policy engine"),
    (["--prefix-share", 0.5, "--disaggregate", "1:1", "--policy", "continuous"], "without --disaggregate"),
])
def test_bad_prefix_options_are_refused(refused, args, needle):
    refused("serve", TINY, "--requests", 10, *args, needle=needle)


def test_a_malformed_mooncake_trace_is_refused(tmp_path, refused):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1, 2]}\n')
    refused("serve", TINY, "--arrival", f"trace:{trace}", "--input-len", "trace", "--output-len", "trace",
            needle="hash_ids has 3 ids for 600 tokens")
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n')
    refused("serve", TINY, "--arrival", f"trace:{trace}", needle="use --input-len trace")
