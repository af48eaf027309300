"""One scheduler step's vocabulary: what the policy needs of an engine, the batch it schedules, what the engine
is given per sequence, and what the step did (for metrics)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from inferd.engine.request import RequestState
from inferd.engine.types import SeqInput


class EngineSizes(Protocol):
    """What the policy needs to know of an engine: the sizes it was built for."""

    block_size: int
    num_kv_blocks: int
    max_batch_tokens: int
    max_seqs: int
    max_logits_rows: int


def num_state_slots(engine: object) -> int:
    """Recurrent-state slots the engine keeps (0: a model without recurrent layers)."""
    return int(getattr(engine, "num_state_slots", 0) or 0)


def kv_block_copier(engine: object) -> Callable[[int, int], None] | None:
    """The engine's copy of one KV block into another (prefix hits within a block), None if it has none."""
    return getattr(engine, "copy_kv_block", None)


@dataclass
class ScheduledSeq:
    state: RequestState
    num_new: int  # positions run this step, starting at state.num_computed (1 + len(draft) for a decode)
    num_sampled: int  # 0 or 1, or 1 + len(draft)
    draft: list[int] = field(default_factory=list)  # speculative tokens verified after the decode token

    @property
    def logits_rows(self) -> int:
        """Rows of logits the engine returns: every row of an echo-logprobs chunk, else the sampled ones."""
        return self.num_new if self.state.wants_prompt_logits else self.num_sampled

    def engine_input(
        self, block_table: list[int], state_slot: int = -1, restore_state=None, snapshot_every: int = 0
    ) -> SeqInput:
        """snapshot_every: ask for the recurrent state when the step ends at a multiple of it (0: never)."""
        st = self.state
        start = st.num_computed
        token_ids = st.token_ids[start : start + self.num_new]
        history = st.token_ids
        if self.draft:  # the decode token, then the drafts; the history as it would be if all were accepted
            token_ids = token_ids + self.draft
            history = st.token_ids + self.draft
        # the grammar's mask for the token this step samples (from the matcher as of the last sampled token)
        allowed = st.mask if st.matcher is not None and self.num_sampled and st.matcher.fill_mask(st.mask) else None
        return SeqInput(
            token_ids=token_ids,
            start_pos=start,
            block_table=block_table,
            num_sampled=self.num_sampled,
            params=st.params,
            history=history,
            num_prompt=st.num_prompt,
            want_logits=st.wants_prompt_logits,
            allowed=allowed,
            lora=st.request.lora.index if st.request.lora else -1,
            lora_scale=st.request.lora.scale if st.request.lora else 1.0,
            state_slot=state_slot,
            restore_state=restore_state,
            snapshot_state=bool(snapshot_every) and (start + self.num_new) % snapshot_every == 0,
        )


@dataclass
class ScheduledBatch:
    """One step's work: `inputs[i]` is what the engine runs for `seqs[i]`."""

    seqs: list[ScheduledSeq]
    inputs: list[SeqInput]

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def num_positions_read(self) -> int:
        """KV positions attended to this step (for the bytes-read estimate)."""
        return sum(s.state.num_computed + s.num_new for s in self.seqs)


@dataclass
class StepStats:
    """What one step did; handed to the observer (metrics) from the scheduler thread."""

    duration_s: float = 0.0
    num_seqs: int = 0
    num_prefill_tokens: int = 0  # prompt (or recomputed) positions run this step
    num_decode_tokens: int = 0  # tokens generated this step (accepted drafts included)
    bytes_read: int = 0  # weights once + K/V of every attended position
    prompt_tokens_done: int = 0  # prompt lengths of requests whose prefill finished this step
    num_draft_tokens: int = 0  # speculative tokens proposed and verified this step
    num_accepted_tokens: int = 0  # of which the model agreed with
    ttfts: list[float] = field(default_factory=list)
    itls: list[float] = field(default_factory=list)
    finished: list[RequestState] = field(default_factory=list)
