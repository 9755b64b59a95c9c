"""What a step of a speculative decoding server costs (``SpecCost``, a StepCost), priced by the same phase analyses
as every other step (opmap.serve.model_cost), not a parallel path:

- verify: the target's decode step with K + 1 new tokens per sequence (``model_table_cost(queries=K + 1)``): its
  GEMMs at M = batch x (K + 1), its attention K + 1 queries over the KV cache, its weights read once;
- draft: one draft pass per drafted token, a decode step of one token per sequence of the draft: a draft model
  priced as any model (``draft:MODEL:K``), or for MTP and EAGLE-3 the target cut to one decoder layer with its
  embedding and head (``model_table_cost(layers=1)``; the MTP module is one decoder layer, an embedding
  projection and the shared head; EAGLE-3's head one decoder layer and a fusion of three hidden states);
- a decode step: K draft passes + one verify, ``K draft.decode_s + verify.decode_s`` at the step's KV;
- a prefill: the target's and the draft's (the draft keeps its own KV of the prompt);
- a mixed step (chunked prefill): the prompt chunks and the decodes' K + 1 verify tokens in one target pass, the
  verify's KV read, the K draft passes over the decodes and the draft's pass over the chunks (``mixed_s``);
- memory per device: the target's usable bytes less the draft's weights, over the target's and the draft's KV
  bytes per token.

Approximated, and stated: the draft passes all priced at the step's KV (the k-th reads k - 1 more tokens); an MTP
or EAGLE head priced as the target's first layer (DeepSeek-V3's first layers are dense where its MTP layer is MoE;
EAGLE-3's reduced draft vocabulary and fusion GEMM not counted); the K lookahead slots a verify writes not
reserved in the KV cache; a draft model runs at the target's tp.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opmap.errors import OpmapError
from opmap.serve.cost import TableCost, prefix_s
from opmap.serve.spec import SpecDecode


@dataclass
class SpecCost:
    """Steps of the target ``target`` (prefill, memory) with speculative decoding ``spec``: ``verify`` its decode
    at K + 1 tokens per sequence, ``draft`` one draft pass; ``kv_capacity_tokens`` what fits beside both."""

    target: TableCost
    verify: TableCost
    draft: TableCost
    spec: SpecDecode
    kv_capacity_tokens: int | None
    draft_weights_bytes: float = 0.0

    def __getattr__(self, name: str) -> Any:
        # runtime, kv_dtype, layout, source, floor: the target's (a pickled copy asks before target is set)
        if name.startswith("__") or name in ("target", "verify", "draft", "spec"):
            raise AttributeError(name)
        return getattr(self.target, name)

    @property
    def kv_bytes_per_token(self) -> float | None:
        t, d = self.target.kv_bytes_per_token, self.draft.kv_bytes_per_token
        return None if t is None else t + (d or 0.0)

    @property
    def memory(self) -> dict | None:
        m = self.target.memory
        if m is None:
            return None
        per_tok = self.kv_bytes_per_token or 0.0
        cap = self.kv_capacity_tokens or 0
        return {**m, "kv_capacity_tokens": cap, "kv_bytes_per_token": per_tok, "kv_bytes": cap * per_tok,
                "usable_bytes": float(m["usable_bytes"]) - self.draft_weights_bytes,
                "draft_weights_bytes": self.draft_weights_bytes,
                "draft_kv_bytes_per_token": self.draft.kv_bytes_per_token}

    def prefill_s(self, tokens: int, seqs: int = 1) -> float:
        return self.target.prefill_s(tokens, seqs) + self.draft.prefill_s(tokens, seqs)

    def decode_s(self, seqs: int, kv_tokens: int) -> float:
        """One speculative step of ``seqs`` sequences holding ``kv_tokens``: K draft passes and one verify."""
        return self.spec.k * self.draft.decode_s(seqs, kv_tokens) + self.verify.decode_s(seqs, kv_tokens)

    def mixed_s(self, prefill_tokens: int, prefill_seqs: int, decode_seqs: int, kv_tokens: int,
                prefix: Sequence[tuple[int, int]] = ()) -> float:
        """A step of prompt chunks and speculative decodes together (opmap.serve.cost.mixed_s's terms, the
        decodes carrying K + 1 verify tokens each)."""
        if decode_seqs == 0:
            return prefix_s(self.target, prefix, self.prefill_s(prefill_tokens, prefill_seqs))
        if prefill_tokens == 0:
            return self.decode_s(decode_seqs, kv_tokens)
        v, n = self.verify, decode_seqs * (self.spec.k + 1)  # the verify pass: K + 1 tokens a decode
        whole = self.target.prefill_s(prefill_tokens + n, prefill_seqs + decode_seqs)
        dec = v.decode_s(decode_seqs, kv_tokens)
        t = max(whole + max(0.0, dec - v.decode_s(decode_seqs, 0)),
                dec + max(0.0, whole - self.target.prefill_s(n, decode_seqs)))
        t += self.spec.k * self.draft.decode_s(decode_seqs, kv_tokens)
        return prefix_s(self.target, prefix, t + self.draft.prefill_s(prefill_tokens, prefill_seqs))

    def to_dict(self) -> dict:
        d = self.target.to_dict()
        d["kv_capacity_tokens"] = self.kv_capacity_tokens
        d["memory"] = self.memory
        d["kv_bytes_per_token"] = self.kv_bytes_per_token
        d["spec"] = {**self.spec.to_dict(),
                     "step": "K draft passes (decode of one token per sequence) + one verify (decode of K + 1 "
                             "tokens per sequence), priced by opmap's phase analyses",
                     "verify": {"source": self.verify.source, "decode": self.verify.to_dict()["decode"]},
                     "draft": {"source": self.draft.source, "prefill": self.draft.to_dict()["prefill"],
                               "decode": self.draft.to_dict()["decode"]}}
        return d


def spec_table_cost(model: str, hardware: str, dtype: str, tp: int, spec: SpecDecode, *, pp: int = 1,
                    progress: Callable[[str], None] | None = None, **kw: Any) -> SpecCost:
    """``model`` on ``hardware`` served with ``spec``: the target, its verify step and the draft, each priced by
    ``model_table_cost`` (``kw``: its runtime, KV format, memory utilization and context options)."""
    from opmap.serve.model_cost import model_table_cost
    from opmap.serve.resolve import Resolved

    if spec.kind == "draft":  # an unknown or unusable draft model refused before the target is priced
        Resolved.build(spec.draft, dtype)
    if spec.kind == "mtp":
        check_mtp(Resolved.build(model, dtype), model)
    say = progress or (lambda s: None)
    target = model_table_cost(model, hardware, dtype, tp, pp=pp, progress=say, **kw)
    verify = model_table_cost(model, hardware, dtype, tp, pp=pp, queries=spec.k + 1,
                              progress=lambda s: say("verify: " + s), **kw)
    if spec.kind == "draft":
        draft = model_table_cost(spec.draft, hardware, dtype, tp, progress=lambda s: say("draft: " + s), **kw)
    else:  # the MTP module / EAGLE head: one decoder layer with the embedding and head
        draft = model_table_cost(model, hardware, dtype, tp, layers=1, progress=lambda s: say("draft: " + s), **kw)
    mem, dmem = target.memory or {}, draft.memory or {}
    w = float(dmem.get("weights_bytes", 0.0))
    per_tok = (target.kv_bytes_per_token or 0.0) + (draft.kv_bytes_per_token or 0.0)
    cap = target.kv_capacity_tokens
    if mem and per_tok > 0:
        cap = int(max(0.0, float(mem["usable_bytes"]) - w) // per_tok)
        if cap < 1:
            raise OpmapError(f"{model} with the {spec.spec()} draft does not fit on {hardware} at tp {tp} pp {pp}: "
                             f"the draft's weights take {w / 2**30:.2f} GiB per device of the "
                             f"{float(mem['usable_bytes']) / 2**30:.2f} GiB left for the KV cache; raise --tp")
    return SpecCost(target, verify, draft, spec, cap, w)


def check_mtp(m, model: str) -> None:
    """``--spec mtp`` needs a model that has MTP modules: a Hugging Face config with ``num_nextn_predict_layers`` >= 1
    (DeepSeek-V3 / R1, GLM-4.5, MiMo); more drafted tokens than modules chain the last, as vLLM and SGLang do."""
    n = int(getattr(m.config, "num_nextn_predict_layers", 0) or 0) if m.hf else 0
    if n < 1:
        raise OpmapError(f"{model} has no MTP module (num_nextn_predict_layers in its config.json): use --spec "
                         "eagle:K or draft:MODEL:K")
