"""Batching policies: named, versioned, immutable values. Every result records the policy (``opmap.record.record``:
its name, version, spec line and parameters).

``none``                one request at a time (request-level, no batching)
``static:B``            wait for B requests, run them as one batch to the end (slots stay held until the
                        longest finishes, as padded request-level batching does); a short batch is sent only
                        when no more requests will arrive
``dynamic:B,WAIT_MS``   Triton-style dynamic batching: send when B are queued or the oldest has waited WAIT_MS
``continuous[:TOKEN_BUDGET]``  iteration-level scheduling (Orca, vLLM v0): new requests are admitted at
                        every iteration boundary while their prompt tokens fit the budget (default 8192,
                        vLLM's max_num_batched_tokens) and the KV cache has room; a prefill iteration runs
                        on its own, decodes wait for it
``chunked:CHUNK``       Sarathi-Serve chunked prefill: every iteration carries all running decodes (one
                        token each) and fills the rest of a CHUNK-token budget with prompt chunks (stall-free)
``engine[:SEQS,TOKENS,BLOCK]``  in-flight batching as vLLM V1 and TensorRT-LLM run it (the default of
                        ``opmap serve``): at most SEQS running sequences (max_num_seqs, 256), a budget of TOKENS
                        per step (max_num_batched_tokens, 8192) filled with one token per running decode, then
                        prompt chunks (chunked prefill), the KV cache paged in blocks of BLOCK tokens (16)
                        allocated as tokens are produced, preemption by recompute when blocks run out
                        (serve/inflight.py); ``,nochunk``: a prompt runs whole in one step; ``,noevict``:
                        TensorRT-LLM's GUARANTEED_NO_EVICT admission (a request's KV to its last token reserved);
                        ``,nomix`` (with ``nochunk``): vLLM V0's default scheduler, prompts in steps of their own
                        ahead of the decodes, which sit those steps out
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from opmap.errors import OpmapError
from opmap.record import key
from opmap.validate import INT_GE1, INT_MAX, options, plausible

ACCEPTED = ("none, static:B, dynamic:B,WAIT_MS, continuous[:TOKEN_BUDGET], chunked:CHUNK, "
            "engine[:MAX_NUM_SEQS,MAX_NUM_BATCHED_TOKENS,KV_BLOCK[,nochunk][,noevict][,nomix]]")
MAX_SEQS = 256  # vLLM's default max_num_seqs: the most sequences in one iteration
WORDS = ("nochunk", "noevict", "nomix")  # the engine policy's words after its sizes


@dataclass(frozen=True)
class SchedulerLimits:
    """A policy's per-step limits in vLLM's names (None: the policy has no such limit): the most sequences a step
    runs, the most tokens it carries, the KV block (tokens) and whether prompts are chunked."""

    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    kv_block: int | None
    chunked_prefill: bool


@dataclass(frozen=True)
class Policy:
    """A batching policy: its parameters are its typed fields. Its record: the name, version and spec line, then
    the fields under ``params`` (each policy class's own)."""

    RECORD: ClassVar[tuple[Any, ...]] = ("name", "version", ("spec_line", key("spec")), "params")
    name = "policy"
    version = 1

    def spec(self) -> str:
        raise NotImplementedError

    @property
    def spec_line(self) -> str:
        """``spec()``, the line that parses back to this policy (``parse_policy``)."""
        return self.spec()

    @property
    def params(self) -> dict[str, int | float | bool]:
        """The policy's parameters by name: its fields (every one a number or a flag)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def limits(self) -> SchedulerLimits:
        """Its per-step limits, each policy's own (no limits read back from a written dict)."""
        raise NotImplementedError



@dataclass(frozen=True)
class NoBatching(Policy):
    name = "none"

    def spec(self) -> str:
        return "none"

    @property
    def limits(self) -> SchedulerLimits:
        return SchedulerLimits(1, None, None, False)  # one sequence at a time


@dataclass(frozen=True)
class Static(Policy):
    batch: int
    name = "static"

    def spec(self) -> str:
        return f"static:{self.batch}"

    @property
    def limits(self) -> SchedulerLimits:
        return SchedulerLimits(self.batch, None, None, False)


@dataclass(frozen=True)
class Dynamic(Policy):
    batch: int
    wait_s: float
    name = "dynamic"

    def spec(self) -> str:
        return f"dynamic:{self.batch},{self.wait_s * 1e3:g}"

    @property
    def limits(self) -> SchedulerLimits:
        return SchedulerLimits(self.batch, None, None, False)


@dataclass(frozen=True)
class Continuous(Policy):
    token_budget: int = 8192
    max_seqs: int = MAX_SEQS
    name = "continuous"

    def spec(self) -> str:
        return f"continuous:{self.token_budget}"

    @property
    def limits(self) -> SchedulerLimits:
        return SchedulerLimits(self.max_seqs, self.token_budget, None, False)


@dataclass(frozen=True)
class Chunked(Policy):
    chunk: int = 512  # Sarathi-Serve's usual chunk sizes are 256-2048 tokens
    max_seqs: int = MAX_SEQS
    name = "chunked"

    def spec(self) -> str:
        return f"chunked:{self.chunk}"

    @property
    def limits(self) -> SchedulerLimits:
        return SchedulerLimits(self.max_seqs, self.chunk, None, True)  # the chunk is the step's token budget


@dataclass(frozen=True)
class Engine(Policy):
    """In-flight batching as production engines schedule it (vLLM V1's scheduler, TensorRT-LLM's in-flight
    batching). Defaults: 256 sequences and 8192 tokens a step, KV blocks of 16 tokens (vLLM's CUDA block size).
    vLLM's own defaults for its OpenAI server depend on the device (vllm/engine/arg_utils.py,
    EngineArgs.get_batch_defaults): 8192 tokens and 1024 sequences on devices of 70 GiB or more other than
    A100, 2048 and 256 otherwise; set them with --max-num-seqs and --max-num-batched-tokens to match a
    deployment.

    ``no_evict``: TensorRT-LLM's GUARANTEED_NO_EVICT capacity scheduler (the default of its executor and of
    ``trtllm-bench throughput``, tensorrt_llm/bench/benchmark/throughput.py ``--scheduler_policy``): a request is
    admitted only when the KV blocks of every running request at its last token, plus its own, fit the cache,
    so nothing is ever preempted; the default (False) is vLLM's, blocks taken as tokens are produced and
    preemption by recompute when they run out (TensorRT-LLM's MAX_UTILIZATION).

    ``no_mix`` (needs ``chunked_prefill`` off): vLLM V0's default scheduler (``Scheduler._schedule_default``,
    vllm/core/scheduler.py; vLLM 0.4.x, vllm-project/vllm @ 0054e1fa): each step first tries the waiting prompts,
    first come first served, whole, while their tokens fit ``max_num_batched_tokens`` (the decodes count against
    ``max_num_seqs`` only) and their blocks are free; if any is admitted the step runs those prompts alone ("Don't
    schedule decodes if prefills are scheduled"), else it runs every running decode (preempting by recompute when
    blocks run out) and admits nothing."""

    max_num_seqs: int = MAX_SEQS
    max_num_batched_tokens: int = 8192
    kv_block: int = 16
    chunked_prefill: bool = True
    no_evict: bool = False
    no_mix: bool = False
    name = "engine"

    def __post_init__(self) -> None:
        check_engine(self.max_num_seqs, self.max_num_batched_tokens, self.kv_block)
        if self.no_mix and self.chunked_prefill:
            raise OpmapError("engine policy: nomix (vLLM V0's prompt steps apart from decode steps) runs whole "
                             "prompts: add nochunk")

    def spec(self) -> str:
        if (self.max_num_seqs, self.max_num_batched_tokens, self.kv_block) == (MAX_SEQS, 8192, 16):
            body = ""
        else:
            body = f":{self.max_num_seqs},{self.max_num_batched_tokens},{self.kv_block}"
        words = (("" if self.chunked_prefill else ",nochunk") + (",noevict" if self.no_evict else "")
                 + (",nomix" if self.no_mix else ""))
        return f"engine{body}{words}" if body or not words else f"engine:{words[1:]}"

    @property
    def limits(self) -> SchedulerLimits:
        return SchedulerLimits(self.max_num_seqs, self.max_num_batched_tokens, self.kv_block, self.chunked_prefill)


def check_engine(max_num_seqs: object, max_num_batched_tokens: object, kv_block: object) -> None:
    """The engine's sizes, each an integer >= 1, and a step budget that holds every running sequence's token
    (vLLM refuses max_num_batched_tokens < max_num_seqs at start-up the same way)."""
    options({"--max-num-seqs": (max_num_seqs, INT_GE1), "--max-num-batched-tokens": (max_num_batched_tokens, INT_GE1),
             "--kv-block": (kv_block, INT_GE1)})
    if max_num_batched_tokens < max_num_seqs:
        raise OpmapError(f"--max-num-batched-tokens ({max_num_batched_tokens}) must be >= --max-num-seqs "
                         f"({max_num_seqs}): every running sequence needs one token of the step's budget")


def check_with_service_time(policy: Policy) -> None:
    """A service time serves whole requests: a policy that schedules iterations is refused with it."""
    if isinstance(policy, (Continuous, Chunked, Engine)):
        raise OpmapError(f"policy {policy.spec()!r} schedules iterations, which a service time does not have: "
                         "use none, static:B or dynamic:B,WAIT_MS with --service-time")


def _bad(spec: str, why: str = "") -> OpmapError:
    return OpmapError(f"bad policy {spec!r}{' (' + why + ')' if why else ''}: accepted: {ACCEPTED}")


def _ints(spec: str, body: str) -> int:
    if not body.strip().isdigit() or not 1 <= int(body) <= INT_MAX:
        raise _bad(spec, f"sizes are integers >= 1, at most {INT_MAX}")
    return int(body)


def parse_policy(spec: str) -> Policy:
    s = spec.strip()
    kind, _, body = s.partition(":")
    if kind == "none" and not body:
        return NoBatching()
    if kind == "static" and body:
        return Static(_ints(spec, body))
    if kind == "dynamic" and body:
        b, _, w = body.partition(",")
        try:
            wait_ms = float(w)
        except ValueError:
            raise _bad(spec, "WAIT_MS is a number of milliseconds") from None
        try:
            wait_ms = plausible("ms").check(wait_ms, "WAIT_MS")  # at most a day (validate.CEILINGS)
        except OpmapError as e:
            raise _bad(spec, str(e)) from None
        return Dynamic(_ints(spec, b), wait_ms / 1e3)
    if kind == "continuous":
        return Continuous(_ints(spec, body)) if body else Continuous()
    if kind == "chunked" and body:
        return Chunked(_ints(spec, body))
    if kind == "engine" and not body:
        return Engine()
    if kind == "engine" and body:
        parts = [p.strip() for p in body.split(",")]
        n = len(parts)
        while n and parts[n - 1] in WORDS:
            n -= 1
        sizes, words = parts[:n], parts[n:]
        if len(sizes) not in (0, 3) or len(set(words)) != len(words):
            raise _bad(spec, "engine takes MAX_NUM_SEQS,MAX_NUM_BATCHED_TOKENS,KV_BLOCK[,nochunk][,noevict][,nomix]")
        try:
            return Engine(*[_ints(spec, p) for p in sizes], chunked_prefill="nochunk" not in words,
                          no_evict="noevict" in words, no_mix="nomix" in words)
        except OpmapError as e:
            raise _bad(spec, str(e)) from None
    raise _bad(spec)
