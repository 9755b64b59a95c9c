"""Speculative decoding: the settings (``--spec mtp:K|eagle:K|draft:MODEL:K`` with ``--spec-accept RATE`` or
``--spec-accepted A``), the tokens a step accepts, and the draws the schedulers share.

Each decode step of a sequence runs K draft passes (MTP: K passes of the MTP module, one decoder layer and the
shared head, as DeepSeek-V3 serves it; EAGLE-3: K passes of its one-layer draft head; a draft model: K of its
decode steps) and one verify pass of the target over K + 1 tokens (the last accepted and the K drafted), then
emits the accepted drafts and one token of the target's own: 1 to K + 1 tokens.

Acceptance (Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative Decoding", ICML,
arXiv 2211.17192, eq. 1): each drafted token is accepted with probability alpha, independently, until the first
rejection; the tokens a step emits, a = min(G, K + 1) with G geometric (P(G = j) = alpha^(j-1) (1 - alpha)), have
mean E[a] = (1 - alpha^(K+1)) / (1 - alpha). The simulator draws a per request per step (``step_tokens``, seeded),
so requests of the same length finish after different numbers of steps and TPOT percentiles spread.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from opmap.errors import OpmapError

KINDS = ("mtp", "eagle", "draft")
MAX_K = 16  # engines draft up to ~8 tokens a step (SGLang's speculative-num-steps default 5, vLLM's examples 2-5)
SPEC_ACCEPTED = "mtp:K, eagle:K or draft:MODEL:K (K drafted tokens per step, an integer from 1 to 16)"
KIND_WORDS = {"mtp": "MTP module (one decoder layer and the shared head)",
              "eagle": "EAGLE-3 draft head (one decoder layer)", "draft": "draft model"}
DEFAULTS = Path(__file__).with_name("spec_defaults.toml")


def expected_tokens(alpha: float, k: int) -> float:
    """Mean tokens a step emits: (1 - alpha^(K+1)) / (1 - alpha) (Leviathan et al. 2023, eq. 1); K + 1 at
    alpha = 1, 1 at alpha = 0."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_for(accepted: float, k: int) -> float:
    """The alpha whose ``expected_tokens(alpha, k)`` is ``accepted`` (1 <= accepted < K + 1): bisection, the
    mean increasing in alpha."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) < accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class SpecDecode:
    """``kind`` (KINDS), ``k`` drafted tokens per step, ``draft`` the draft model (kind draft), ``alpha`` the
    per-token acceptance probability, ``basis`` where alpha came from; ``seed`` seeds the per-step draws."""

    kind: str
    k: int
    alpha: float
    basis: str
    draft: str | None = None
    seed: int = 0

    @property
    def tokens_per_step(self) -> float:
        return expected_tokens(self.alpha, self.k)

    def spec(self) -> str:
        return f"{self.kind}:{self.draft}:{self.k}" if self.kind == "draft" else f"{self.kind}:{self.k}"

    def text(self) -> str:
        who = KIND_WORDS[self.kind] + (f" {self.draft}" if self.draft else "")
        return (f"speculative decoding {self.spec()}: {self.k} draft passes of the {who} and one verify pass of the "
                f"target over {self.k + 1} tokens per step; acceptance {self.alpha:.4g} per token ({self.basis}), "
                f"{self.tokens_per_step:.4g} tokens per step on average, drawn per request per step")

    def to_dict(self) -> dict:
        return {"spec": self.spec(), "kind": self.kind, "k": self.k, "draft": self.draft, "alpha": self.alpha,
                "alpha_basis": self.basis, "tokens_per_step": self.tokens_per_step, "verify_tokens": self.k + 1,
                "tokens_drawn": "per request per step, seeded: min(G, K + 1), G geometric with P(G = j) = "
                                "alpha^(j-1) (1 - alpha) (Leviathan et al. 2023)", "seed": self.seed}


def parse_spec(text: str, accept: float | None = None, accepted: float | None = None, seed: int = 0) -> SpecDecode:
    """``--spec`` with its acceptance (``--spec-accept`` alpha in [0, 1), or ``--spec-accepted`` tokens per step
    in [1, K + 1)), each refused in one line; without either, the kind's published default (spec_defaults.toml)."""
    parts = str(text).strip().split(":")
    kind = parts[0].strip().lower()
    if kind not in KINDS:
        raise OpmapError(f"unknown --spec kind {parts[0]!r}; accepted: {SPEC_ACCEPTED}")
    # a draft model's name may hold colons itself (hf:NAME, path/to/file.py:factory): all between the first and last
    ok = len(parts) >= 3 and ":".join(parts[1:-1]).strip() if kind == "draft" else len(parts) == 2
    if not ok:
        raise OpmapError(f"bad --spec {text!r}; accepted: {SPEC_ACCEPTED}")
    try:
        k = int(parts[-1])
    except ValueError:
        k = 0
    if not 1 <= k <= MAX_K or parts[-1].strip() != str(k):
        raise OpmapError(f"bad --spec {text!r}: K must be an integer from 1 to {MAX_K}, got {parts[-1]!r}")
    draft = ":".join(parts[1:-1]).strip() if kind == "draft" else None
    alpha, basis = _acceptance(kind, k, accept, accepted)
    return SpecDecode(kind, k, alpha, basis, draft, seed)


