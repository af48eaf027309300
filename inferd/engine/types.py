"""The values both engines and the scheduler exchange. Plain Python: importing this module needs no compiled
extension, so the scheduler, the protocol and their tests run without a compiler."""

from __future__ import annotations

import enum
import hashlib
import struct
from dataclasses import dataclass, field
from collections.abc import Sequence

import numpy as np

BLOCK_SIZE = 64  # positions per KV block: the attention kernels' tile (checked against the C header)
MAX_LOGPROBS = 20  # top logprobs a sampled row can report (checked against the C header)


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None  # random numbers depend only on (seed, position)
    logprobs: int | None = None  # None: none; 0: the chosen token's; k <= 20: also the top k

    def validate(self) -> None:
        """Raises ValueError naming the first bad field."""
        checks = [
            ("temperature", 0.0 <= self.temperature <= 100.0, "between 0 and 100"),
            ("top_k", self.top_k >= 0, "0 (off) or positive"),
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("min_p", 0.0 <= self.min_p <= 1.0, "in [0, 1]"),
            ("repetition_penalty", 0.0 < self.repetition_penalty <= 10.0, "in (0, 10]"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "in [-2, 2]"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "in [-2, 2]"),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, f"in [0, {MAX_LOGPROBS}]"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


GREEDY = SamplingParams(temperature=0.0)


@dataclass(frozen=True)
class LoraUse:
    """A request's LoRA adapter: the engine's index of it, the scale the request applies it with (times the
    adapter's alpha / rank), and the adapter's identity ("name\0digest of its matrices"), under which the prefix
    cache keeps the K/V it computes apart from the base model's and other adapters'."""

    index: int
    scale: float = 1.0
    identity: str = ""

    @property
    def name(self) -> str:
        return self.identity.partition("\0")[0]

    @property
    def cache_root(self) -> bytes:
        h = hashlib.blake2b(b"lora\0" + self.identity.encode(), digest_size=16)
        h.update(struct.pack("<d", self.scale))
        return h.digest()


@dataclass
class SeqInput:
    """One sequence's part of a step."""

    token_ids: Sequence[int]  # a prefill chunk, 1 decode token, or 1 + draft tokens
    start_pos: int  # position of token_ids[0]; earlier positions are in the KV cache
    block_table: Sequence[int]  # KV blocks covering [0, start_pos + len(token_ids)), BLOCK_SIZE each
    num_sampled: int = 1  # sample after the last num_sampled tokens (0: non-final prefill chunk)
    params: SamplingParams | None = None
    history: Sequence[int] = ()  # prompt + generated tokens so far (for penalties)
    num_prompt: int = 0  # history[:num_prompt] is the prompt
    want_logits: bool = False  # return the logits of every token in token_ids
    # the grammar's allowed tokens for the sampled row (num_sampled 1): packed uint32 bits, (vocab + 31) // 32
    allowed: np.ndarray | None = None
    lora: int = -1  # the engine's LoRA adapter (Engine.add_adapter's index) this sequence runs with; -1: none
    lora_scale: float = 1.0  # times the adapter's own alpha / rank
    # a model with recurrent layers: the sequence's state slot (start_pos 0 starts it empty, else it continues),
    # the state to put in it first (a prefix-cache hit's snapshot, the state after start_pos positions), and
    # whether to return the state after this step (it ends at a block boundary the prefix cache keeps)
    state_slot: int = -1
    restore_state: np.ndarray | None = None
    snapshot_state: bool = False


@dataclass
class SeqOutput:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    logits: np.ndarray | None = None  # (len(token_ids), vocab) float32 when want_logits
    state: np.ndarray | None = None  # the recurrent state after the step, when SeqInput.snapshot_state


class RequestStatus(enum.Enum):
    """Where a request is in its life. A request whose prompt was computed once never goes back to WAITING or
    PREFILLING: preempted, it waits as PREEMPTED and recomputes as DECODING (its prompt logprobs, if any, are
    complete and its prompt tokens were counted)."""

    WAITING = "waiting"  # queued; its prompt has not been computed yet
    PREFILLING = "prefilling"  # running; prompt chunks still to come
    DECODING = "decoding"  # running; the prompt has been computed
    PREEMPTED = "preempted"  # queued again after its prompt was computed (its KV blocks were taken)
    FINISHED = "finished"

    @property
    def prompt_done(self) -> bool:
        return self in (RequestStatus.DECODING, RequestStatus.PREEMPTED)

    @property
    def is_waiting(self) -> bool:
        return self in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
