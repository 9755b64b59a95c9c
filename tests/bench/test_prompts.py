"""opmap.bench.prompts: prompts of exact token counts, counted as the server counts them (its usage), under a
WordLevel tokenizer (the launched model's), a BPE that merges across word boundaries and adds a BOS, and a chat
template."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlparse

import numpy as np
import pytest

from opmap.bench.prompts import ExactPrompts, build_prompts
from opmap.errors import OpmapError

LENGTHS = [1, 7, 100, 513]


def _usage_prompt_tokens(server, path: str, body: dict) -> int:
    u = urlparse(server.base_url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        c.request("POST", path, json.dumps({"model": server.model_id, "max_tokens": 1, **body}),
                  {"content-type": "application/json"})
        r = c.getresponse()
        data = json.loads(r.read())
    finally:
        c.close()
    assert r.status == 200, data
    return data["usage"]["prompt_tokens"]


def test_the_server_counts_exactly_the_length_asked(server):
    prompts = build_prompts(server.tokenizer_dir, LENGTHS, seed=3)
    got = [_usage_prompt_tokens(server, "/v1/completions", {"prompt": p}) for p in prompts]
    assert got == LENGTHS
    assert len(set(prompts)) == len(prompts)  # drawn, not one text cut to length


def test_chat_counts_the_template(server):
    """The launched tokenizer's chat template wraps the message in <|user|> ... <|assistant|>: 2 tokens of its
    own, so a 2-token chat prompt is an empty message and a 1-token one is refused."""
    prompts = build_prompts(server.tokenizer_dir, [2, 9, 64], seed=1, api="chat")
    got = [_usage_prompt_tokens(server, "/v1/chat/completions",
                                {"messages": [{"role": "user", "content": p}]}) for p in prompts]
    assert got == [2, 9, 64] and prompts[0] == ""
    with pytest.raises(OpmapError, match="adds 2 tokens of its own"):
        build_prompts(server.tokenizer_dir, [1], api="chat")


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """A byte-level BPE trained here on a generated corpus (300 merges): its merges join across a decoded
    boundary, so a text decoded from n random ids often re-encodes to another length; a BOS added by its
    post-processor counts too."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    rng = np.random.default_rng(0)
    syll = ["ka", "to", "ri", "men", "so", "la", "vi", "ne", "stra", "po", "qu", "ex"]
    corpus = [" ".join("".join(rng.choice(syll, rng.integers(1, 4))) for _ in range(30)) for _ in range(300)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    d = tmp_path_factory.mktemp("bpe")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>").save_pretrained(d)
    return d


def test_exact_under_a_merging_bpe_with_bos(bpe_dir):
    """Counted independently by the tokenizers library (the post-processor's BOS included): every prompt has the
    length asked, 1 (the BOS alone: an empty prompt) included."""
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    lengths = [1, 2, 5, 33, 200, 777]
    prompts = build_prompts(bpe_dir, lengths, seed=7)
    assert [len(raw.encode(p).ids) for p in prompts] == lengths
    assert prompts[0] == "" and raw.encode(prompts[3]).ids[0] == raw.token_to_id("<s>")


def test_the_prompt_builder_plugs_into_the_workload(bpe_dir):
    """ExactPrompts is the bench's prompt builder (index, tokens, rng) -> str: the same rng state, the same text."""
    ep = ExactPrompts(bpe_dir)
    a = ep(0, 40, np.random.default_rng(5))
    b = ep(1, 40, np.random.default_rng(5))
    assert a == b and ep.count(a) == 40


def test_bad_tokenizers_and_lengths_are_one_line_errors(tmp_path, bpe_dir):
    with pytest.raises(OpmapError, match="not a folder"):
        build_prompts(tmp_path / "none", [4])
    with pytest.raises(OpmapError, match="no tokenizer could be read"):
        build_prompts(tmp_path, [4])
    with pytest.raises(OpmapError, match="accepted: 1 to"):
        build_prompts(bpe_dir, [0])
    with pytest.raises(OpmapError, match="no chat template"):
        build_prompts(bpe_dir, [4], api="chat")
