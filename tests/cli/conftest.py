"""Fixtures for the command-line tests: run ``main`` in-process, a tiny user model, a stand-in calibration,
published Hugging Face configs."""

from __future__ import annotations

import json

import pytest

from opmap.cli import main

TINY = ("import torch\n"
        "def tiny():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()), (torch.randn(2, 16),)\n")


@pytest.fixture
def cli(capsys):
    """``cli(*args)`` runs ``opmap ARGS`` in-process: (exit status, stdout, stderr)."""
    def run(*args):
        rc = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return rc, out, err

    return run


@pytest.fixture
def refused(cli):
    """``refused(*args, needle=...)``: exit status 2, one line on stderr holding ``needle``, no traceback."""
    def run(*args, needle: str):
        rc, out, err = cli(*args)
        lines = [x for x in err.splitlines() if x.strip()]
        assert rc == 2 and len(lines) == 1 and needle in lines[0], (rc, err)
        assert "Traceback" not in err + out
        return lines[0]

    return run


@pytest.fixture
def tiny_model(tmp_path):
    """path/to/tiny.py:tiny, a two-layer user model."""
    f = tmp_path / "tiny.py"
    f.write_text(TINY)
    return f"{f}:tiny"


@pytest.fixture
def fail_if_called(monkeypatch):
    """``fail_if_called("module.attr")``: calling it fails the test (work that bad input must not reach)."""
    def patch(target: str):
        def boom(*_a, **_k):
            raise AssertionError(f"{target} ran on bad input")

        monkeypatch.setattr(target, boom)

    return patch


@pytest.fixture
def stand_in_calibration(monkeypatch):
    """The library's calibrate replaced by a fixed, tiny CPU calibration (no measuring); the calls made to it
    are recorded in the returned list."""
    import torch

    from opmap.calibrate import Calibration, fingerprint
    from opmap.timing import Sample

    calls = []

    def fake(device="cpu", quick=False, progress=None, budgeted=True):
        calls.append((device, quick))
        if progress:
            progress("matmul fp32 256x256x256")
        return Calibration(
            device, fingerprint(torch.device(device)),
            matmul=[{"m": 256, "n": 256, "k": 256, "dtype": "fp32", "layout": "nt", "flops_per_s": 1e11,
                     "min_s": 3.2e-4, "max_s": 3.6e-4}],
            bandwidth=[{"kind": "copy", "bytes": 2 ** 20, "bytes_per_s": 1e10, "min_s": 1e-4, "max_s": 1.2e-4}],
            launch_overhead=Sample((5e-6, 6e-6, 7e-6)), vector={"fp32": 1e10}, transcendental_per_s=1e9,
            view_overhead_s=2e-6)

    monkeypatch.setattr("opmap.calibrate.calibrate", fake)
    return calls


# Published config.json files, field for field as their hub repositories hold them (written here: tests download
# nothing). The figures the tests check are worked from these fields.
PUBLISHED_CONFIGS = {
    "Qwen/Qwen2.5-7B": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
        "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
        "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False,
        "use_sliding_window": False, "vocab_size": 152064},
}


@pytest.fixture
def published_config(tmp_path):
    """``published_config(repo)``: the path of a config.json holding PUBLISHED_CONFIGS[repo] (``**fields`` replace
    some of its fields)."""
    def write(repo: str, **fields) -> str:
        path = tmp_path / repo.replace("/", "--") / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**PUBLISHED_CONFIGS[repo], **fields}))
        return str(path)

    return write
