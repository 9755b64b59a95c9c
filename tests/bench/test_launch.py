"""opmap.bench.launch: a real transformers serve on a random-weight model, answering, streaming token by token,
refusing past its context, and stopped by PID (folder removed) however its block ends."""

from __future__ import annotations

import http.client
import json
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import pytest
from launched_server import TINY_CONFIG, pid_alive

from opmap.bench.launch import PAGE_TOKENS, available_cores, launch_server
from opmap.errors import OpmapError


def _post(base_url: str, path: str, body: dict) -> tuple[int, list[dict]]:
    """POST ``body``; (status, the JSON of each SSE data event, or the body's JSON when not a stream)."""
    u = urlparse(base_url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        c.request("POST", path, json.dumps(body), {"content-type": "application/json"})
        r = c.getresponse()
        raw = r.read().decode()
    finally:
        c.close()
    if not body.get("stream") or r.status != 200:
        return r.status, [json.loads(raw)] if raw.strip().startswith("{") else []
    events = [ln[5:].strip() for ln in raw.splitlines() if ln.startswith("data:")]
    return r.status, [json.loads(e) for e in events if e != "[DONE]"]


def _procs_under(folder: Path) -> list[int]:
    """PIDs whose command line names ``folder`` (the server's model folder lives in it)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if str(folder) in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def test_the_server_answers_as_launched(server):
    """The served id is the model folder's path (transformers serve names a local model by it), torch gets one
    core fewer than this process may use, the KV cache is capped, and a streamed answer of 24 tokens comes as
    several events (with OMP_NUM_THREADS unset the whole answer arrived as one) with usage counting them."""
    assert server.model_id == str(server.model_dir)
    assert server.settings.threads == max(1, available_cores() - 1)
    assert server.settings.kv_tokens == server.settings.kv_blocks * PAGE_TOKENS
    assert pid_alive(server.pid)
    status, events = _post(server.base_url, "/v1/completions", {
        "model": server.model_id, "prompt": "w5 w6 w7 w8", "max_tokens": 24, "stream": True,
        "stream_options": {"include_usage": True}})
    assert status == 200
    usage = [e["usage"] for e in events if e.get("usage")]
    assert usage == [{"prompt_tokens": 4, "completion_tokens": 24, "total_tokens": 28}]
    text_events = [e for e in events if e.get("choices") and e["choices"][0].get("text")]
    assert len(text_events) >= 4, "the answer came in fewer than 4 events: torch starves the web process"
    # no EOS in the written model: every answer runs to max_tokens, each token one word of the vocabulary
    words = "".join(e["choices"][0]["text"] for e in text_events).split()
    assert len(words) == 24 and all(w.startswith("w") for w in words)


def test_a_prompt_at_the_context_is_an_http_400(server):
    prompt = " ".join(f"w{3 + i % 100}" for i in range(TINY_CONFIG["max_position_embeddings"]))
    status, body = _post(server.base_url, "/v1/completions", {"model": server.model_id, "prompt": prompt,
                                                              "max_tokens": 4})
    assert status == 400 and server.context == 1024


def test_stopped_and_removed_when_the_benchmark_raises(tiny_config, monkeypatch, tmp_path):
    """Ctrl-C (KeyboardInterrupt, which an ``except Exception`` would let through) inside the block: the server's
    PID is gone and its temp folder removed as the interrupt passes on."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        with launch_server(str(tiny_config), startup_timeout_s=120) as s:
            pid, folder = s.pid, s.model_dir.parent
            assert pid_alive(pid) and folder.is_dir()
            raise KeyboardInterrupt
    assert not pid_alive(pid) and not folder.exists()
    assert list(tmp_path.iterdir()) == [] and _procs_under(tmp_path) == []


def test_a_server_not_ready_in_time_is_stopped_with_its_log(tiny_config, monkeypatch, tmp_path):
    """Start-up takes seconds: a 0.5 s limit fails in one message naming the limit and quoting the server's log,
    and leaves no process and no folder behind."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(OpmapError, match=r"not ready after 0.5 s .*its last log lines"):
        with launch_server(str(tiny_config), startup_timeout_s=0.5):
            pass
    assert list(tmp_path.iterdir()) == [] and _procs_under(tmp_path) == []


@pytest.mark.parametrize("cfg, needle", [
    ({**TINY_CONFIG, "num_hidden_layers": 64, "hidden_size": 8192, "intermediate_size": 28672,
      "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256}, "GiB, over 50% of the"),
    ({**TINY_CONFIG, "vocab_size": 8}, "vocab_size 8 is too small"),
])
def test_configs_it_cannot_serve_are_refused_before_starting(tmp_path, monkeypatch, cfg, needle):
    """A 64-layer, 8192-wide Llama (about 56e9 parameters, 224 GB at fp32: 64 x (4 x 8192^2 x (1 + 2 x 1/8) ... )
    is refused by its size before any weight is allocated; a vocabulary too small for a tokenizer likewise."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(OpmapError, match=needle):
        with launch_server(str(p)):
            pass
    assert list((tmp_path / "tmp").iterdir()) == []


def test_bad_options_are_one_line_errors(tiny_config):
    with pytest.raises(OpmapError, match="--kv-blocks"):
        with launch_server(str(tiny_config), kv_blocks=0):
            pass
    with pytest.raises(OpmapError, match="accepted: cpu, cuda"):
        with launch_server(str(tiny_config), device="tpu"):
            pass
    with pytest.raises(OpmapError, match="does not exist"):
        with launch_server("/nonexistent/config.json"):
            pass
