"""A real local OpenAI-compatible server for ``opmap bench --launch``: a random-weight model built from a Hugging Face
config and a small tokenizer, written to a temp folder and served by ``transformers serve --continuous-batching``.

What a trial of ``transformers serve`` (transformers 5.25) on a 2-core CPU found, and how each is handled here:

- without a cap on its KV blocks it sizes the cache from free memory (60% of RAM, not up after 45 s): the cache
  is capped at ``kv_blocks`` blocks of ``PAGE_TOKENS`` tokens (``--cb-num-blocks``) and the step at
  ``max_batch_tokens`` tokens (``--cb-max-batch-tokens``; its default, 8192, allocates an 8192 x 8192 mask);
- with torch using every core the web process starves and a whole answer arrives as one SSE event (TTFT =
  end-to-end): OMP_NUM_THREADS is set to ``threads``, by default one core fewer than this process may use;
- the served model id is the model folder's path: it is read back from ``/v1/models``;
- the stream merges tokens into one event when the web process falls behind: counted from ``usage``, timed by
  event (opmap.bench.client);
- a prompt at or past the context is an HTTP 400, ``max_tokens`` past it just stops: ``LaunchedServer.context``;
- it refuses ``ignore_eos`` (HTTP 422, unknown field) and stops at the config's EOS: the written config and
  generation config have no EOS token, so every answer runs to ``max_tokens``.

The server is stopped by its PID (SIGTERM to its process group, SIGKILL after ``STOP_GRACE_S``) when the ``with``
block ends, on an exception and on Ctrl-C, and the temp folder is removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from opmap.errors import OpmapError
from opmap.validate import INT_GE1, POSITIVE, options

PAGE_TOKENS = 256  # ContinuousBatchingConfig.page_size default (transformers 5.25): tokens per KV block
DEFAULT_KV_BLOCKS = 64  # 16,384 tokens of KV: enough for a bench of short requests, tens of MB for a tiny model
DEFAULT_MAX_BATCH_TOKENS = 1024  # tokens per step; transformers' own default, 8192, costs a 256 MB attention mask
STOP_GRACE_S = 10.0  # SIGTERM, then this long for uvicorn to shut down, then SIGKILL
LOG_LINES = 12  # the server's last log lines shown when it fails to start
MAX_RAM_SHARE = 0.5  # a model whose weights take more than this share of available memory is refused
SPECIAL_TOKENS = ("<unk>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@dataclass(frozen=True)
class WrittenModel:
    """What ``write_model`` wrote: its parameters, vocabulary (tokens), model type, dtype (torch's name, no
    prefix) and context (tokens; None where the config sets none)."""

    parameters: int
    vocab_size: int
    model_type: str
    dtype: str
    context: int | None


@dataclass(frozen=True)
class LaunchSettings:
    """How a server was started: the config, device, torch threads, KV blocks of ``page_tokens`` tokens
    (``kv_tokens`` in all), tokens a step, the scheduler, the seconds writing the model and starting the server,
    the model written, the server and transformers' version. Written in bench.json as ``launched.settings``."""

    config: str
    device: str
    threads: int
    kv_blocks: int
    page_tokens: int
    kv_tokens: int
    max_batch_tokens: int
    scheduler: str
    write_s: float
    startup_s: float
    parameters: int
    vocab_size: int
    model_type: str
    dtype: str
    context: int | None
    server: str
    transformers: str | None


@dataclass(frozen=True)
class LaunchedServer:
    """A running server: ``base_url`` (http://127.0.0.1:PORT, no /v1), ``model_id`` as /v1/models reports it,
    the folders it serves from, its PID, the context it accepts (tokens, prompt + answer), and how it was
    started (``settings``: threads, KV blocks, step budget, start-up seconds, ...). Its record is bench.json's
    ``launched`` (the folders as their paths' text)."""

    base_url: str
    model_id: str
    model_dir: Path
    tokenizer_dir: Path
    pid: int
    context: int | None
    settings: LaunchSettings


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """torch threads for the server: one core left to its web process (tokenizing, SSE), at least 1."""
    return max(1, available_cores() - 1)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it; the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_config(target: str):
    """The transformers config of ``target`` (a config.json, a folder holding one, or hf:NAME from the local
    cache), validated and refused if it needs the repository's own code (opmap.workloads.hf.load_config)."""
    from opmap.workloads.hf import load_config

    return load_config(target)


