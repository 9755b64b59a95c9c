"""opmap analyze --phase: decode and train outputs, the phase line and memory verdict, bad combinations in one line."""

from __future__ import annotations

import json

import pytest


def test_prefill_default_carries_phase_and_memory(tmp_path, cli):
    rc, out, err = cli("analyze", "gpt2", "--seq", "32", "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    assert d["schema_version"] == 2
    assert d["phase"]["name"] == "prefill" and d["phase"]["ttft_s"] == d["totals"]["predicted_latency_s"]
    assert set(d["memory"]["per_device"]) == {"weights_bytes", "gradients_bytes", "optimizer_bytes",
                                              "activations_bytes", "kv_cache_bytes", "workspace_bytes",
                                              "total_bytes"}
    assert {"capacity_bytes", "fits", "max_batch", "max_context"} <= set(d["memory"])
    assert "phase: prefill: time to first token" in out


def test_decode_writes_tpot_and_tokens_per_s(tmp_path, cli):
    rc, out, err = cli("analyze", "gpt2", "--phase", "decode", "--kv-len", "256", "--batch", "4", "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    p = d["phase"]
    assert p["name"] == "decode" and p["tokens_per_s"] == pytest.approx(4 / p["tpot_s"])
    # GPT-2: 2 x 12 layers x 12 heads x 64 x 2 B = 36,864 B per token, 256 tokens, 4 sequences
    assert d["memory"]["per_device"]["kv_cache_bytes"] == 36_864 * 256 * 4
    assert "time per output token" in out and "memory: fits" in out


def test_train_writes_mfu_and_hfu(tmp_path, cli):
    rc, out, err = cli("analyze", "gpt2", "--phase", "train", "--seq", "64", "--recompute", "full",
                       "--microbatch", "1", "--global-batch", "4", "--zero", "1", "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    p = d["phase"]
    for k in ("iteration_s", "tokens_per_s", "model_flops", "hardware_flops", "model_flops_per_s_per_device",
              "mfu", "hfu"):
        assert p[k] > 0, k
    assert p["microsteps"] == 4 and p["hardware_flops"] > p["model_flops"] * 0.9
    m = d["memory"]["per_device"]
    assert m["optimizer_bytes"] == pytest.approx(12 * d["totals"]["params"]) and m["activations_bytes"] > 0
    assert "MFU" in out and "HFU" in out and "PaLM" in out


@pytest.mark.parametrize("args,needle", [
    (("gpt2", "--kv-len", "128"), "--kv-len is for --phase decode"),
    (("gpt2", "--phase", "decode", "--recompute", "full"), "--recompute is for --phase train"),
    (("gpt2", "--phase", "train", "--microbatch", "3", "--global-batch", "8"), "not a multiple"),
    (("resnet50", "--phase", "decode"), "vision model"),
    (("gpt2", "--phase", "decode", "--seq", "64"), "takes --kv-len"),
    (("gpt2", "--phase", "sample"), "unknown phase 'sample'"),
])
def test_bad_phase_combinations_one_line(cli, args, needle):
    rc, out, err = cli("analyze", *args)
    assert rc == 2
    assert needle in err and len(err.strip().splitlines()) == 1


def test_train_over_several_devices_takes_the_sharded_iteration(tmp_path, cli):
    # gpt2, tp 2 x dp 2, microbatch 2, global batch 8: each data-parallel rank runs 8 / (2 x 2) = 2 microbatches;
    # the iteration is the sharded one (parallelism.step_s); tokens per iteration = 8 x 64; model FLOPs are the
    # whole global batch's, spread over the 4 devices for MFU
    rc, out, err = cli("analyze", "gpt2", "--phase", "train", "--seq", "64", "--tp", "2", "--dp", "2",
                       "--microbatch", "2", "--global-batch", "8", "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    p, par = d["phase"], d["parallelism"]
    assert par["tp"] == 2 and par["dp"] == 2 and par["microbatches"] == 2
    assert p["iteration_s"] == pytest.approx(par["step_s"])
    assert p["tokens_per_s"] == pytest.approx(8 * 64 / p["iteration_s"])
    peak = p["dense_peak_flops_per_s"]
    assert p["mfu"] == pytest.approx(p["model_flops"] / (p["iteration_s"] * 4) / peak)
    assert any(c["collective"] == "all_reduce" for c in d["collectives"])
    assert "train on 4 devices" in out


def test_fused_adamw_is_one_kernel_per_step(tmp_path, cli):
    # --optimizer adamw-fused: one aten._fused_adamw_ over every fp32 master weight, gradient and both moments
    # (read 4 x 4 B, write 3 x 4 B per parameter) instead of about ten kernels per parameter
    rc, out, err = cli("analyze", "gpt2", "--phase", "train", "--seq", "32", "--optimizer", "adamw-fused",
                       "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    (fused,) = [n for n in d["nodes"] if n["op"] == "aten._fused_adamw_.default"]
    params = d["totals"]["params"]
    assert fused["bytes_read"] == 4 * 4 * params and fused["bytes_written"] == 3 * 4 * params
    rc, out, err = cli("analyze", "gpt2", "--optimizer", "adamw-fused")
    assert rc == 2 and "--optimizer is for --phase train" in err


def test_memory_is_per_device_under_a_layout(tmp_path, cli):
    # tp 2 x pp 2: each device holds about a quarter of the parameters (dense / (tp x pp)), so its weights,
    # gradients and AdamW state are about a quarter of one device's; the reason names the layout
    rc, _, err = cli("analyze", "gpt2", "--phase", "train", "--seq", "64", "--out", tmp_path / "one")
    assert rc == 0, err
    rc, _, err = cli("analyze", "gpt2", "--phase", "train", "--seq", "64", "--tp", "2", "--pp", "2",
                     "--global-batch", "4", "--out", tmp_path / "four")
    assert rc == 0, err
    one = json.loads((tmp_path / "one" / "analysis.json").read_text())["memory"]["per_device"]
    four = json.loads((tmp_path / "four" / "analysis.json").read_text())["memory"]
    for k in ("weights_bytes", "optimizer_bytes"):
        assert 0.2 < four["per_device"][k] / one[k] < 0.3
    assert any("tp2 pp2" in s for s in four["assumptions"])


def test_decode_under_engine_runtime(tmp_path, cli):
    rc, out, err = cli("analyze", "gpt2", "--phase", "decode", "--kv-len", "128", "--runtime", "engine",
                       "--out", tmp_path, "--no-store")
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    rt = d["assumptions"]["runtime"]
    assert rt["name"] == "engine" and rt["stack"] == "cuda-graphs" and d["fusion"]["policy"] == "engine"
    # one graph launch (15 us, ocannl issue 488) + the scheduler gap (160 us, vLLM PR 11133) per step
    assert d["phase"]["runtime_per_step_s"] == pytest.approx(175e-6)
    assert d["phase"]["tpot_s"] == pytest.approx(d["phase"]["kernel_time_s"] + 175e-6)
    assert d["fusion"]["kernels"] < d["fusion"]["eager_kernels"]
    assert "runtime engine (cuda-graphs)" in out and d["assumptions"]["launch_overhead_s"]["value"] == 0.5e-6


def test_analyze_default_runtime_is_eager(tmp_path, cli):
    rc, out, err = cli("analyze", "gpt2", "--seq", "32", "--out", tmp_path, "--no-store")
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    assert d["assumptions"]["runtime"]["name"] == "eager" and d["assumptions"]["runtime"]["per_step_s"] == 0
    assert d["fusion"]["policy"] == "eager" and "runtime eager: a host launch per kernel" in out


@pytest.mark.parametrize("args,needle", [
    (("gpt2", "--phase", "train", "--seq", "32", "--runtime", "graphs"), "--runtime graphs prices serving steps"),
    (("gpt2", "--runtime", "jit"), "unknown runtime 'jit'"),
])
def test_bad_runtime_one_line(refused, args, needle):
    refused("analyze", *args, "--no-store", needle=needle)


@pytest.mark.parametrize("extra", [(), ("--runtime", "engine")])
def test_one_headline_phase_line_totals_and_json_agree(tmp_path, cli, extra):
    """llama-3-8b decode over tp 2: the phase line, the Totals box and analysis.json print one step time (the
    Totals box printed the one-device kernel sum, 10.3 ms, beside a phase line of 8.25 ms)."""
    from opmap.report.sheet import si

    rc, out, err = cli("analyze", "llama-3-8b", "--phase", "decode", "--kv-len", "1024", "--tp", "2", *extra,
                       "--rows", "1", "--out", tmp_path, "--no-store")
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    tpot = d["phase"]["tpot_s"]
    assert d["totals"]["predicted_latency_s"] == tpot
    assert d["totals"]["predicted_latency_name"] == "time per output token"
    assert f"{tpot * 1e3:.4g} ms per output token" in out  # the phase line
    totals = [line for line in out.splitlines() if "predicted time per output token" in line]
    assert len(totals) == 1 and si(tpot, "s") in totals[0]  # the Totals box
    assert d["totals"]["kernel_time_s"] > tpot  # the one-device sum is not the headline under tp 2


def test_prefill_under_graphs_adds_one_graph_launch(tmp_path, cli):
    rc, out, err = cli("analyze", "gpt2", "--seq", "32", "--runtime", "graphs", "--fusion", "compiler",
                       "--out", tmp_path, "--no-store")
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    p = d["phase"]
    # one graph launch per step (15 us, ahrefs/ocannl issue 488), nothing else per step under graphs
    assert p["ttft_s"] == pytest.approx(p["kernel_time_s"] + 15e-6)
    assert p["ttft_s"] == d["totals"]["predicted_latency_s"]
    assert d["fusion"]["policy"] == "compiler" and d["assumptions"]["runtime"]["fusion"] == "compiler"
    assert "runtime graphs (cuda-graphs)" in out


def test_train_prints_one_iteration_per_device_in_training_words(tmp_path, cli):
    """gpt2 over tp 2 x pp 2 x dp 2 with selective recomputation: the phase line, the Totals box and analysis.json
    print one iteration, per device, equal to its parts; HFU >= MFU with the line saying what each counts; the memory
    verdict speaks of gradients, optimizer state and saved activations, never of a KV cache, a context or
    requests; selective recomputation grows the step and never says it adds nothing."""
    from opmap.report.sheet import si

    rc, out, err = cli("analyze", "gpt2", "--phase", "train", "--seq", "64", "--tp", "2", "--pp", "2", "--dp", "2",
                       "--microbatch", "1", "--global-batch", "8", "--recompute", "selective", "--rows", "1",
                       "--out", tmp_path, "--no-store")
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    p = d["phase"]
    step = p["step_s"]
    assert d["totals"]["predicted_latency_s"] == step == p["iteration_s"] == d["parallelism"]["step_s"]
    parts = p["microsteps"] * (p["microstep_s"] + p["recompute_s"]) + p["bubble_s"] + p["exposed_comm_s"] + \
        p["optimizer_s"]
    assert step == pytest.approx(parts, rel=0.01) and p["recompute_s"] > 0
    assert p["hfu"] >= p["mfu"]
    text = " ".join(out.split())  # rich wraps long lines
    assert f"iteration {step * 1e3:.4g} ms per device" in text  # the phase line
    totals = [line for line in out.splitlines() if "predicted iteration" in line]
    assert len(totals) == 1 and si(step, "s") in totals[0]  # the Totals box
    assert "HFU >= MFU" in text and "adds nothing" not in text
    header = text[:text.index("Kernels (")]
    assert "gradients, optimizer state, saved activations" in header
    for word in ("KV cache", "context", "request", "time to first token"):
        assert word not in header, word


@pytest.mark.parametrize("runtime,cache", [("engine", "written into the cache in place"),
                                           ("eager", "DynamicCache appends by torch.cat")])
def test_hf_decode_notes_the_cache_its_runtime_writes(tmp_path, cli, runtime, cache):
    """A Hugging Face config's decode says which KV write it priced (an engine's one token in place; eager
    transformers' DynamicCache append), and never that it has no KV cache (the prefill's note)."""
    pytest.importorskip("transformers")
    cfg = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    rc, out, err = cli("analyze", p, "--phase", "decode", "--kv-len", "1024", "--batch", "8", "--runtime", runtime,
                       "--out", tmp_path / "out", "--no-store")
    assert rc == 0, err
    d = json.loads((tmp_path / "out" / "analysis.json").read_text())["assumptions"]
    notes = " ".join(d["workload_notes"])
    assert cache in notes and "no KV cache" not in notes and "no KV cache" not in out
    assert d["phase"]["kv_write"] == ("in-place" if runtime == "engine" else "append")
