"""What travels between the HTTP side and the scheduler thread: a Request in, RequestOutputs back.

`RequestState` is the scheduler's per-request bookkeeping; only the scheduler thread mutates it after
submit (the HTTP side only reads `usage()` numbers from delivered outputs).
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass, field, replace
from typing import Any
from collections.abc import Sequence

import numpy as np

from inferd.engine.speculative import AcceptanceGate, PromptLookup, accept
from inferd.engine.types import LoraUse, RequestStatus, SamplingParams


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token or a stop string; also a completed cache warm
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"  # client disconnected, or the server is shutting down
    ERROR = "error"  # see RequestOutput.error_status / error_message


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams | None = None  # None: greedy
    max_tokens: int = 16
    stop: Sequence[str] = ()  # stop strings, never part of the returned text
    stop_token_ids: frozenset[int] = frozenset()  # EOS ids (unless ignore_eos) and any extra stop ids
    detokenize: bool = True
    prompt_logprobs: int | None = None  # echo + logprobs: top-k of every prompt position (0: chosen only)
    warm: bool = False  # prefill the prompt into the prefix cache (up to its cache granule), no output
    timeout_s: float | None = None
    speculative: bool | None = None  # prompt-lookup speculative decoding; None: the server's setting
    constraint: Any = None  # engine.constraints.Constraint: a grammar every choice must follow
    shown_special: frozenset[int] = frozenset()  # special tokens kept in the text (tool-call markers)
    lora: LoraUse | None = None  # the LoRA adapter the request runs with

    def length_error(self, max_model_len: int) -> str | None:
        """Why this request can never run in a context of `max_model_len` positions, or None."""
        if not self.prompt_ids:
            return "the prompt is empty"
        total = len(self.prompt_ids) + (0 if self.warm else self.max_tokens)
        if total > max_model_len:
            return (
                f"this model's maximum context length is {max_model_len} tokens; the request "
                f"needs {len(self.prompt_ids)} prompt tokens + {self.max_tokens} max tokens = {total}"
            )
        return None


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass
class RequestOutput:
    """One step's worth of news about one request (a delta, except usage which is cumulative)."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # (logprob of the prompt token, top-k [(token, logprob)]) for prompt positions 1.. (new ones only)
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
    finish_reason: FinishReason | None = None
    error_status: int | None = None  # HTTP status when finish_reason is ERROR
    error_message: str | None = None
    usage: Usage | None = None
    stop_string: str | None = None  # the request's stop string that ended it (APIs that say which: Anthropic's)


