"""Published in-flight-batching serving results beside ``opmap serve``'s predictions (issue 20).

Each ``Ref`` is one published figure, exactly as printed, with its unit, workload (model, precision, lengths,
scenario, SLO), system (accelerator, count, TP/PP), engine and source (repository + path + commit, or URL). The rows
are data: one CSV per source in benchmarks/reference/serving/ (its README lists the columns and the sources), read
by ``load_refs`` (benchmarks/tables.py: parsed with csv, an unknown column or a bad number refused in one line); a
row's ``recipe`` names how its engine settings become opmap flags (``RECIPES``).
The runner turns each into an ``opmap serve`` command, runs it as a subprocess (``python -m opmap.cli`` with this
checkout's ``src`` first on the path), reads serve.json and prints predicted / published per device.

Kinds of row (``scenario``):
- ``offline``: output tokens/s under an unbounded queue (trtllm-bench throughput, vLLM benchmark_throughput,
  MLPerf Offline). Predicted: serve.json ``throughput.output_tokens_per_s`` of one replica (``--arrival
  offline``) / (tp x pp). Published: the figure / the accelerators that produced it (the TP group for
  TensorRT-LLM's tables, the whole system for MLPerf).
- ``server``: MLPerf Server, the highest Poisson rate meeting p99 TTFT / TPOT. Predicted: serve.json
  ``capacity.rate_per_s`` (``--find-capacity`` with the scenario's SLO) x mean output tokens / (tp x pp).
- ``itl``: mean inter-token latency at a fixed Poisson rate (TensorRT-LLM's online serving table). Predicted:
  serve.json ``latency.itl.mean_s``.

ratio = predicted speed / published speed: throughput rows predicted / published, latency rows published /
predicted; > 1 means opmap predicts faster than was measured. Band (issue 20): 0.75-1.33. A row whose figure set a
catalog or runtime value is ``fit`` and kept out of the verdict (``ROLES``).

Flags the CLI does not accept yet (``--runtime``, ``--kv-dtype``, ``--max-num-seqs``, ``--pp``, ...): the row is
reported "not runnable: <opmap's error line>", or, with ``--drop-missing-flags``, run without them (listed per row).

Run:  .venv/bin/python benchmarks/serving_reference.py [--quick | --rows ID,ID] [--jobs 2] [--drop-missing-flags]
Writes benchmarks/results/serving_reference.json (a --rows / --quick run: serving_reference_subset.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO / "src") not in sys.path:  # this checkout's opmap (its catalog sizes the engines), not an installed one
    sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(HERE))
from opmap.errors import OpmapError  # noqa: E402
from tables import Column, read_table, read_tables  # noqa: E402
from tables import flags as table_flags  # noqa: E402

BAND = (0.75, 1.33)
SCHEMA_VERSION = 1
SERVER_START_RATE = 1.0  # requests/s where --find-capacity's grid starts (it spans x1/8..x16 and moves from there)

# The published figures, their workloads, layouts, engines and sources are data: benchmarks/reference/serving/*.csv,
# one file per source (benchmarks/reference/serving/README.md: the columns and what each source's rows rest on).
# The code below turns a row into an opmap serve command ("recipes": what the published run's engine was set to).
SERVING_TABLES = HERE / "reference" / "serving"
MLPERF_SLO = "MLPerf llama2-70b Server: p99 TTFT 2000 ms, p99 TPOT 200 ms (the summary's ttft_latency / tpot_latency)"

@dataclass(frozen=True)
class Ref:
    """One published serving figure and the workload that produced it. ``value`` and ``unit`` as published;
    ``devices`` = the accelerators that produced ``value`` (so per device = value / devices for throughput)."""

    id: str
    scenario: str  # offline | server | itl
    published_model: str  # as the source names it
    model: str  # opmap zoo model with that architecture
    hardware: str  # opmap catalog name
    devices: int
    tp: int
    dtype: str
    input_len: int  # mean prompt tokens (fixed for synthetic rows)
    output_len: float  # mean generated tokens (fixed for synthetic rows; tokens / samples for MLPerf)
    value: float
    unit: str
    engine: str
    source: str
    pp: int = 1
    rate_per_s: float | None = None  # itl rows: the offered QPS
    slo_ttft_ms: float | None = None  # server rows
    slo_tpot_ms: float | None = None
    flags: dict[str, str] = field(default_factory=dict)  # extra opmap serve flags
    requests: int = 1000
    role: str = "held out"  # held out | fit
    notes: str = ""  # assumptions the row's prediction rests on
    input_spec: str = ""  # an opmap length spec for a dataset's prompt distribution (else input_len, fixed)
    output_spec: str = ""  # the same for the generated lengths (else output_len, fixed)
    table: str = ""  # the reference table (benchmarks/reference/serving/<table>.csv) the row comes from
    value_per: str = "devices"  # "devices": value is for all ``devices`` together; "device": already per accelerator

    @property
    def per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def published_per_device(self) -> float:
        """Throughput rows: value / devices (tokens/s per accelerator); itl rows: the latency in seconds."""
        if self.scenario == "itl":
            return self.value / 1e3  # ms -> s
        return self.value if self.value_per == "device" else self.value / self.devices

    def what(self) -> str:
        lay = f"tp{self.tp}" + (f" pp{self.pp}" if self.pp > 1 else "")
        sysn = f"{self.devices} x {self.hardware}"
        extra = f" @ {self.rate_per_s:g} QPS" if self.rate_per_s else ""
        return (f"{self.published_model} {self.dtype} {self.input_len}/{self.output_len:g} {self.scenario}{extra}, "
                f"{lay} on {sysn}, {self.engine}")

    def command(self, out: Path) -> list[str]:
        """The opmap serve argument list (after ``python -m opmap.cli``) that predicts this row."""
        args = ["serve", self.model, "--hardware", self.hardware, "--tp", str(self.tp), "--dtype", self.dtype,
                "--requests", str(self.requests), "--input-len", self.input_spec or str(self.input_len),
                "--output-len", self.output_spec or str(round(self.output_len)), "--out", str(out), "--no-store"]
        if self.pp > 1:
            args += ["--pp", str(self.pp)]
        if self.scenario == "offline":
            args += ["--arrival", "offline"]
        elif self.scenario == "itl":
            args += ["--arrival", f"poisson:{self.rate_per_s:g}"]
        else:  # server: the capacity search starts at a fixed rate, never at one taken from the published figure
            args += ["--arrival", f"poisson:{SERVER_START_RATE:g}", "--find-capacity", "--slo-ttft",
                     f"{self.slo_ttft_ms:g}", "--slo-tpot", f"{self.slo_tpot_ms:g}"]
        for k, v in self.flags.items():
            args += [k] if v == "" else [k, v]
        return args


ENGINE_FLAGS = {"--runtime": "engine"}


# --- engine configuration per row (what the published run's engine was set to) --------------------------------
# trtllm-bench rows run opmap serve's trtllm-bench engine preset (src/opmap/engines/trtllm-bench.toml and
# opmap.engines.rules: the one implementation of trtllm-bench's max_batch_size / max_num_tokens heuristic,
# tensorrt_llm/bench/build/tuning.py calc_engine_setting + finetune_setting, GUARANTEED_NO_EVICT, KV blocks of
# tokens_per_block 32, the KV cache a fraction of the memory free after the weights). The preset sizes the engine
# from the run's own lengths and the model opmap prices; the rows add only what the published run set.
TRT_PRESET = "trtllm-bench@1.0"
TRT_FREE_FRACTION = 0.95  # perf-overview (both versions): "--kv_cache_free_gpu_mem_fraction 0.95" in most runs
TRT_CHUNKED = ("chunked context is off by default in trtllm-bench (the preset's whole prompts); opmap chunks here "
               "(--chunked-prefill): with whole prompts a budget of max_num_tokens close to the prompt, as the "
               "heuristic gives at 2048/2048, would admit a prompt only when no decode runs, which the published "
               "rates rule out")


@dataclass(frozen=True)
class Geometry:
    """What trtllm-bench's sizing reads of a model, for an engine built for another data set than the row runs
    (``sizing_input_len``): parameters, layers, KV heads, head size (the model's published config.json)."""

    params: float
    layers: int
    kv_heads: int
    head_dim: int


GEOMETRY = {  # meta-llama/* and mistralai/Mixtral-8x7B-v0.1 config.json; parameter counts from the model cards
    "llama-3-8b": Geometry(8.03e9, 32, 8, 128),
    "llama-3-70b": Geometry(70.6e9, 80, 8, 128),
    "llama-3.1-405b": Geometry(405.9e9, 126, 8, 128),
    "mixtral-8x7b": Geometry(46.7e9, 32, 8, 128),
    "llama-2-70b": Geometry(69.0e9, 80, 8, 128),
}


def device_gib(hw: str) -> float:
    """The device's memory in GiB as the catalog holds it (HBM as vendors state it: 80 for an H100, 141 for an
    H200, 192 for an MI300X; the L40S's 48 GB GDDR6 as 48 GiB), the figure the engines' sizing starts from."""
    from opmap.hardware import get_hardware

    return get_hardware(hw).memory_bytes / 2**30


def geometry(model: str) -> Geometry:
    if model not in GEOMETRY:
        raise OpmapError(f"no engine-sizing geometry for model {model!r} (serving_reference.GEOMETRY has "
                         f"{', '.join(GEOMETRY)}): write its rows with recipe 'given' and the engine's flags")
    return GEOMETRY[model]


def trtllm_bench_setting(model: str, hw: str, tp: int, pp: int, isl: int, osl: int, weight_bytes: float,
                         kv_bytes: float, fraction: float = TRT_FREE_FRACTION) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) as trtllm-bench's heuristic picks them for ``model``'s published geometry
    (opmap.engines.trtllm_bench_setting: the one implementation)."""
    from opmap.engines import trtllm_bench_setting as sizing

    g = geometry(model)
    per_token = 2 * g.layers * max(tp, g.kv_heads) * g.head_dim * kv_bytes
    h = sizing(g.params, weight_bytes, per_token, device_gib(hw) * 2**30, tp, pp, isl, osl, fraction)
    return h.max_batch_size, h.max_num_tokens


def free_fraction_as_utilization(model: str, hw: str, tp: int, pp: int, weight_bytes: float,
                                 fraction: float) -> float:
    """A ``given`` row's KV fraction of the memory free after the weights (a TensorRT-LLM harness outside
    trtllm-bench, such as MLPerf's) as opmap's default --gpu-memory-utilization, vLLM's, of the whole device
    (usable = capacity x u - weights - reserve). The same KV pool: capacity x u - weights = fraction x (capacity -
    weights), so u = fraction + (1 - fraction) x weights / capacity, per device (the runtime reserve is left inside
    the free memory on both sides)."""
    g = geometry(model)
    weights = g.params * weight_bytes / (tp * pp) / 2**30
    return min(1.0, fraction + (1 - fraction) * weights / device_gib(hw))


# The prompts of MLPerf's llama2-70b set (OpenOrca, 24,576 samples, Llama-2 tokenizer, chat template included):
# mean 222.33 tokens, median 152, p90 519, max 1021 (processorca.py keeps prompts under 1024 tokens, it does not
# truncate them). Computed over every row of openshift-psap/performance-dashboard
# mlperf-data/summaries/llama2-70b-99.csv @ 7cd1065d (input_length per sample, copied from tok_input_length of the
# official open_orca_gpt4_tokenized_llama.sampled_24576.pkl by mlperf-data/original/generate_dataset_summaries.py);
# MLCommons itself publishes only the output mean (294.45 tokens per sample, language/llama2-70b/README.md).
# As a lognormal: median 152 and mean 222.33 give sigma = sqrt(2 ln(222.33 / 152)) = 0.872, truncated at 1023
# (processorca.py keeps prompts under 1024 tokens).
# (the tables' input_len 222 and input_spec lognormal:152,0.872,1023)
# The generated lengths: each run's mean (tokens / samples, 290-293; MLCommons' reference run: 294.45) with the spread
# of the set's reference answers (GPT-4's, tok_output_length: median 190, mean 218.89 over the same 24,576 rows, same
# extract), as a lognormal: sigma = sqrt(2 ln(218.89 / 190)) = 0.532, median = mean / exp(sigma^2 / 2) = mean / 1.152.
# How Llama 2's own answers spread is not published; the reference answers are the nearest published spread. Capped
# at 1024: the reference SUT generates with max_new_tokens 1024 (mlcommons/inference language/llama2-70b/SUT.py
# gen_kwargs).
MLPERF_OSL_SIGMA, MLPERF_OSL_MAX = 0.532, 1024
# A run of the whole set, as MLPerf's Offline scenario runs it (min_query_count 24,576 for llama2-70b): with lengths
# that vary, a run of about one batch (1,000 requests at 806-1,024 sequences in flight) is mostly its drain, the
# longest answers finishing alone; the published rate is the sustained one.


def mlperf_output_spec(mean: float) -> str:
    return f"lognormal:{mean / math.exp(MLPERF_OSL_SIGMA ** 2 / 2):.1f},{MLPERF_OSL_SIGMA},{MLPERF_OSL_MAX}"


def _trt_engine(ref: dict, weight_bytes: float | None, kv_bytes: float,
                fraction: float) -> tuple[dict[str, str], str]:
    """The flags of a trtllm-bench throughput row: the trtllm-bench preset at the row's KV fraction (of the memory
    free after the weights, as the engine reads it), chunked. A row whose engine was built for another data set
    (``sizing_input_len`` / ``sizing_output_len``: ``trtllm-bench build --dataset``) gets the batch and token
    budget the heuristic gives at those lengths and the build's default fraction (``TRT_FREE_FRACTION``), given
    as --max-num-seqs / --max-num-batched-tokens (the preset states the override)."""
    flags = {"--engine-preset": TRT_PRESET, "--chunked-prefill": "", "--gpu-memory-utilization": f"{fraction:g}"}
    cfg = (f"engine: opmap's {TRT_PRESET} preset (src/opmap/engines/trtllm-bench.toml: the heuristic of "
           f"tensorrt_llm/bench/build/tuning.py at the run's lengths, GUARANTEED_NO_EVICT, KV blocks of 32); "
           f"--kv_cache_free_gpu_mem_fraction {fraction:g}; {TRT_CHUNKED}; {ref['requests']} requests "
           "(perf-overview's table for this ISL/OSL)")
    if ref["sizing_input_len"]:
        s_isl, s_osl = ref["sizing_input_len"], ref["sizing_output_len"] or round(ref["output_len"])
        if weight_bytes is None:  # a quant_algo the heuristic does not size: BuildConfig's defaults (build.py)
            u = _untuned()
            bs, tok = u.max_batch_size, u.max_num_tokens
        else:
            bs, tok = trtllm_bench_setting(ref["model"], ref["hardware"], ref["tp"], ref["pp"], s_isl, s_osl,
                                           weight_bytes, kv_bytes, TRT_FREE_FRACTION)
        flags.update({"--max-num-seqs": str(bs), "--max-num-batched-tokens": str(tok)})
        cfg += (f"; engine built for {s_isl}/{s_osl} at {TRT_FREE_FRACTION}: max_batch_size {bs}, max_num_tokens "
                f"{tok} (opmap.engines.trtllm_bench_setting with the model's published geometry)")
    return flags, cfg


# Bytes a weight or a KV element takes in the engine's sizing: the trtllm-bench preset's table (tuning.py's
# BYTES_PER_ELEM: NO_QUANT 2.0, FP8 1.0, FP8_BLOCK_SCALES 1.0, NVFP4 0.5), src/opmap/engines/trtllm-bench.toml. A
# row's KV cache is 16-bit unless its kv_dtype column says otherwise. A weight format whose quant_algo the heuristic
# does not size (gpt-oss's MXFP4: build.py's TUNED_QUANTS) has no bytes here: the engine takes BuildConfig's
# defaults (the preset's [untuned] table).
def _bytes_table() -> dict[str, float]:
    from opmap.engines import parse_preset
    from opmap.engines.tables import BytesPerElement

    return {k: float(v) for k, v in parse_preset(TRT_PRESET).rule(BytesPerElement).by_format.items()}


SIZING_BYTES = _bytes_table()


def _sizing_bytes(ref: dict, key: str, default: str) -> float:
    fmt = ref[key] or default
    if fmt not in SIZING_BYTES:
        raise OpmapError(f"{ref['table']}.csv row {ref['id']}: {key} {fmt!r} has no bytes per element for the "
                         f"engine's sizing; known: {', '.join(SIZING_BYTES)}")
    return SIZING_BYTES[fmt]


def _untuned():
    from opmap.engines import parse_preset
    from opmap.engines.tables import BenchUntuned

    return parse_preset(TRT_PRESET).rule(BenchUntuned)


def _recipe_trtllm_bench(ref: dict) -> tuple[dict[str, str], str]:
    """trtllm-bench throughput: the engine's batch and token budget from its heuristic (BuildConfig's defaults for
    a quant_algo it does not size), GUARANTEED_NO_EVICT, KV as the row's fraction of the memory free after the
    weights (``TRT_FREE_FRACTION`` when the row names none)."""
    untuned = _untuned().applies(ref["dtype"] or "bf16")
    wb = None if untuned else _sizing_bytes(ref, "dtype", "bf16")
    kv = _sizing_bytes(ref, "kv_dtype", "bf16")
    return _trt_engine(ref, wb, kv, ref["kv_free_fraction"] or TRT_FREE_FRACTION)


def _recipe_given(ref: dict) -> tuple[dict[str, str], str]:
    """The row's flags as written; a ``kv_free_fraction`` (an engine's KV share of the memory left after the
    weights) becomes opmap's --gpu-memory-utilization."""
    frac = ref["kv_free_fraction"]
    if frac is None:
        return {}, ""
    u = free_fraction_as_utilization(ref["model"], ref["hardware"], ref["tp"], ref["pp"],
                                     _sizing_bytes(ref, "dtype", "bf16"), frac)
    return ({"--gpu-memory-utilization": f"{u:.4f}"},
            f"KV fraction {frac:.2f} of free memory = --gpu-memory-utilization {u:.4f} of the device")


