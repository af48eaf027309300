"""The scheduling policy: which sequences run in the next step, and what the engine's outputs mean for them.

No threads, no locks, no event loop: `add()` requests, `schedule()` a batch, run it on an engine, hand the
outputs to `postprocess()`, and `take_outputs()` what each request should be told. The engine loop
(inferd/engine/loop.py) drives it for the server, `inferd generate` drives it in the main thread, and the tests
drive it step by step with a fake engine and a fake clock.

Policy: running sequences first, decodes before prefill chunks (a long prompt being chunked in must not stall
everyone already generating); then waiting requests in arrival order while the step's token budget and the KV
cache allow. While sequences are decoding, the prompt tokens of a step are capped lower than the step's budget
(`max_prefill_while_decoding`): a decode step costs about as much as a small prefill chunk, so a full-budget chunk
would make the streams' next token several times later than their usual cadence (bench/results/itl_mixed.md).
When the cache is full the latest-arrived running sequence is preempted: its blocks go (full ones stay in the
prefix cache), and it is recomputed later from its prompt and what it generated so far.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Protocol
from collections.abc import Callable, Sequence

import numpy as np

from inferd.engine.kv_cache import KVCacheManager
from inferd.engine.request import FinishReason, Request, RequestOutput, RequestState, log_softmax_top
from inferd.engine.speculative import AcceptanceGate, PromptLookup, accept
from inferd.engine.types import RequestStatus, SeqInput, SeqOutput

log = logging.getLogger("inferd.scheduler")


class EngineSizes(Protocol):
    """What the policy needs to know of an engine: the sizes it was built for."""

    block_size: int
    num_kv_blocks: int
    max_batch_tokens: int
    max_seqs: int
    max_logits_rows: int


@dataclass
class ScheduledSeq:
    state: RequestState
    num_new: int  # positions run this step, starting at state.num_computed (1 + len(draft) for a decode)
    num_sampled: int  # 0 or 1, or 1 + len(draft)
    draft: list[int] = field(default_factory=list)  # speculative tokens verified after the decode token


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


class Scheduler:
    def __init__(
        self,
        engine: EngineSizes,
        *,
        max_model_len: int,
        max_running: int | None = None,
        enable_prefix_caching: bool = True,
        speculative: bool = False,
        max_prefill_while_decoding: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.block_size = engine.block_size
        self.kv = KVCacheManager(engine.num_kv_blocks, engine.block_size, enable_prefix_caching)
        self.max_running = min(max_running or engine.max_seqs, engine.max_seqs)
        self.max_batch_tokens = engine.max_batch_tokens
        # prompt tokens a step may take beside decodes (None or 0: the whole budget)
        self.max_prefill_while_decoding = max_prefill_while_decoding or None
        # logits rows (sampled rows plus every row of an echo-logprobs chunk) are capped separately
        self.max_logits_rows = engine.max_logits_rows
        # A sequence must fit in the cache alone, otherwise preemption could never make room for it.
        self.max_model_len = min(max_model_len, engine.num_kv_blocks * engine.block_size)
        # prompt-lookup speculative decoding for requests that do not say (Request.speculative is None)
        self.speculative = speculative
        self.clock = clock

        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.requests: dict[str, RequestState] = {}  # every unfinished request, by id
        self.num_preemptions = 0
        self._outputs: list[tuple[RequestState, RequestOutput]] = []

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def take_outputs(self) -> list[tuple[RequestState, RequestOutput]]:
        """What each request should be told since the last call, in order."""
        outputs, self._outputs = self._outputs, []
        return outputs

    # ---- arrivals, aborts, timeouts ------------------------------------------------------------------

    def add(self, st: RequestState) -> None:
        """Queue a new request; one that can never run is failed at once (its output says why)."""
        req = st.request
        params = req.params
        # Unseeded sampling still gets a seed: the C sampler's random numbers are a function of
        # (seed, position), and a fixed default would make every unseeded request identical.
        if params is not None and params.seed is None and params.temperature > 0:
            st.params = replace(params, seed=secrets.randbits(63))
        else:
            st.params = params
        st.token_ids = list(req.prompt_ids)
        st.num_prompt = len(req.prompt_ids)
        st.speculative = (self.speculative if req.speculative is None else req.speculative) and not req.warm
        if req.constraint is not None:  # drafts are not checked against the grammar: constrained does not draft
            st.speculative = False
            st.matcher = req.constraint.new_matcher()
            st.mask = req.constraint.new_mask()
        st.warm_target = len(req.prompt_ids) // self.block_size * self.block_size
        self.requests[req.request_id] = st
        error = self._check_fits(req)
        if error:
            self._finish(st, FinishReason.ERROR, error, status=400)
            return
        self.waiting.append(st)

    def _check_fits(self, req: Request) -> str | None:
        if not req.prompt_ids:
            return "the prompt is empty"
        total = len(req.prompt_ids) + (0 if req.warm else req.max_tokens)
        if total > self.max_model_len:
            return (
                f"this model's maximum context length is {self.max_model_len} tokens; the request "
                f"needs {len(req.prompt_ids)} prompt tokens + {req.max_tokens} max tokens = {total}"
            )
        return None

    def abort(self, request_id: str) -> RequestState | None:
        """Finish a request (the client went away); None if it has finished already."""
        st = self.requests.get(request_id)
        if st is not None:
            self._finish(st, FinishReason.ABORT)
        return st

    def expire_timeouts(self) -> list[RequestState]:
        now = self.clock()
        expired = [
            st
            for st in list(self.running) + list(self.waiting)
            if st.request.timeout_s is not None and now - st.arrival_time > st.request.timeout_s
        ]
        for st in expired:
            self._finish(st, FinishReason.ERROR, f"request timed out after {st.request.timeout_s:g} s", status=504)
        return expired

    def abort_all(self, reason: FinishReason, message: str, status: int) -> list[RequestState]:
        states = list(self.requests.values())
        for st in states:
            self._finish(st, reason, message, status=status)
        return states

    # ---- schedule ---------------------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch:
        budget = self.max_batch_tokens
        rows_left = self.max_logits_rows
        scheduled: list[ScheduledSeq] = []
        in_batch: set[int] = set()
        preempted = False

        for want_decode in (True, False):
            if not want_decode and scheduled and self.max_prefill_while_decoding:
                budget = min(budget, self.max_prefill_while_decoding)  # the decodes keep their cadence
            for st in list(self.running):
                if budget <= 0 or rows_left <= 0:
                    break
                if id(st) in in_batch or st not in self.running:
                    continue
                remaining = st.target_len - st.num_computed
                if (remaining == 1) != want_decode:
                    continue
                n = self._chunk(st, min(remaining, budget), rows_left)
                draft = self._draft(st, budget, rows_left) if want_decode and st.speculative else []
                if not self._reserve(st, st.num_computed + n + len(draft), in_batch):
                    preempted = True
                    continue
                if draft:
                    s = ScheduledSeq(st, n + len(draft), 1 + len(draft), draft)
                else:
                    s = ScheduledSeq(st, n, self._num_sampled(st, n))
                scheduled.append(s)
                in_batch.add(id(st))
                budget -= s.num_new
                rows_left -= self._rows(s)

        # Then waiting ones, strictly in arrival order, only if nothing had to be preempted (no room).
        while self.waiting and budget > 0 and rows_left > 0 and not preempted and len(self.running) < self.max_running:
            st = self.waiting[0]
            if not self.kv.has_seq(st.key):
                self._match_prefix(st)
            remaining = st.target_len - st.num_computed
            if remaining <= 0:  # a cache warm whose blocks were all cached already
                self._finish(st, FinishReason.STOP)
                continue
            n = self._chunk(st, min(remaining, budget), rows_left)
            # Chunk down to what fits rather than waiting for a whole prompt's worth of free blocks.
            room = (len(self.kv.block_table(st.key)) + self.kv.num_free_blocks) * self.block_size
            n = min(n, room - st.num_computed)
            if n <= 0:
                break
            self.kv.allocate(st.key, st.num_computed + n)
            self.waiting.popleft()
            self.running.append(st)
            st.status = RequestStatus.DECODING if st.status.prompt_done else RequestStatus.PREFILLING
            if st.first_scheduled_time is None:
                st.first_scheduled_time = self.clock()
            s = ScheduledSeq(st, n, self._num_sampled(st, n))
            scheduled.append(s)
            budget -= n
            rows_left -= self._rows(s)
        # a sequence failed while making room for a later one is not run
        scheduled = [s for s in scheduled if s.state.status is not RequestStatus.FINISHED]
        return ScheduledBatch(scheduled, [self._seq_input(s) for s in scheduled])

    def _draft(self, st: RequestState, budget: int, rows_left: int) -> list[int]:
        """Prompt-lookup draft tokens to verify after `st`'s decode token this step (maybe none).

        The drafts are cut to what can still be used (max_tokens, the context), to the step's token budget and
        logits rows, and to the KV blocks the sequence holds or can take while one free block per running
        sequence stays for plain decodes: a draft is a bet, never worth preempting anyone for."""
        if self._wants_logits(st):
            return []
        req = st.request
        room = min(req.max_tokens - len(st.output_ids), self.max_model_len - len(st.token_ids), budget, rows_left) - 1
        spare = max(0, self.kv.num_free_blocks - len(self.running))
        capacity = (len(self.kv.block_table(st.key)) + spare) * self.block_size
        room = min(room, capacity - (st.num_computed + 1))
        if room <= 0:
            return []
        if st.lookup is None or st.gate is None:
            st.lookup = PromptLookup()
            st.gate = AcceptanceGate()
        st.lookup.extend(st.token_ids[len(st.lookup.tokens) :])  # generated since the last look
        if not st.gate.allow():
            return []
        return st.lookup.propose()[:room]

    def _wants_logits(self, st: RequestState) -> bool:
        return st.request.prompt_logprobs is not None and not st.status.prompt_done

    def _chunk(self, st: RequestState, n: int, rows_left: int) -> int:
        # an echo-logprobs chunk returns a logits row per token, and the engine holds only so many rows
        return min(n, rows_left) if self._wants_logits(st) else n

    def _rows(self, s: ScheduledSeq) -> int:
        return s.num_new if self._wants_logits(s.state) else s.num_sampled

    def _num_sampled(self, st: RequestState, n: int) -> int:
        reaches_end = st.num_computed + n == len(st.token_ids)
        return 1 if reaches_end and not st.request.warm and st.request.max_tokens > 0 else 0

    def _match_prefix(self, st: RequestState) -> None:
        if st.request.warm:
            cap = st.target_len
        elif self._wants_logits(st):
            cap = 0  # prompt logprobs need the logits of every prompt position: nothing may be skipped
        else:
            cap = len(st.token_ids) - 1
        st.num_computed = self.kv.match_prefix(st.key, st.token_ids, cap)
        if st.num_cached_tokens is None:
            st.num_cached_tokens = st.num_computed

    def _reserve(self, st: RequestState, num_positions: int, in_batch: set[int]) -> bool:
        """Make room for `st` by preempting the latest-arrived unscheduled running sequences."""
        while not self.kv.can_allocate(st.key, num_positions):
            if self._release_waiting():
                continue
            victim = next((v for v in reversed(self.running) if id(v) not in in_batch), None)
            if victim is None or victim is st:
                if len(self.running) == 1 and not in_batch:  # alone and still no room: never will be
                    self._finish(
                        st, FinishReason.ERROR, "the request needs more KV cache than the server has", status=400
                    )
                else:
                    self._preempt(st)
                return False
            self._preempt(victim)
        self.kv.allocate(st.key, num_positions)
        return True

    def _release_waiting(self) -> bool:
        """Drop the prefix-cache hits that waiting sequences hold (matched at the head of the queue, then not
        admitted for want of room); they match again when admitted. Cheaper than preempting a running
        sequence, and a sequence running alone must never be failed for blocks that waiting ones hold."""
        released = False
        for w in self.waiting:
            if self.kv.has_seq(w.key):
                self.kv.free(w.key)
                w.num_computed = 0
                released = True
        return released

    def _preempt(self, st: RequestState) -> None:
        # Recompute later: drop the blocks (full ones stay in the prefix cache, so the recompute is mostly
        # a cache hit), keep the generated tokens, go back to the front of the queue.
        self.running.remove(st)
        self.kv.free(st.key)
        st.num_computed = 0
        if st.status.prompt_done:
            st.status = RequestStatus.PREEMPTED
        else:
            st.status = RequestStatus.WAITING
            st.prompt_logprobs.clear()  # collected again, from position 1, by the recompute
        st.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(st)

    def _seq_input(self, s: ScheduledSeq) -> SeqInput:
        st = s.state
        start = st.num_computed
        token_ids = st.token_ids[start : start + s.num_new]
        history = st.token_ids
        if s.draft:  # the decode token, then the drafts; the history as it would be if all were accepted
            token_ids = token_ids + s.draft
            history = st.token_ids + s.draft
        # the grammar's mask for the token this step samples (from the matcher as of the last sampled token)
        allowed = st.mask if st.matcher is not None and s.num_sampled and st.matcher.fill_mask(st.mask) else None
        return SeqInput(
            token_ids=token_ids,
            start_pos=start,
            block_table=list(self.kv.block_table(st.key)),
            num_sampled=s.num_sampled,
            params=st.params,
            history=history,
            num_prompt=st.num_prompt,
            want_logits=self._wants_logits(st),
            allowed=allowed,
        )

    # ---- postprocess --------------------------------------------------------------------------------------

    def postprocess(self, batch: ScheduledBatch, outputs: Sequence[SeqOutput | BaseException]) -> StepStats:
        """Apply one step's outputs (one per scheduled sequence; an exception fails only its sequence)."""
        if len(outputs) != len(batch):
            raise RuntimeError(f"engine returned {len(outputs)} outputs for {len(batch)} sequences")
        stats = StepStats(num_seqs=len(batch))
        now = self.clock()
        for s, out in zip(batch.seqs, outputs):
            st = s.state
            if st.status is RequestStatus.FINISHED:  # aborted meanwhile
                continue
            if isinstance(out, BaseException):
                log.error("engine failed request %s: %r", st.request.request_id, out)
                self._finish(st, FinishReason.ERROR, f"internal engine error: {out}", status=500)
                stats.finished.append(st)
                continue
            was_prompt_done = st.status.prompt_done
            if self._wants_logits(st):
                self._collect_prompt_logprobs(st, s, out.logits)
            tokens = out.tokens
            if s.draft:
                # Keep the drafts up to the first disagreement, plus the model's own token there. The K/V of
                # the decode token and of the accepted drafts is valid; what the rejected drafts wrote lies at
                # positions >= num_computed, never read, overwritten by the next step.
                assert st.gate is not None
                tokens = accept(s.draft, out.tokens)
                num_accepted = len(tokens) - 1
                st.gate.record(len(s.draft), num_accepted)
                stats.num_draft_tokens += len(s.draft)
                stats.num_accepted_tokens += num_accepted
                st.num_computed += 1 + num_accepted
                # only blocks full of accepted tokens get a prefix hash
                self.kv.cache_blocks(st.key, st.token_ids + tokens[:num_accepted], st.num_computed)
            else:
                st.num_computed += s.num_new
                if not (was_prompt_done and s.num_new == 1):
                    stats.num_prefill_tokens += s.num_new
                self.kv.cache_blocks(st.key, st.token_ids, st.num_computed)

            if st.request.warm:
                if st.num_computed >= st.target_len:
                    self._finish(st, FinishReason.STOP)
                    stats.finished.append(st)
                continue
            if st.num_computed >= st.num_prompt and not was_prompt_done:
                st.status = RequestStatus.DECODING
                stats.prompt_tokens_done += st.num_prompt
            if s.num_sampled == 0:
                if st.request.max_tokens == 0 and st.num_computed >= len(st.token_ids):
                    self._finish(st, FinishReason.LENGTH)  # scoring a prompt (echo) without generating
                    stats.finished.append(st)
                continue
            if st.first_token_time is None:
                st.first_token_time = now
                stats.ttfts.append(now - st.arrival_time)
            elif st.last_token_time is not None:
                stats.itls.append(now - st.last_token_time)
            st.last_token_time = now
            num_before = len(st.output_ids)
            if self._append_tokens(st, out, tokens):
                stats.finished.append(st)
            stats.num_decode_tokens += len(st.output_ids) - num_before
        return stats

    def _append_tokens(self, st: RequestState, out: SeqOutput, tokens: Sequence[int]) -> bool:
        """Add sampled tokens in order, checking the token-level stops after each (a stop discards the rest),
        and tell the request; True if it finished. Stop strings are the output processor's (output.py)."""
        req = st.request
        new_ids: list[int] = []
        reason: FinishReason | None = None
        grammar_error: str | None = None
        for tok in tokens:
            grammar_done = False
            if st.matcher is not None:
                step = req.constraint.advance(st.matcher, tok, req.stop_token_ids)
                if not step.ok:
                    grammar_error = step.error
                    break
                grammar_done = step.done
            st.token_ids.append(tok)
            st.output_ids.append(tok)
            new_ids.append(tok)
            if tok in req.stop_token_ids or grammar_done:  # a complete grammar: nothing more may follow
                reason = FinishReason.STOP
            elif len(st.output_ids) >= req.max_tokens or len(st.token_ids) >= self.max_model_len:
                reason = FinishReason.LENGTH
            if reason is not None:
                break
        if grammar_error is not None:
            if st.matcher.accepts_eos():  # what was written is complete: end there
                reason = FinishReason.STOP
            else:
                self._outputs.append((st, RequestOutput(req.request_id, token_ids=new_ids, usage=st.usage())))
                self._finish(st, FinishReason.ERROR, f"the output could not follow its grammar: {grammar_error}")
                return True
        n = len(new_ids)
        logprobs = list(out.logprobs[:n]) if st.params is not None and st.params.logprobs is not None else None
        top = list(out.top_logprobs[:n]) if logprobs is not None and out.top_logprobs else None
        if reason is not None:  # free the blocks before the client can see the end of its request
            self._finish(st, reason, deliver=False)
        self._outputs.append(
            (
                st,
                RequestOutput(
                    request_id=req.request_id,
                    token_ids=new_ids,
                    logprobs=logprobs,
                    top_logprobs=top,
                    finish_reason=reason,
                    prompt_logprobs=st.take_prompt_logprobs(),
                    usage=st.usage(),
                ),
            )
        )
        return reason is not None

    def finish_at_stop_string(self, st: RequestState, num_output_tokens: int) -> None:
        """The output processor found a stop string ending at generated token `num_output_tokens`: the sequence
        ends there (it may have finished in the same step already), and tokens after it do not count."""
        extra = len(st.output_ids) - num_output_tokens
        if extra > 0:
            del st.output_ids[num_output_tokens:]
            del st.token_ids[len(st.token_ids) - extra :]
        self._finish(st, FinishReason.STOP, deliver=False)
        st.finish_reason = FinishReason.STOP  # also over a reason the step's later tokens gave

    def _collect_prompt_logprobs(self, st: RequestState, s: ScheduledSeq, logits: np.ndarray | None) -> None:
        if logits is None:
            raise RuntimeError("engine returned no logits for a want_logits sequence")
        k = st.request.prompt_logprobs or 0
        start = st.num_computed
        # row i predicts position start + i + 1; only rows that predict a prompt token matter here
        rows = min(s.num_new, st.num_prompt - 1 - start)
        if rows > 0:
            targets = st.token_ids[start + 1 : start + 1 + rows]
            st.prompt_logprobs.extend(log_softmax_top(logits[:rows], targets, k))

    # ---- finishing ---------------------------------------------------------------------------------------

    def _finish(
        self,
        st: RequestState,
        reason: FinishReason,
        message: str | None = None,
        *,
        status: int = 500,
        deliver: bool = True,
    ) -> None:
        if st.status is RequestStatus.FINISHED:
            return
        if st in self.running:
            self.running.remove(st)
        elif st in self.waiting:
            self.waiting.remove(st)
        st.status = RequestStatus.FINISHED
        st.finish_reason = reason
        st.finish_time = self.clock()
        self.kv.free(st.key)
        self.requests.pop(st.request.request_id, None)
        if deliver:
            self._outputs.append(
                (
                    st,
                    RequestOutput(
                        request_id=st.request.request_id,
                        finish_reason=reason,
                        error_message=message,
                        error_status=status if reason == FinishReason.ERROR else None,
                        prompt_logprobs=st.take_prompt_logprobs(),
                        usage=st.usage(),
                    ),
                )
            )
