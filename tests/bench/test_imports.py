"""``opmap bench --from FILE``: other tools' result files read into the bench record and run store
(opmap.bench.imports). Formats tested: AIPerf from the file the real tool writes (run here against the launched
transformers serve); vLLM, GuideLLM and inference-perf from files written by hand from the field lists of the code
that writes them (tests/bench/data, each format's source in opmap.bench.imports), with their figures computed
below by formula."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).resolve().parent / "data"


def _body(opmap_cli, tmp_path, name, *extra):
    out = tmp_path / "out"
    rc, so, se = opmap_cli("bench", "--from", DATA / name, "--out", out, "--store", tmp_path / "s.duckdb", *extra)
    assert rc == 0, so + se
    return json.loads((out / "bench.json").read_text()), so


def test_vllm_detailed_per_request(opmap_cli, tmp_path):
    """--save-detailed lists: per-request figures by formula. The fixture's 4 ok requests: TTFT 0.1..0.4 s and 3
    ITLs each, so e2e = TTFT + sum(ITL) = 0.16, 0.29, 0.42, 0.55 s and TPOT = sum(ITL) / 3 = 0.02..0.05 s; numpy's
    linear percentiles of those (as vLLM's own np.percentile)."""
    body, out = _body(opmap_cli, tmp_path, "vllm_serve_detailed.json")
    assert body["imported"]["granularity"] == "per-request" and body["imported"]["tool"] == "vllm bench serve"
    ttft, e2e = np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.16, 0.29, 0.42, 0.55])
    lat = body["latency"]
    for m, x in (("ttft", ttft), ("e2e", e2e), ("tpot", (e2e - ttft) / 3)):
        assert lat[m]["p50_s"] == pytest.approx(np.percentile(x, 50))
        assert lat[m]["p99_s"] == pytest.approx(np.percentile(x, 99))
        assert lat[m]["mean_s"] == pytest.approx(x.mean())
    assert body["requests"]["measured"] == 5 and body["requests"]["ok"] == 4 and body["errors"]["http_error"] == 1
    assert body["throughput"]["requests_per_s"] == 2.0  # the file's: 4 completed over its 2.0 s duration
    assert len(body["samples"]["ttft_s"]) == 4
    # the file's own summary (computed by vLLM from the same lists) agrees
    d = json.loads((DATA / "vllm_serve_detailed.json").read_text())
    assert lat["e2e"]["p99_s"] == pytest.approx(d["p99_e2el_ms"] / 1e3, rel=1e-3)


def test_vllm_percentiles_only(opmap_cli, tmp_path):
    body, _ = _body(opmap_cli, tmp_path, "vllm_serve.json")
    d = json.loads((DATA / "vllm_serve.json").read_text())
    assert body["imported"]["granularity"] == "percentiles"
    assert body["latency"]["ttft"]["p99_s"] == pytest.approx(d["p99_ttft_ms"] / 1e3)
    assert body["latency"]["itl"]["p50_s"] == pytest.approx(d["median_itl_ms"] / 1e3)
    assert body["latency"]["ttft"]["p95_s"] is None  # not in the file: not made up
    assert body["samples"]["ttft_s"] == []
    assert body["spec"]["concurrency"] == 2 and body["spec"]["arrival"] is None  # max_concurrency 2, rate inf


def _keys(d, at=""):
    """Every key path of a bench.json body, values apart (errors and error_examples: maps of the kinds seen)."""
    if not isinstance(d, dict) or at in ("/errors", "/error_examples"):
        return {at}
    return {at} | {p for k, v in d.items() for p in _keys(v, f"{at}/{k}")}


def test_percentiles_only_figures_typed_and_shaped_as_measured(tmp_path):
    """A percentiles-only import is a BenchFigures whose bench.json has the keys of a per-request one (the same
    tool, vllm_serve.json against vllm_serve_detailed.json): what the tool did not report is None, never absent;
    its rates are the file's (request_throughput, output_throughput); its failures one count (the kinds are not
    in the file): num_prompts - completed."""
    from opmap.bench import imports
    from opmap.bench.import_formats import read_result
    from opmap.bench.metrics import BenchFigures
    from opmap.record import record

    figs = {n: imports.figures(read_result(DATA / n, None, 0), 600.0, 1)
            for n in ("vllm_serve.json", "vllm_serve_detailed.json")}
    assert all(isinstance(f, BenchFigures) for f in figs.values())
    pct, per = figs["vllm_serve.json"], figs["vllm_serve_detailed.json"]
    assert _keys(record(pct)) == _keys(record(per))
    d = json.loads((DATA / "vllm_serve.json").read_text())
    assert pct.throughput.requests_per_s == pytest.approx(d["request_throughput"])
    assert pct.throughput.output_tokens_per_s == pytest.approx(d["output_throughput"])
    assert record(pct)["cdf"]["ttft_s"] is None and pct.latency.ttft.p95_s is None
    assert not pct.all_failed and pct.requests.failed == d["num_prompts"] - d["completed"]
    assert record(pct)["errors"] == {"failed": d["num_prompts"] - d["completed"]}