def _recipe_mlperf_llama2(ref: dict) -> tuple[dict[str, str], str]:
    """MLPerf llama2-70b: the mean answer is the run's tokens / samples, spread as the set's reference answers."""
    if not ref["samples_per_s"]:
        raise OpmapError(f"{ref['table']}.csv row {ref['id']}: recipe mlperf-llama2-70b needs samples_per_s")
    mean = ref["value"] / ref["samples_per_s"]
    ref["output_len"], ref["output_spec"] = round(mean, 2), mlperf_output_spec(mean)
    return _recipe_given(ref)


RECIPES = {"trtllm-bench": _recipe_trtllm_bench, "given": _recipe_given, "mlperf-llama2-70b": _recipe_mlperf_llama2}
SCENARIOS = ("offline", "server", "itl")
COLUMNS = (Column("id", required=True), Column("recipe", required=True), Column("scenario", required=True),
           Column("published_model", required=True), Column("model", required=True),
           Column("hardware", required=True), Column("devices", int, True), Column("tp", int, True),
           Column("pp", int, default=1), Column("dtype", required=True), Column("kv_dtype"),
           Column("input_len", int, True), Column("output_len", float), Column("samples_per_s", float),
           Column("value", float, True), Column("unit", required=True), Column("engine", required=True),
           Column("rate_per_s", float), Column("slo_ttft_ms", float), Column("slo_tpot_ms", float),
           Column("requests", int, default=1000), Column("kv_free_fraction", float),
           Column("flags", table_flags, default={}), Column("role", default="held out"),
           Column("input_spec", default=""), Column("output_spec", default=""), Column("notes", default=""),
           Column("cell", default=""), Column("value_per", default="devices"), Column("sizing_input_len", int),
           Column("sizing_output_len", int), Column("source", required=True))


