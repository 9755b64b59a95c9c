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


def test_a_batch_beyond_memory_is_the_users_batch_not_the_models_error(refused, fail_if_called):
    """gpt2 at batch 100000 x seq 512: the embedding's output alone is 100000 x 512 x 768 x 4 B = 157 GB, which
    the CPU allocator refuses at once (the ids, 410 MB, and the weights, 0.5 GB, are all that is allocated)."""
    fail_if_called("opmap.cli.calibrate.run_calibration")
    refused("profile", "gpt2", "--batch", "100000", "--seq", "512", "--hardware", "xeon-8480", "--iters", "1",
            "--warmup", "0", "--profile-iters", "1", needle="profile of gpt2 at batch 100000 x seq 512 does not fit")
