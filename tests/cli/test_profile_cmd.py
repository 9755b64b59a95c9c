"""opmap profile: bad input refused before a calibration or a build; the first use of --hardware local
calibrates through the library, then profiles. (The profile itself is tested in measure/.)"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("args,needle", [
    (("--device", "meta"), "profile runs on a real device; accepted: cpu, cuda (got 'meta')"),
    (("--dtype", "int8"), "profile runs torch dtypes; accepted: fp32, tf32, bf16, fp16 (got 'int8'"),
    (("--datasheet", "nope"), "unknown hardware 'nope'"),
])
def test_bad_input_fails_before_calibrating(empty_cache, refused, fail_if_called, args, needle):
    fail_if_called("opmap.calibrate.calibrate")
    fail_if_called("opmap.workloads.load_workload")
    refused("profile", "gpt2", *args, needle=needle)
    assert not empty_cache.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_device(empty_cache, refused, fail_if_called):
    fail_if_called("opmap.calibrate.calibrate")
    refused("profile", "gpt2", "--device", "cuda",
            needle="--device cuda: no CUDA device is available here; accepted: cpu")


@pytest.mark.parametrize("args,needle", [
    (("no-such-model", "--hardware", "h100-sxm"), "unknown model"),
    (("gpt2", "--hardware", "nope"), "unknown hardware 'nope'"),
    (("gpt2", "--hardware", "h100-sxm", "--image-size", "64"), "takes --seq, not --image-size"),
])
def test_bad_model_or_hardware(empty_cache, refused, fail_if_called, args, needle):
    fail_if_called("opmap.calibrate.calibrate")
    refused("profile", *args, needle=needle)


BAD_MODELS = {  # target (in tmp_path) -> the file written there (None: none), the refusal
    "missing.py:tiny": (None, "model file {tmp}/missing.py does not exist"),
    "bad.py:tiny": ("def tiny():\n    raise ValueError('boom')\n",
                    "bad.py:tiny() on device 'cpu' failed: ValueError: boom"),
    "config.json": ('{"model_type": "llama", "hidden_size": -4}', "hidden_size must be an integer from 1 to"),
    "missing.onnx": (None, "ONNX model {tmp}/missing.onnx does not exist (or is not a file)"),
}


@pytest.mark.parametrize("name", list(BAD_MODELS))
def test_a_bad_model_file_is_refused_before_the_first_use_calibration(empty_cache, refused, fail_if_called, tmp_path,
                                                                      name):
    """A user's file, a Hugging Face config or an ONNX model that cannot be read is refused in one line before the
    minute-long calibration a first use of --hardware local runs (it ran first, then the model failed)."""
    fail_if_called("opmap.calibrate.calibrate")
    text, needle = BAD_MODELS[name]
    if text is not None:
        (tmp_path / name.split(":")[0]).write_text(text)
    refused("profile", f"{tmp_path}/{name}", "--iters", "1", needle=needle.format(tmp=tmp_path))
    assert not empty_cache.exists()


def test_a_zoo_shape_past_its_positions_is_refused_before_the_first_use_calibration(empty_cache, refused,
                                                                                   fail_if_called):
    fail_if_called("opmap.calibrate.calibrate")
    refused("profile", "gpt2", "--seq", "4096", needle="gpt2 takes --seq from 1 to 1024, got 4096")
    assert not empty_cache.exists()


def test_first_use_of_local_calibrates_then_profiles(empty_cache, cli, stand_in_calibration, tiny_model, tmp_path):
    rc, out, err = cli("profile", tiny_model, "--iters", "2", "--profile-iters", "1", "--warmup", "0",
                       "--out", tmp_path / "p")
    assert rc == 0, err
    assert stand_in_calibration == [("cpu", False)]  # the full grid, as opmap calibrate would run it
    assert "no calibration for cpu yet" in out and "running opmap calibrate first" in out
    assert f"wrote {empty_cache / 'opmap' / 'local.toml'}; use it with --hardware local" in out
    assert "p50" in out and (tmp_path / "p" / "profile.json").is_file()
    # the second run finds the profile and does not calibrate again
    rc, out, err = cli("profile", tiny_model, "--iters", "1", "--profile-iters", "1", "--warmup", "0")
    assert rc == 0, err
    assert stand_in_calibration == [("cpu", False)] and "no calibration" not in out


@pytest.mark.parametrize("args,needle", [
    (["--iters", "0"], "--iters must be an integer from 1 to 2147483647 (got 0)"),
    (["--warmup", "-1"], "--warmup must be an integer from 0 to 2147483647 (got -1)"),
    (["--profile-iters", "0"], "--profile-iters must be an integer from 1 to"),
    (["--batch", "0"], "--batch must be an integer from 1 to")])
def test_counts_are_refused_before_calibrating(refused, fail_if_called, args, needle):
    fail_if_called("opmap.cli.calibrate.run_calibration")
    fail_if_called("opmap.cli.common.build_workload")
    refused("profile", "gpt2", *args, needle=needle)


def test_a_batch_beyond_memory_is_refused_before_calibrating_or_building(empty_cache, refused, fail_if_called):
    """The newcomer's command, gpt2 at batch 100000 x seq 512 with no --hardware (a first use would calibrate):
    refused from the meta capture's sizes before the calibration and before any real tensor. The floor
    (opmap.measure.oom.run_bytes, fp32): the weights, 124,439,808 x 4 B = 0.50 GB, plus the largest operator,
    the lm_head matmul, 100000 x 512 x 768 x 4 B = 157.29 GB in and 100000 x 512 x 50257 x 4 B = 10,292.63 GB
    out: 10,450.4 GB."""
    fail_if_called("opmap.cli.calibrate.run_calibration")
    fail_if_called("opmap.api.check_memory")  # the first step of a real-tensor build
    refused("profile", "gpt2", "--batch", "100000", "--seq", "512",
            needle="profile of gpt2 at batch 100000 x seq 512 needs at least 10,450.4 GB on cpu")


BIG = ("import torch\n"
       "class Big(torch.nn.Module):\n"
       "    def forward(self, x):\n"
       "        return x.new_empty(2 ** 46)\n"
       "def big():\n"
       "    return Big(), (torch.zeros(2),)\n")


def test_the_allocators_refusal_is_the_users_request_not_the_models_error(refused, fail_if_called, tmp_path):
    """A user's model (not sized up front) whose forward asks for 2^46 fp32 elements, 2^48 B = 281,475.0 GB: the
    CPU allocator refuses at once, and the line names the request and the bytes, not a fault of the model."""
    f = tmp_path / "big.py"
    f.write_text(BIG)
    fail_if_called("opmap.cli.calibrate.run_calibration")
    line = refused("profile", f"{f}:big", "--hardware", "xeon-8480", "--iters", "1", "--warmup", "0",
                   "--profile-iters", "1", "--no-store",
                   needle=f"profile of {f}:big at batch 1 does not fit in cpu memory: one allocation asked for "
                          "281,475.0 GB")
    assert "error in the model" not in line


TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def slow_profile(path) -> str:
    """A hardware profile whose fp32 matrix peak is 1 MFLOP/s (any CPU beats it): not this device's."""
    from opmap.calibrate import to_toml

    v = lambda x: {"value": x, "kind": "measured", "source": "test profile"}  # noqa: E731
    path.write_text(to_toml({"name": "slowcpu", "display_name": "slow cpu", "vendor": "test", "device_type": "cpu",
                             "matrix_peak_flops_per_s": {"fp32": v(1e6)}, "vector_peak_flops_per_s": {"fp32": v(1e6)},
                             "memory_bytes": v(64e9), "memory_bandwidth_bytes_per_s": v(1e8),
                             "launch_overhead_s": v(3e-6)}))
    return str(path)


