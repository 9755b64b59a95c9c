"""fit and sweep under engine presets: a stack per vendor named in every fit cell, sized by its engine's rules
(a Hugging Face config, examples/tiny-llama.json); sweep's decode batches against the engine's CUDA graphs (a zoo
model and the config)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TINY = str(Path(__file__).resolve().parents[2] / "examples" / "tiny-llama.json")


def test_fit_names_each_vendors_stack(cli, tmp_path):
    """nvidia=trtllm, amd=vllm: the H100 cell runs TensorRT-LLM's defaults (2048 sequences, 8192 tokens, 0.9 of
    the free memory: usable = 0.9 x (capacity - weights - reserve)); the MI300X (192 GiB, >= 70 GiB, not an A100)
    vLLM's API-server defaults (1024 sequences, 8192 tokens, 0.9 of the whole device)."""
    rc, out, err = cli("fit", "--models", TINY, "--hardware", "h100-sxm,mi300x", "--devices", 1, "--requests", 100,
                       "--devices-budget", 1, "--engine-preset", "NVIDIA=trtllm,amd=vllm", "--no-store",
                       "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "fit.json").read_text())
    cells = {c["hardware"]: c for c in d["cells"]}
    h, m = cells["h100-sxm"]["engine_preset"], cells["mi300x"]["engine_preset"]
    assert (h["engine"], h["max_num_seqs"], h["max_num_batched_tokens"], h["memory"]["of"]) == ("trtllm", 2048,
                                                                                                8192, "free")
    assert (m["engine"], m["max_num_seqs"], m["max_num_batched_tokens"], m["memory"]["of"]) == ("vllm", 1024, 8192,
                                                                                                "total")
    mem = cells["h100-sxm"]["memory"]
    assert mem["usable_bytes"] == pytest.approx(0.9 * (mem["capacity_bytes"] - mem["weights_bytes"]
                                                       - mem["reserve_bytes"]))
    assert d["engine_settings"]["engine_presets"] == {"nvidia": "trtllm@1.3", "amd": "vllm@0.11"}
    assert "stack trtllm@1.3" in out and "stack vllm@0.11" in out
    assert "[stack trtllm@1.3]" in (tmp_path / "fit.md").read_text()


@pytest.mark.parametrize("model", ["gpt2", TINY])
def test_sweep_states_the_graph_each_decode_batch_replays(cli, tmp_path, model):
    """TensorRT-LLM's default CUDA graphs (CudaGraphConfig: no padding, max_batch_size 128): batch sizes 1..31,
    32, 64, 128; a decode batch of 33 replays the 64 graph, 100 the 128 one, 200 none."""
    rc, out, err = cli("sweep", model, "--phase", "decode", "--batch", "1,33,100,200", "--seq", 64,
                       "--engine-preset", "trtllm", "--no-store", "--out", tmp_path)
    assert rc == 0, err
    ep = json.loads((tmp_path / "sweep.json").read_text())["engine_preset"]
    assert ep["cuda_graph_sizes"] == list(range(1, 32)) + [32, 64, 128]
    assert ep["decode_graph_batch"] == {"1": 1, "33": 64, "100": 128, "200": None}
    assert "200 -> no graph" in out


def test_sweep_refuses_a_preset_with_measure(refused):
    refused("sweep", "gpt2", "--measure", "--engine-preset", "vllm", "--no-store",
            needle="--engine-preset describes a serving engine's predicted steps")


def test_fit_refuses_a_bad_vendor_list(refused):
    refused("fit", "--models", TINY, "--hardware", "h100-sxm", "--engine-preset", "nvidia=trtllm,nvidia=vllm",
            "--no-store", needle="names vendor 'nvidia' twice")
