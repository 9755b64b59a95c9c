"""opmap.api: a model loaded once and stepped per phase, shape, hardware and runtime; its keys; its configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opmap.api import Layout, Model, Phase, RuntimeChoice, Shape, capture_key, step_key
from opmap.capture import cache
from opmap.errors import OpmapError
from opmap.hardware import get_hardware
from opmap.phases.runtime import get_runtime
from opmap.precision import build_dtype

TINY = str(Path(__file__).resolve().parents[1] / "examples" / "tiny-llama.json")


@pytest.fixture
def counted(monkeypatch):
    """The captures and builds that really run: opmap.phases.step.capture_phase and
    opmap.workloads.phases.phase_workload, each called through and counted."""
    import opmap.phases.step as step
    import opmap.workloads.phases as phases

    calls = {"capture": 0, "build": 0}

    def spy(module, name, what):
        real = getattr(module, name)

        def counting(*a, **k):
            calls[what] += 1
            return real(*a, **k)

        monkeypatch.setattr(module, name, counting)

    spy(step, "capture_phase", "capture")
    spy(phases, "phase_workload", "build")
    return calls


@pytest.mark.parametrize("target", ["gpt2", TINY])
def test_a_step_is_built_and_captured_once_whatever_it_is_analysed_on(target, counted, monkeypatch):
    """Decode at one shape analysed on two devices under two runtimes, then train at the same shape twice: one
    build and one capture per phase (the capture cache off: the model object alone keeps them)."""
    monkeypatch.setenv("OPMAP_GRAPH_CACHE", "0")
    m = Model(target, "bf16")
    shape = Shape(2)
    decode = Phase("decode", kv_len=64).spec(target, shape.batch)
    for hw_name, runtime in (("h100-sxm", "eager"), ("a100", "graphs"), ("h100-sxm", "engine")):
        hw = get_hardware(hw_name)
        m.phase(decode, shape, hw, get_runtime(hw, runtime), "eager")
    assert counted == {"capture": 1, "build": 1} and (m.captures, m.builds) == (1, 1)
    train = Phase("train").spec(target, shape.batch)
    for _ in range(2):
        m.phase(train, Shape(2, 32), get_hardware("h100-sxm"), None, "eager")
    assert counted == {"capture": 2, "build": 2} and (m.captures, m.builds) == (2, 2)


def test_a_prefill_is_captured_once_and_then_comes_from_the_capture_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPMAP_GRAPH_CACHE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = Model("gpt2", "bf16")
    a = first.prefill(Shape(1, 32), get_hardware("h100-sxm"), "eager")
    first.prefill(Shape(1, 32), get_hardware("a100"), "eager")
    assert first.captures == 1
    again = Model("gpt2", "bf16")  # another process, as far as the model object knows
    b = again.prefill(Shape(1, 32), get_hardware("h100-sxm"), "eager")
    assert again.captures == 0 and again.builds == 0
    assert b.predicted_latency_s == a.predicted_latency_s


def test_decode_kv_bytes_are_the_formula_on_a_hugging_face_config_and_a_zoo_model(monkeypatch):
    """KV bytes read by one decode step: 2 (K and V) x KV heads x head dim x layers x bytes x tokens.
    examples/tiny-llama.json: num_key_value_heads 4, hidden_size 128 / num_attention_heads 4 = head dim 32,
    num_hidden_layers 2; GPT-2 (its published config): n_head 12, n_embd 768 / 12 = 64, n_layer 12; bf16: 2 bytes;
    batch 2 x kv_len 64 = 128 tokens."""
    monkeypatch.setenv("OPMAP_GRAPH_CACHE", "0")
    cfg = json.loads(Path(TINY).read_text())
    assert (cfg["num_key_value_heads"], cfg["hidden_size"] // cfg["num_attention_heads"],
            cfg["num_hidden_layers"]) == (4, 32, 2)
    for target, want in ((TINY, 2 * 4 * 32 * 2 * 2 * 128), ("gpt2", 2 * 12 * 64 * 12 * 2 * 128)):
        spec = Phase("decode", kv_len=64).spec(target, 2)
        pa = Model(target, "bf16").phase(spec, Shape(2), get_hardware("h100-sxm"), None, "eager")
        assert pa.figures.floor.kv_cache_read_bytes == want


def test_keys_are_the_ones_cached_before_the_facade(monkeypatch):
    """A prefill keeps the key of the fields analyze wrote before phases existed (graphs cached then stay valid);
    a model file, a config or a real device is not cacheable."""
    monkeypatch.setenv("OPMAP_GRAPH_CACHE", "1")
    fields = {"model": "gpt2", "batch": 1, "seq": 32, "image_size": None, "build_dtype": build_dtype("bf16"),
              "layout": "nchw", "overrides": []}
    assert step_key("gpt2", "bf16", "meta", Shape(1, 32), "nchw", ()) == cache.key(fields)
    assert capture_key("gpt2", "bf16", {"device": "meta", "what": "serve model summary"}) == cache.key(
        {"model": "gpt2", "build_dtype": build_dtype("bf16"), "device": "meta", "what": "serve model summary"})
    assert step_key("gpt2", "bf16", "cpu", Shape(1, 32), "nchw", ()) is None
    assert capture_key(TINY, "bf16", {}) is None


@pytest.mark.parametrize("make, needle", [
    (lambda: Shape(-1), "--batch must be"),
    (lambda: Shape(1, float("nan")), "--seq must be"),
    (lambda: Shape(True), "--batch must be"),
    (lambda: Phase("serve"), "unknown phase 'serve'; accepted: prefill, decode, train"),
    (lambda: Phase("decode", kv_len=0), "--kv-len must be"),
    (lambda: Phase("train", zero=4), "--zero must be"),
    (lambda: Layout(tp=0), "--tp must be"),
    (lambda: Layout(devices=float("inf")), "--devices must be"),
    (lambda: RuntimeChoice("jit"), "unknown runtime 'jit'"),
])
def test_bad_config_values_are_refused_in_one_line(make, needle):
    with pytest.raises(OpmapError) as e:
        make()
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_training_step_runs_eager_only():
    spec = Phase("train").spec("gpt2", 1)
    with pytest.raises(OpmapError, match="--phase train runs eager"):
        RuntimeChoice("graphs").resolve(get_hardware("h100-sxm"), spec)


def test_the_graph_hash_of_a_capture_is_the_store_hash_of_its_file(monkeypatch):
    """opmap analyze records api.graph_hash of the captured graph; the run store hashes a run folder's
    analysis.json nodes (opmap.store.rows.graph_hash): the same run must get the same hash either way."""
    from opmap.api import graph_hash
    from opmap.store.rows import graph_hash as file_hash

    monkeypatch.setenv("OPMAP_GRAPH_CACHE", "0")
    for target in ("gpt2", TINY):
        a = Model(target, "bf16").prefill(Shape(1, 16), get_hardware("h100-sxm"), "eager")
        assert graph_hash(a.graph) == file_hash(json.loads(json.dumps(a.to_dict()["nodes"])))
