"""Fuzzing every file format opmap reads: a seeded generator mutates a valid file of each format (values swapped
for NaN, inf, negatives, huge numbers, wrong types; keys dropped; bytes truncated, flipped or replaced by binary
junk) and hands it to the reader opmap uses for that format. Each reader must either accept the input or refuse
it with one OpmapError line; any other exception is a traceback a user would see, and a read that takes longer
than HANG_S is a hang. Thousands of inputs in all, each under its own timer (SIGALRM).

The readers are the ones the commands call (the same functions, not copies), so a format's refusal here is
the refusal the command prints as ``opmap: error: ...`` with exit status 2 (checked for a sample through the
CLI in test_a_sample_through_the_cli)."""

from __future__ import annotations

import copy
import json
import random
import signal
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from opmap.errors import OpmapError

HANG_S = 5.0  # a reader that parses a few kB for longer than this is hung (the slowest valid read here: ~50 ms)
SEED = 20261204

# Values a careless user or an attacker puts where a number or a name belongs.
NASTY = [float("nan"), float("inf"), float("-inf"), -1, 0, -0.0, 1e30, -1e30, 2**64, 1.9, 1e-300, True, False,
         None, "", "1", "abc", "nan", "1e400", "[/b]", "\x1b[2J", "</script>", [], [1, 2], {}, {"a": 1}]
HUGE_TOKEN = "__OPMAP_FUZZ_1E400__"  # written as the bare JSON literal 1e400 (parses to inf in Python)


class Hang(Exception):
    pass


def _alarm(_signum, _frame):
    raise Hang()


def _leaves(tree, path=()):
    """Every (path, value) of a JSON-like tree, containers included."""
    yield path, tree
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _leaves(v, (*path, i))


def _set(tree, path, value):
    if not path:
        return value
    node = tree
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return tree


def _delete(tree, path):
    node = tree
    for p in path[:-1]:
        node = node[p]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    elif isinstance(node, list) and node:
        node.pop(path[-1])
    return tree


def mutate_tree(tree, rng: random.Random):
    """One to three structural edits: a value swapped for a nasty one (or 1e400), a key dropped, a list emptied."""
    t = copy.deepcopy(tree)
    for _ in range(rng.randint(1, 3)):
        spots = list(_leaves(t))
        path, _value = rng.choice(spots)
        r = rng.random()
        if r < 0.7 or not path:
            t = _set(t, path, HUGE_TOKEN if rng.random() < 0.08 else copy.deepcopy(rng.choice(NASTY)))
        elif r < 0.9:
            t = _delete(t, path)
        else:
            t = _set(t, path, [])
    return t


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Byte-level damage: truncation, flipped bytes, inserted junk, a binary file, an empty file."""
    r = rng.random()
    if r < 0.3:
        return data[: rng.randrange(len(data) + 1)]
    if r < 0.6:
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if r < 0.8:
        i = rng.randrange(len(data) + 1)
        return data[:i] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 32))) + data[i:]
    if r < 0.95:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 512)))
    return b""


def dump_json(tree) -> bytes:
    return json.dumps(tree, allow_nan=True).replace(f'"{HUGE_TOKEN}"', "1e400").encode()


def dump_toml(tree) -> bytes:
    """TOML text of a mutated tree: values TOML cannot hold (None) are written as strings; nan/inf as TOML's own."""
    import tomli_w

    def clean(v):
        if v is None:
            return "null"
        if v == HUGE_TOKEN:
            return float("inf")
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, list):
            vs = [clean(x) for x in v]
            return vs if len({type(x) for x in vs}) <= 1 else [str(x) for x in vs]
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 2**63:
            return float(v)
        return v

    return tomli_w.dumps(clean(tree) if isinstance(tree, dict) else {"value": clean(tree)}).encode()