@pytest.mark.parametrize("kind", ["zoo", "hf-config", "onnx"])
def test_an_mfu_past_100_percent_is_printed_with_a_warning(cli, tmp_path, onnx_zoo, kind):
    """`profile model.onnx` printed MFU 106% and predicted / measured 16.3 with no warning. MFU = matrix FLOPs / (p50
    x peak) cannot pass 100%: printed past it, a warning line says it is impossible and what it suggests; a
    predicted / measured past 3x gets one too. The MFU is checked against that formula from profile.json."""
    import json

    pytest.importorskip("transformers")
    if kind == "zoo":
        target = ["resnet50", "--image-size", "32"]
    elif kind == "hf-config":
        (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
        target = [tmp_path / "config.json", "--seq", "16"]
    else:
        target = [onnx_zoo["gpt2"][0], "--seq", "16"]
    rc, out, err = cli("profile", *target, "--hardware", slow_profile(tmp_path / "slow.toml"), "--iters", "2",
                       "--profile-iters", "1", "--warmup", "1", "--no-store", "--out", tmp_path / "p")
    assert rc == 0, err
    d = json.loads((tmp_path / "p" / "profile.json").read_text())
    m = d["mfu"]
    assert m["calibrated"]["mfu"] == pytest.approx(m["model_matrix_flops"] / (m["latency_s"] * 1e6))
    assert m["calibrated"]["mfu"] > 1 and m["latency_s"] == d["latency"]["p50_s"]
    text = " ".join(out.split())
    assert f"MFU {m['calibrated']['mfu']:.1%}" in text
    assert f"warning: MFU {m['calibrated']['mfu']:.0%} of the calibrated peak (slowcpu, 1e+06 FLOP/s) is impossible" \
        in text and "profile with --hardware local" in text
    assert d["accuracy"]["predicted_over_measured"] > 3 and "beyond 3x either way" in text


# AdamW keeps two fp32 states per parameter (Loshchilov & Hutter 2019, Algorithm 2: m and v; torch.optim.AdamW's
# exp_avg and exp_avg_sq): 8 B a parameter at fp32. ResNet-50 has 25,557,032 parameters (torchvision's model card,
# ResNet50_Weights.IMAGENET1K_V1 num_params); the tiny Llama config: embeddings and LM head 2 x 256 x 64, per layer q
# and o 64 x 64, k and v 64 x 32 (2 KV heads of 16), gate, up and down 3 x 64 x 128, two norms 64; the final norm 64.
TRAIN_PARAMS = {"zoo": 25_557_032,
                "hf-config": 2 * 256 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 64}


@pytest.mark.parametrize("kind", ["zoo", "hf-config"])
def test_a_training_profile_runs_and_names_the_optimizer_it_predicts(cli, tmp_path, kind):
    """`profile resnet50 --train` predicted an AdamW step and timed an SGD loop: the measured step runs AdamW too,
    its state in the run is what the prediction holds (8 B a parameter), and the output names it."""
    import json

    pytest.importorskip("transformers")
    if kind == "zoo":
        target = ["resnet50", "--image-size", "32", "--batch", "2"]
    else:
        (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
        target = [tmp_path / "config.json", "--seq", "16"]
    rc, out, err = cli("profile", *target, "--train", "--iters", "1", "--profile-iters", "1", "--warmup", "0",
                       "--no-store", "--hardware", slow_profile(tmp_path / "slow.toml"), "--out", tmp_path / "p")
    assert rc == 0, err
    d = json.loads((tmp_path / "p" / "profile.json").read_text())
    state = 8 * TRAIN_PARAMS[kind]
    assert d["optimizer"]["predicted_state_bytes"] == d["optimizer"]["measured_state_bytes"] == state
    assert d["memory"]["per_device"]["optimizer_bytes"] == state and d["phase"]["optimizer"] == "adamw"
    text = " ".join(out.split())
    assert "training step (forward, loss, backward, AdamW update)" in text
    assert "optimizer: adamw in the prediction and the measured step" in text


def test_the_optimizer_is_refused_without_a_training_step_or_unknown(refused, fail_if_called):
    fail_if_called("opmap.calibrate.calibrate")
    refused("profile", "gpt2", "--optimizer", "sgd", needle="--optimizer names a training step's update: add --train")
    refused("profile", "gpt2", "--train", "--optimizer", "lion",
            needle="unknown optimizer 'lion'; accepted: adamw, adamw-fused, sgd")