@pytest.mark.parametrize("name, tool, ttft_p99_s, e2e_p50_s, rps", [
    ("guidellm_report.json", "GuideLLM", 0.120, 0.95, 4.0),  # ms fields / 1e3; request_latency in s
    ("inference_perf_stage_0_lifecycle_metrics.json", "inference-perf", 0.110, 0.9, 2.0)])  # all in s
def test_documented_formats(opmap_cli, tmp_path, name, tool, ttft_p99_s, e2e_p50_s, rps):
    body, _ = _body(opmap_cli, tmp_path, name)
    assert body["imported"]["tool"] == tool and body["imported"]["granularity"] == "percentiles"
    assert body["latency"]["ttft"]["p99_s"] == pytest.approx(ttft_p99_s)
    assert body["latency"]["e2e"]["p50_s"] == pytest.approx(e2e_p50_s)
    assert body["throughput"]["requests_per_s"] == pytest.approx(rps)


@pytest.mark.parametrize("name", ["vllm_serve_detailed.json", "vllm_serve.json", "guidellm_report.json",
                                  "inference_perf_stage_0_lifecycle_metrics.json"])
def test_store_round_trip_and_consumers(opmap_cli, tmp_path, name):
    """An imported run is a bench run: runs show, compare (with another import of the same file), report and
    memo work on it, per-request or percentiles only."""
    store = tmp_path / "s.duckdb"
    ids = []
    for _ in range(2):
        rc, so, se = opmap_cli("bench", "--from", DATA / name, "--store", store)
        assert rc == 0, so + se
        ids.append(so.split("recorded as run ")[1].split()[0])
    rc, so, se = opmap_cli("runs", "show", ids[0], "--store", store)
    tool = {"v": "vllm bench serve", "g": "GuideLLM", "i": "inference-perf"}[name[0]]
    assert rc == 0 and f"client_version: {tool}" in so + se
    rc, so, se = opmap_cli("compare", ids[0], ids[1], "--store", store)
    assert rc == 0, so + se  # the same file twice: no regression
    rc, so, se = opmap_cli("report", ids[0], "--store", store, "--out", tmp_path / "r.html")
    assert rc == 0, so + se
    assert (tmp_path / "r.html").stat().st_size > 0
    rc, so, se = opmap_cli("memo", ids[0], "--store", store, "--out", tmp_path / "memo")
    assert rc == 0, so + se


@pytest.mark.parametrize("content, why", [
    ("{not json", "is not JSON"), ('{"hello": 1}', "not a result file of a known tool"),
    ("[" * 100 + "]" * 100, "nests deeper"), ('{"completed": 1, "duration": "x", "request_throughput": 1, '
                                             '"backend": "vllm"}', "duration")])
def test_bad_files(opmap_cli, tmp_path, content, why):
    p = tmp_path / "f.json"
    p.write_text(content)
    rc, so, se = opmap_cli("bench", "--from", p, "--no-store")
    assert rc == 2 and why in so + se and "Traceback" not in so + se


def test_format_mismatch_and_sources(opmap_cli, tmp_path):
    rc, so, se = opmap_cli("bench", "--from", DATA / "vllm_serve.json", "--format", "aiperf", "--no-store")
    assert rc == 2 and "--format vllm" in so + se
    rc, so, se = opmap_cli("bench", "http://x:8000", "--model", "m", "--from", DATA / "vllm_serve.json")
    assert rc == 2 and "one of them" in so + se


@pytest.mark.parametrize("model", ["hf", "gpt2"])
def test_predict_joins(opmap_cli, tmp_path, tiny_config, model):
    """--predict on an imported file: the file's figures beside a simulation of its load (a Hugging Face config
    or a zoo model, a catalog device), recorded as a serve run."""
    body, so = _body(opmap_cli, tmp_path, "vllm_serve.json", "--predict", "--config",
                     tiny_config if model == "hf" else model, "--hardware", "h100-sxm")
    doc = json.loads((tmp_path / "out" / "bench_predict.json").read_text())
    assert doc["workload"]["requests"] == 4 and doc["workload"]["mode"] == "closed"
    rows = {(r["metric"], r["stat"]): r for r in doc["predictions"]["model"]["rows"]}
    assert rows[("ttft", "p99")]["measured"] == pytest.approx(0.397)
    assert rows[("ttft", "p99")]["predicted"] > 0