@dataclass(eq=False)
class RequestState:
    request: Request
    arrival_time: float
    status: RequestStatus = RequestStatus.WAITING
    params: SamplingParams | None = None  # the request's, with a seed drawn if it had none
    token_ids: list[int] = field(default_factory=list)  # prompt + generated
    num_prompt: int = 0
    num_computed: int = 0  # positions whose K/V is in the cache
    output_ids: list[int] = field(default_factory=list)
    warm_target: int = 0  # warm requests: positions to get cached
    num_cached_tokens: int | None = None  # prefix-cache hit at first admission
    num_preemptions: int = 0
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    _prompt_logprobs_sent: int = 0
    speculative: bool = False  # resolved at admission (request, else server)
    lookup: PromptLookup | None = None  # prompt-lookup drafts over token_ids
    gate: AcceptanceGate | None = None
    matcher: Any = None  # constrained: the grammar's state (constraints.py)
    mask: np.ndarray | None = None  # constrained: the next token's allowed-token bits
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: FinishReason | None = None

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def key(self) -> str:
        return self.request.request_id

    @property
    def target_len(self) -> int:
        """Positions that must be computed before the next sample (or, for a warm, before it is done)."""
        return self.warm_target if self.request.warm else len(self.token_ids)

    @property
    def wants_prompt_logits(self) -> bool:
        """Echo logprobs: every prompt position's logits are needed, until the prompt is done."""
        return self.request.prompt_logprobs is not None and not self.status.prompt_done

    def start(self, cache_granule: int, speculative: bool) -> None:
        """Set up what the scheduler tracks, at arrival; `speculative` is the server's default, `cache_granule` the
        prefix cache's (a warm computes the prompt's positions up to a multiple of it)."""
        req = self.request
        # Unseeded sampling still gets a seed: the C sampler's random numbers are a function of
        # (seed, position), and a fixed default would make every unseeded request identical.
        params = req.params
        self.params = (
            replace(params, seed=secrets.randbits(63))
            if params and params.seed is None and params.temperature > 0
            else params
        )
        self.token_ids = list(req.prompt_ids)
        self.num_prompt = len(req.prompt_ids)
        self.speculative = (speculative if req.speculative is None else req.speculative) and not req.warm
        if req.constraint is not None:  # drafts are not checked against the grammar: constrained does not draft
            self.speculative = False
            self.matcher = req.constraint.new_matcher()
            self.mask = req.constraint.new_mask()
        self.warm_target = len(req.prompt_ids) // cache_granule * cache_granule

    def propose_draft(self, room: int) -> list[int]:
        """Prompt-lookup draft tokens (at most `room`) to verify after this decode step's token, maybe none."""
        if self.lookup is None or self.gate is None:
            self.lookup = PromptLookup()
            self.gate = AcceptanceGate()
        self.lookup.extend(self.token_ids[len(self.lookup.tokens) :])  # generated since the last look
        return self.lookup.propose()[:room] if self.gate.allow() else []

    def accept_draft(self, draft: list[int], sampled: Sequence[int]) -> list[int]:
        """The drafts up to the first disagreement, plus the model's own token there."""
        assert self.gate is not None
        tokens = accept(draft, sampled)
        self.gate.record(len(draft), len(tokens) - 1)
        return tokens

    def append_tokens(
        self, tokens: Sequence[int], max_model_len: int
    ) -> tuple[list[int], FinishReason | None, str | None]:
        """Add sampled tokens in order, advancing the grammar and checking the token-level stops after each (a
        stop discards the rest). Returns (tokens added, why the sequence ends or None, the grammar's error)."""
        req = self.request
        new_ids: list[int] = []
        for tok in tokens:
            grammar_done = False
            if self.matcher is not None:
                step = req.constraint.advance(self.matcher, tok, req.stop_token_ids)
                if not step.ok:
                    # what was written is complete: end there
                    return new_ids, (FinishReason.STOP if self.matcher.accepts_eos() else None), step.error
                grammar_done = step.done
            self.token_ids.append(tok)
            self.output_ids.append(tok)
            new_ids.append(tok)
            if tok in req.stop_token_ids or grammar_done:  # a complete grammar: nothing more may follow
                return new_ids, FinishReason.STOP, None
            if len(self.output_ids) >= req.max_tokens or len(self.token_ids) >= max_model_len:
                return new_ids, FinishReason.LENGTH, None
        return new_ids, None, None

    def collect_prompt_logprobs(self, num_new: int, logits: np.ndarray | None) -> None:
        """Keep the logprobs of the prompt tokens that this step's logits rows (from num_computed) predict."""
        if logits is None:
            raise RuntimeError("engine returned no logits for a want_logits sequence")
        start = self.num_computed
        # row i predicts position start + i + 1; only rows that predict a prompt token matter here
        rows = min(num_new, self.num_prompt - 1 - start)
        if rows > 0:
            targets = self.token_ids[start + 1 : start + 1 + rows]
            self.prompt_logprobs.extend(log_softmax_top(logits[:rows], targets, self.request.prompt_logprobs or 0))

    def usage(self) -> Usage:
        return Usage(self.num_prompt, len(self.output_ids), self.num_cached_tokens or 0)

    def take_prompt_logprobs(self) -> list[tuple[float, list[tuple[int, float]]]] | None:
        if self.request.prompt_logprobs is None or self._prompt_logprobs_sent == len(self.prompt_logprobs):
            return None
        new = self.prompt_logprobs[self._prompt_logprobs_sent :]
        self._prompt_logprobs_sent = len(self.prompt_logprobs)
        return new


def log_softmax_top(logits: np.ndarray, targets: Sequence[int], k: int) -> list[tuple[float, list[tuple[int, float]]]]:
    """Per row: (logprob of targets[row], the top-k (token, logprob) pairs, best first)."""
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lp = x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))
    out = []
    for row, target in enumerate(targets):
        top: list[tuple[int, float]] = []
        if k > 0:
            idx = np.argpartition(-lp[row], k - 1)[:k]
            idx = idx[np.argsort(-lp[row][idx], kind="stable")]
            top = [(int(i), float(lp[row, i])) for i in idx]
        out.append((float(lp[row, target]), top))
    return out
