"""Other benchmark tools run for real against the tests' launched ``transformers serve`` (tests/bench/conftest.py's
``server``), each from its own virtual environment (``make setup`` creates them beside the main one: their pins
clash with the dev environment's torch and transformers), so that ``opmap bench --from`` is tested on the files
the tools write.

- AIPerf (``aiperf profile``): its artifact folder holds profile_export_aiperf.json (the summary) and
  profile_export.jsonl (one record per request).
- GuideLLM (``guidellm run``): its JSON report (``--output kind=json,path=...``).
- inference-perf (``inference-perf --config_file``): its report folder (summary_lifecycle_metrics.json,
  per_request_lifecycle_metrics.json with ``report.request_lifecycle.per_request``).

Each tool gets a few requests (a 2-layer random-weight model: a request is milliseconds on the server; the tools'
own start-up, 5-30 s each, is most of the time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TOOLS = ("aiperf", "guidellm", "inference-perf")
REQUESTS = 6
CONCURRENCY = 2
INPUT_TOKENS = 32
OUTPUT_TOKENS = 16


def venv(tool: str) -> Path:
    """The tool's virtual environment: ``ext-TOOL`` inside the environment running the tests (the Makefile's
    ``$(VENV)/ext-TOOL``), or $OPMAP_EXT_VENVS/ext-TOOL."""
    root = Path(os.environ.get("OPMAP_EXT_VENVS") or sys.prefix)
    return root / f"ext-{tool}"


def missing(tool: str) -> str | None:
    """Why the tool cannot run here (None: it can)."""
    exe = venv(tool) / "bin" / tool
    return None if exe.exists() else f"{exe} is missing (make setup installs it)"


def _env(tool: str) -> dict[str, str]:
    """The tool's environment: no GPU, its venv first on PATH, none of the test run's Python path (the tool
    imports its own transformers). Offline (the launched model's tokenizer is a local folder), except for AIPerf:
    in HF_HUB_OFFLINE mode it resolves every tokenizer name through the Hub cache (aiperf 0.13.0
    common/tokenizer.py ``_resolve_local_snapshot``), which refuses a local folder; given a path online, it loads
    the folder with AutoTokenizer and asks the Hub nothing."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "HF_HUB_OFFLINE",
                                                             "TRANSFORMERS_OFFLINE")}
    if tool != "aiperf":
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.update(CUDA_VISIBLE_DEVICES="", HF_HUB_DISABLE_TELEMETRY="1", NO_COLOR="1", TERM="dumb",
               PATH=f"{venv(tool) / 'bin'}:{env.get('PATH', '')}")
    return env


def _run(tool: str, args: list[str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess:
    p = subprocess.run([str(venv(tool) / "bin" / tool), *args], cwd=cwd, env=_env(tool), capture_output=True,
                       text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise AssertionError(f"{tool} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def run_aiperf(srv, out: Path, timeout_s: float = 300.0) -> Path:
    """``aiperf profile`` at concurrency CONCURRENCY, REQUESTS requests of INPUT_TOKENS -> OUTPUT_TOKENS, streaming
    completions; the artifact folder."""
    art = out / "aiperf"
    _run("aiperf", ["profile", "--model", srv.model_id, "--url", srv.base_url, "--endpoint-type", "completions",
                    "--streaming", "--tokenizer", str(srv.tokenizer_dir), "--concurrency", str(CONCURRENCY),
                    "--request-count", str(REQUESTS), "--synthetic-input-tokens-mean", str(INPUT_TOKENS),
                    "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(OUTPUT_TOKENS),
                    "--output-tokens-stddev", "0", "--artifact-dir", str(art), "--ui-type", "none",
                    "--random-seed", "0"], out, timeout_s)
    return art


def _words(n: int, seed: int) -> str:
    """A prompt of ``n`` of the launched model's words (its word-level tokenizer: one token each)."""
    return " ".join(f"w{(seed * 131 + 7 * k) % 2000 + 3}" for k in range(n))


def run_guidellm(srv, out: Path, timeout_s: float = 300.0) -> Path:
    """``guidellm run`` concurrent at CONCURRENCY streams, REQUESTS prompts of INPUT_TOKENS words asking
    OUTPUT_TOKENS (a JSON Lines data file: its synthetic_text data builds prompts from an English corpus, which
    the launched model's word-level tokenizer encodes as nothing: "Cannot build /v1/completions prompt"); the
    JSON report."""
    path = out / "guidellm.json"
    data = out / "guidellm-prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": _words(INPUT_TOKENS, i), "prompt_tokens_count": INPUT_TOKENS,
                                        "output_tokens_count": OUTPUT_TOKENS}) + "\n" for i in range(REQUESTS)))
    with DropField(srv.base_url, "ignore_eos") as url:
        _guidellm(srv, url, data, path, out, timeout_s)
    return path