def _param_bytes(config) -> tuple[int, int]:
    """(parameters, bytes) of the causal LM ``config`` builds, counted on the meta device (nothing allocated)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    n = sum(p.numel() for p in model.parameters())
    b = sum(p.numel() * p.element_size() for p in model.parameters())
    return n, b


def _check_fits(target: str, config) -> int:
    """Refuses a model whose random weights would not fit in memory; returns its parameter count."""
    try:
        n, b = _param_bytes(config)
    except Exception as e:  # a config transformers cannot build a causal LM from
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise OpmapError(f"{target}: transformers builds no causal LM from it ({type(e).__name__}: {first}); "
                         "--launch takes a decoder config") from None
    import psutil

    avail = psutil.virtual_memory().available
    if b > MAX_RAM_SHARE * avail:
        raise OpmapError(f"{target}: its {n:,} parameters take {b / 2**30:.3g} GiB, over {MAX_RAM_SHARE:.0%} of the "
                         f"{avail / 2**30:.3g} GiB available; --launch serves small configs (a few layers, hidden "
                         f"64-1024)")
    return n


def write_model(target: str, folder: Path, *, seed: int = 0) -> WrittenModel:
    """Write a random-weight model built from ``target``'s config and a WordLevel tokenizer of exactly its
    vocabulary size into ``folder``; returns what was written (parameters, vocabulary, dtype, context)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = _load_config(target)
    text = config.get_text_config()
    vocab = int(getattr(text, "vocab_size", 0) or 0)
    if vocab < len(SPECIAL_TOKENS) + 16:
        raise OpmapError(f"{target}: vocab_size {vocab} is too small for a tokenizer (at least "
                         f"{len(SPECIAL_TOKENS) + 16}); --launch takes a decoder config with a vocabulary")
    # no EOS: transformers serve refuses ignore_eos, and a random model would otherwise stop at random
    for c in {id(config): config, id(text): text}.values():
        c.eos_token_id = None
        c.bos_token_id = None
        c.pad_token_id = None
    n = _check_fits(target, config)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = None
    from transformers.utils import logging as tf_logging

    bars = tf_logging.is_progress_bar_enabled()
    tf_logging.disable_progress_bar()  # "Writing model shards" would cut through the bench's own progress
    try:
        model.save_pretrained(folder)
    finally:
        if bars:
            tf_logging.enable_progress_bar()
    write_tokenizer(folder, vocab)
    return WrittenModel(n, vocab, config.model_type, str(next(model.parameters()).dtype).removeprefix("torch."),
                        getattr(text, "max_position_embeddings", None))


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A WordLevel tokenizer of exactly ``vocab_size`` entries (a model's every output id decodes): the special
    tokens of ``SPECIAL_TOKENS``, then words ``w3``, ``w4``, ... split on whitespace, so a prompt of n words
    is n tokens; no BOS or EOS added; a chat template that adds ``<|user|>`` and ``<|assistant|>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with a space, as they were split
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                   additional_special_tokens=list(SPECIAL_TOKENS[1:]))
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)


def _command(model_dir: Path, device: str, port: int, kv_blocks: int, max_batch_tokens: int) -> list[str]:
    return [sys.executable, "-m", "transformers.cli.transformers", "serve", str(model_dir),
            "--continuous-batching", "--device", device, "--cb-num-blocks", str(kv_blocks),
            "--cb-max-batch-tokens", str(max_batch_tokens), "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning"]


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"})
    return env


