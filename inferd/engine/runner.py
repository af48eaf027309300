"""One sequence through the engine without the scheduler: `inferd generate` and `inferd perplexity`.
The sequence owns KV blocks 0..n-1 in order; prompts are prefilled in chunks of the engine's token budget."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from inferd.engine.engine import BLOCK_SIZE, Engine, SamplingParams, SeqInput
from inferd.engine.speculative import AcceptanceGate, PromptLookup, accept


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


def generate(engine: Engine, prompt: list[int], params: SamplingParams, max_tokens: int,
             stop_ids: Iterable[int] = (), stats: GenerationStats | None = None,
             speculative: bool = False) -> Iterator[int]:
    """Yields sampled token ids until max_tokens, a stop id, or the end of the context. With `speculative`,
    prompt-lookup drafts are verified in the same steps; the tokens are the same either way."""
    if not prompt:
        raise ValueError("the prompt is empty")
    params.validate()
    max_tokens = min(max_tokens, engine.context_length - len(prompt))
    if max_tokens <= 0:
        raise ValueError(f"the prompt ({len(prompt)} tokens) fills the context of {engine.context_length}")
    stats = stats if stats is not None else GenerationStats()
    stats.prompt_tokens = len(prompt)
    table = list(range(blocks_needed(len(prompt) + max_tokens)))
    if len(table) > engine.num_kv_blocks:
        raise ValueError(f"{len(prompt) + max_tokens} positions need {len(table)} KV blocks; the engine has "
                         f"{engine.num_kv_blocks}")
    stop = set(stop_ids)
    history = list(prompt)
    t0 = time.perf_counter()
    pos = 0
    while True:                                                   # prefill, chunk by chunk
        chunk = prompt[pos:pos + engine.max_batch_tokens]
        last = pos + len(chunk) == len(prompt)
        out = engine.step([SeqInput(chunk, pos, table, 1 if last else 0, params, history, len(prompt))])[0]
        pos += len(chunk)
        if last:
            break
    stats.prefill_seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    lookup = PromptLookup(prompt) if speculative else None
    gate = AcceptanceGate()
    new_tokens = out.tokens
    while True:
        for token in new_tokens:
            history.append(token)
            stats.generated_tokens += 1
            stats.decode_seconds = time.perf_counter() - t1
            if token in stop:
                return
            yield token
            if stats.generated_tokens == max_tokens:
                return
        token = history[-1]
        # positions pos .. pos + len(new_tokens) - 1 get their KV now; drafts must stay inside the budget
        pos = len(history) - 1
        draft: list[int] = []
        if lookup is not None:
            lookup.extend(new_tokens)
            if gate.allow():
                room = min(max_tokens - stats.generated_tokens, len(table) * BLOCK_SIZE - pos) - 1
                draft = lookup.propose()[:max(0, room)]
        out = engine.step([SeqInput([token] + draft, pos, table, 1 + len(draft), params, history,
                                    len(prompt))])[0]
        new_tokens = accept(draft, out.tokens)
        gate.record(len(draft), len(new_tokens) - 1)
        stats.drafted_tokens += len(draft)
        stats.accepted_tokens += len(new_tokens) - 1


@dataclass
class PerplexityResult:
    ppl: float
    stderr: float
    chunks: int
    scored_tokens: int


def perplexity(engine: Engine, tokens: list[int], ctx: int, bos_id: int | None = None,
               progress=None) -> PerplexityResult:
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
        chunk = list(tokens[c * ctx:(c + 1) * ctx])
        if bos_id is not None:
            chunk[0] = bos_id
        # the first half is only context: its steps ask for no logits (with a big vocabulary the output matmul
        # and the logits of the rows not scored would be most of the work)
        step = engine.max_batch_tokens
        starts = sorted(set(range(0, first, step)) | set(range(first, ctx, step)))
        for pos, end in zip(starts, starts[1:] + [ctx]):
            part = chunk[pos:end]
            # logits are needed for positions first .. ctx-2 (each predicts the next token)
            lo, hi = max(pos, first), min(pos + len(part), ctx - 1)
            if hi > lo:
                out = engine.step([SeqInput(part, pos, table, 0, want_logits=True)])[0]
                for r0 in range(lo, hi, 32):                 # float64 in slices: bounded memory for big vocabularies
                    r1 = min(hi, r0 + 32)
                    logits = out.logits[r0 - pos:r1 - pos].astype(np.float64)
                    m = logits.max(axis=1, keepdims=True)
                    lse = (m[:, 0] + np.log(np.exp(logits - m).sum(axis=1)))
                    targets = np.asarray(chunk[r0 + 1:r1 + 1])
                    token_nll = lse - logits[np.arange(r1 - r0), targets]
                    nll += float(token_nll.sum())
                    nll2 += float((token_nll ** 2).sum())
                count += hi - lo
            else:
                engine.step([SeqInput(part, pos, table, 0)])
        if progress:
            progress(c + 1, n_chunks, math.exp(nll / count))
    mean = nll / count
    var = nll2 / count - mean * mean
    ppl = math.exp(mean)
    stderr = math.sqrt(var / (count - 1)) * ppl if var > 0 and count > 1 else 0.0
    return PerplexityResult(ppl, stderr, n_chunks, count)
