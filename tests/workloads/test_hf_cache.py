"""The decode cache's layout probed once a module and reused at every batch (opmap.workloads.hf_cache.cache_layout's
memo), on published configs narrowed: DeepSeek-R1's absorbed MLA latent and gpt-oss's sliding and full layers."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_family_configs import DEEPSEEK_R1, GPT_OSS_20B, shallow  # noqa: E402
from opmap.workloads.hf import _transformers  # noqa: E402
from opmap.workloads.hf_cache import PROBE_BATCH, cache_layout  # noqa: E402
from opmap.workloads.hf_mla import absorb_mla  # noqa: E402
from opmap.workloads.load import load_workload  # noqa: E402


def _expected_entry(cfg: dict) -> tuple[tuple[int, int], tuple[int, int]]:
    """Per layer and sequence, (key heads, key width), (value heads, value width) as the config says: MLA decoded
    absorbed caches one latent of kv_lora_rank plus the RoPE key of qk_rope_head_dim (opmap.workloads.hf_mla; V the
    latent's first columns, width 0); a GQA layer num_key_value_heads x head_dim for each of K and V."""
    if "kv_lora_rank" in cfg:
        return (1, cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]), (1, 0)
    kv = (cfg["num_key_value_heads"], cfg["head_dim"])
    return kv, kv


@pytest.mark.parametrize("name,cfg", [("deepseek-r1", shallow(DEEPSEEK_R1, 2)),
                                      ("gpt-oss-20b", shallow(GPT_OSS_20B, 4))])
def test_one_probe_serves_every_batch(tmp_path, name, cfg):
    """The memoised layout at each batch equals a probe run at that batch, and matches the config's widths."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    w = load_workload(str(p), 1, 1, "bf16", "meta")
    absorb_mla(w.module)
    tf = _transformers()
    memo: dict = {}
    key = "cache" if "cache" in inspect.signature(w.module.forward).parameters else "past_key_values"
    (kh, kw), (vh, vw) = _expected_entry(cfg)
    for batch in (1, 3, 64):
        got = cache_layout(tf, w.module, batch, key, name, memo)
        assert got == cache_layout(tf, w.module, batch, key, name)
        assert len(got) == cfg["num_hidden_layers"]
        assert all(lc.key == (batch, kh, 1, kw) and lc.value == (batch, vh, 1, vw) for lc in got)
    # one probe for the module at its layer count, kept at PROBE_BATCH
    assert list(memo) == [(cfg["num_hidden_layers"], key)]
    assert all(lc.key[0] == PROBE_BATCH for lc in memo[(cfg["num_hidden_layers"], key)])
