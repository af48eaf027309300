"""The scheduler thread: the Engine's only caller.

Each loop iteration takes new requests and aborts from the HTTP side, then runs one `step()`:
schedule (pick decode tokens and prefill chunks under a token budget) -> run (one `Engine.step`) ->
postprocess (append tokens, detokenize, check stops, deliver to the requests' asyncio queues).

Everything here except `submit`/`abort`/`stop` runs in the scheduler thread; the HTTP side talks to it only
through a lock-guarded inbox and results come back through each loop's LoopWaker.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol, Sequence

import numpy as np

from inferd.engine.engine import SeqInput
from inferd.engine.kv_cache import KVCacheManager
from inferd.engine.request import (FinishReason, Request, RequestOutput, RequestState, TextState,
                                   log_softmax_top)
from inferd.engine.loop_waker import LoopWaker
from inferd.engine.speculative import AcceptanceGate, PromptLookup, accept

log = logging.getLogger("inferd.scheduler")


class QueueFull(Exception):
    """Too many requests waiting; the HTTP side answers 503 with Retry-After."""


class SchedulerStopped(Exception):
    """The scheduler is shutting down or has died; no new requests."""


@dataclass
class StepStats:
    """What one step did; handed to the observer (metrics) from the scheduler thread."""
    duration_s: float = 0.0
    num_seqs: int = 0
    num_prefill_tokens: int = 0      # prompt (or recomputed) positions run this step
    num_decode_tokens: int = 0       # tokens generated this step (accepted drafts included)
    bytes_read: int = 0              # weights once + K/V of every attended position
    prompt_tokens_done: int = 0      # prompt lengths of requests whose prefill finished this step
    num_draft_tokens: int = 0        # speculative tokens proposed and verified this step
    num_accepted_tokens: int = 0     # of which the model agreed with
    ttfts: list[float] = field(default_factory=list)
    itls: list[float] = field(default_factory=list)
    finished: list[RequestState] = field(default_factory=list)


class Observer(Protocol):
    def on_step(self, stats: StepStats) -> None: ...
    def on_finished(self, states: Sequence[RequestState]) -> None: ...


class EngineLike(Protocol):
    block_size: int
    num_kv_blocks: int
    max_batch_tokens: int
    max_seqs: int
    weight_bytes: int
    kv_bytes_per_token: int

    def step(self, seqs: list) -> list: ...


@dataclass
class _Scheduled:
    state: RequestState
    num_new: int        # positions run this step, starting at state.num_computed (1 + len(draft) for a decode)
    num_sampled: int    # 0 or 1, or 1 + len(draft)
    draft: list[int] = field(default_factory=list)   # speculative tokens verified after the decode token


class Scheduler:
    def __init__(self, engine: EngineLike, *, max_running: int | None = None, max_waiting: int = 256,
                 max_model_len: int, enable_prefix_caching: bool = True, tokenizer=None,
                 observer: Observer | None = None, watchdog: Callable[[], None] | None = None,
                 idle_wait_s: float = 0.5, speculative: bool = False):
        self.engine = engine
        self.block_size = engine.block_size
        self.kv = KVCacheManager(engine.num_kv_blocks, engine.block_size, enable_prefix_caching)
        self.max_running = min(max_running or engine.max_seqs, engine.max_seqs)
        self.max_waiting = max_waiting
        self.max_batch_tokens = engine.max_batch_tokens
        # A sequence must fit in the cache alone, otherwise preemption could never make room for it.
        self.max_model_len = min(max_model_len, engine.num_kv_blocks * engine.block_size)
        self.tokenizer = tokenizer
        self.observer = observer
        self.watchdog = watchdog
        self.idle_wait_s = idle_wait_s
        # prompt-lookup speculative decoding for requests that do not say (Request.speculative is None)
        self.speculative = speculative
        # logits rows (sampled rows plus every row of an echo-logprobs chunk) are capped separately
        self.max_logits_rows = getattr(engine, "max_logits_rows", engine.max_batch_tokens)
        # Test hook (fault injection): called with the states of a batch before Engine.step; may raise.
        self.before_step: Callable[[list[RequestState]], None] | None = None

        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self._states: dict[str, RequestState] = {}
        self._outbox: dict[LoopWaker, list] = {}    # outputs not yet handed to their loops
        self._wakers: dict[asyncio.AbstractEventLoop, LoopWaker] = {}

        self._lock = threading.Lock()
        self._inbox: list[RequestState] = []
        self._aborts: list[str] = []
        self._num_unadmitted = 0     # inbox + waiting, read by submit() for the queue limit
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.dead: BaseException | None = None   # set if the loop itself crashed
        self.num_steps = 0
        self.num_preemptions = 0

    # ---- HTTP side (event loop thread) ----------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_loop, name="inferd-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort everything still in flight and join the thread."""
        with self._lock:
            self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():   # nothing pushes any more
            for waker in list(self._wakers.values()):
                waker.close()

    def submit(self, request: Request) -> "RequestHandle":
        """Queue a request; must be called from the asyncio loop that will consume its outputs."""
        if self.dead is not None or self._stop:
            raise SchedulerStopped("the scheduler is not running")
        loop = asyncio.get_running_loop()
        waker = self._wakers.get(loop)
        if waker is None or waker.closed:
            waker = self._wakers[loop] = LoopWaker(loop)
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        state = RequestState(request=request, waker=waker, queue=queue, arrival_time=time.monotonic())
        with self._lock:
            if self._num_unadmitted >= self.max_waiting:
                raise QueueFull(f"{self._num_unadmitted} requests are already waiting")
            self._num_unadmitted += 1
            self._inbox.append(state)
        self._wake.set()
        return RequestHandle(self, state)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)
        self._wake.set()

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return self._num_unadmitted

    # ---- the loop --------------------------------------------------------------------------------------

    def _run_loop(self) -> None:
        try:
            while True:
                if self.watchdog is not None:
                    self.watchdog()
                stop = self._drain_inbox()
                if stop:
                    self._abort_all(FinishReason.ABORT, "the server is shutting down")
                    return
                self._expire_timeouts()
                if not self.running and not self.waiting:
                    self._wake.wait(self.idle_wait_s)
                    self._wake.clear()
                    continue
                self.step()
        except BaseException as e:  # a bug in the loop itself: fail everyone rather than hang them
            log.exception("scheduler loop crashed")
            self.dead = e
            self._abort_all(FinishReason.ERROR, f"internal scheduler error: {e!r}", status=500)

    def step(self) -> StepStats:
        # The observer of the step's start: one attached meanwhile (after the start-up warm-up) must not
        # be told about a step it did not see begin.
        observer = self.observer
        batch = self._schedule()
        stats = StepStats(num_seqs=len(batch))
        if batch:
            outputs = self._run(batch, stats)
            self._postprocess(batch, outputs, stats)
        self.num_steps += 1
        self._flush()
        if observer is not None:
            observer.on_step(stats)
            if stats.finished:
                observer.on_finished(stats.finished)
        return stats

    # ---- inbox, aborts, timeouts ---------------------------------------------------------------------

    def _drain_inbox(self) -> bool:
        with self._lock:
            new, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
            stop = self._stop
        for st in new:
            self._states[st.request.request_id] = st
            self._admit_new(st)
        finished = []
        for rid in aborts:
            st = self._states.get(rid)
            if st is not None:
                self._finish(st, FinishReason.ABORT)
                finished.append(st)
        self._flush()
        if finished and self.observer is not None:
            self.observer.on_finished(finished)
        return stop

    def _admit_new(self, st: RequestState) -> None:
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
        st.warm_target = len(req.prompt_ids) // self.block_size * self.block_size
        if not req.warm and self.tokenizer is not None and req.detokenize:
            st.text = TextState(self.tokenizer, req.prompt_ids, req.stop)
        error = self._check_fits(st)
        if error:
            self._dec_unadmitted()   # counted by submit(), never reaches the waiting queue
            self._fail(st, error, status=400)
            return
        self.waiting.append(st)

    def _check_fits(self, st: RequestState) -> str | None:
        req = st.request
        if not req.prompt_ids:
            return "the prompt is empty"
        total = len(req.prompt_ids) + (0 if req.warm else req.max_tokens)
        if total > self.max_model_len:
            return (f"this model's maximum context length is {self.max_model_len} tokens; the request "
                    f"needs {len(req.prompt_ids)} prompt tokens + {req.max_tokens} max tokens = {total}")
        return None

    def _expire_timeouts(self) -> None:
        now = time.monotonic()
        finished = []
        for st in list(self.running) + list(self.waiting):
            t = st.request.timeout_s
            if t is not None and now - st.arrival_time > t:
                self._finish(st, FinishReason.ERROR, f"request timed out after {t:g} s", status=504)
                finished.append(st)
        self._flush()
        if finished and self.observer is not None:
            self.observer.on_finished(finished)

    def _abort_all(self, reason: FinishReason, message: str, status: int = 503) -> None:
        with self._lock:
            new, self._inbox = self._inbox, []
        for st in new:
            self._states[st.request.request_id] = st
        for st in list(self._states.values()):
            self._finish(st, reason, message, status=status)
        self._flush()

    # ---- schedule ---------------------------------------------------------------------------------------

    def _schedule(self) -> list[_Scheduled]:
        budget = self.max_batch_tokens
        rows_left = self.max_logits_rows
        scheduled: list[_Scheduled] = []
        in_batch: set[int] = set()
        preempted = False

        # Running sequences first, decodes before prefill chunks: a long prompt being chunked in must not
        # stall the token stream of everyone already generating.
        for want_decode in (True, False):
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
                    s = _Scheduled(st, n + len(draft), 1 + len(draft), draft)
                else:
                    s = _Scheduled(st, n, self._num_sampled(st, n))
                scheduled.append(s)
                in_batch.add(id(st))
                budget -= s.num_new
                rows_left -= self._rows(s)

        # Then waiting ones, strictly in arrival order, only if nothing had to be preempted (no room).
        while (self.waiting and budget > 0 and rows_left > 0 and not preempted
               and len(self.running) < self.max_running):
            st = self.waiting[0]
            if not self.kv.has_seq(st.key):
                self._match_prefix(st)
            remaining = st.target_len - st.num_computed
            if remaining <= 0:   # a cache warm whose blocks were all cached already
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
            self._dec_unadmitted()
            self.running.append(st)
            if st.first_scheduled_time is None:
                st.first_scheduled_time = time.monotonic()
            s = _Scheduled(st, n, self._num_sampled(st, n))
            scheduled.append(s)
            budget -= n
            rows_left -= self._rows(s)
        return scheduled

    def _draft(self, st: RequestState, budget: int, rows_left: int) -> list[int]:
        """Prompt-lookup draft tokens to verify after `st`'s decode token this step (maybe none).

        The drafts are cut to what can still be used (max_tokens, the context), to the step's token budget and
        logits rows, and to the KV blocks the sequence holds or can take while one free block per running
        sequence stays for plain decodes: a draft is a bet, never worth preempting anyone for."""
        if self._wants_logits(st):
            return []
        req = st.request
        room = min(req.max_tokens - len(st.output_ids), self.max_model_len - len(st.token_ids),
                   budget, rows_left) - 1
        spare = max(0, self.kv.num_free_blocks - len(self.running))
        capacity = (len(self.kv.block_table(st.key)) + spare) * self.block_size
        room = min(room, capacity - (st.num_computed + 1))
        if room <= 0:
            return []
        if st.lookup is None:
            st.lookup = PromptLookup()
            st.gate = AcceptanceGate()
        st.lookup.extend(st.token_ids[len(st.lookup.tokens):])   # generated since the last look
        if not st.gate.allow():
            return []
        return st.lookup.propose()[:room]

    def _wants_logits(self, st: RequestState) -> bool:
        return st.request.prompt_logprobs is not None and not st.prompt_logprobs_done

    def _chunk(self, st: RequestState, n: int, rows_left: int) -> int:
        # an echo-logprobs chunk returns a logits row per token, and the engine holds only so many rows
        return min(n, rows_left) if self._wants_logits(st) else n

    def _rows(self, s: _Scheduled) -> int:
        return s.num_new if self._wants_logits(s.state) else s.num_sampled

    def _num_sampled(self, st: RequestState, n: int) -> int:
        reaches_end = st.num_computed + n == len(st.token_ids)
        return 1 if reaches_end and not st.request.warm and st.request.max_tokens > 0 else 0

    def _match_prefix(self, st: RequestState) -> None:
        req = st.request
        if req.warm:
            cap = st.target_len
        elif req.prompt_logprobs is not None and not st.prompt_logprobs_done:
            cap = 0   # prompt logprobs need the logits of every prompt position: nothing may be skipped
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
                if len(self.running) == 1 and not in_batch:   # alone and still no room: never will be
                    self._fail(st, "the request needs more KV cache than the server has", status=400)
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
        if not st.prompt_logprobs_done:
            st.prompt_logprobs.clear()   # collected again, from position 1, by the recompute
        st.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(st)
        with self._lock:
            self._num_unadmitted += 1

    def _dec_unadmitted(self) -> None:
        with self._lock:
            self._num_unadmitted -= 1

    # ---- run --------------------------------------------------------------------------------------------

    def _seq_input(self, s: _Scheduled):
        st = s.state
        start = st.num_computed
        token_ids = st.token_ids[start:start + s.num_new]
        history = st.token_ids
        if s.draft:   # the decode token, then the drafts; the history as it would be if all were accepted
            token_ids = token_ids + s.draft
            history = st.token_ids + s.draft
        return SeqInput(
            token_ids=token_ids,
            start_pos=start,
            block_table=list(self.kv.block_table(st.key)),
            num_sampled=s.num_sampled,
            params=st.params,
            history=history,
            num_prompt=st.num_prompt,
            want_logits=self._wants_logits(st),
        )

    def _run(self, batch: list[_Scheduled], stats: StepStats) -> list:
        t0 = time.perf_counter()
        try:
            outputs = self._engine_step(batch)
        except Exception as e:
            if len(batch) == 1:
                outputs = [e]
            else:
                # One bad sequence must not fail its neighbours: rerun each alone (rewriting the same K/V
                # positions is harmless) and fail only the ones that raise again.
                log.warning("engine step failed (%r); retrying the %d sequences one by one", e, len(batch))
                outputs = []
                for s in batch:
                    try:
                        outputs.append(self._engine_step([s])[0])
                    except Exception as e1:
                        outputs.append(e1)
        stats.duration_s = time.perf_counter() - t0
        stats.bytes_read = self.engine.weight_bytes + self.engine.kv_bytes_per_token * sum(
            s.state.num_computed + s.num_new for s in batch)
        return outputs

    def _engine_step(self, batch: list[_Scheduled]) -> list:
        if self.before_step is not None:
            self.before_step([s.state for s in batch])
        outputs = self.engine.step([self._seq_input(s) for s in batch])
        if len(outputs) != len(batch):
            raise RuntimeError(f"engine returned {len(outputs)} outputs for {len(batch)} sequences")
        return outputs

    # ---- postprocess --------------------------------------------------------------------------------------

    def _postprocess(self, batch: list[_Scheduled], outputs: list, stats: StepStats) -> None:
        now = time.monotonic()
        for s, out in zip(batch, outputs):
            st = s.state
            if st.finished:   # failed by the "alone and no room" rule while scheduling
                continue
            if isinstance(out, BaseException):
                log.error("engine failed request %s: %r", st.request.request_id, out)
                self._finish(st, FinishReason.ERROR, f"internal engine error: {out}", status=500)
                stats.finished.append(st)
                continue
            is_decode = s.num_new == 1 + len(s.draft) and st.prompt_done
            if st.request.prompt_logprobs is not None and not st.prompt_logprobs_done:
                self._collect_prompt_logprobs(st, s, out.logits)
            tokens = out.tokens
            if s.draft:
                # Keep the drafts up to the first disagreement, plus the model's own token there. The K/V of
                # the decode token and of the accepted drafts is valid; what the rejected drafts wrote lies at
                # positions >= num_computed, never read, overwritten by the next step.
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
                if not is_decode:
                    stats.num_prefill_tokens += s.num_new
                self.kv.cache_blocks(st.key, st.token_ids, st.num_computed)

            if st.request.warm:
                if st.num_computed >= st.target_len:
                    self._finish(st, FinishReason.STOP)
                    stats.finished.append(st)
                continue
            if st.num_computed >= st.num_prompt and not st.prompt_done:
                st.prompt_done = True
                st.prompt_logprobs_done = True
                stats.prompt_tokens_done += st.num_prompt
            if s.num_sampled == 0:
                if st.request.max_tokens == 0 and st.num_computed >= len(st.token_ids):
                    self._finish(st, FinishReason.LENGTH)   # scoring a prompt (echo) without generating
                    stats.finished.append(st)
                continue
            if st.first_token_time is None:
                st.first_token_time = now
                stats.ttfts.append(now - st.arrival_time)
            else:
                stats.itls.append(now - st.last_token_time)
            st.last_token_time = now
            num_before = len(st.output_ids)
            if self._append_tokens(st, out, tokens):
                stats.finished.append(st)
            stats.num_decode_tokens += len(st.output_ids) - num_before

    def _append_tokens(self, st: RequestState, out, tokens: Sequence[int]) -> bool:
        """Add sampled tokens in order, checking every stop condition after each (a stop discards the rest),
        deliver; True if the request finished."""
        req = st.request
        new_ids: list[int] = []
        reason: FinishReason | None = None
        text = ""
        for tok in tokens:
            st.token_ids.append(tok)
            st.output_ids.append(tok)
            new_ids.append(tok)
            if tok in req.stop_token_ids:
                reason = FinishReason.STOP
            elif st.text is not None:
                delta, hit_stop = st.text.add(tok)
                text += delta
                if hit_stop:
                    reason = FinishReason.STOP
            if reason is None and (len(st.output_ids) >= req.max_tokens
                                   or len(st.token_ids) >= self.max_model_len):
                reason = FinishReason.LENGTH
            if reason is not None:
                break
        n = len(new_ids)
        logprobs = list(out.logprobs[:n]) if st.params is not None and st.params.logprobs is not None else None
        top = list(out.top_logprobs[:n]) if logprobs is not None and out.top_logprobs else None
        if reason is not None and reason != FinishReason.STOP and st.text is not None:
            text += st.text.flush()   # release text held back for a stop string that never came
        if reason is not None:   # free the blocks before the client can see the end of its request
            self._finish(st, reason, deliver=False)
        self._deliver(st, RequestOutput(
            request_id=req.request_id, token_ids=new_ids, text=text, logprobs=logprobs, top_logprobs=top,
            finish_reason=reason, prompt_logprobs=st.take_prompt_logprobs(), usage=st.usage()))
        return reason is not None

    def _collect_prompt_logprobs(self, st: RequestState, s: _Scheduled, logits: np.ndarray | None) -> None:
        if logits is None:
            raise RuntimeError("engine returned no logits for a want_logits sequence")
        k = st.request.prompt_logprobs or 0
        start = st.num_computed
        # row i predicts position start + i + 1; only rows that predict a prompt token matter here
        rows = min(s.num_new, st.num_prompt - 1 - start)
        if rows > 0:
            targets = st.token_ids[start + 1:start + 1 + rows]
            st.prompt_logprobs.extend(log_softmax_top(logits[:rows], targets, k))

    # ---- finishing ---------------------------------------------------------------------------------------

    def _fail(self, st: RequestState, message: str, status: int) -> None:
        self._finish(st, FinishReason.ERROR, message, status=status)

    def _finish(self, st: RequestState, reason: FinishReason, message: str | None = None, *,
                status: int = 500, deliver: bool = True) -> None:
        if st.finished:
            return
        st.finished = True
        st.finish_reason = reason
        st.finish_time = time.monotonic()
        if st in self.running:
            self.running.remove(st)
        elif st in self.waiting:
            self.waiting.remove(st)
            self._dec_unadmitted()
        self.kv.free(st.key)
        self._states.pop(st.request.request_id, None)
        if deliver:
            text = st.text.flush() if st.text is not None and reason == FinishReason.LENGTH else ""
            self._deliver(st, RequestOutput(
                request_id=st.request.request_id, text=text, finish_reason=reason,
                error_message=message, error_status=status if reason == FinishReason.ERROR else None,
                prompt_logprobs=st.take_prompt_logprobs(), usage=st.usage()))

    def _deliver(self, st: RequestState, out: RequestOutput) -> None:
        self._outbox.setdefault(st.waker, []).append((st.queue, out))

    def _flush(self) -> None:
        """Hand the outputs gathered since the last flush to their event loops: one wake-up per loop, not one
        per output."""
        outbox, self._outbox = self._outbox, {}
        for waker, items in outbox.items():
            if waker.loop.is_closed():        # nobody is listening any more; this thread is its only pusher
                waker.close()
                if self._wakers.get(waker.loop) is waker:
                    del self._wakers[waker.loop]
            else:
                waker.push(items)


class RequestHandle:
    """The HTTP side's view of one request: an async iterator of outputs, and abort()."""

    def __init__(self, scheduler: Scheduler, state: RequestState):
        self._scheduler = scheduler
        self.state = state
        self.request_id = state.request.request_id
        self.done = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        if self.done:
            raise StopAsyncIteration
        out = await self.state.queue.get()
        if out.finish_reason is not None:
            self.done = True
        return out

    def abort(self) -> None:
        if not self.done:
            self.done = True
            self._scheduler.abort(self.request_id)