def _tail(log: Path, n: int = LOG_LINES) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    lines = [ln for ln in lines if ln.strip()][-n:]
    return "\n".join(lines) if lines else "(empty log)"


def _models(base_url: str, timeout_s: float = 2.0) -> list[dict] | None:
    """/v1/models' entries, or None while the server does not answer."""
    try:
        with urllib.request.urlopen(base_url + "/v1/models", timeout=timeout_s) as r:  # noqa: S310 (our own URL)
            data = json.loads(r.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return data.get("data") if isinstance(data, dict) and isinstance(data.get("data"), list) else None


def _wait_ready(proc: subprocess.Popen, base_url: str, log: Path, timeout_s: float) -> str:
    """Poll /v1/models until the server lists a loaded model; its id. Raises with the log's last lines if the
    process exits or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        rc = proc.poll()
        if rc is not None:
            raise OpmapError(f"transformers serve exited with status {rc} before it was ready; its last log "
                             f"lines:\n{_tail(log)}")
        entries = _models(base_url)
        if entries:
            return str(entries[0].get("id"))
        if time.monotonic() > deadline:
            raise OpmapError(f"transformers serve was not ready after {timeout_s:g} s (no model at "
                             f"{base_url}/v1/models); its last log lines:\n{_tail(log)}")
        time.sleep(0.2)


def stop_process(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """Stop the server by its PID: SIGTERM to its process group (it leads one: start_new_session), then
    SIGKILL after ``grace_s``; waits until it is gone."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def launch_server(config: str, *, device: str = "cpu", port: int | None = None, startup_timeout_s: float = 120.0,
                  threads: int | None = None, kv_blocks: int = DEFAULT_KV_BLOCKS,
                  max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS, seed: int = 0) -> Iterator[LaunchedServer]:
    """Start ``transformers serve`` on a random-weight model built from ``config`` (module docstring), yield a
    ``LaunchedServer`` once /v1/models answers, and stop it (by PID) and remove its temp folder when the block
    ends, however it ends. ``threads``: torch threads (default: the cores this process may use, minus one);
    ``kv_blocks``: KV cache blocks of PAGE_TOKENS tokens; ``max_batch_tokens``: tokens per step."""
    options({"--kv-blocks": (kv_blocks, INT_GE1), "--max-batch-tokens": (max_batch_tokens, INT_GE1),
             "--threads": (threads, INT_GE1), "--port": (port, INT_GE1.but(hi=65535)),
             "--startup-timeout": (startup_timeout_s, POSITIVE)})
    if device != "cpu" and not device.startswith("cuda"):
        raise OpmapError(f"--device {device!r}: accepted: cpu, cuda, cuda:N")
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn", "openai", "accelerate", "psutil", "tokenizers", "transformers")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise OpmapError(f"--launch needs {', '.join(missing)}: pip install 'opmap[bench]'")
    threads = threads or default_threads()
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="opmap-bench-"))
    proc = None
    try:
        model_dir = tmp / "model"
        model_dir.mkdir()
        written = write_model(config, model_dir, seed=seed)
        t_written = time.monotonic()
        port = port or free_port()
        base_url = f"http://127.0.0.1:{port}"
        log = tmp / "server.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(_command(model_dir, device, port, kv_blocks, max_batch_tokens),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=_env(threads), start_new_session=True, cwd=tmp)
        model_id = _wait_ready(proc, base_url, log, startup_timeout_s)
        t_ready = time.monotonic()
        ctx = written.context
        w = written
        yield LaunchedServer(base_url, model_id, model_dir, model_dir, proc.pid, int(ctx) if ctx else None,
                             LaunchSettings(config, device, threads, kv_blocks, PAGE_TOKENS, kv_blocks * PAGE_TOKENS,
                                            max_batch_tokens, "fifo", t_written - t0, t_ready - t_written,
                                            w.parameters, w.vocab_size, w.model_type, w.dtype, w.context,
                                            "transformers serve --continuous-batching", _version("transformers")))
    finally:
        if proc is not None:
            stop_process(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None
