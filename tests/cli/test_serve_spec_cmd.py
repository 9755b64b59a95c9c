"""opmap serve --spec: speculative decoding's settings refused in one line before any pricing, and printed in the
header and serve.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opmap.serve.spec import expected_tokens

TINY = str(Path(__file__).resolve().parents[2] / "examples" / "tiny-llama.json")


@pytest.mark.parametrize("args,needle", [
    (("--spec", "mtp:0"), "K must be an integer from 1 to 16"),
    (("--spec", "eagle:3", "--spec-accept", 1.0), "--spec-accept must be a number >= 0 and < 1"),
    (("--spec", "eagle:3", "--spec-accept", -0.2), "--spec-accept must be a number >= 0 and < 1"),
    (("--spec", "eagle:3", "--spec-accepted", 5), "--spec-accepted must be a number from 1 to below K + 1 = 4"),
    (("--spec", "medusa:3", "--spec-accept", 0.5), "unknown --spec kind 'medusa'"),
    (("--spec", "eagle:3"), "no published default"),
    (("--spec-accept", 0.5), "give --spec too"),
    (("--spec", "mtp:1", "--policy", "engine"), "simulated under --policy continuous"),
    (("--spec", "mtp:1", "--policy", "static:8"), "simulated under --policy continuous"),
    (("--spec", "mtp:1", "--disaggregate", "1:1"), "without --disaggregate"),
    (("--spec", "mtp:1", "--service-time", "fixed:10", "--policy", "none"), "drop --service-time"),
    (("--spec", "draft:no-such-model:3", "--spec-accept", 0.6), "unknown model 'no-such-model'"),
    (("--spec", "mtp:1"), "has no MTP module (num_nextn_predict_layers"),
])
def test_serve_refuses_bad_spec_before_pricing(refused, fail_if_called, args, needle):
    fail_if_called("opmap.serve.model_cost.model_table_cost")
    refused("serve", TINY, "--requests", 10, *args, needle=needle)


def test_serve_spec_prints_its_settings_and_writes_them(tmp_path, cli):
    """eagle:3 at alpha 0.7: 2.533 tokens a step (Leviathan et al. eq. 1) in the header and serve.json, the verify
    and draft pricing beside the target's, the policy continuous (--spec's default)."""
    rc, out, err = cli("serve", TINY, "--spec", "eagle:3", "--spec-accept", 0.7, "--requests", 40, "--input-len", 64,
                       "--output-len", 64, "--arrival", "poisson:50", "--no-store", "--out", tmp_path)
    assert rc == 0, err
    assert "speculative decoding eagle:3" in out and "2.533 tokens per step" in out
    d = json.loads((tmp_path / "serve.json").read_text())
    s = d["assumptions"]["speculative_decoding"]
    assert s["k"] == 3 and s["alpha"] == 0.7 and s["verify_tokens"] == 4
    assert s["tokens_per_step"] == pytest.approx(expected_tokens(0.7, 3))
    assert d["policy"]["name"] == "continuous"
    assert d["assumptions"]["memory"]["draft_weights_bytes"] > 0
