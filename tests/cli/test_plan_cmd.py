"""opmap plan and the parallel flags of opmap analyze."""

from __future__ import annotations

import json

import pytest


def test_plan_gpt2_ranks(tmp_path, cli):
    rc, out, err = cli("plan", "gpt2", "--hardware", "h100-sxm", "--devices", 8, "--seq", 64, "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "plan.json").read_text())
    assert d["legal_fitting"] > 0 and d["ranked"]
    tps = [c["tokens_per_s"] for c in d["ranked"]]
    assert tps == sorted(tps, reverse=True)
    assert all(c["tp"] * c["cp"] * c["pp"] * c["dp"] == 8 for c in d["ranked"])
    assert all(c["reason"] for c in d["rejected"])
    # context parallelism searched: 64 tokens split into 2 cp chunks for cp in 1, 2, 4, 8 (all divide 64 / 2)
    assert d["cp_searched"] == [1, 2, 4, 8] and any(c["cp"] > 1 for c in d["ranked"])
    # the header names the sequence and the global batch (default 2 x devices = 16)
    assert d["seq"] == 64 and d["global_batch"] == 16
    assert "seq 64, global batch 16" in " ".join(out.split())
    md = (tmp_path / "plan.md").read_text()
    assert "Sequence 64 tokens, global batch 16 sequences." in md
    # memory in binary GiB on screen and in plan.md, as the rest of opmap prints it
    first = d["ranked"][0]["memory_bytes"] / 2**30
    assert f"{first:.4g} GiB" in out and "| memory (GiB) |" in md and f"| {first:.4g} |" in md


def test_plan_rejects_with_numbers(tmp_path, cli):
    rc, out, err = cli("plan", "llama-3-8b", "--devices", 1, "--seq", 128, "--global-batch", 1, "--out", tmp_path)
    assert rc == 0, err
    d = json.loads((tmp_path / "plan.json").read_text())
    assert d["ranked"] == []  # 8B training state alone is 128 GB (16 B per parameter)
    # binary GiB, as every other command prints memory (an H100's 80 GB of HBM is 80 GiB)
    assert all(" GiB per device of 80 GiB" in c["reason"] for c in d["rejected"])


def test_analyze_parallel_block(tmp_path, cli):
    rc, out, err = cli("analyze", "gpt2", "--seq", 64, "--tp", 2, "--dp", 2, "--out", tmp_path, "--rows", 1)
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    assert d["parallelism"]["tp"] == 2 and d["parallelism"]["devices"] == 4
    coll = [k for k in d["kernels"] if k["kernel_class"] == "collective"]
    assert coll and all(k["bound"] == "interconnect" for k in coll)
    assert {"collective", "message_bytes", "group_size", "link", "predicted_s"} <= set(coll[0])


def test_analyze_default_has_no_parallel_block(tmp_path, cli):
    rc, out, err = cli("analyze", "gpt2", "--seq", 64, "--out", tmp_path, "--rows", 1)
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    assert "parallelism" not in d
    assert all(k["kernel_class"] != "collective" for k in d["kernels"])


def test_bad_layouts_exit_2(refused):
    refused("analyze", "gpt2", "--tp", 5, needle="does not divide the 12 attention heads")
    refused("analyze", "gpt2", "--tp", 2, "--devices", 4, needle="is not tp x pp x dp")
    refused("analyze", "gpt2", "--sp", needle="needs --tp above 1")
    refused("analyze", "gpt2", "--tp", 2, "--cp", 2, "--devices", 8, needle="is not tp x cp x pp x dp")
    # 12 layers' causal attention over cp 3: 64 tokens do not split into 6 chunks
    refused("analyze", "gpt2", "--seq", 64, "--cp", 3, needle="needs the sequence 64 to divide into 6 chunks")


def test_analyze_cp_reports_the_ring(tmp_path, cli):
    rc, out, err = cli("analyze", "gpt2", "--seq", 64, "--cp", 2, "--phase", "train", "--out", tmp_path, "--rows", 1)
    assert rc == 0, err
    d = json.loads((tmp_path / "analysis.json").read_text())
    assert d["parallelism"]["cp"] == 2 and d["parallelism"]["devices"] == 2
    ring = [k for k in d["kernels"] if k["kernel_class"] == "collective" and k["purpose"].startswith("CP")]
    # gpt2: 12 layers, one ring step each way per layer at cp 2 (cp - 1 = 1)
    assert {k["phase"] for k in ring} == {"forward", "backward"} and all(k["count"] == 12 for k in ring)
    assert "CP ring" in " ".join(out.split())


def test_plan_refuses_an_absurd_device_count(refused, fail_if_called):
    """Before: --devices 2**30 was taken and the layout search ran on for minutes."""
    fail_if_called("opmap.explore.plan.plan")
    refused("plan", "gpt2", "--devices", 2**30, "--no-store",
            needle="--devices must be an integer from 1 to 131072 (got 1073741824)")


def test_an_attention_kernel_the_device_has_no_rows_for_is_refused(refused, fail_if_called):
    fail_if_called("opmap.explore.plan.plan")
    refused("plan", "gpt2", "--devices", 8, "--attention-kernel", "fa9", "--no-store",
            needle="--attention-kernel 'fa9': h100-sxm has no measured rows for it; accepted: cudnn, fa2, fa3")
    refused("analyze", "gpt2", "--hardware", "a100-sxm-80gb", "--attention-kernel", "fa2", "--no-store",
            needle="a100-sxm-80gb has no measured rows for it; accepted: none")


def test_analyze_prices_attention_with_the_kernel_it_names(tmp_path, cli):
    """A long causal prefill on the H100: FlashAttention-2 runs the attention core at its measured 333 TFLOP/s where
    cuDNN runs 529 (FlashAttention-3 paper, Figure 5, causal, 8k, head dim 128): the kernel's time grows by that
    ratio and the assumptions name the kernel."""
    times = {}
    for k in ("cudnn", "fa2"):
        out = tmp_path / k
        rc, _, err = cli("analyze", "llama-3-8b", "--seq", 8192, "--attention-kernel", k, "--out", out, "--rows", 1,
                         "--no-store")
        assert rc == 0, err
        d = json.loads((out / "analysis.json").read_text())
        assert d["assumptions"]["attention_kernel"].startswith(f"{k}:")
        attn = [x for x in d["kernels"] if x["kernel_class"] == "matrix" and "flash tiling" in x["why"]]
        assert len(attn) == 32  # one attention core per layer
        times[k] = sum(x["predicted_s"] for x in attn)
    assert times["fa2"] / times["cudnn"] == pytest.approx(529 / 333, rel=0.02)


@pytest.mark.parametrize("factor,why", [("nan", "--attention-dropout must be"), ("0.5", "--attention-dropout must be"),
                                        ("inf", "--attention-dropout must be")])
def test_an_attention_dropout_factor_below_one_or_not_finite_is_refused(refused, fail_if_called, factor, why):
    fail_if_called("opmap.explore.plan.plan")
    refused("plan", "gpt2", "--devices", 8, "--attention-dropout", factor, "--no-store", needle=why)
    refused("analyze", "gpt2", "--attention-dropout", factor, "--no-store", needle=why)


def test_analyze_prices_attention_dropout_at_the_factor_it_names(tmp_path, cli):
    """A GPT-2 config with attention dropout 0.1 (attn_pdrop) trained on the H100: the attention kernels' matrix time
    is the catalog's cuDNN factor (0.614 / 0.594 ms, TransformerEngine issue 3312) over the no-dropout curve by
    default, and --attention-dropout 2 doubles the no-dropout time; the assumptions say which."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 256, "n_head": 2, "n_positions": 1024,
                               "vocab_size": 1000, "attn_pdrop": 0.1, "resid_pdrop": 0.1, "embd_pdrop": 0.1}))
    got = {}
    for flag in ((), ("--attention-dropout", 2)):
        out = tmp_path / f"out{len(flag)}"
        rc, _, err = cli("analyze", str(cfg), "--phase", "train", "--seq", 1024, "--batch", 2, *flag, "--out", out,
                         "--rows", 1, "--no-store")
        assert rc == 0, err
        d = json.loads((out / "analysis.json").read_text())
        attn = [x for x in d["kernels"] if "flash tiling" in x["why"]]
        assert len(attn) == 4  # forward and backward of two layers
        got[flag] = (sum(x["matrix_s"] for x in attn), d["assumptions"]["attention_dropout"])
    (default_s, default_line), (two_s, two_line) = got[()], got[("--attention-dropout", 2)]
    assert two_s / default_s == pytest.approx(2 / (0.614 / 0.594), rel=1e-3)
    assert "cudnn runs 1.03x" in default_line and "3312" in default_line
    assert "cudnn runs 2x" in two_line and "--attention-dropout" in two_line


def test_plan_places_tp_across_a_trn2_ultraserver(tmp_path, cli):
    """A Llama config of 32 heads on 32 Trn2 chips: tp 32 spans two 16-chip instances of one u-trn2x64 UltraServer
    (the catalog's 64-chip NeuronLink tier), so plan tries it; before, TP stopped at the 16 of one instance."""
    cfg = {"model_type": "llama", "vocab_size": 2048, "hidden_size": 512, "intermediate_size": 1024,
           "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 32,
           "max_position_embeddings": 4096, "torch_dtype": "float32"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    rc, _, err = cli("plan", path, "--hardware", "trn2", "--devices", 32, "--seq", 64, "--phase", "prefill",
                     "--dtype", "bf16", "--out", tmp_path / "p")
    assert rc == 0, err
    d = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert any(c["tp"] == 32 for c in d["ranked"] + d["rejected"])