def to_ref(row: dict) -> Ref:
    """One table row as a Ref: the recipe's engine flags after the row's own, its citation after the cell."""
    where = f"{row['table']}.csv row {row['id']}"
    if row["recipe"] not in RECIPES:
        raise OpmapError(f"{where}: recipe {row['recipe']!r} unknown; accepted: {', '.join(RECIPES)}")
    if row["scenario"] not in SCENARIOS:
        raise OpmapError(f"{where}: scenario {row['scenario']!r} unknown; accepted: {', '.join(SCENARIOS)}")
    if row["role"] not in ("held out", "fit"):
        raise OpmapError(f"{where}: role {row['role']!r} unknown; accepted: held out, fit")
    if row["value_per"] not in ("devices", "device"):
        raise OpmapError(f"{where}: value_per {row['value_per']!r} unknown; accepted: devices (the figure is for all "
                         "the row's accelerators), device (already per accelerator)")
    row = dict(row)
    flags, cfg = RECIPES[row["recipe"]](row)
    if row["output_len"] is None:
        raise OpmapError(f"{where}: output_len is empty")
    kv = {"--kv-dtype": row["kv_dtype"]} if row["kv_dtype"] else {}
    source = "; ".join(x for x in (row["source"], row["cell"], cfg) if x)
    keep = {k: row[k] for k in Ref.__dataclass_fields__ if k in row and k not in ("source", "flags")}
    return Ref(**keep, source=source, flags={**row["flags"], **kv, **flags})