def check_reader(name: str, read: Callable[[Path], object], seeds: list[bytes], parse: Callable[[bytes], object],
                 dump: Callable[[object], bytes], n: int, tmp: Path, suffix: str = "") -> dict:
    """Feed ``n`` mutated inputs to ``read``; returns counts and the first failures (tracebacks and hangs)."""
    rng = random.Random(f"{SEED}:{name}")
    accepted = refused = 0
    failures: list[str] = []
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i in range(n):
            seed = rng.choice(seeds)
            if rng.random() < 0.75:
                data = dump(mutate_tree(parse(seed), rng))
            else:
                data = mutate_bytes(seed, rng)
            path = tmp / f"{name}-{i}{suffix}"
            path.write_bytes(data)
            signal.setitimer(signal.ITIMER_REAL, HANG_S)
            try:
                read(path)
                accepted += 1
            except OpmapError as e:
                msg = str(e)
                if not msg or "\n" in msg or "Traceback" in msg:
                    failures.append(f"{name}: refusal not one line: {msg!r} for {data[:200]!r}")
                refused += 1
            except Hang:
                failures.append(f"{name}: hang over {HANG_S} s for {data[:200]!r}")
            except Exception as e:  # noqa: BLE001 - any other exception is the traceback a user would see
                failures.append(f"{name}: {type(e).__name__}: {e} for {data[:200]!r}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            path.unlink()
    finally:
        signal.signal(signal.SIGALRM, old)
    return {"accepted": accepted, "refused": refused, "failures": failures}


# -- the formats: each a reader (path -> anything, or OpmapError), seeds, and how to parse and write a seed -----

N_PER_FORMAT = 600  # x formats: thousands of inputs in all, about a second per format here


def _trace_seeds() -> list[bytes]:
    jsonl = "\n".join(json.dumps({"arrival_s": 0.1 * i, "input_len": 128 + i, "output_len": 32}) for i in range(8))
    csv = "arrival_s,input_len,output_len\n" + "\n".join(f"{0.2 * i},{64 + i},16" for i in range(8))
    return [jsonl.encode(), csv.encode()]


def _trace_parse(b: bytes):
    text = b.decode()
    if text.startswith("{"):
        return [json.loads(x) for x in text.splitlines()]
    lines = text.splitlines()
    return [lines[0].split(",")] + [[float(v) for v in x.split(",")] for x in lines[1:]]


def _trace_dump(tree) -> bytes:
    if isinstance(tree, list) and tree and isinstance(tree[0], list):  # CSV rows (the header may be damaged too)
        return "\n".join(",".join(str(v) for v in row) if isinstance(row, list) else str(row)
                         for row in tree).encode()
    if isinstance(tree, list):
        return "\n".join(dump_json(x).decode() for x in tree).encode()
    return dump_json(tree)


def _toml_seeds() -> list[bytes]:
    from opmap.hardware.spec import CATALOG_DIR

    return [(CATALOG_DIR / f"{n}.toml").read_bytes() for n in ("h100-sxm", "l4", "xeon-8480")]


def _cache_seed(tmp: Path) -> bytes:
    import torch
    from torch import nn

    from opmap.capture import cache as graph_cache
    from opmap.capture import capture

    g = capture(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)).to("meta"),
                (torch.empty(4, 8, device="meta"),))
    graph_cache.store("x", g, graph_cache.CachedWorkload("mlp", 4, None, ("a",)))
    return (graph_cache.cache_dir() / "x.json").read_bytes()


def _cache_parse(b: bytes):
    return json.loads(b.split(b"\n", 1)[1])


def _cache_dump(tree) -> bytes:
    """A mutated payload under a header whose hash matches it: the reader's type checks, not its hash, must
    refuse it."""
    import hashlib

    from opmap.capture import cache as graph_cache

    payload = dump_json(tree)
    header = {"cache_version": graph_cache.CACHE_VERSION, "key": "x", "bytes": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest()}
    return json.dumps(header).encode() + b"\n" + payload


def _cache_read(path: Path):
    """The cache reads an entry by key from its folder: the mutated file is put there under key x. A cache miss
    is None; the reader must never raise (not even OpmapError) and never hang."""
    from opmap.capture import cache as graph_cache

    target = graph_cache.cache_dir() / "x.json"
    target.write_bytes(path.read_bytes())
    got = graph_cache.load("x")
    if got is None:  # a miss: counted as a refusal (the graph is captured again)
        raise OpmapError("cache miss")
    assert len(got) in (2, 3) and got[0].nodes is not None