def test_aiperf_real(server, tmp_path, opmap_cli):
    """AIPerf run for real against the launched server, its artifact folder imported: per-request records whose
    TTFT agrees with AIPerf's own summary (the same definition), and whose e2e is opmap's (send to the stream's
    end: request_end_ns - request_start_ns of each JSONL record; AIPerf's request_latency stops at the last
    response chunk, up to a few ms earlier)."""
    import external_tools as et

    why = et.missing("aiperf")
    if why:
        pytest.skip(why)
    art = et.run_aiperf(server, tmp_path)
    out = tmp_path / "out"
    rc, so, se = opmap_cli("bench", "--from", art, "--out", out, "--store", tmp_path / "s.duckdb")
    assert rc == 0, so + se
    body = json.loads((out / "bench.json").read_text())
    summ = json.loads((art / "profile_export_aiperf.json").read_text())
    assert body["imported"]["granularity"] == "per-request"
    assert body["requests"]["ok"] == et.REQUESTS and body["spec"]["concurrency"] == et.CONCURRENCY
    assert body["latency"]["ttft"]["mean_s"] == pytest.approx(summ["time_to_first_token"]["avg"] / 1e3, rel=1e-6)
    assert body["latency"]["ttft"]["p50_s"] == pytest.approx(summ["time_to_first_token"]["p50"] / 1e3, rel=1e-6)
    rows = [json.loads(x)["metadata"] for x in (art / "profile_export.jsonl").read_text().splitlines() if x.strip()]
    e2e = np.array([(r["request_end_ns"] - r["request_start_ns"]) / 1e9 for r in rows])
    # opmap's end is the later of request_end_ns and the last chunk (first token + AIPerf's inter-chunk gaps, ms
    # floats off its own perf counter): that sum can overrun request_end_ns by a fraction of a microsecond (seen in
    # CI: 144 ns), so the check allows 1 us, a thousandth of a millisecond, far below any latency this run measures.
    assert body["latency"]["e2e"]["p99_s"] == pytest.approx(np.percentile(e2e, 99), abs=1e-6)
    assert body["latency"]["e2e"]["p50_s"] >= summ["request_latency"]["p50"] / 1e3 - 1e-9
    assert body["usage_check"]["implausible"] == 0


def test_inference_perf_real(server, tmp_path, opmap_cli):
    """inference-perf run for real (through DropField: it sends ignore_eos, which transformers serve refuses), its
    report folder imported: its per-request report's records, whose TTFT and end-to-end latency agree with its own
    summary report (the same requests: TTFT = first token - start, latency = end - start)."""
    import external_tools as et

    why = et.missing("inference-perf")
    if why:
        pytest.skip(why)
    rep = et.run_inference_perf(server, tmp_path)
    out = tmp_path / "out"
    store = tmp_path / "s.duckdb"
    rc, so, se = opmap_cli("bench", "--from", rep, "--out", out, "--store", store)
    assert rc == 0, so + se
    body = json.loads((out / "bench.json").read_text())
    own = json.loads((rep / "summary_lifecycle_metrics.json").read_text())["successes"]["latency"]
    assert body["imported"]["granularity"] == "per-request" and body["requests"]["ok"] == et.REQUESTS
    assert body["spec"]["concurrency"] == et.CONCURRENCY
    for ours, theirs in (("ttft", "time_to_first_token"), ("e2e", "request_latency")):
        assert body["latency"][ours]["mean_s"] == pytest.approx(own[theirs]["mean"], rel=1e-6)
        assert body["latency"][ours]["p50_s"] == pytest.approx(own[theirs]["median"], rel=1e-6)
    rc, so, se = opmap_cli("bench", "--from", rep / "summary_lifecycle_metrics.json", "--store", store)
    assert rc == 0, so + se  # its summary alone: the percentiles
    rid = so.split("recorded as run ")[1].split()[0]
    rc, so, se = opmap_cli("memo", rid, "--store", store, "--out", tmp_path / "memo")
    assert rc == 0, so + se


def test_guidellm_real(server, tmp_path, opmap_cli):
    """GuideLLM run for real (a JSON Lines prompt file; through DropField: it sends ignore_eos), its JSON report
    imported: the requests it kept (all of them here) as records, whose TTFT and latency means agree with its own
    (means: GuideLLM's percentiles are not numpy's linear ones)."""
    import external_tools as et

    why = et.missing("guidellm")
    if why:
        pytest.skip(why)
    rep = et.run_guidellm(server, tmp_path)
    out = tmp_path / "out"
    rc, so, se = opmap_cli("bench", "--from", rep, "--out", out, "--store", tmp_path / "s.duckdb")
    assert rc == 0, so + se
    body = json.loads((out / "bench.json").read_text())
    m = json.loads(rep.read_text())["benchmarks"][0]["metrics"]
    assert body["imported"]["granularity"] == "per-request" and body["requests"]["ok"] == et.REQUESTS
    assert body["spec"]["concurrency"] == et.CONCURRENCY and body["endpoint"]["model"] == server.model_id
    assert body["latency"]["ttft"]["mean_s"] == pytest.approx(m["time_to_first_token_ms"]["successful"]["mean"]
                                                              / 1e3, rel=1e-6)
    assert body["latency"]["e2e"]["mean_s"] == pytest.approx(m["request_latency"]["successful"]["mean"], rel=1e-6)
    assert body["latency"]["itl"]["p50_s"] == pytest.approx(
        m["inter_token_latency_ms"]["successful"]["percentiles"]["p50"] / 1e3)
