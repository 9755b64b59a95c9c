"""A bench run read back from its folder (opmap.bench.run_files): every record as the client made it (the
server's completion ids included), the load and the endpoint; a folder that is not a run is one line."""

from __future__ import annotations

import json

import pytest

from opmap.bench.client import run_load
from opmap.bench.nullserver import NullConfig, NullServer, ThreadServer
from opmap.bench.records import RequestSpec
from opmap.bench.run_files import read_run
from opmap.errors import OpmapError


def test_a_run_folder_round_trips(tmp_path, capsys):
    from opmap.cli import main

    with ThreadServer(NullServer(NullConfig(first_token_s=0.01, token_s=0.002))) as port:
        rc = main(["bench", f"http://127.0.0.1:{port}", "--model", "null", "--concurrency", "2", "--requests", "6",
                   "--input-len", "8", "--output-len", "5", "--no-store", "--out", str(tmp_path / "run")])
        assert rc == 0
        direct = run_load(f"http://127.0.0.1:{port}", "null", [RequestSpec(0, None, "a b c", 3, 4)], concurrency=1)
    assert direct.records[0].response_id == "null"  # the null server's chunks carry "id": "null"
    run = read_run(tmp_path / "run")
    body = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert run.result.mode == "closed" and run.concurrency == 2 and run.result.model == "null"
    assert len(run.result.records) == body["requests"]["measured"] == 6
    r = min(run.result.records, key=lambda r: r.index)
    assert r.ok and r.output_tokens_asked == 5 and len(r.token_times_s) == 5 and r.response_id == "null"
    assert r.first_token_s == r.token_times_s[0] and r.sent_s < r.first_token_s <= r.end_s
    assert run.label().endswith("(closed loop c=2)")


def test_what_is_not_a_run_is_one_line(tmp_path):
    with pytest.raises(OpmapError, match="not a folder"):
        read_run(tmp_path / "missing")
    (tmp_path / "bench.json").write_text(json.dumps({"kind": "serve"}))
    with pytest.raises(OpmapError, match="is not a bench run's"):
        read_run(tmp_path)
    (tmp_path / "bench.json").write_text(json.dumps({"kind": "bench", "client": {"mode": "open"}}))
    with pytest.raises(OpmapError, match="no requests.parquet"):
        read_run(tmp_path)


def test_a_run_records_the_servers_models_and_version_and_the_client_host(tmp_path, server):
    """The real transformers serve: its /v1/models entry kept (id, owned_by); it has no /version (vLLM and SGLang
    answer {"version": ...}), so none is recorded; the client's host is this machine."""
    import platform

    from opmap.cli import main

    rc = main(["bench", server.base_url, "--model", server.model_id, "--requests", "2", "--input-len", "8",
               "--output-len", "4", "--no-store", "--out", str(tmp_path / "run")])
    assert rc == 0
    body = json.loads((tmp_path / "run" / "bench.json").read_text())
    info = body["endpoint"]["server_info"]
    assert info["models"][0]["id"] == server.model_id and "version" not in info
    assert body["client"]["host"]["name"] == platform.node() and body["client"]["host"]["cpus"] >= 1
    run = read_run(tmp_path / "run")
    assert all(r.response_id for r in run.result.records if r.ok)  # transformers serve names each completion


class _VersionedServer(NullServer):
    """The null endpoint plus vLLM's ``GET /version`` ({"version": ...}: vllm/entrypoints/openai/api_server.py)
    and a /v1/models entry with vLLM's ModelCard fields."""

    async def route(self, method, path, body, writer):
        from opmap.bench.nullserver import _response

        if method == "GET" and path == "/version":
            writer.write(_response("200 OK", b'{"version": "0.9.1"}'))
            return await writer.drain()
        if method == "GET" and path.rstrip("/") == "/v1/models":
            card = {"id": "null", "object": "model", "owned_by": "vllm", "root": "/models/x", "max_model_len": 4096,
                    "permission": [{"nested": "dropped"}]}
            writer.write(_response("200 OK", json.dumps({"object": "list", "data": [card]}).encode()))
            return await writer.drain()
        return await super().route(method, path, body, writer)


def test_a_servers_version_and_model_card_are_kept():
    with ThreadServer(_VersionedServer(NullConfig())) as port:
        res = run_load(f"http://127.0.0.1:{port}", "null", [RequestSpec(0, None, "a b", 2, 3)], concurrency=1)
    assert res.server_info == {"models": [{"id": "null", "max_model_len": 4096, "owned_by": "vllm",
                                           "root": "/models/x"}], "version": "0.9.1"}


def test_the_launched_servers_settings_are_read_typed():
    """bench.json's ``launched`` block (a LaunchedServer's record) read back as the settings a stack fit takes:
    64 KV blocks of 16 tokens (kv_tokens 64 x 16 = 1024), 256 tokens a step; a run against a URL has none; a
    setting of the wrong type (a damaged file) is absent, never a crash."""
    from pathlib import Path

    from opmap.bench.launch import LaunchedServer, LaunchSettings
    from opmap.bench.run_files import Launched
    from opmap.record import record

    settings = LaunchSettings("cfg.json", "cpu", 2, 64, 16, 64 * 16, 256, "fifo", 0.5, 3.0, 1000, 32, "llama",
                              "bfloat16", 128, "transformers serve", "5.0")
    srv = LaunchedServer("http://127.0.0.1:1", "m", Path("/m"), Path("/t"), 1, 128, settings)
    block = json.loads(json.dumps(record(srv)))  # as bench.json holds it
    assert Launched.of(block) == Launched("cfg.json", "bfloat16", 256, 16, 64, 1024)
    assert Launched.of(None) is None and Launched.of({}) is None
    assert Launched.of({"settings": {"config": 3, "kv_blocks": True, "page_tokens": 16}}) == Launched(
        None, None, None, 16, None, None)
    assert Launched.of({"settings": "x"}) == Launched(None, None, None, None, None, None)
