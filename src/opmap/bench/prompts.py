"""Prompts of an exact token count under a tokenizer, as the server will count them (``usage.prompt_tokens``).

The count is the server's: ``/v1/completions`` tokenizes the prompt with the tokenizer's special tokens (a BOS
where its post-processor adds one: transformers serve calls ``tokenizer(prompt)``); ``/v1/chat/completions``
renders the one user message through the chat template first (its role markers and generation prompt count).
Each prompt is built from random ordinary tokens, decoded to text, and re-encoded: where the text tokenizes to
another length (tokens merge or split across their boundary), the ids are trimmed or extended and tried again,
until the round trip gives exactly the length asked; a length no text reaches is refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from opmap.errors import OpmapError

APIS = ("completions", "chat")
MAX_TRIES = 64  # adjustments per prompt; a tokenizer that merges across boundaries settles in a few
MAX_PROMPT_TOKENS = 1 << 20


def load_tokenizer(tokenizer_dir: str | Path):
    """A transformers tokenizer from a local folder (or a tokenizer.json's folder): never downloaded, never the
    repository's own code."""
    p = Path(tokenizer_dir)
    if p.is_file() and p.name == "tokenizer.json":
        p = p.parent
    if not p.is_dir():
        raise OpmapError(f"--tokenizer {tokenizer_dir}: not a folder; accepted: a local folder holding "
                         "tokenizer.json (or tokenizer_config.json and its vocabulary), or its tokenizer.json")
    from transformers import AutoTokenizer
    from transformers.utils import logging as tf_logging

    tf_logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(str(p), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # a folder transformers cannot read a tokenizer from
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise OpmapError(f"--tokenizer {tokenizer_dir}: no tokenizer could be read ({first}); accepted: a local "
                         "folder holding tokenizer.json (or tokenizer_config.json and its vocabulary)") from None


def counter(tok, api: str = "completions") -> Callable[[str], int]:
    """How the server counts a prompt's tokens under ``api`` (module docstring)."""
    if api not in APIS:
        raise OpmapError(f"--api {api!r}: accepted: {', '.join(APIS)}")
    if api == "completions":
        return lambda text: len(tok(text)["input_ids"])
    if not getattr(tok, "chat_template", None):
        raise OpmapError("--api chat: the tokenizer has no chat template, so its prompt length cannot be "
                         "counted as the server will; use --api completions")

    def chat(text: str) -> int:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)

    return chat


def _ordinary_ids(tok) -> np.ndarray:
    """Token ids that are not special and decode to visible text (candidate prompt tokens)."""
    special = set(tok.all_special_ids)
    vocab = tok.get_vocab()
    ids = [i for t, i in vocab.items() if i not in special and not t.startswith("<") and t.strip()]
    if len(ids) < 2:
        raise OpmapError("the tokenizer has fewer than 2 ordinary tokens: no prompt can be built from it")
    return np.array(sorted(ids), dtype=np.int64)


def _fit(tok, count: Callable[[str], int], n: int, pool: np.ndarray, rng: np.random.Generator,
         overhead: int) -> str:
    """A text that counts exactly ``n`` tokens, from random ids of ``pool`` (module docstring)."""
    body = n - overhead
    ids = list(rng.choice(pool, size=body)) if body > 0 else []
    for _ in range(MAX_TRIES):
        text = tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) if ids else ""
        got = count(text)
        if got == n:
            return text
        if got > n:  # trim: drop the surplus (at least one id)
            ids = ids[:max(0, len(ids) - max(1, got - n))]
        else:  # extend by the shortfall
            ids += list(rng.choice(pool, size=n - got))
    raise OpmapError(f"no prompt of exactly {n} tokens found in {MAX_TRIES} tries (this tokenizer merges tokens "
                     f"across word boundaries); try another --input-len")


class ExactPrompts:
    """Prompts of exact token counts under one tokenizer and api: ``fit(n, rng)``, or called as the bench's prompt
    builder ``(index, tokens, rng) -> str`` (opmap.bench.workload.PromptFn)."""

    def __init__(self, tokenizer_dir: str | Path, api: str = "completions") -> None:
        self.tok = load_tokenizer(tokenizer_dir)
        self.api = api
        self.count = counter(self.tok, api)
        self.overhead = self.count("")
        self.pool = _ordinary_ids(self.tok)

    def fit(self, n: int, rng: np.random.Generator) -> str:
        """A prompt the server counts as exactly ``n`` tokens. Lengths below the template's own tokens (a BOS,
        a chat template's role markers) are refused: the server adds them whatever the prompt."""
        n = int(n)
        if n < max(1, self.overhead) or n > MAX_PROMPT_TOKENS:
            raise OpmapError(f"input length {n}: the server adds {self.overhead} tokens of its own to every prompt "
                             f"({self.api}); accepted: {max(1, self.overhead)} to {MAX_PROMPT_TOKENS:,} tokens")
        return _fit(self.tok, self.count, n, self.pool, rng, self.overhead)

    def __call__(self, index: int, tokens: int, rng: np.random.Generator) -> str:
        return self.fit(tokens, rng)


def build_prompts(tokenizer_dir: str | Path, input_lens: Sequence[int], *, seed: int = 0,
                  api: str = "completions") -> list[str]:
    """One prompt per entry of ``input_lens`` whose token count, as the server counts it under ``api``, is exactly
    that length (round-trip checked; ``ExactPrompts.fit``)."""
    ep = ExactPrompts(tokenizer_dir, api)
    rng = np.random.default_rng(seed)
    return [ep.fit(n, rng) for n in input_lens]