# Tables in SERVING_TABLES with columns of their own: load_refs leaves them out, each has its own reader below.
LATENCY_TABLE = "mlperf_server_latency.csv"
SIDE_TABLES = (LATENCY_TABLE,)


def load_refs(folder: Path = SERVING_TABLES) -> list[Ref]:
    """Every row of every table in ``folder`` (but ``SIDE_TABLES``), as Refs, in file-name then row order."""
    return [to_ref(r) for r in read_tables(folder, COLUMNS, skip=SIDE_TABLES)]


@dataclass(frozen=True)
class ServerLatency:
    """The latency statistics of one MLPerf Server run, exactly as its mlperf_log_summary.txt prints them (ns
    written as ms / s): ``id`` is the Server row's id in its throughput table, ``anchor`` the same system's Offline
    row; the scheduled (offered Poisson) and completed rates in samples/s; TTFT and TPOT percentiles in ms; the mean
    request latency in s."""

    id: str
    anchor: str
    scheduled_per_s: float
    completed_per_s: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p90_ms: float
    tpot_p99_ms: float
    mean_latency_s: float
    source: str


LATENCY_COLUMNS = (Column("id", required=True), Column("anchor", required=True),
                   *(Column(f.name, float, True) for f in ServerLatency.__dataclass_fields__.values()
                     if f.name not in ("id", "anchor", "source")),
                   Column("source", required=True))


