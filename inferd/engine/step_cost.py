"""How long a step takes, learned from the steps that ran: what the scheduler needs to size a prefill chunk so
that the streams decoding beside it wait at most `max_step_latency_s` for their next token.

A step that carries decode tokens and a prefill chunk costs about what the decodes alone cost (the weights
stream once, whatever the batch) plus a cost per prompt token (the matmuls are compute-bound at prefill sizes,
so that part grows with the chunk). Both are running means over recent steps: decode-only steps give the
first, steps with a chunk give the second once the first is known. The machine's speed drifts (other
processes, memory bandwidth phases), so recent steps count most.
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 0.2  # weight of the newest step in each running mean
MIN_CHUNK_FOR_RATE = 16  # shorter chunks say more about the fixed cost than about the per-token one


@dataclass
class StepCost:
    decode_s: float | None = None  # a step of decode tokens only
    per_prompt_token_s: float | None = None  # what each prompt token adds to a step

    def observe(self, duration_s: float, num_decode_rows: int, num_prompt_tokens: int) -> None:
        if num_prompt_tokens == 0:
            if num_decode_rows:
                self.decode_s = _mean(self.decode_s, duration_s)
            return
        if num_prompt_tokens < MIN_CHUNK_FOR_RATE:
            return
        fixed = self.decode_s if num_decode_rows and self.decode_s is not None else 0.0
        rate = max(duration_s - fixed, 0.0) / num_prompt_tokens
        self.per_prompt_token_s = _mean(self.per_prompt_token_s, rate)

    def prompt_tokens_within(self, budget_s: float, floor: int) -> int | None:
        """Prompt tokens a step with decodes may take and still end within `budget_s`; never fewer than `floor`
        (a prompt must always progress). None until both costs have been seen."""
        if self.decode_s is None or not self.per_prompt_token_s:
            return None
        return max(floor, int((budget_s - self.decode_s) / self.per_prompt_token_s))


def _mean(old: float | None, new: float) -> float:
    return new if old is None else old + DECAY * (new - old)