def _run_seeds(tmp: Path) -> list[bytes]:
    """An analysis.json of a small user model and a serving run's serve.json, both written by opmap itself."""
    from opmap.cli import main

    model = tmp / "tiny.py"
    model.write_text("import torch\nfrom torch import nn\n\ndef tiny():\n"
                     "    return nn.Sequential(nn.Linear(16, 32), nn.ReLU()), (torch.randn(4, 16),)\n")
    out = tmp / "runs"
    assert main(["analyze", f"{model}:tiny", "--out", str(out), "--no-store", "--rows", "1"]) == 0
    assert main(["serve", "gpt2", "--service-time", "exp:100", "--policy", "none", "--arrival", "poisson:5",
                 "--requests", "50", "--out", str(out), "--no-store"]) == 0
    serve = {**json.loads((out / "serve.json").read_text()), "kind": "serve"}  # as runs import names a folder's
    return [(out / "analysis.json").read_bytes(), json.dumps(serve).encode()]


def _run_read(path: Path):
    from opmap.store import validate_run

    validate_run(json.loads(path.read_bytes()))


def _json_read(read):
    """A reader of parsed JSON, given a file: bytes that are not JSON are the file reader's refusal, which the
    command makes before calling it (runs import: 'cannot import F: expected ... (JSONDecodeError)')."""
    def run(path: Path):
        try:
            d = json.loads(path.read_bytes())
        except (ValueError, RecursionError):
            return None
        return read(d)
    return run


_QUALITY = {"schema_version": 1, "workload": "gpt2", "dtype": "int8", "reference_dtype": "fp32",
            "rel_error": 0.0123, "max_abs_error": 0.5, "agreement": 0.97, "agreement_kind": "top-1 token agreement",
            "positions": 1024, "seed": 0, "weights": "random"}
# Hugging Face configs in the shapes of published ones (Llama 3 8B, GPT-2, Mixtral 8x7B), the fields opmap reads
_HF = [{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "torch_dtype": "bfloat16"},
       {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257,
        "layer_norm_epsilon": 1e-05},
       {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
        "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": None}]


def _hf_read(path: Path):
    """The reader `opmap analyze path/config.json` uses: the file read and checked, transformers' config class
    built from it (trust_remote_code off; nothing built on any device)."""
    from opmap.workloads.hf import load_config

    load_config(str(path))


def _folder_read(path: Path):
    """A run folder as compare, memo and report read it (opmap.store.source.load): the file is the folder's
    analysis.json. Its link to the mutated file is the reader's to refuse, so the bytes are copied in."""
    from opmap.store.source import load

    folder = path.parent / "run-folder"
    folder.mkdir(exist_ok=True)
    target = folder / "analysis.json"
    target.unlink(missing_ok=True)
    target.write_bytes(path.read_bytes())
    load(str(folder), path.parent / "no-store.duckdb")


_TUNE_CAND = {"label": "threads=1,dtype=fp32", "threads": 1, "dtype": "fp32", "channels_last": False, "sdpa": "auto",
              "chunks": 1}
# a whole entry as cache.write_entry writes it (tune/result.py's SignatureResult), so mutations reach the typed read
_TUNE = {"signature": {"key": "gemm:1x2x3x0:fp32:nt", "family": "gemm", "shape": [1, 2, 3, 0], "dtype": "fp32",
                       "layout": "nt", "count": 1, "modules": ["fc"]},
         "candidates": [{**_TUNE_CAND, "predicted_s": 1e-4, "predicted_rank": 1, "timed": True, "default": True,
                         "changes_precision": False, "measured_s": 1e-4, "min_s": 1e-4, "max_s": 1e-4, "iqr_s": 0.0,
                         "samples": 3}],
         "chosen": _TUNE_CAND, "default": _TUNE_CAND, "default_s": 1e-4, "chosen_s": 1e-4, "gain": 1.0,
         "kept_default_because": "", "predicted_chosen_s": 1e-4, "predicted_default_s": 1e-4,
         "parallel_region_s": 0.0, "parallel_region_probe_s": None, "candidate_hash": "h", "fingerprint": {},
         "versions": {}, "schema_version": 1, "key": "k"}