def load_server_latency(refs: list[Ref], folder: Path = SERVING_TABLES) -> list[ServerLatency]:
    """The rows of ``folder``/mlperf_server_latency.csv, each checked against the throughput rows ``refs``: ``id``
    names a server row, ``anchor`` an offline row of the same system (hardware and accelerator count)."""
    by_id = {r.id: r for r in refs}
    out = []
    for row in read_table(folder / LATENCY_TABLE, LATENCY_COLUMNS):
        where = f"{LATENCY_TABLE} row {row['id']}"
        srv, off = by_id.get(row["id"]), by_id.get(row["anchor"])
        if srv is None or srv.scenario != "server":
            raise OpmapError(f"{where}: id must name a server row of the throughput tables")
        if off is None or off.scenario != "offline" or (off.hardware, off.devices) != (srv.hardware, srv.devices):
            raise OpmapError(f"{where}: anchor {row['anchor']!r} must name an offline row of the same system "
                             f"({srv.devices} x {srv.hardware})")
        out.append(ServerLatency(**{k: row[k] for k in ServerLatency.__dataclass_fields__}))
    return out


REFS: list[Ref] = load_refs()

# A row that set a catalog or runtime value goes here (id -> what it set); such rows are listed, not judged.
FIT: dict[str, str] = {}
QUICK = ("trt17-8b-h100-128-128", "trt17-70b-h100-tp2-1000-1000", "trt17-mix-h100-tp1-128-128",
         "trt14-8b-h100-467-256-q16", "mlperf41-h200x8-offline", "oracle-405b-mi300x-128-2048")