def _guidellm(srv, url: str, data: Path, path: Path, out: Path, timeout_s: float) -> None:
    _run("guidellm", ["run", "--backend", f"kind=openai_http,target={url},model={srv.model_id},"
                                          "request_format=/v1/completions",
                      "--profile", f"kind=concurrent,streams={CONCURRENCY}",
                      "--data", f"kind=json_file,path={data}",
                      "--tokenizer", f"kind=huggingface_auto,model={srv.tokenizer_dir}",
                      "--constraint", f"kind=max_requests,count={REQUESTS}",
                      "--output", f"kind=json,path={path}", "--disable-console-interactive"], out, timeout_s)


def run_inference_perf(srv, out: Path, timeout_s: float = 300.0) -> Path:
    """``inference-perf`` with a concurrent stage (REQUESTS requests at CONCURRENCY), random-token prompts of fixed
    lengths (its "synthetic" type builds prompts from an English corpus, which the launched model's word-level
    tokenizer turns into no tokens: "Could not generate a prompt of exactly 32 tokens"), streaming completions,
    per-request report on, through DropField (ignore_eos); the report folder."""
    with DropField(srv.base_url, "ignore_eos") as url:
        return _inference_perf(srv, url, out, timeout_s)


def _inference_perf(srv, url: str, out: Path, timeout_s: float) -> Path:
    rep = out / "inference-perf"
    cfg = {"api": {"type": "completion", "streaming": True},
           "data": {"type": "random",
                    "input_distribution": {"min": INPUT_TOKENS, "max": INPUT_TOKENS, "mean": INPUT_TOKENS,
                                           "std_dev": 0, "total_count": REQUESTS, "type": "fixed"},
                    "output_distribution": {"min": OUTPUT_TOKENS, "max": OUTPUT_TOKENS, "mean": OUTPUT_TOKENS,
                                            "std_dev": 0, "total_count": REQUESTS, "type": "fixed"}},
           "load": {"type": "concurrent", "num_workers": 1,
                    "stages": [{"num_requests": REQUESTS, "concurrency_level": CONCURRENCY}]},
           "server": {"type": "vllm", "model_name": srv.model_id, "base_url": url, "ignore_eos": False},
           "tokenizer": {"pretrained_model_name_or_path": str(srv.tokenizer_dir)},
           "report": {"request_lifecycle": {"summary": True, "per_stage": True, "per_request": True}},
           "storage": {"local_storage": {"path": str(rep)}}}
    (out / "inference-perf.json").write_text(json.dumps(cfg))
    _run("inference-perf", ["--config_file", str(out / "inference-perf.json")], out, timeout_s)
    return rep


class DropField:
    """``with DropField(upstream_url, "ignore_eos") as url:`` a reverse proxy on 127.0.0.1 (aiohttp, in a thread)
    that forwards each request with those fields taken out of its JSON body and streams the answer back chunk by
    chunk. inference-perf 0.7.0 puts ``ignore_eos`` in every body (apis/completion.py, apis/chat.py, even when its
    config says false), GuideLLM 0.8.1 wherever a request asks an output length (backends/openai/
    request_handlers.py), and transformers serve refuses the field (HTTP 422 "Unexpected fields in the request");
    the launched model has no EOS, so its answers run to max_tokens without it."""

    def __init__(self, upstream: str, *fields: str) -> None:
        self.upstream, self.fields = upstream.rstrip("/"), fields

    def __enter__(self) -> str:
        import asyncio
        import threading

        from aiohttp import ClientSession, web

        async def handle(req: web.Request) -> web.StreamResponse:
            body = await req.read()
            if body:
                try:
                    d = json.loads(body)
                    for f in self.fields:
                        d.pop(f, None)
                    body = json.dumps(d).encode()
                except ValueError:
                    pass
            async with ClientSession() as s, s.request(req.method, self.upstream + req.path_qs, data=body,
                                                       headers={"Content-Type": "application/json"}) as up:
                resp = web.StreamResponse(status=up.status, headers={
                    "Content-Type": up.headers.get("Content-Type", "application/json")})
                await resp.prepare(req)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp

        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        self.runner = web.AppRunner(app)
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        ready.wait(10)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