def _acceptance(kind: str, k: int, accept: float | None, accepted: float | None) -> tuple[float, str]:
    if accept is not None and accepted is not None:
        raise OpmapError("--spec-accept (per-token acceptance) and --spec-accepted (tokens per step) say the same "
                         "thing: give one")
    if accept is not None:
        if isinstance(accept, bool) or not isinstance(accept, (int, float)) or not 0 <= accept < 1:
            raise OpmapError(f"--spec-accept must be a number from 0 to below 1 (the probability each drafted "
                             f"token is accepted), got {accept!r}")
        return float(accept), "given: --spec-accept"
    if accepted is not None:
        if isinstance(accepted, bool) or not isinstance(accepted, (int, float)) or not 1 <= accepted < k + 1:
            raise OpmapError(f"--spec-accepted must be a number from 1 to below K + 1 = {k + 1} (mean tokens a step "
                             f"emits), got {accepted!r}")
        return alpha_for(float(accepted), k), f"given: --spec-accepted {accepted:g} tokens per step"
    d = defaults().get(kind)
    if d is None:
        raise OpmapError(f"--spec {kind} has no published default acceptance in opmap's data: give --spec-accept "
                         "RATE (0 <= RATE < 1) or --spec-accepted A (1 <= A < K + 1)")
    if k == d["k"] or "chained_length" not in d:
        return float(d["alpha"]), "default: " + d["source"]
    a = alpha_for(float(d["chained_length"]), int(d["chained_k"]))
    return a, f"default for K > {d['k']}: {d['chained_source']}, solved for alpha"


@lru_cache(maxsize=1)
def defaults() -> dict[str, dict]:
    """The published acceptance figures by kind (spec_defaults.toml), each with its source."""
    with DEFAULTS.open("rb") as f:
        return tomllib.load(f)


def step_tokens(spec: SpecDecode, out_len: list[int]) -> list[np.ndarray]:
    """Per request, the tokens each of its decode steps emits (its first token comes from the prefill): draws of
    min(G, K + 1) until they reach out_len - 1, the last cut to what is left (a request stops at its length).
    One generator seeded by ``spec.seed``, requests in id order: the counting scheduler and the reference draw the
    same steps whatever order they meet the requests in."""
    rng = np.random.default_rng([spec.seed, 38])
    k1, mean = spec.k + 1, spec.tokens_per_step
    p = 1.0 - spec.alpha
    out: list[np.ndarray] = []
    for n in out_len:
        need = int(n) - 1
        if need <= 0:
            out.append(np.zeros(0, dtype=np.int64))
            continue
        got = np.minimum(rng.geometric(p, size=math.ceil(need / mean * 1.25) + 8), k1)
        while int(got.sum()) < need:
            got = np.concatenate([got, np.minimum(rng.geometric(p, size=need), k1)])
        c = np.cumsum(got)
        i = int(np.searchsorted(c, need))  # the step that reaches need
        steps = got[: i + 1].copy()
        steps[i] -= int(c[i]) - need
        out.append(steps)
    return out


def spec_of(cost) -> SpecDecode | None:
    """The speculative decoding a step cost prices (opmap.serve.spec_cost sets ``cost.spec``), None for any other
    cost (a ServiceTime's ``spec`` is its text, a method)."""
    s = getattr(cost, "spec", None)
    return s if isinstance(s, SpecDecode) else None