CLAIM = "at least 85% of held-out rows within 0.75-1.33 and mean absolute error under 20%"
ROW_TIMEOUT_S = 1800


def role(ref: Ref) -> str:
    return "fit" if ref.id in FIT else ref.role


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           "COLUMNS": "240", "NO_COLOR": "1", "TERM": "dumb"}
    return env


def _opmap(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opmap.cli", *args], env=_env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, cwd=REPO)


def accepted_flags() -> set[str]:
    """The long options ``opmap serve --help`` lists in this checkout."""
    p = _opmap(["serve", "--help"], 300)
    return set(re.findall(r"--[a-z][a-z0-9-]*", p.stdout + p.stderr))


def error_line(text: str) -> str:
    """The one line saying why opmap refused (``opmap: error: ...`` or typer's ``No such option``)."""
    lines = [ln.strip(" │|\t") for ln in text.splitlines()]
    for pat in ("opmap: error", "No such option", "Error", "Traceback"):
        hit = [ln for ln in lines if pat in ln]
        if hit:
            return hit[-1] if pat != "Traceback" else next((ln for ln in reversed(lines) if ln), hit[-1])
    return next((ln for ln in reversed(lines) if ln), "no output")


def predicted(ref: Ref, report: dict) -> tuple[float, str]:
    """(predicted figure in the row's per-device unit, what opmap reported), from serve.json."""
    if ref.scenario == "offline":
        out = report["throughput"]["output_tokens_per_s"]
        return out / ref.per_replica, f"{out:.4g} out tok/s per replica"
    if ref.scenario == "itl":
        return report["latency"]["itl"]["mean_s"], f"TPOT mean {report['latency']['tpot']['mean_s'] * 1e3:.3g} ms"
    cap = report["capacity"]["rate_per_s"]
    # the run's own mean answer length (a distribution's draws, truncated, are not exactly the row's mean)
    req = report.get("requests") or {}
    mean_out = req["output_tokens"] / req["count"] if req.get("count") else round(ref.output_len)
    return cap * mean_out / ref.per_replica, f"capacity {cap:.4g} req/s per replica x {mean_out:.4g} tokens"


def ratio(ref: Ref, pred: float) -> float:
    """Predicted speed / published speed (> 1: opmap faster than measured)."""
    pub = ref.published_per_device
    return pub / pred if ref.scenario == "itl" else pred / pub


def run_row(ref: Ref, accepted: set[str] | None) -> dict:
    """Run one row's opmap serve command; ``accepted`` = the options to keep (None: keep every row flag)."""
    res = {"id": ref.id, "role": role(ref), "published_per_device": ref.published_per_device, "dropped_flags": []}
    with tempfile.TemporaryDirectory(prefix="serving_ref_") as tmp:
        out = Path(tmp) / "run"
        args = ref.command(out)
        if accepted is not None:
            keep, i = [], 0
            while i < len(args):
                a = args[i]
                takes_value = a in ref.flags and ref.flags[a] != ""
                if a.startswith("--") and a in ref.flags and a not in accepted:
                    res["dropped_flags"].append(a)
                    i += 2 if takes_value else 1
                    continue
                keep.append(a)
                i += 1
            args = keep
        res["command"] = "opmap " + " ".join(args).replace(str(out), "OUT")
        try:
            p = _opmap(args, ROW_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {**res, "status": f"not runnable: timed out after {ROW_TIMEOUT_S} s"}
        if p.returncode != 0:
            return {**res, "status": f"not runnable: {error_line(p.stderr + p.stdout)}"}
        try:
            report = json.loads((out / "serve.json").read_text())
            pred, how = predicted(ref, report)
        except (OSError, KeyError, TypeError, ValueError) as e:
            return {**res, "status": f"not runnable: serve.json unreadable ({type(e).__name__}: {e})"}
    r = ratio(ref, pred)
    return {**res, "status": "ok", "predicted_per_device": pred, "ratio": r, "how": how,
            "in_band": BAND[0] <= r <= BAND[1], "runtime": report.get("runtime") or report.get("cost", {}).get(
                "runtime"), "preemptions": report.get("preemptions")}


def summary(results: list[dict]) -> dict:
    held = [x for x in results if x["role"] == "held out"]
    ok = [x for x in held if x["status"] == "ok"]
    ratios = [x["ratio"] for x in ok]
    mae = statistics.fmean(abs(r - 1) for r in ratios) if ratios else None
    in_band = sum(1 for x in ok if x["in_band"])
    return {"held_out": len(held), "runnable": len(ok), "not_runnable": len(held) - len(ok), "in_band": in_band,
            "in_band_fraction": in_band / len(held) if held else None,
            "median_ratio": statistics.median(ratios) if ratios else None, "mean_abs_error": mae,
            "geomean_error": math.exp(statistics.fmean(abs(math.log(r)) for r in ratios)) - 1 if ratios else None,
            "pass": bool(held) and len(ok) == len(held) and in_band >= 0.85 * len(held) and mae is not None
            and mae < 0.20,
            # the same claim over the rows that ran: rows waiting on a format or layout opmap does not accept yet
            # (not runnable) are counted above, not judged here
            "pass_runnable": bool(ok) and in_band >= 0.85 * len(ok) and mae is not None and mae < 0.20}


def by_device(refs: list[Ref], results: list[dict]) -> dict[str, dict]:
    """Per accelerator: held-out rows, how many ran, the geometric mean of predicted / published, the geometric-mean
    error (exp(mean |ln ratio|) - 1) and the share of runnable rows within ``BAND``."""
    out: dict[str, dict] = {}
    for ref, x in zip(refs, results, strict=True):
        if x["role"] != "held out":
            continue
        d = out.setdefault(ref.hardware, {"rows": 0, "runnable": 0, "ratios": []})
        d["rows"] += 1
        if x["status"] == "ok":
            d["runnable"] += 1
            d["ratios"].append(x["ratio"])
    for d in out.values():
        r = d.pop("ratios")
        d["geomean_ratio"] = math.exp(statistics.fmean(math.log(v) for v in r)) if r else None
        d["geomean_error"] = math.exp(statistics.fmean(abs(math.log(v)) for v in r)) - 1 if r else None
        d["in_band_share"] = sum(BAND[0] <= v <= BAND[1] for v in r) / len(r) if r else None
    return dict(sorted(out.items()))


def _fmt(ref: Ref, v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1e3:.3g} ms" if ref.scenario == "itl" else f"{v:,.0f} tok/s/dev"


def select(rows_arg: str | None, quick: bool) -> list[Ref]:
    by_id = {r.id: r for r in REFS}
    if rows_arg:
        ids = [s.strip() for s in rows_arg.split(",") if s.strip()]
        bad = [i for i in ids if i not in by_id]
        if bad:
            raise SystemExit(f"serving_reference: unknown row id(s) {', '.join(bad)}; --list prints the ids")
        return [by_id[i] for i in ids]
    return [by_id[i] for i in QUICK] if quick else list(REFS)


def markdown(payload: dict) -> str:
    """The rows of a results JSON as a Markdown table (for benchmarks/README.md)."""
    lines = ["| row | workload | system | engine | published | per device | predicted | ratio | band | role |",
             "|---|---|---|---|---:|---:|---:|---:|---|---|"]
    for x in payload["rows"]:
        ref = Ref(**{k: x[k] for k in Ref.__dataclass_fields__})
        lay = f"tp{ref.tp}" + (f" pp{ref.pp}" if ref.pp > 1 else "")
        wl = f"{ref.published_model}, {ref.dtype}, {ref.input_len}/{ref.output_len:g}, {ref.scenario}"
        if ref.rate_per_s:
            wl += f" @ {ref.rate_per_s:g} QPS"
        pred = _fmt(ref, x.get("predicted_per_device"))
        r = f"{x['ratio']:.2f}" if x["status"] == "ok" else x["status"]
        band = ("in" if x.get("in_band") else "out") if x["status"] == "ok" and x["role"] == "held out" else "-"
        lines.append(f"| {ref.id} | {wl} | {ref.devices} x {ref.hardware}, {lay} | {ref.engine} | {ref.value} "
                     f"{ref.unit} | {_fmt(ref, ref.published_per_device)} | {pred} | {r} | {band} | {x['role']} |")
    return "\n".join(lines)


def write_results(payload: dict, subset: bool) -> Path:
    """results/serving_reference.json for the whole table; a --rows / --quick run writes
    serving_reference_subset.json instead, so it never replaces the full table's results."""
    sys.path.insert(0, str(REPO / "src"))
    from opmap.validate import json_text

    out_dir = HERE / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / ("serving_reference_subset.json" if subset else "serving_reference.json")
    tmp = out.with_suffix(f".json.{os.getpid()}.tmp")
    tmp.write_text(json_text(payload, indent=2) + "\n")
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", help="comma-separated row ids (see --list)")
    ap.add_argument("--quick", action="store_true", help=f"only {len(QUICK)} rows, one per kind of source")
    ap.add_argument("--jobs", type=int, default=2, help="rows run at once (at most 2 on a shared host)")
    ap.add_argument("--drop-missing-flags", action="store_true",
                    help="run rows without the flags this checkout's CLI lacks (listed per row) instead of "
                         "reporting them not runnable")
    ap.add_argument("--list", action="store_true", help="print the rows and their commands, run nothing")
    ap.add_argument("--markdown", action="store_true", help="print the last results JSON as a Markdown table")
    a = ap.parse_args(argv)
    if a.markdown:
        print(markdown(json.loads((HERE / "results" / "serving_reference.json").read_text())))
        return 0
    refs = select(a.rows, a.quick)
    if a.list:
        for r in refs:
            print(f"{r.id}: {r.what()} = {r.value:g} {r.unit} ({r.published_per_device:.6g} per device)\n"
                  f"  opmap {' '.join(r.command(Path('OUT')))}")
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console(width=None if sys.stdout.isatty() else 200)
    accepted = accepted_flags() if a.drop_missing_flags else None
    with ThreadPoolExecutor(max_workers=max(1, min(a.jobs, 2))) as pool:
        results = list(pool.map(lambda r: run_row(r, accepted), refs))
    t = Table(title="opmap serve predicted / published, per device (ratio > 1: opmap faster)")
    for c in ("id", "published", "predicted", "ratio", "band", "role", "opmap", "dropped flags"):
        t.add_column(c, overflow="fold")
    for ref, x in zip(refs, results, strict=True):
        band = "-" if x["role"] != "held out" else ("in" if x.get("in_band") else "out")
        t.add_row(ref.id, _fmt(ref, ref.published_per_device), _fmt(ref, x.get("predicted_per_device")),
                  f"{x['ratio']:.2f}" if "ratio" in x else x["status"], band if x["status"] == "ok" else "-",
                  x["role"], x.get("how", ""), " ".join(x["dropped_flags"]))
    con.print(t)
    s = summary(results)
    mae = "-" if s["mean_abs_error"] is None else f"{s['mean_abs_error']:.1%}"
    med = "-" if s["median_ratio"] is None else f"{s['median_ratio']:.2f}"
    con.print(f"held-out rows in {BAND[0]}-{BAND[1]}: {s['in_band']} of {s['held_out']} ({s['not_runnable']} not "
              f"runnable); median ratio {med}; mean absolute error {mae}; claim ({CLAIM}): "
              f"{'PASS' if s['pass'] else 'FAIL'}; over the {s['runnable']} rows that ran: "
              f"{'PASS' if s['pass_runnable'] else 'FAIL'}", highlight=False)
    devices = by_device(refs, results)
    for hw, d in devices.items():
        line = (f"  {hw}: {d['runnable']} of {d['rows']} rows run" + ("" if d["geomean_ratio"] is None else
                f"; predicted / published {d['geomean_ratio']:.2f} (geometric mean), geometric-mean error "
                f"{d['geomean_error']:.1%}, {d['in_band_share']:.0%} within {BAND[0]}-{BAND[1]}"))
        con.print(line, highlight=False)
    from _common import machine, now_iso

    path = write_results({"schema_version": SCHEMA_VERSION, "benchmark": "serving_reference", "created": now_iso(),
                          "machine": machine(), "claim": CLAIM, "band": list(BAND),
                          "drop_missing_flags": a.drop_missing_flags, "summary": s, "by_device": devices,
                          "rows": [{**asdict(ref), "what": ref.what(), **x} for ref, x in zip(refs, results,
                                                                                              strict=True)]},
                         subset=bool(a.rows or a.quick))
    con.print(f"wrote {path}")
    return 0 if s["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
