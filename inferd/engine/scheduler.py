"""The scheduling policy: which sequences run in the next step, and what the engine's outputs mean for them.

No threads, no locks, no event loop: `add()` requests, `schedule()` a batch, run it on an engine, hand the
outputs to `postprocess()`, and `take_outputs()` what each request should be told. The engine loop
(inferd/engine/loop.py) drives it for the server, `inferd generate` drives it in the main thread, and the tests
drive it step by step with a fake engine and a fake clock.

Policy: running sequences first, decodes before prefill chunks (a long prompt being chunked in must not stall
everyone already generating); then waiting requests in arrival order while the step's token budget and the KV
cache allow.

While sequences are decoding, every prompt token in the step delays their next token: on a CPU the matmuls are
compute-bound from a few rows on, so a prompt token costs about what a decode row costs, and a 256-token chunk
beside 8 decodes makes that step many times a decode step (bench/results/step_latency/). So the prompt tokens a
step takes beside decodes (all prompts' chunks together) are cut to what keeps the step within a bound:
`step_latency_factor` (K) times what a step of those decodes alone takes, by default; or `max_step_latency_s`
when that is set. A stream's slowest token then comes at most about K times later than its usual one, whatever
the model, the machine or the batch, with no number to tune. The prompt's own cost changes little: the weights
stream once per step either way, so small chunks mostly add steps, and the decodes ride along in those steps.
The costs come from a fit over recent steps (step_cost.py); before it has seen enough steps a chunk beside
decodes is the smallest one (MIN_PREFILL_BESIDE_DECODES), which a prompt never goes below so that it always
progresses. A step without decodes (nothing is streaming) takes prompt tokens up to the whole budget, and
`max_prefill_while_decoding` stays an upper bound on the chunk.

The bound alone would starve prompts that arrive faster than it lets them in: a step takes about K - 1 decode
steps' worth of prompt tokens, while a closed-loop load brings (prompt tokens / output tokens) of them per decode
token, over 5 for long prompts and short answers. Prompts would pile up, fewer streams would decode, their steps
and so the chunks would shrink, and throughput would fall. So a step also takes at least the prompt tokens
waiting to be computed spread over PACE_STEPS steps: a sustained stream of prompts is then taken in as fast as
it comes, evenly over the steps (every step a little longer, none much longer: the tail stays near the median),
while one long prompt in a quiet period still comes in at the bound's pace.
When the cache is full the latest-arrived running sequence is preempted: its blocks go (full ones stay in the
prefix cache), and it is recomputed later from its prompt and what it generated so far.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from inferd.engine.kv_cache import KVCacheManager
from inferd.engine.request import FinishReason, RequestOutput, RequestState
from inferd.engine.sequences import Sequences
from inferd.engine.step_cost import StepCost
from inferd.engine.step import EngineSizes, ScheduledBatch, ScheduledSeq, StepStats, kv_block_copier, num_state_slots
from inferd.engine.types import RequestStatus, SeqOutput

__all__ = ["EngineSizes", "ScheduledBatch", "ScheduledSeq", "Scheduler", "StepStats"]

log = logging.getLogger("inferd.scheduler")

MIN_PREFILL_BESIDE_DECODES = 16  # a step's latency bound never stops a prompt from progressing
DEFAULT_STEP_LATENCY_FACTOR = 3.0  # a step with prompt tokens beside decodes: at most this many decode steps
PACE_STEPS = 32  # beside decodes, a step takes at least the pending prompt tokens over this many steps


class Scheduler(Sequences):
    def __init__(
        self,
        engine: EngineSizes,
        *,
        max_model_len: int,
        max_running: int | None = None,
        enable_prefix_caching: bool = True,
        speculative: bool = False,
        max_prefill_while_decoding: int | None = None,
        max_step_latency_s: float | None = None,
        step_latency_factor: float | None = DEFAULT_STEP_LATENCY_FACTOR,
        clock: Callable[[], float] = time.monotonic,
    ):
        slots = num_state_slots(engine)
        # a recurrent model's cached prefix needs the state at its end: prefill chunks end at block boundaries and
        # the state there is kept beside the block (kv_cache.py: at most one snapshot per state slot)
        self.snapshot_states = bool(slots) and enable_prefix_caching
        if self.snapshot_states:
            log.info("prefix caching keeps recurrent-state snapshots at block boundaries (at most %d)", slots)
        if slots and speculative:
            log.info("speculative decoding is off: this model has recurrent layers, which rejected drafts would alter")
        # a recurrent model's draft tokens would enter its state before they are verified: it never drafts
        self.allow_drafts = not slots
        kv = KVCacheManager(engine.num_kv_blocks, engine.block_size, enable_prefix_caching, slots)
        kv.copy_block = kv_block_copier(engine)  # prefix hits within a block (kv_cache.py)
        super().__init__(kv, clock)
        self.block_size = engine.block_size
        # what a prefix-cache hit is a multiple of: a position where hits within a block are possible, else a block
        self.cache_granule = 1 if kv.hits_within_block else self.block_size
        self.max_running = min(max_running or engine.max_seqs, engine.max_seqs)
        if slots:
            self.max_running = min(self.max_running, slots)
        self.max_batch_tokens = engine.max_batch_tokens
        # prompt tokens a step may take beside decodes (None or 0: the whole budget)
        self.max_prefill_while_decoding = max_prefill_while_decoding or None
        # while sequences decode, a step should end within this many seconds, else within this many times a step
        # of the decodes alone (both None or 0: only the cap above bounds the chunk)
        self.max_step_latency_s = max_step_latency_s or None
        self.step_latency_factor = step_latency_factor or None
        self.step_cost = StepCost()
        self.pace_steps = PACE_STEPS
        # logits rows (sampled rows plus every row of an echo-logprobs chunk) are capped separately
        self.max_logits_rows = engine.max_logits_rows
        # A sequence must fit in the cache alone, otherwise preemption could never make room for it.
        self.max_model_len = min(max_model_len, engine.num_kv_blocks * engine.block_size)
        # prompt-lookup speculative decoding for requests that do not say (Request.speculative is None)
        self.speculative = speculative

    # ---- arrivals, aborts, timeouts ------------------------------------------------------------------

    def add(self, st: RequestState) -> None:
        """Queue a new request; one that can never run is failed at once (its output says why)."""
        req = st.request
        st.start(self.cache_granule, self.speculative)
        st.speculative = st.speculative and self.allow_drafts
        self.requests[req.request_id] = st
        error = req.length_error(self.max_model_len)
        if error:
            self._finish(st, FinishReason.ERROR, error, status=400)
            return
        self.waiting.append(st)

    # ---- schedule ---------------------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch:
        budget = self.max_batch_tokens
        rows_left = self.max_logits_rows
        scheduled: list[ScheduledSeq] = []
        in_batch: set[int] = set()
        preempted = False

        for want_decode in (True, False):
            if not want_decode and scheduled:  # the decodes keep their cadence
                budget = min(budget, self._prefill_beside_decodes(self.max_batch_tokens - budget))
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
                rows_left -= s.logits_rows

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
            rows_left -= s.logits_rows
        # a sequence failed while making room for a later one is not run
        scheduled = [s for s in scheduled if s.state.status is not RequestStatus.FINISHED]
        return ScheduledBatch(
            scheduled,
            [
                s.engine_input(
                    list(self.kv.block_table(s.state.key)),
                    self.kv.state_slot(s.state.key),
                    self.kv.take_restore(s.state.key) if self.snapshot_states else None,
                    self.block_size if self.snapshot_states else 0,
                )
                for s in scheduled
            ],
        )

    def _prefill_beside_decodes(self, decode_rows: int) -> int:
        """Prompt tokens a step with `decode_rows` decode rows may take (the module's docstring says why)."""
        cap = self.max_prefill_while_decoding or self.max_batch_tokens
        if self.max_step_latency_s is None and self.step_latency_factor is None:
            return cap
        cost = self.step_cost
        decode_s = cost.decode_s(decode_rows)
        bound = self.max_step_latency_s or (decode_s or 0.0) * (self.step_latency_factor or 1.0)
        fits = cost.prompt_tokens_within(bound, decode_rows, MIN_PREFILL_BESIDE_DECODES)
        # nothing learned yet: the smallest chunk, which teaches the costs
        fits = fits if fits is not None else MIN_PREFILL_BESIDE_DECODES
        return min(cap, max(fits, -(-self._pending_prompt_tokens() // self.pace_steps)))

    def _pending_prompt_tokens(self) -> int:
        """Prompt tokens still to compute of the running sequences and of the waiting ones that may start."""
        pending = sum(st.target_len - st.num_computed for st in self.running if not st.status.prompt_done)
        free = self.max_running - len(self.running)
        for st in self.waiting:
            if free <= 0:
                break
            pending += st.target_len - st.num_computed
            free -= 1
        return pending

    def observe(self, batch: ScheduledBatch, duration_s: float) -> None:
        """How long `batch` took to run: what sizes the next steps' prefill chunks (step_cost.py)."""
        decode_rows = sum(s.num_new for s in batch.seqs if s.num_sampled and s.num_new == s.num_sampled)
        prompt_tokens = sum(s.num_new for s in batch.seqs if s.num_new != s.num_sampled)
        self.step_cost.observe(duration_s, decode_rows, prompt_tokens)

    def _draft(self, st: RequestState, budget: int, rows_left: int) -> list[int]:
        """Draft tokens cut to what can still be used (max_tokens, the context), to the step's token budget and
        logits rows, and to the KV blocks the sequence holds or can take while one free block per running
        sequence stays for plain decodes: a draft is a bet, never worth preempting anyone for."""
        if st.wants_prompt_logits:
            return []
        req = st.request
        room = min(req.max_tokens - len(st.output_ids), self.max_model_len - len(st.token_ids), budget, rows_left) - 1
        spare = max(0, self.kv.num_free_blocks - len(self.running))
        capacity = (len(self.kv.block_table(st.key)) + spare) * self.block_size
        room = min(room, capacity - (st.num_computed + 1))
        return st.propose_draft(room) if room > 0 else []

    def _chunk(self, st: RequestState, n: int, rows_left: int) -> int:
        # an echo-logprobs chunk returns a logits row per token, and the engine holds only so many rows
        n = min(n, rows_left) if st.wants_prompt_logits else n
        if self.snapshot_states:  # a chunk across a block boundary stops there, where its state is snapshot
            boundary = (st.num_computed + n) // self.block_size * self.block_size
            if st.num_computed < boundary < st.num_computed + n:
                n = boundary - st.num_computed
        return n

    def _num_sampled(self, st: RequestState, n: int) -> int:
        reaches_end = st.num_computed + n == len(st.token_ids)
        return 1 if reaches_end and not st.request.warm and st.request.max_tokens > 0 else 0

    def _match_prefix(self, st: RequestState) -> None:
        if st.request.warm:
            cap = st.target_len
        elif st.wants_prompt_logits:
            cap = 0  # prompt logprobs need the logits of every prompt position: nothing may be skipped
        else:
            cap = len(st.token_ids) - 1
        # a request with an adapter has K/V of its own: its blocks hash under the adapter's root
        root = st.request.lora.cache_root if st.request.lora else None
        st.num_computed = self.kv.match_prefix(st.key, st.token_ids, cap, root)
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
            if st.wants_prompt_logits:
                st.collect_prompt_logprobs(s.num_new, out.logits)
            tokens = out.tokens
            if s.draft:
                # The K/V of the decode token and of the accepted drafts is valid; what the rejected drafts wrote
                # lies at positions >= num_computed, never read, overwritten by the next step.
                tokens = st.accept_draft(s.draft, out.tokens)
                num_accepted = len(tokens) - 1
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
                if self.snapshot_states and out.state is not None:
                    self.kv.store_snapshot(st.key, st.num_computed, out.state)

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
        """Add the sampled tokens (token-level stops only: stop strings are the output processor's, output.py)
        and tell the request; True if it finished."""
        req = st.request
        new_ids, reason, grammar_error = st.append_tokens(tokens, self.max_model_len)
        if grammar_error is not None and reason is None:
            self._outputs.append((st, RequestOutput(req.request_id, token_ids=new_ids, usage=st.usage())))
            self._finish(st, FinishReason.ERROR, f"the output could not follow its grammar: {grammar_error}")
            return True
        n = len(new_ids)
        logprobs = list(out.logprobs[:n]) if st.params is not None and st.params.logprobs is not None else None
        top = list(out.top_logprobs[:n]) if logprobs is not None and out.top_logprobs else None
        if reason is not None:  # free the blocks before the client can see the end of its request
            self._finish(st, reason, deliver=False)
        output = RequestOutput(
            request_id=req.request_id,
            token_ids=new_ids,
            logprobs=logprobs,
            top_logprobs=top,
            finish_reason=reason,
            prompt_logprobs=st.take_prompt_logprobs(),
            usage=st.usage(),
        )
        self._outputs.append((st, output))
        return reason is not None
