"""The engine without the server: `inferd generate` (one request through the same scheduler as the server's,
driven in the caller's thread) and `inferd perplexity` (one sequence owning KV blocks 0..n-1, prefilled in chunks
of the engine's token budget, logits scored in numpy)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol
from collections.abc import Iterator

import numpy as np

from inferd.engine.loop import StepRunner, run_batch
from inferd.engine.output import OutputProcessor
from inferd.engine.request import FinishReason, Request, RequestOutput, RequestState
from inferd.engine.scheduler import EngineSizes, Scheduler
from inferd.engine.types import BLOCK_SIZE, SeqInput


def blocks_needed(num_positions: int) -> int:
    return -(-num_positions // BLOCK_SIZE)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tps(self) -> float:
        # the first token comes out of the prefill step; the rest each cost one decode step
        steps = self.generated_tokens - 1
        return steps / self.decode_seconds if steps > 0 and self.decode_seconds else 0.0


class SteppableEngine(StepRunner, EngineSizes, Protocol):
    context_length: int


def generate(
    engine: SteppableEngine,
    request: Request,
    *,
    tokenizer=None,
    speculative: bool = False,
    stats: GenerationStats | None = None,
) -> Iterator[RequestOutput]:
    """One request through the server's own scheduler, driven in this thread: schedule -> run -> postprocess
    until it finishes. Yields its outputs (token ids, and text when a tokenizer is given); raises ValueError
    if the request fails."""
    scheduler = Scheduler(
        engine,
        max_model_len=engine.context_length,
        max_running=1,
        enable_prefix_caching=False,
        speculative=speculative,
    )
    output = OutputProcessor(tokenizer, scheduler)
    stats = stats if stats is not None else GenerationStats()
    stats.prompt_tokens = len(request.prompt_ids)
    scheduler.add(RequestState(request, arrival_time=time.monotonic()))
    first_token_seen = False
    while True:
        for _, out in output.process(scheduler.take_outputs()):
            if out.finish_reason is FinishReason.ERROR:
                raise ValueError(out.error_message)
            stats.generated_tokens += len(out.token_ids)
            yield out
        if not scheduler.has_work:
            return
        batch = scheduler.schedule()
        t0 = time.perf_counter()
        step = scheduler.postprocess(batch, run_batch(engine, batch))
        elapsed = time.perf_counter() - t0
        if first_token_seen:
            stats.decode_seconds += elapsed
        else:
            stats.prefill_seconds += elapsed
            first_token_seen = step.num_decode_tokens > 0
        stats.drafted_tokens += step.num_draft_tokens
        stats.accepted_tokens += step.num_accepted_tokens


@dataclass
class PerplexityResult:
    ppl: float
    stderr: float
    chunks: int
    scored_tokens: int


def _token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits)[target] per row, float64. The exponentials are taken in float32 (each term of the sum is
    in (0, 1] after subtracting the row's max; the sum itself is float64): a float64 copy of (rows, vocab) logits
    cost more than the step that made them."""
    m = logits.max(axis=1, keepdims=True)
    sums = np.exp(logits - m).sum(axis=1, dtype=np.float64)
    picked = logits[np.arange(len(targets)), targets].astype(np.float64)
    return m[:, 0].astype(np.float64) + np.log(sums) - picked


def perplexity(
    engine: SteppableEngine, tokens: list[int], ctx: int, bos_id: int | None = None, progress=None
) -> PerplexityResult:
    """llama.cpp's method: chunks of `ctx` tokens (the first replaced by BOS when the model adds one), each
    scored on its second half; PPL = exp(mean NLL), its error from the NLL's standard error."""
    n_chunks = len(tokens) // ctx
    if n_chunks < 1 or ctx < 4:
        raise ValueError(f"{len(tokens)} tokens make no chunk of {ctx}; use a longer text or a smaller -c")
    if ctx > engine.context_length or blocks_needed(ctx) > engine.num_kv_blocks:
        raise ValueError(f"-c {ctx} is larger than the model's context or the KV cache")
    table = list(range(blocks_needed(ctx)))
    first = ctx // 2
    nll = nll2 = 0.0
    count = 0
    for c in range(n_chunks):
        chunk = list(tokens[c * ctx : (c + 1) * ctx])
        if bos_id is not None:
            chunk[0] = bos_id
        pos = 0
        while pos < ctx:
            # steps end at `first`: the first half is only context, so no logits (the vocabulary-wide output
            # matmul and the copy) are made for it; logits are needed for positions first .. ctx-2, in steps of at
            # most max_logits_rows (an engine built with few rows bounds a 262k vocabulary's logits)
            step = engine.max_batch_tokens if pos < first else min(engine.max_batch_tokens, engine.max_logits_rows)
            end = min(pos + step, first if pos < first else ctx)
            part = chunk[pos:end]
            lo, hi = pos, min(end, ctx - 1)
            if pos >= first and hi > lo:
                logits = engine.step([SeqInput(part, pos, table, 0, want_logits=True, state_slot=0)])[0].logits
                assert logits is not None
                for r0 in range(lo, hi, 32):  # in slices: bounded temporaries for big vocabularies (Gemma's 262k)
                    r1 = min(hi, r0 + 32)
                    token_nll = _token_nll(logits[r0 - pos : r1 - pos], np.asarray(chunk[r0 + 1 : r1 + 1]))
                    nll += float(token_nll.sum())
                    nll2 += float((token_nll**2).sum())
                count += hi - lo
            else:
                engine.step([SeqInput(part, pos, table, 0, state_slot=0)])  # (slot 0: a recurrent model's state)
            pos = end
        if progress:
            progress(c + 1, n_chunks, math.exp(nll / count))
    mean = nll / count
    var = nll2 / count - mean * mean
    ppl = math.exp(mean)
    stderr = math.sqrt(var / (count - 1)) * ppl if var > 0 and count > 1 else 0.0
    return PerplexityResult(ppl, stderr, n_chunks, count)