def _tune_read(path: Path):
    """The tuning cache's entry ``k``: the mutated file put in its folder. A bad entry is absent (None, tuned
    again); the reader never raises."""
    from opmap.explore.tune import cache as tune_cache

    (path.parent / "tune").mkdir(exist_ok=True)
    (path.parent / "tune" / "k.json").write_bytes(path.read_bytes())
    if tune_cache.read_entry(path.parent / "tune", "k") is None:
        raise OpmapError("absent")


def _formats(tmp: Path) -> dict[str, tuple]:
    from opmap.hardware.spec import load_spec_file
    from opmap.mapping.fusion_plan import read_fusion_plan
    from opmap.measure.quality import read_quality
    from opmap.serve.arrivals import read_trace

    plan = {"kernels": [[0, 1, 2], [3], [4, 5]]}
    runs = _run_seeds(tmp)
    return {
        "hf-config": (_hf_read, [json.dumps(c).encode() for c in _HF], json.loads, dump_json),
        "fusion-plan": (read_fusion_plan, [json.dumps(plan).encode()], json.loads, dump_json),
        "quality-json": (read_quality, [json.dumps(_QUALITY).encode()], json.loads, dump_json),
        "trace": (read_trace, _trace_seeds(), _trace_parse, _trace_dump),
        "hardware-toml": (load_spec_file, _toml_seeds(), lambda b: tomllib.loads(b.decode()), dump_toml),
        "graph-cache": (_cache_read, [_cache_seed(tmp)], _cache_parse, _cache_dump),
        "run-export": (_json_read(lambda d: _run_read_dict(d)), runs, json.loads, dump_json),
        "run-folder": (_folder_read, runs[:1], json.loads, dump_json),
        "tune-cache": (_tune_read, [json.dumps(_TUNE).encode()], json.loads, dump_json),
    }


def _run_read_dict(d):
    from opmap.store import validate_run

    validate_run(d)


@pytest.fixture(scope="module")
def formats(tmp_path_factory):

    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "tiny.py").write_text("import torch\nfrom torch import nn\n\ndef tiny():\n    return nn.Sequential("
                                 "nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), (torch.randn(4, 16),)\n")
    with pytest.MonkeyPatch.context() as mp:  # both restored after the module (the graph cache stays off elsewhere)
        mp.setenv("XDG_CACHE_HOME", str(tmp / "xdg"))
        mp.setenv("OPMAP_GRAPH_CACHE", "1")
        yield tmp, _formats(tmp)


@pytest.mark.parametrize("name", ["hf-config", "hardware-toml", "trace", "fusion-plan", "quality-json",
                                  "run-export", "graph-cache", "run-folder", "tune-cache"])
def test_mutated_inputs_are_read_or_refused_in_one_line(formats, name):
    tmp, table = formats
    read, seeds, parse, dump = table[name]
    suffix = ".json" if name == "hf-config" else ""  # a config is named by its path: path/to/config.json
    for seed in seeds:
        p = tmp / f"{name}-seed{suffix}"
        p.write_bytes(seed)
        read(p)
    r = check_reader(name, read, seeds, parse, dump, N_PER_FORMAT, tmp, suffix)
    assert r["failures"] == [], "\n".join(r["failures"][:10])
    # the mutations reach the checks: a good share is refused, and some survive (a mutation that changes nothing
    # the reader uses, such as a dropped optional key)
    assert r["refused"] >= N_PER_FORMAT // 5, r


# -- not a file: what a name can be besides a regular file of sensible size ---------------------------------------

SPECIAL = ("link to /dev/zero", "fifo", "folder", "over every limit")


def _make_special(path: Path, kind: str) -> None:
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)  # no writer: an ordinary open blocks for ever
    elif kind == "folder":
        path.mkdir()
    else:  # sparse, past the largest limit (a trace's 256 MiB): refused on its size, nothing read
        from opmap.safeio import LIMIT_TRACE_BYTES

        with open(path, "wb") as f:
            f.truncate(LIMIT_TRACE_BYTES + 1)


