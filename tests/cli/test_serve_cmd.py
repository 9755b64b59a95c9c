"""opmap serve."""

from __future__ import annotations

import json
import math

import pytest


def test_serve_service_time_writes_the_contract(tmp_path, cli):
    rc, out, err = cli("serve", "gpt2", "--service-time", "exp:100", "--policy", "none", "--arrival", "poisson:5",
                       "--requests", 2000, "--seed", 3, "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "serve.json").read_text())
    for k in ("policy", "arrival", "requests", "throughput", "latency", "goodput", "slo_attainment",
              "queueing_share", "validity"):
        assert k in d
    assert set(d["latency"]) == {"e2e", "ttft", "tpot", "itl", "queue"}
    assert set(d["latency"]["queue"]) == {"mean_s", "p50_s", "p90_s", "p95_s", "p99_s"}
    assert set(d["throughput"]) == {"requests_per_s", "tokens_per_s", "output_tokens_per_s"}
    assert d["policy"]["name"] == "none" and d["policy"]["version"] == 1
    assert d["throughput"]["requests_per_s"] == pytest.approx(5, rel=0.1)
    assert "MLPerf-style validity" in out


def test_find_capacity_mm1_p99(tmp_path, cli):
    """M/M/1 sojourn time is exponential with rate mu - lambda (Kleinrock 1975 sec. 3.2): a p99 limit L is met
    up to lambda* = mu - ln(100) / L = 10 - 4.605 / 2 = 7.70 requests/s (p99 over 100,000 requests: 10%)."""
    rc, out, err = cli("serve", "gpt2", "--service-time", "exp:100", "--policy", "none", "--arrival", "poisson:5",
                       "--requests", 100_000, "--slo-p99", 2000, "--find-capacity", "--out", tmp_path)
    assert rc == 0, err
    cap = json.loads((tmp_path / "serve.json").read_text())["capacity"]
    assert cap["rate_per_s"] == pytest.approx(10 - math.log(100) / 2, rel=0.1)


def test_serve_pricing_flags_reach_serve_json(tmp_path, cli):
    """--pp, --runtime, --kv-dtype, --gpu-memory-utilization: the header names the runtime; serve.json's
    assumptions carry the runtime, the KV format, the layout and the memory per device."""
    rc, out, err = cli("serve", "gpt2", "--arrival", "poisson:20", "--requests", 50, "--pp", 2, "--runtime", "graphs",
                       "--kv-dtype", "fp8", "--gpu-memory-utilization", 0.5, "--out", tmp_path)
    assert rc == 0, err
    a = json.loads((tmp_path / "serve.json").read_text())["assumptions"]
    assert a["runtime"]["name"] == "graphs" and a["kv_dtype"] == "fp8"
    assert a["layout"] == {"tp": 1, "pp": 2, "replicas": 1}
    assert a["memory"]["utilization"] == 0.5
    # gpt2: 12 layers x 2 x 768 x 1 byte (fp8), 6 layers per stage
    assert a["memory"]["kv_bytes_per_token"] == 12 * 2 * 768 / 2
    assert "runtime graphs" in out


def test_serve_a_replica_of_16_gpus_in_an_nvl72_rack(tmp_path, cli):
    """A Llama config of 16 heads served at tp 16 on GB200 (inside the 72-GPU NVLink domain) and as tp 8 x pp 2 on
    B200 (the second stage on another node, over InfiniBand): both priced, each GPU holding 1/16 of the weights."""
    cfg = {"model_type": "llama", "vocab_size": 2048, "hidden_size": 512, "intermediate_size": 1024,
           "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 16,
           "max_position_embeddings": 4096, "torch_dtype": "float32"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    got = {}
    for hw, tp, pp in (("gb200", 16, 1), ("b200", 8, 2)):
        rc, _, err = cli("serve", path, "--hardware", hw, "--tp", tp, "--pp", pp, "--dtype", "bf16",
                         "--arrival", "poisson:20", "--requests", 20, "--out", tmp_path / hw)
        assert rc == 0, err
        a = json.loads((tmp_path / hw / "serve.json").read_text())["assumptions"]
        assert a["layout"] == {"tp": tp, "pp": pp, "replicas": 1}
        got[hw] = a["memory"]
    assert got["gb200"]["weights_bytes"] == pytest.approx(got["b200"]["weights_bytes"], rel=0.01)


def test_serve_prices_a_qwen2_config_with_per_layer_types(tmp_path, cli, published_config):
    """Qwen2.5-7B (hub: Qwen/Qwen2.5-7B): transformers derives one layer_types entry per layer and reads it by
    index. Before: the 1-layer capture cut the list to one entry, and the 2-layer capture failed with IndexError
    in config.layer_types[i]. KV bytes per token: K and V x 28 layers x 4 KV heads x head_dim 128 (3584 / 28) x
    2 bytes (bf16) = 57,344; weights: 7,615,616,512 parameters (embeddings and untied head 2 x 152,064 x 3,584,
    per layer q, k, v, o with q/k/v biases 3,584^2 + 3,584 + 2 x (3,584 x 512 + 512) + 3,584^2, MLP 3 x 3,584 x
    18,944, two norms 2 x 3,584; final norm 3,584: Qwen2.5 report's 7.61 B) x 2 bytes."""
    rc, out, err = cli("serve", published_config("Qwen/Qwen2.5-7B"), "--requests", 20, "--input-len", 128,
                       "--output-len", 16, "--out", tmp_path, "--no-store")
    assert rc == 0, err
    mem = json.loads((tmp_path / "serve.json").read_text())["assumptions"]["memory"]
    assert mem["kv_bytes_per_token"] == 2 * 28 * 4 * 128 * 2
    per_layer = 2 * 3584 ** 2 + 3584 + 2 * (3584 * 512 + 512) + 3 * 3584 * 18944 + 2 * 3584
    assert mem["weights_bytes"] == 2 * (2 * 152064 * 3584 + 28 * per_layer + 3584)


def test_serve_refuses_a_context_past_the_model_limit(refused):
    refused("serve", "gpt2", "--input-len", 1000, "--output-len", 100, "--requests", 5,
            needle="at most 1024 positions")


def test_serve_gpt2_continuous(tmp_path, cli):
    rc, out, err = cli("serve", "gpt2", "--hardware", "h100-sxm", "--arrival", "poisson:50", "--requests", 200,
                       "--input-len", "uniform:32,256", "--output-len", 32, "--policy", "chunked:256",
                       "--replicas", 2, "--router", "least_loaded", "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "serve.json").read_text())
    assert d["cost"]["kind"] == "table" and d["cost"]["kv_capacity_tokens"] > 1_000_000
    assert d["validity"]["verdict"] == "VALID"
    assert 0 < d["latency"]["ttft"]["p50_s"] < d["latency"]["e2e"]["p50_s"]
    assert d["latency"]["itl"]["mean_s"] > 0


def test_serve_defaults_to_the_engine_policy_with_its_sizes(tmp_path, cli):
    """No --policy: in-flight batching (engine) with the sizes given; gpt2 on an H100 holds over a million KV
    tokens, so 200 short requests never run out of blocks (no preemption). The replica's blocks are
    floor(kv_capacity_tokens / kv_block)."""
    rc, out, err = cli("serve", "gpt2", "--arrival", "poisson:50", "--requests", 200, "--input-len", 128,
                       "--output-len", 16, "--max-num-seqs", 64, "--max-num-batched-tokens", 2048, "--kv-block", 32,
                       "--out", tmp_path, "--no-store")
    assert rc == 0, err
    d = json.loads((tmp_path / "serve.json").read_text())
    assert d["policy"]["name"] == "engine" and d["policy"]["spec"] == "engine:64,2048,32"
    assert d["scheduler"] == {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "kv_block": 32,
                              "chunked_prefill": True}
    assert d["kv_cache"]["blocks"] == d["cost"]["kv_capacity_tokens"] // 32
    assert d["preemptions"] == {"total": 0, "requests_preempted": 0, "max_per_request": 0}
    assert d["assumptions"]["kv_cache"].startswith("paged in blocks of 32 tokens")
    for k in ("ttft", "tpot", "itl", "e2e"):
        assert set(d["latency"][k]) == {"mean_s", "p50_s", "p90_s", "p95_s", "p99_s"}
    assert "preemptions 0 (0 requests, recomputed)" in out


@pytest.mark.parametrize("args,needle", [
    (("--max-num-seqs", 256, "--max-num-batched-tokens", 100),
     "--max-num-batched-tokens (100) must be >= --max-num-seqs (256)"),
    (("--max-num-batched-tokens", 100), "--max-num-batched-tokens (100) must be >= --max-num-seqs (256)"),
    (("--kv-block", 0), "--kv-block must be an integer from 1 to 2147483647 (got 0)"),
    (("--max-num-seqs", -3), "--max-num-seqs must be an integer from 1 to 2147483647 (got -3)"),
    (("--policy", "chunked:256", "--kv-block", 16), "--kv-block set the engine policy's sizes: use --policy engine"),
    (("--policy", "engine:8,64,16", "--max-num-seqs", 4), "set the engine policy's sizes"),
    (("--policy", "engine:8,64"), "engine takes MAX_NUM_SEQS,MAX_NUM_BATCHED_TOKENS,KV_BLOCK"),
    (("--disaggregate", "1:1", "--kv-block", 16), "use --policy continuous"),
])
def test_serve_refuses_bad_engine_sizes_before_pricing(refused, fail_if_called, args, needle):
    fail_if_called("opmap.serve.model_cost.model_table_cost")
    refused("serve", "gpt2", "--no-store", *args, needle=needle)


def test_serve_gpt2_disaggregated(tmp_path, cli):
    """gpt2's KV cache: 12 layers x (K + V) x 768 x 2 bytes (bf16) = 36,864 bytes per token; a 1:1 split of
    two H100 SXM stays inside one DGX node and moves it over NVLink at 450 GB/s per direction (datasheet)."""
    rc, out, err = cli("serve", "gpt2", "--hardware", "h100-sxm", "--arrival", "poisson:50", "--requests", 200,
                       "--input-len", 256, "--output-len", 32, "--disaggregate", "1:1", "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "serve.json").read_text())
    k = d["disaggregation"]["kv_transfer"]
    assert k["bytes_per_token"] == pytest.approx(12 * 2 * 768 * 2)
    assert k["bandwidth_bytes_per_s"] == pytest.approx(450e9)
    assert d["disaggregation"]["kv_transfer_s"]["mean_s"] >= 256 * 36864 / 450e9
    assert d["replicas"] == 2 and d["assumptions"]["disaggregate"] == "1:1"
    assert d["validity"]["verdict"] == "VALID" and "disaggregated 1:1" in out


@pytest.mark.parametrize("args,needle", [
    (("--arrival", "poisson"), "accepted: poisson:RATE"),
    (("--policy", "batch:4"), "accepted: none, static:B"),
    (("--service-time", "exp:100", "--policy", "continuous"), "use none, static:B"),
    (("--slo-p99", 100, "--slo-ttft", 100), "--slo-p99 replaces"),
    (("--router", "random"), "accepted: round_robin"),
    (("--arrival", "offline", "--find-capacity"), "varies the arrival rate"),
    (("--input-len", "normal:5"), "accepted: N, uniform"),
    (("--disaggregate", "1:0"), "accepted: P:D"),
    (("--disaggregate", "1:1"), "drop --service-time"),
    (("--disaggregate", "1:1", "--replicas", 3), "drop --replicas"),
    (("--engine", "spark", "--find-capacity"), "unknown engine 'spark'; accepted: local, ray"),
    (("--runtime", "jit"), "unknown runtime 'jit'; accepted: eager"),
    (("--kv-dtype", "fp4"), "unknown --kv-dtype 'fp4'; accepted: bf16"),
    (("--gpu-memory-utilization", 0), "--gpu-memory-utilization"),
    (("--gpu-memory-utilization", 1.2), "--gpu-memory-utilization"),
    (("--pp", 0), "--pp"),
])
def test_serve_refuses_bad_input(refused, args, needle):
    refused("serve", "gpt2", "--service-time", "fixed:10", "--policy", "none", *args, needle=needle)


@pytest.mark.parametrize("args,needle", [
    (("--service-time", "exp:100", "--policy", "continuous"), "use none, static:B"),
    (("--service-time", "exp:100", "--policy", "engine"), "use none, static:B"),
    (("--policy", "none", "--router", "random"), "accepted: round_robin"),
    (("--policy", "continuous", "--router", "random"), "accepted: round_robin"),
    (("--policy", "continuous", "--router", "batched:0,300"), "integer SIZE >= 1"),
    (("--policy", "continuous", "--disaggregate", "1:1", "--router", "batched:4,50"), "not batched:4,50"),
    (("--policy", "engine:nomix"), "runs whole prompts: add nochunk"),
])
def test_a_bad_policy_or_router_is_refused_by_parsing_not_by_a_simulation(refused, fail_if_called, args, needle):
    """The policy and router are checked by parsing them: no simulation runs (an empty one did before), and the
    model is not priced."""
    fail_if_called("opmap.serve.simulate")
    fail_if_called("opmap.serve.sim.simulate")
    fail_if_called("opmap.serve.model_cost.model_table_cost")
    refused("serve", "gpt2", *args, needle=needle)


# Finite but absurd: before, each ran and printed figures without a word (fixed:1e308: p99 TTFT inf ms; a rate of
# 1e300 requests/s, a WAIT_MS or an SLO of 1e308 taken as they are). The ceilings: opmap.validate.CEILINGS.
@pytest.mark.parametrize("args,needle", [
    (("--service-time", "fixed:1e308", "--policy", "none"),
     "service time 'fixed:1e308': MS must be a number > 0 and <= 86400000 ms (one day at most) (got 1e+308)"),
    (("--service-time", "exp:1e300", "--policy", "none"), "MS must be a number > 0 and <= 86400000 ms"),
    (("--service-time", "exp:0", "--policy", "none"), "MS must be a number > 0 and <= 86400000 ms (one day at most) "
                                                      "(got 0); accepted: fixed:MS, exp:MS"),
    (("--service-time", "fixed:10", "--policy", "dynamic:8,1e308"),
     "WAIT_MS must be a number from 0 to 86400000 ms (one day at most) (got 1e+308)"),
    (("--service-time", "fixed:10", "--policy", "none", "--arrival", "poisson:1e300"),
     "arrival 'poisson:1e300': RATE must be a number > 0 and <= 1000000 requests/s (got 1e+300)"),
    (("--service-time", "fixed:10", "--policy", "none", "--arrival", "gamma:1e300,2"),
     "RATE must be a number > 0 and <= 1000000 requests/s (got 1e+300)"),
    (("--slo-ttft", "1e308"), "--slo-ttft must be a number > 0 and <= 86400000 ms (one day at most) (got 1e+308)"),
    (("--slo-p99", "1e200"), "--slo-p99 must be a number > 0 and <= 86400000 ms (one day at most) (got 1e+200)"),
])
def test_serve_refuses_absurd_numbers_before_simulating(refused, fail_if_called, args, needle):
    fail_if_called("opmap.serve.summarize")
    fail_if_called("opmap.serve.model_cost.model_table_cost")
    refused("serve", "gpt2", "--requests", 50, "--no-store", *args, needle=needle)


def test_serve_refuses_a_hardware_peak_past_any_device(tmp_path, refused, fail_if_called):
    """The issue's case: a TOML whose bf16 peak is 1e308 priced a p99 TTFT of ~6e+293 ms (exit 0). The peak is
    now refused in one line naming the field, the value and the range (hardware.curves.MAX_FLOPS_PER_S)."""
    from opmap.hardware.spec import CATALOG_DIR

    text = (CATALOG_DIR / "h100-sxm.toml").read_text().split("\n[calibration]")[0]
    old = "[matrix_peak_flops_per_s.bf16]\nvalue = 989.4e12"
    assert old in text
    f = tmp_path / "fast.toml"
    f.write_text(text.replace(old, "[matrix_peak_flops_per_s.bf16]\nvalue = 1e308"))
    fail_if_called("opmap.serve.model_cost.model_table_cost")
    refused("serve", "gpt2", "--hardware", f, "--requests", 50, "--no-store",
            needle="matrix_peak_flops_per_s.bf16.value must be a number from 1000000 to 1e+18 FLOP/s (got 1e+308)")


# rich markup that does not balance, a clear-screen CSI, an OSC 8 hyperlink: each crashed or reached the terminal
EVIL = "m[/b]\x1b[2J\x1b]8;;http://evil\x1b\\x"


def test_serve_prints_user_strings_as_text(tmp_path, cli):
    """The model name (with --service-time it is only a label) and a trace file's path ("[" / "b]..." is a
    path holding "[/b]") are printed literally, with no escape byte reaching the terminal."""
    d = tmp_path / "[" / "b]\x1b[2J"
    d.mkdir(parents=True)
    trace = d / "t.jsonl"
    trace.write_text("".join(f'{{"arrival_s": {i * 0.1}, "input_len": 16, "output_len": 4}}\n' for i in range(20)))
    rc, out, err = cli("serve", EVIL, "--service-time", "fixed:10", "--policy", "none", "--arrival", f"trace:{trace}",
                       "--out", d / "out", "--no-store")
    assert rc == 0, err
    assert "\x1b" not in out + err
    # the folder written is named as it is, its escape visible (validate.visible), not removed
    assert "opmap serve m[/b]x on" in out and "trace:" in out and "/[/b]\\x1b[2J/out/serve.json" in out
    assert json.loads((d / "out" / "serve.json").read_text())["assumptions"]["model"] == EVIL  # kept as given


def test_serve_never_writes_through_a_link(tmp_path, cli):
    """Links at the final names and at the temporary name the PNG was once drawn to (latency_cdf.PID.tmp.png):
    every target is left as it was, the outputs are new regular files."""
    import os

    victims = {n: tmp_path / f"victim-{n}" for n in ("serve.json", "latency_cdf.png",
                                                     f"latency_cdf.{os.getpid()}.tmp.png")}
    out = tmp_path / "out"
    out.mkdir()
    for name, v in victims.items():
        v.write_text("secret\n")
        (out / name).symlink_to(v)
    rc, _, err = cli("serve", "gpt2", "--service-time", "fixed:10", "--policy", "none", "--requests", 50,
                     "--out", out, "--no-store")
    assert rc == 0, err
    assert all(v.read_bytes() == b"secret\n" for v in victims.values())
    assert not (out / "serve.json").is_symlink() and json.loads((out / "serve.json").read_text())["latency"]


def test_an_earlier_latency_cdf_never_stays_beside_a_new_serve_json(tmp_path, cli, monkeypatch):
    """The second run draws no PNG (matplotlib made unavailable, the failure imitated): the first run's
    latency_cdf.png goes in the same step as the new serve.json lands."""
    pytest.importorskip("matplotlib")
    import importlib.util

    args = ("serve", "gpt2", "--service-time", "fixed:10", "--policy", "none", "--requests", 50, "--out", tmp_path,
            "--no-store")
    assert cli(*args, "--arrival", "poisson:5")[0] == 0
    assert (tmp_path / "latency_cdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a))
    rc, out, err = cli(*args, "--arrival", "poisson:7")
    assert rc == 0, err
    assert "latency_cdf.png skipped" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["serve.json"]
    assert json.loads((tmp_path / "serve.json").read_text())["arrival"] == "poisson:7"


# -- traces a newcomer writes by hand: one line, exit 2, never a hang or a traceback -----------------------------

def test_a_nan_arrival_time_is_refused_not_simulated_forever(tmp_path):
    """Before: NaN sorted into the arrivals and the event loop never advanced (``serve`` hung). Run as a real
    process under a timeout, so that a regression fails here instead of hanging the suite."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import opmap

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": NaN, "input_len": 8, "output_len": 4}\n{"arrival_s": 1.0}\n')
    env = {**os.environ, "PYTHONPATH": str(Path(opmap.__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-m", "opmap.cli", "serve", "gpt2", "--arrival", f"trace:{trace}",
                        "--no-store"], capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
                       check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == (f"opmap: error: trace file '{trace}': row 1: arrival_s must be a number from 0 to "
                                "31536000 s (one year at most) (got nan)")


@pytest.mark.parametrize("content,needle", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "is not UTF-8 text (byte 0)"),  # before: UnicodeDecodeError
    (b"", "holds no requests (empty, or only comments)"),
    (b'{"arrival_s": 1e30}\n{"arrival_s": 2e30}\n',  # before: accepted, every latency reported as 0 s
     "row 1: arrival_s must be a number from 0 to 31536000 s (one year at most) (got 1e+30)"),
    (b'{"arrival_s": -5}\n', "row 1: arrival_s must be a number from 0 to 31536000 s (one year at most) (got -5)"),
])
def test_serve_refuses_bad_traces_in_one_line(tmp_path, refused, fail_if_called, content, needle):
    fail_if_called("opmap.serve.simulate")
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(content)
    refused("serve", "gpt2", "--arrival", f"trace:{trace}", "--no-store", needle=needle)


@pytest.mark.parametrize("path,what", [("/dev/zero", "is a device"), ("/etc", "is a folder")])
def test_a_trace_path_that_is_not_a_file_says_what_it_is(refused, fail_if_called, path, what):
    """Before: trace:/dev/zero and trace:/etc said "not found"."""
    fail_if_called("opmap.serve.simulate")
    refused("serve", "gpt2", "--arrival", f"trace:{path}", "--no-store",
            needle=f"trace file {path} {what}: expected a regular file; accepted: JSONL or CSV")


def test_requests_zero_with_a_trace_is_refused(tmp_path, refused):
    """Before: the trace was cut to 0 rows and the summary failed with an IndexError traceback."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0.5}\n')
    refused("serve", "gpt2", "--arrival", f"trace:{trace}", "--requests", "0", "--service-time", "fixed:10",
            "--policy", "none", "--no-store", needle="--requests must be an integer from 1 to 10000000 (got 0)")


def test_the_kv_assumption_names_the_engines_admission_rule():
    """serve.json's kv_cache assumption says what the policy does: engine pages and preempts by recompute;
    engine ``noevict`` (TensorRT-LLM's GUARANTEED_NO_EVICT) admits only what fits to the last token, so it never
    preempts; continuous reserves in full."""
    from opmap.cli.serve import _kv_words
    from opmap.serve import parse_policy

    assert "preemption by recompute" in _kv_words(parse_policy("engine"))
    noevict = _kv_words(parse_policy("engine:256,8192,16,noevict"))
    assert "GUARANTEED_NO_EVICT" in noevict and "no preemption" in noevict and "recompute" not in noevict
    assert _kv_words(parse_policy("continuous")).startswith("reserved in full")


@pytest.mark.parametrize("runtime", ["eager", "graphs", "engine", "engine-eager"])
@pytest.mark.parametrize("model", ["gpt2", "tiny"])
def test_serve_prints_the_runtime_line_the_analysis_prints(tmp_path, cli, model, runtime):
    """serve's runtime line is opmap.phases.runtime.Runtime.line, the analysis sheet's: under engine on an H100 it
    names the graph launch (15 us, ocannl issue 488) and the scheduler gap (160 us, vLLM PR 11133) apart; its own
    copy printed '175 us per step' and 'fusion eager' under graphs, where the sheet prints neither."""
    from pathlib import Path

    from opmap.hardware import get_hardware
    from opmap.phases.runtime import get_runtime

    target = str(Path(__file__).resolve().parents[2] / "examples" / "tiny-llama.json") if model == "tiny" else model
    rc, out, err = cli("serve", target, "--hardware", "h100-sxm", "--arrival", "poisson:20", "--requests", 20,
                       "--runtime", runtime, "--out", tmp_path)
    assert rc == 0, err
    line = get_runtime(get_hardware("h100-sxm"), runtime).line()
    assert " ".join(line.split()) in " ".join(out.split())  # rich wraps the console's lines
    if runtime == "engine":
        assert "(15 us)" in line and "160 us scheduler gap per step" in line
