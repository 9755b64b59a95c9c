"""Shared fixtures: small zoo captures on the meta device (no weights allocated), one quick calibration of this
host per session.

No test reads what a user's machine left behind: every place opmap keeps state lies in one temporary folder of the
session (SESSION), set before opmap or transformers is imported and held by an autouse fixture -- the calibrated
profile ``--hardware local`` reads (hardware/local.py) and the graph and tune caches (capture/cache.py,
explore/tune/cache.py), all under $XDG_CACHE_HOME; the run store ($OPMAP_STORE, else under $XDG_DATA_HOME:
store/db.py). The capture cache stays off in tests (a cached graph must not answer for the code under test);
tests/capture/test_cache.py turns it on in a temporary folder. The local engine runs tasks inline ($OPMAP_WORKERS 1,
below)."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import shutil
import tempfile
import warnings

import pytest

SESSION = tempfile.mkdtemp(prefix="opmap-tests-")
OWN = {"XDG_CACHE_HOME": os.path.join(SESSION, "cache"), "XDG_DATA_HOME": os.path.join(SESSION, "data"),
       "OPMAP_STORE": os.path.join(SESSION, "runs.duckdb"), "OPMAP_GRAPH_CACHE": "0",
       # fit, sweep and serve --find-capacity run their tasks inline (opmap.explore.engine.WORKERS_ENV): a pool's
       # spawned interpreters each import torch, 10-40 s of a two-task test on a loaded 2-core host; the pool itself
       # is tested where it is the subject (tests/explore/test_engine.py names its workers, and
       # tests/cli/test_stop_cmd.py runs its commands without this variable)
       "OPMAP_WORKERS": "1"}
os.environ.update(OWN)

# imported after the environment is set: a module that reads a cache location as it is imported reads the session's
from opmap.analyze import analyze  # noqa: E402
from opmap.hardware import get_hardware  # noqa: E402
from opmap.workloads import build_zoo  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def own_caches():
    """The session's own caches (OWN), for every test; the folder is removed at the end of the session."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in OWN.items():
            mp.setenv(k, v)
        yield OWN
    shutil.rmtree(SESSION, ignore_errors=True)


@pytest.fixture(scope="session")
def session_calibration() -> str:
    """``--hardware`` for this machine's CPU: one quick calibration per session (13 s on 2 cores), into the session's
    folder (never the user's profile). A busy host is measured too, marked (--allow-busy): the tests that use it
    measure under the same load."""
    from opmap.cli import main

    out = os.path.join(SESSION, "calibration", "local.toml")
    assert main(["calibrate", "--quick", "--allow-busy", "--out", out, "--no-store"]) == 0
    return out


@functools.cache
def analysis(name: str, batch: int, seq: int, dtype: str = "fp32", hw: str = "h100-sxm"):
    return analyze(build_zoo(name, batch, seq, dtype), get_hardware(hw), dtype)


@pytest.fixture
def analysis_of():
    return analysis


@pytest.fixture(scope="session")
def onnx_zoo(tmp_path_factory):
    """Small zoo models exported once per session with torch.onnx.export (the TorchScript exporter, dynamo=False:
    offline and fast; opset 20, where Gelu is one op): name -> (path, module, example inputs). GPT-2 and BERT at
    2 layers, d 64, 4 heads, batch 2 x seq 32 with dynamic batch and seq dims; ResNet-50's topology (3, 4, 6, 3
    bottlenecks) at width 8 on 2 x 3 x 64 x 64 images, exported without constant folding (BatchNormalization
    kept, as eager PyTorch runs it) and, as ``resnet50-folded``, with it (BN folded into the convolutions); ViT at
    64 x 64 pixels, 2 layers, d 64."""
    import torch

    from opmap.workloads.bert import Bert, BertConfig
    from opmap.workloads.gpt2 import GPT2, GPT2Config
    from opmap.workloads.resnet import ResNet
    from opmap.workloads.vit import ViT, ViTConfig

    folder = tmp_path_factory.mktemp("onnx-zoo")
    torch.manual_seed(0)
    ids = torch.zeros(2, 32, dtype=torch.long)
    specs = {
        "gpt2": (GPT2(GPT2Config(vocab_size=1000, block_size=64, n_layer=2, n_head=4, n_embd=64)), (ids,),
                 ["input_ids"], {"input_ids": {0: "batch", 1: "seq"}}, {}),
        "bert": (Bert(BertConfig(vocab_size=1000, max_position=64, hidden=64, n_layer=2, n_head=4, intermediate=256)),
                 (ids, ids), ["input_ids", "token_type_ids"],
                 {"input_ids": {0: "batch", 1: "seq"}, "token_type_ids": {0: "batch", 1: "seq"}}, {}),
        "resnet50": (ResNet((3, 4, 6, 3), num_classes=10, width=8), (torch.randn(2, 3, 64, 64),), ["images"],
                     {"images": {0: "batch"}}, {"do_constant_folding": False}),
    }
    specs["resnet50-folded"] = (*specs["resnet50"][:4], {})
    specs["vit"] = (ViT(ViTConfig(image_size=64, hidden=64, n_layer=2, n_head=4, mlp_dim=256, num_classes=10)),
                    (torch.randn(2, 3, 64, 64),), ["images"], {"images": {0: "batch"}}, {})
    return _export(folder, specs)


@pytest.fixture(scope="session")
def onnx_llama(tmp_path_factory):
    """Llama (2 layers, d 64, 4 query heads over 2 KV heads) exported once per session with the dynamo exporter
    at opset 23 (the TorchScript exporter has no conversion for grouped-query SDPA): one ai.onnx Attention node per
    layer, RMSNormalization for the norms, static shapes (2 x 32 tokens). About 7 s: kept apart from onnx_zoo."""
    import torch

    from opmap.workloads.llama import Llama, LlamaConfig

    torch.manual_seed(0)
    ids = torch.zeros(2, 32, dtype=torch.long)
    module = Llama(LlamaConfig(vocab_size=1000, dim=64, n_layer=2, n_head=4, n_kv_head=2, ffn_dim=128, max_seq=64))
    folder = tmp_path_factory.mktemp("onnx-llama")
    return _export(folder, {"llama": (module, (ids,), ["input_ids"], None, {"dynamo": True, "opset_version": 23})})


def _export(folder, specs):
    import torch

    out = {}
    for name, (module, inputs, names, axes, kw) in specs.items():
        module = module.eval()
        path = folder / f"{name}.onnx"
        kw = {"dynamo": False, "opset_version": 20, "dynamic_axes": axes, **kw}
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(module, inputs, str(path), input_names=names, **kw)
        out[name] = (path, module, inputs)
    return out


@pytest.fixture
def cli(capsys):
    """``cli(*args)`` runs ``opmap ARGS`` in-process: (exit status, stdout, stderr); the command-line and
    engine-preset tests share it."""
    def run(*args):
        from opmap.cli import main

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