def _special_cases(tmp: Path, table: dict) -> dict[str, tuple[Path, Callable[[], object]]]:
    """Per format: where its reader looks, and the read (a cache miss or an absent entry raised as a refusal)."""
    from opmap.capture import cache as graph_cache
    from opmap.explore.tune import cache as tune_cache
    from opmap.store.source import load

    def miss(got):
        if got is not None:
            raise AssertionError(f"read something from a special file: {got!r}"[:200])
        raise OpmapError("miss")

    at = {n: tmp / "special" / f"{n}{SUFFIX.get(n, '')}" for n in
          ("hf-config", "hardware-toml", "trace", "fusion-plan", "quality-json")}
    cases = {n: (p, (lambda r, p: lambda: r(p))(table[n][0], p)) for n, p in at.items()}
    cases["graph-cache"] = (graph_cache.cache_dir() / "special.json", lambda: miss(graph_cache.load("special")))
    cases["tune-cache"] = (tmp / "special-tune" / "k.json",
                           lambda: miss(tune_cache.read_entry(tmp / "special-tune", "k")))
    cases["run-folder"] = (tmp / "special-run" / "analysis.json",
                           lambda: load(str(tmp / "special-run"), tmp / "no-store.duckdb"))
    return cases


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("name", ["hf-config", "hardware-toml", "trace", "fusion-plan", "quality-json",
                                  "graph-cache", "tune-cache", "run-folder"])
def test_a_name_that_is_not_a_bounded_regular_file_is_refused_in_one_line(formats, name, kind):
    """Each reader through opmap.safeio: a link to /dev/zero (before: MemoryError for a --hardware TOML, a graph
    cache entry, a plan, a quality file), a FIFO (before: a hang), a folder or a file past the limit is refused in
    one line (a cache: a miss), within HANG_S and without reading the file."""
    import shutil

    tmp, table = formats
    path, read = _special_cases(tmp, table)[name]
    _make_special(path, kind)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        with pytest.raises(OpmapError) as e:
            read()
    except Hang:
        pytest.fail(f"{name}: {kind} hung the reader")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    assert str(e.value) and "\n" not in str(e.value)


def _cli_cases(tmp: Path) -> dict[str, Callable[[Path], list[str]]]:
    """The command that reads each format, given the file (small, quick targets)."""
    model = tmp / "tiny.py"
    return {
        "hf-config": lambda f: ["analyze", str(f), "--seq", "16", "--rows", "1"],
        "hardware-toml": lambda f: ["analyze", f"{model}:tiny", "--hardware", str(f), "--rows", "1"],
        "trace": lambda f: ["serve", "gpt2", "--service-time", "exp:100", "--policy", "none",
                            "--arrival", f"trace:{f}"],
        "fusion-plan": lambda f: ["analyze", f"{model}:tiny", "--fusion-plan", str(f), "--rows", "1"],
        "quality-json": lambda f: ["analyze", f"{model}:tiny", "--dtype", "int8", "--quality", str(f), "--rows", "1"],
        "run-export": lambda f: ["runs", "import", str(f), "--store", str(tmp / "store" / "runs.duckdb")],
    }


SUFFIX = {"hf-config": ".json", "hardware-toml": ".toml", "run-export": ".json"}


@pytest.mark.parametrize("name", ["hf-config", "hardware-toml", "trace", "fusion-plan", "quality-json", "run-export"])
def test_a_sample_through_the_cli(formats, name, capsys):
    """Eight refused mutations of each format through the command that reads it: exit status 2 and one line on
    stderr, no traceback (the commands print the readers' refusals as they are)."""
    from opmap.cli import main

    tmp, table = formats
    read, seeds, parse, dump = table[name]
    rng = random.Random(f"{SEED}:cli:{name}")
    cmd = _cli_cases(tmp)[name]
    tried = 0
    while tried < 8:
        data = dump(mutate_tree(parse(rng.choice(seeds)), rng)) if rng.random() < 0.75 else \
            mutate_bytes(rng.choice(seeds), rng)
        f = tmp / f"cli-{name}-{tried}{SUFFIX.get(name, '')}"
        f.write_bytes(data)
        try:
            read(f)
            continue  # accepted by the reader: not a refusal to check here
        except OpmapError:
            pass
        capsys.readouterr()
        rc = main([*cmd(f), "--no-store"] if name != "run-export" else cmd(f))
        out, err = capsys.readouterr()
        lines = [x for x in err.splitlines() if x.strip()]
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("opmap: error:"), (name, data[:200], err)
        assert "Traceback" not in out + err
        tried += 1
