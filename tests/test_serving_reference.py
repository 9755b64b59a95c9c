"""The published in-flight-batching table (benchmarks/serving_reference.py): every row well formed and sourced,
and the unit conversions checked by hand. Runs no opmap serve (that is the benchmark's job): seconds."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from opmap.errors import OpmapError
from opmap.hardware.spec import catalog
from opmap.workloads.zoo import MODELS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import serving_reference as sr  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COMMIT = re.compile(r"@ [0-9a-f]{40}\b")


def by_id(i: str) -> sr.Ref:
    return next(r for r in sr.REFS if r.id == i)


def test_at_least_30_rows_with_unique_ids():
    ids = [r.id for r in sr.REFS]
    assert len(ids) >= 30
    assert len(set(ids)) == len(ids)
    assert set(sr.QUICK) <= set(ids)
    assert set(sr.FIT) <= set(ids)


@pytest.mark.parametrize("ref", sr.REFS, ids=lambda r: r.id)
def test_row_is_sourced_and_runnable_by_opmap(ref: sr.Ref):
    # a source pinned to a commit (repository rows) or a URL (web pages)
    assert COMMIT.search(ref.source) or ref.source.startswith("https://")
    assert ref.value > 0 and ref.unit and ref.engine and ref.value_per in ("devices", "device")
    assert ref.hardware in catalog()
    if ref.model.startswith("hf:"):  # a model the zoo lacks, named by its hub id: runs once its config is cached
        assert "not in opmap's zoo" in ref.notes
    elif ref.model.startswith("examples/hf/"):  # a published config.json the repository holds (examples/hf/README.md)
        cfg = json.loads((ROOT / ref.model).read_text())
        assert ref.input_len + round(ref.output_len) <= cfg["max_position_embeddings"]
    else:
        assert ref.model in MODELS and MODELS[ref.model].kind == "text"
        # the prompt plus the generated tokens fit the model's context
        assert ref.input_len + round(ref.output_len) <= MODELS[ref.model].max_seq
    assert ref.scenario in ("offline", "server", "itl")
    assert ref.devices % (ref.tp * ref.pp) == 0  # the system holds whole replicas
    assert sr.role(ref) in ("held out", "fit")
    cmd = ref.command(Path("OUT"))
    assert cmd[:2] == ["serve", ref.model] and cmd[cmd.index("--tp") + 1] == str(ref.tp)
    if ref.scenario == "server":
        assert ref.slo_ttft_ms and ref.slo_tpot_ms and "--find-capacity" in cmd
        assert cmd[cmd.index("--arrival") + 1].startswith("poisson:")
    elif ref.scenario == "itl":
        assert cmd[cmd.index("--arrival") + 1] == f"poisson:{ref.rate_per_s:g}"
    else:
        assert cmd[cmd.index("--arrival") + 1] == "offline"


def test_per_device_conversion_by_hand():
    # MLPerf v4.1 DGX-H100 llama2-70b-99.9 Offline: 24524.9 tokens/s for the 8-GPU system -> 3065.6125 per GPU;
    # mean output = 24524.9 tokens/s / 84.4792 samples/s = 290.31 tokens
    m = by_id("mlperf41-h100x8-offline")
    assert m.published_per_device == pytest.approx(24524.9 / 8) == pytest.approx(3065.6125)
    assert m.output_len == pytest.approx(290.31)
    # TensorRT-LLM v0.17: 70B FP8 on H100 at TP2, 1000/1000: 4390.53 tokens/s for the TP group -> 2195.265 per GPU
    t = by_id("trt17-70b-h100-tp2-1000-1000")
    assert t.published_per_device == pytest.approx(2195.265)


def test_predicted_per_device_from_serve_json_by_hand():
    # Offline: one TP2 replica producing 3000 output tok/s is 1500 per GPU; against 2195.265 published: 0.6833
    t = by_id("trt17-70b-h100-tp2-1000-1000")
    pred, _ = sr.predicted(t, {"throughput": {"output_tokens_per_s": 3000.0}})
    assert pred == pytest.approx(1500.0)
    assert sr.ratio(t, pred) == pytest.approx(1500.0 / 2195.265)
    # Server: capacity 10 req/s per TP2 replica x 290 output tokens (290.32 rounded) / 2 GPUs = 1450 tok/s per GPU
    s = by_id("mlperf41-h100x8-server")
    pred, _ = sr.predicted(s, {"capacity": {"rate_per_s": 10.0}})
    assert pred == pytest.approx(1450.0)
    # ITL: published 11 ms mean, predicted 22 ms: opmap twice as slow -> ratio 0.5 (speed, not time)
    i = by_id("trt14-8b-h100-467-256-q16")
    pred, _ = sr.predicted(i, {"latency": {"itl": {"mean_s": 0.022}, "tpot": {"mean_s": 0.022}}})
    assert sr.ratio(i, pred) == pytest.approx(0.5)


def test_summary_counts_band_and_mean_absolute_error():
    rows = [{"role": "held out", "status": "ok", "ratio": r, "in_band": sr.BAND[0] <= r <= sr.BAND[1]}
            for r in (0.5, 1.0, 1.2)]
    rows.append({"role": "held out", "status": "not runnable: opmap: error: No such option: --pp"})
    rows.append({"role": "fit", "status": "ok", "ratio": 3.0, "in_band": False})
    s = sr.summary(rows)
    assert (s["held_out"], s["runnable"], s["not_runnable"], s["in_band"]) == (4, 3, 1, 2)
    assert s["mean_abs_error"] == pytest.approx((0.5 + 0.0 + 0.2) / 3)
    assert s["pass"] is False and s["pass_runnable"] is False  # 2 of 3 that ran in band: 67% < 85%
    ran = [{"role": "held out", "status": "ok", "ratio": r, "in_band": True} for r in (0.9, 1.0, 1.1)]
    s = sr.summary([*ran, {"role": "held out", "status": "not runnable: opmap: error: unknown dtype 'nvfp4'"}])
    assert s["pass"] is False and s["pass_runnable"] is True  # MAE (0.1 + 0 + 0.1) / 3 = 6.7%, all in band


def test_error_line_names_the_refused_flag():
    typer = ("Usage: python -m opmap.cli serve [OPTIONS] MODEL\nTry 'python -m opmap.cli serve --help' for help.\n"
             "╭─ Error ──────────╮\n│ No such option: --runtime                      │\n╰──────────────────╯\n")
    assert sr.error_line(typer) == "No such option: --runtime"
    assert sr.error_line("opmap: error: --kv-dtype takes bf16, fp16, fp8 or int8, got 'x'\n") == (
        "opmap: error: --kv-dtype takes bf16, fp16, fp8 or int8, got 'x'")


def test_rows_option_refuses_unknown_ids():
    with pytest.raises(SystemExit, match="unknown row id"):
        sr.select("no-such-row", False)
    assert [r.id for r in sr.select(None, True)] == list(sr.QUICK)


def test_trtllm_bench_engine_setting_by_hand():
    """trtllm-bench's heuristic (tensorrt_llm/bench/build/tuning.py), worked by hand.
    Llama 3.1 8B, FP8 weights and KV, one H100 (80 GiB), 128/128: engine 8.03e9 / 2^30 = 7.4785 GiB; cache
    (80 - 7.4785) x 0.95 = 68.895 GiB; KV per token 2 x 32 layers x 8 heads x 128 x 1 B = 65536 B; requests
    68.895 GiB / (65536 B x 256) = 4409 -> raw batch min(4409, 4096) = 4096 -> 256 x ceil(4096 / 256) = 4096;
    tokens min(4096 x 2, 32768) = 8192 -> 1024 x ceil(8192 / 1024) = 8192.
    Llama 3.1 70B, FP8, two H200 (141 GiB each), 128/2048: engine 65.75 GiB; cache (282 - 65.75) x 0.95 =
    205.44 GiB; KV per token 2 x 80 x 8 x 128 = 163840 B; requests 205.44 GiB / (163840 B x 2176) = 618.7 ->
    128 x ceil(618.7 / 128) = 640; tokens 618.7 x (1 + 128 / 2048) = 657 -> at least 2048."""
    assert sr.trtllm_bench_setting("llama-3-8b", "h100-sxm", 1, 1, 128, 128, 1.0, 1.0) == (4096, 8192)
    assert sr.trtllm_bench_setting("llama-3-70b", "h200", 2, 1, 128, 2048, 1.0, 1.0) == (640, 2048)
    # the KV pool as a fraction of the device: 0.95 of the free memory = 0.95 + 0.05 x 7.4785 / 80 of it
    u = sr.free_fraction_as_utilization("llama-3-8b", "h100-sxm", 1, 1, 1.0, 0.95)
    assert u == pytest.approx(0.95 + 0.05 * 8.03e9 / 2**30 / 80) == pytest.approx(0.954674, abs=1e-6)
    ref = by_id("trt17-8b-h100-128-128")
    cmd = ref.command(Path("OUT"))  # the trtllm-bench preset sizes it from the run (tests/engines/test_engine_rules.py)
    assert cmd[cmd.index("--engine-preset") + 1] == "trtllm-bench@1.0" and "--policy" not in cmd
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.95" and "--chunked-prefill" in cmd
    assert ref.requests == 30000


def test_every_row_comes_from_a_table_and_names_its_source():
    tables = {p.stem for p in sr.SERVING_TABLES.glob("*.csv") if p.name not in sr.SIDE_TABLES}
    assert {r.table for r in sr.REFS} == tables  # every table file holds rows, every row names its table
    for r in sr.REFS:
        assert r.source.strip() and r.table


def _write(tmp_path: Path, header: str, row: str) -> Path:
    (tmp_path / "t.csv").write_text(header + "\n" + row + "\n")
    return tmp_path


GOOD = ("id,recipe,scenario,published_model,model,hardware,devices,tp,dtype,input_len,output_len,value,unit,engine,"
        "flags,source")
ROW = "x,given,offline,Llama,llama-3-8b,h100-sxm,1,1,fp8,128,128,{value},tok/s,vLLM,--runtime=engine,{source}"


def test_loader_reads_a_well_formed_row(tmp_path):
    refs = sr.load_refs(_write(tmp_path, GOOD, ROW.format(value="1000.5", source="https://example.org/t")))
    assert len(refs) == 1 and refs[0].value == 1000.5 and refs[0].table == "t"
    assert refs[0].flags == {"--runtime": "engine"} and refs[0].pp == 1 and refs[0].role == "held out"


@pytest.mark.parametrize("header,row,message", [
    (GOOD + ",colour", ROW.format(value="1", source="s") + ",red", r"t\.csv: unknown column\(s\) 'colour'"),
    (GOOD, ROW.format(value="12k", source="s"), r"t\.csv line 2: column 'value' must be a number, got '12k'"),
    (GOOD, ROW.format(value="nan", source="s"), r"column 'value' must be a number"),
    (GOOD, ROW.format(value="1", source=""), r"t\.csv line 2: column 'source' is empty"),
    (GOOD.replace(",source", ""), ROW.format(value="1", source="s").rsplit(",", 1)[0],
     r"must include 'source'|required column\(s\) source missing"),
    (GOOD, ROW.format(value="1", source="s").replace("given", "guess"), r"recipe 'guess' unknown; accepted: "),
    (GOOD, ROW.format(value="1", source="s").replace("--runtime=engine", "runtime=engine"),
     r"column 'flags' must be a valid value, got 'runtime=engine'"),
    (GOOD, ROW.format(value="1", source="s") + ",extra", r"more cell\(s\) than the header"),
])
def test_loader_refuses_a_malformed_row_in_one_line(tmp_path, header, row, message):
    with pytest.raises(OpmapError, match=message) as e:
        sr.load_refs(_write(tmp_path, header, row))
    assert "\n" not in str(e.value)


def test_loader_refuses_a_repeated_id(tmp_path):
    (tmp_path / "a.csv").write_text(GOOD + "\n" + ROW.format(value="1", source="s") + "\n")
    (tmp_path / "b.csv").write_text(GOOD + "\n" + ROW.format(value="2", source="s") + "\n")
    with pytest.raises(OpmapError, match=r"b\.csv: id 'x' is also in a\.csv"):
        sr.load_refs(tmp_path)


def test_per_gpu_figures_and_engine_built_for_another_data_set_by_hand():
    # TensorRT-LLM's developer-guide table prints output tokens/s per GPU: DeepSeek R1 on 4 B200 (DEP4), 6,463 per
    # GPU, is 6,463 per device, not 6,463 / 4
    assert by_id("trtdg-deepseek-r1-b200-dep4-1000-1000").published_per_device == 6463
    # Azure's GB200 runs build one engine for the longest data set (2048/2048) at trtllm-bench build's default KV
    # fraction 0.95, then run at 0.83: Llama 3.1 8B FP8 on one GB200 (186 GiB): engine 8.03e9 / 2^30 = 7.4785 GiB;
    # cache (186 - 7.4785) x 0.95 = 169.595 GiB; KV 65,536 B a token x 4096 = 0.25 GiB a request: 678.4 requests ->
    # 128 x ceil(678.4 / 128) = 768; tokens 678.4 x 2 = 1356.8 -> at least 2048; the run's KV 0.83 of the free memory
    # (the trtllm-bench preset's sense of --gpu-memory-utilization)
    ref = by_id("azgb200-8b-tp1-128-128")
    cmd = ref.command(Path("OUT"))
    assert cmd[cmd.index("--engine-preset") + 1] == "trtllm-bench@1.0"
    assert (cmd[cmd.index("--max-num-seqs") + 1], cmd[cmd.index("--max-num-batched-tokens") + 1]) == ("768", "2048")
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.83"
    assert ref.requests == 1000 and ref.published_per_device == 41058


def test_mlperf_v40_rows_by_hand():
    # MLPerf v4.0 DGX-H100 llama2-70b-99.9 Offline: 21805.8 tokens/s for 8 GPUs -> 2725.725 per GPU; mean output
    # 21805.8 / 74.699 samples/s = 291.92 tokens; engine: batch 896 (Offline config), max_num_tokens 16384 (the v4.0
    # builder's), KV blocks of 128, no chunked context
    m = by_id("mlperf40-h100x8-offline")
    assert m.published_per_device == pytest.approx(2725.725) and m.output_len == pytest.approx(291.92)
    cmd = m.command(Path("OUT"))
    assert cmd[cmd.index("--policy") + 1] == "engine:896,16384,128,nochunk" and cmd[cmd.index("--tp") + 1] == "2"
    # v4.0 H200 (TP1 x 8) Server: 26485.43 completed tokens/s -> 3310.67875 per GPU, batch 896 (Server config)
    s = by_id("mlperf40-h200x8-server")
    assert s.published_per_device == pytest.approx(3310.67875)
    assert (s.tp, s.slo_ttft_ms, s.slo_tpot_ms) == (1, 2000, 200)
    cmd = s.command(Path("OUT"))
    assert cmd[cmd.index("--policy") + 1] == "engine:896,16384,128,nochunk"


def _mlperf_rows() -> dict[str, dict]:
    rows = sr.read_tables(sr.SERVING_TABLES, sr.COLUMNS, skip=sr.SIDE_TABLES)
    return {r["id"]: r for r in rows if r["table"].startswith("mlperf_inference_")}


def test_server_latency_table_matches_the_server_rows():
    lat = sr.load_server_latency(sr.REFS)
    rows = _mlperf_rows()
    assert {x.id for x in lat} == {i for i, r in rows.items() if r["scenario"] == "server"}
    for x in lat:
        assert COMMIT.search(x.source) and x.source.endswith("/Server/performance/run_1/mlperf_log_summary.txt")
        assert x.source.split(" ")[0] == rows[x.id]["source"].split(" ")[0]  # same results repository
        assert x.completed_per_s == rows[x.id]["samples_per_s"]  # the summary's 'Completed samples per second'
        assert x.scheduled_per_s >= x.completed_per_s
        assert x.ttft_p50_ms <= x.ttft_p90_ms <= x.ttft_p99_ms < 2000  # VALID runs: p99 within the SLO
        assert x.tpot_p50_ms <= x.tpot_p90_ms <= x.tpot_p99_ms < 200
    # v4.0 DGX-H100 Server summary: 50th percentile first token latency 381546051 ns = 381.546051 ms; 99th percentile
    # time to output token 156076924 ns = 156.076924 ms; mean latency 40055013686 ns = 40.055013686 s
    h = next(x for x in lat if x.id == "mlperf40-h100x8-server")
    assert (h.ttft_p50_ms, h.tpot_p99_ms, h.mean_latency_s) == (381.546051, 156.076924, 40.055013686)


def test_server_latency_loader_refuses_a_wrong_anchor(tmp_path):
    good = (sr.SERVING_TABLES / sr.LATENCY_TABLE).read_text().splitlines()
    bad = good[1].replace("mlperf40-h100x8-offline", "mlperf40-h200x8-offline", 1)
    (tmp_path / sr.LATENCY_TABLE).write_text(good[0] + "\n" + bad + "\n")
    with pytest.raises(OpmapError, match=r"anchor 'mlperf40-h200x8-offline' must name an offline row of the same"):
        sr.load_server_latency(sr.REFS, tmp_path)
    (tmp_path / sr.LATENCY_TABLE).write_text(good[0] + "\n" + good[1].replace("-server,", "-offline,", 1) + "\n")
    with pytest.raises(OpmapError, match=r"id must name a server row"):
        sr.load_server_latency(sr.REFS, tmp_path)


def test_dep_rows_run_serve_with_dp_attention():
    """TensorRT-LLM's DEPn columns (enable_attention_dp, experts over n GPUs) run as serve --tp n --ep n
    --dp-attention: n attention ranks of one GPU, not tensor-parallel attention."""
    dep = [r for r in sr.REFS if r.notes.startswith("DEP")]
    assert len(dep) >= 40
    for r in dep:
        cmd = r.command(Path("OUT"))
        n = int(re.match(r"DEP(\d+)", r.notes).group(1))
        assert cmd[cmd.index("--tp") + 1] == cmd[cmd.index("--ep") + 1] == str(n) == str(r.tp), r.id
        assert "--dp-attention" in cmd and "simulates DP attention" in r.notes, r.id


def test_rocm_blog_mi355x_rows_by_hand():
    # ROCm blog w4a6-quant-mm (26 Jun 2026), Llama-3.1-8B on one MI355X, vllm bench throughput, sonnet 1024/128:
    # the mean prompt is (total - output tokens/s) / requests/s, not the command's 1024: bf16 (65725 - 7878) / 61.5 =
    # 940.6, fp8 (83253 - 9979) / 78.0 = 939.4, mxfp4 (87460 - 10483) / 81.9 = 939.9; output 7878 / 61.5 = 128.1
    for fmt, total, out, rps in (("bf16", 65725, 7878, 61.5), ("fp8", 83253, 9979, 78.0),
                                 ("mxfp4", 87460, 10483, 81.9)):
        ref = by_id(f"rocm-w4a6-8b-mi355x-{fmt}")
        assert ref.input_len == round((total - out) / rps, -1) == 940 and round(out / rps) == ref.output_len == 128
        assert ref.published_per_device == out and (ref.dtype, ref.devices, ref.requests) == (fmt, 1, 16384)
        cmd = ref.command(Path("OUT"))  # vLLM's LLM class: the preset's offline sizes (1024 sequences, 16384 tokens)
        assert cmd[cmd.index("--engine-preset") + 1] == "vllm@0.11" and "--max-num-batched-tokens" not in cmd
        assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.85"
    # vllm bench serve, 500 random 1024/128 prompts at rate inf against vllm serve (OPENAI_API_SERVER: 8192 tokens)
    s = by_id("rocm-w4a6-8b-mi355x-serve-mxfp4")
    cmd = s.command(Path("OUT"))
    assert (s.input_len, s.output_len, s.requests, s.published_per_device) == (1024, 128, 500, 5764)
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "8192" and cmd[cmd.index("--arrival") + 1] == "offline"


def test_gpt_oss_rows_run_mxfp4_and_the_build_defaults():
    """gpt-oss's checkpoint is MXFP4 experts on every device (openai/gpt-oss-*: quant_method mxfp4; the page's own
    llm_options run it with the TRITON MoE backend and KV 'auto' on Hopper, and list it in neither its FP4 nor its FP8
    ModelOpt models): Hopper rows --dtype mxfp4 (W4A16_MXFP4, tensorrt_llm/_torch/model_config.py
    get_mxfp4_quant_algo), Blackwell rows w4a8-mxfp4 (W4A8_MXFP4_MXFP8). Neither quant_algo is in build.py's
    TUNED_QUANTS, so trtllm-bench sizes them with BuildConfig's 2048 / 8192, the preset's own (no --max-num-seqs);
    a row whose engine was built for another data set takes the same defaults."""
    rows = [r for r in sr.REFS if r.id.startswith("trtdg-gpt-oss")]
    assert len(rows) == 44
    for r in rows:
        cmd = r.command(Path("OUT"))
        want = "mxfp4" if r.hardware in ("h100-sxm", "h200") else "w4a8-mxfp4"
        assert cmd[cmd.index("--dtype") + 1] == want and "--max-num-seqs" not in cmd, r.id
        assert ("--kv-dtype" in cmd) == (want == "w4a8-mxfp4"), r.id  # KV fp8 on Blackwell, auto (bf16) on Hopper
    ref = {"sizing_input_len": 2048, "sizing_output_len": 2048, "output_len": 2048.0, "requests": 1000}
    flags, _ = sr._trt_engine(ref, None, 2.0, 0.95)  # None: no bytes per weight, the heuristic does not run
    assert (flags["--max-num-seqs"], flags["--max-num-batched-tokens"]) == ("2048", "8192")
