"""The scheduler thread: the Engine's only caller.

Each iteration takes new requests and aborts from the HTTP side (a lock-guarded inbox), expires timeouts, then
runs one step: the policy schedules a batch (inferd/engine/scheduler.py), the engine runs it, the policy
postprocesses the token-level outputs, the output processor (inferd/engine/output.py) turns them into text and
stop strings, and the outputs go to each request's mailbox through its event loop's LoopWaker (one wake-up per
loop per step). The loop keeps request id -> (waker, mailbox); the scheduler never sees where outputs go.

Everything except `submit`/`abort`/`stop` (and `RequestHandle`) runs in the scheduler thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Protocol
from collections.abc import Callable, Sequence

from inferd.engine.loop_waker import LoopWaker
from inferd.engine.mailbox import Mailbox, RequestHandle
from inferd.engine.output import OutputProcessor
from inferd.engine.request import FinishReason, Request, RequestOutput, RequestState
from inferd.engine.scheduler import ScheduledBatch, Scheduler, StepStats
from inferd.engine.types import SeqInput, SeqOutput

log = logging.getLogger("inferd.scheduler")


class QueueFull(Exception):
    """Too many requests waiting; the HTTP side answers 503 with Retry-After."""


class SchedulerStopped(Exception):
    """The scheduler is shutting down or has died; no new requests."""


class Observer(Protocol):
    def on_step(self, stats: StepStats) -> None: ...
    def on_finished(self, states: Sequence[RequestState]) -> None: ...


class SideQueue(Protocol):
    def has_work(self) -> bool: ...
    def step(self) -> int: ...


class StepRunner(Protocol):
    """The engine as the loop uses it (Engine, CudaEngine, or a test's fake)."""

    weight_bytes: int
    kv_bytes_per_token: int

    def step(self, seqs: list[SeqInput]) -> list[SeqOutput]: ...


def run_batch(
    engine: StepRunner, batch: ScheduledBatch, before_step: Callable[[list[RequestState]], None] | None = None
) -> list[SeqOutput | BaseException]:
    """One engine step over the batch. If it raises, each sequence is rerun alone (rewriting the same K/V
    positions is harmless), so one bad sequence fails alone, not its neighbours."""

    def run(indices: list[int]) -> list[SeqOutput]:
        if before_step is not None:
            before_step([batch.seqs[i].state for i in indices])
        outputs = engine.step([batch.inputs[i] for i in indices])
        if len(outputs) != len(indices):
            raise RuntimeError(f"engine returned {len(outputs)} outputs for {len(indices)} sequences")
        return outputs

    try:
        return list(run(list(range(len(batch)))))
    except Exception as e:
        if len(batch) == 1:
            return [e]
        log.warning("engine step failed (%r); retrying the %d sequences one by one", e, len(batch))
    results: list[SeqOutput | BaseException] = []
    for i in range(len(batch)):
        try:
            results.append(run([i])[0])
        except Exception as e1:
            results.append(e1)
    return results


class EngineLoop:
    def __init__(
        self,
        engine: StepRunner,
        scheduler: Scheduler,
        *,
        tokenizer=None,
        max_waiting: int = 256,
        observer: Observer | None = None,
        watchdog: Callable[[], None] | None = None,
        idle_wait_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.engine = engine
        self.scheduler = scheduler
        self.output = OutputProcessor(tokenizer, scheduler)  # None: token ids only, no text
        self.max_waiting = max_waiting
        self.observer = observer
        self.watchdog = watchdog
        self.idle_wait_s = idle_wait_s
        self.clock = clock
        # Test hook (fault injection): called with the states of a batch before Engine.step; may raise.
        self.before_step: Callable[[list[RequestState]], None] | None = None
        self.dead: BaseException | None = None  # set if the loop itself crashed
        self.num_steps = 0
        # Prefill-only work of other models served beside this one (EmbeddingQueue): one step of each between
        # this engine's steps, on this thread, so the models take turns on the cores instead of fighting for them.
        self.side_queues: list[SideQueue] = []

        self._lock = threading.Lock()
        self._inbox: list[RequestState] = []
        self._aborts: list[str] = []
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._wakers: dict[asyncio.AbstractEventLoop, LoopWaker] = {}
        self._deliveries: dict[str, tuple[LoopWaker, Mailbox]] = {}  # request id -> where its outputs go

    # ---- the HTTP side (event loop threads) ------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self._inbox) + len(self.scheduler.waiting)

    @property
    def event_loops(self) -> list[asyncio.AbstractEventLoop]:
        """The event loops this engine loop delivers to."""
        return list(self._wakers)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="inferd-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort everything still in flight and join the thread."""
        with self._lock:
            self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():  # nothing pushes any more
            for waker in list(self._wakers.values()):
                waker.close()

    def submit(self, request: Request) -> RequestHandle:
        """Queue a request; must be called from the asyncio loop that will consume its outputs."""
        if self.dead is not None or self._stop:
            raise SchedulerStopped("the scheduler is not running")
        loop = asyncio.get_running_loop()
        waker = self._wakers.get(loop)
        if waker is None or waker.closed:
            waker = self._wakers[loop] = LoopWaker(loop)
        state = RequestState(request=request, arrival_time=self.clock())
        box = Mailbox(loop)
        with self._lock:
            if self.num_waiting >= self.max_waiting:
                raise QueueFull(f"{self.num_waiting} requests are already waiting")
            self._deliveries[request.request_id] = (waker, box)
            self._inbox.append(state)
        self._wake.set()
        return RequestHandle(state, box, self.abort)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)
        self._wake.set()

    def wake(self) -> None:
        """A side queue has new work."""
        self._wake.set()

    # ---- the scheduler thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                if self.watchdog is not None:
                    self.watchdog()
                if self.admit_pending():
                    self._finished(
                        self.scheduler.abort_all(FinishReason.ABORT, "the server is shutting down", status=503)
                    )
                    return
                self._finished(self.scheduler.expire_timeouts())
                side = [q for q in self.side_queues if q.has_work()]
                if not self.scheduler.has_work and not side:
                    self._wake.wait(self.idle_wait_s)
                    self._wake.clear()
                    continue
                for q in side:
                    q.step()
                if self.scheduler.has_work:
                    self.step()
        except BaseException as e:  # a bug in the loop itself: fail everyone rather than hang them
            log.exception("scheduler loop crashed")
            self.dead = e
            with self._lock:
                new, self._inbox = self._inbox, []
            message = f"internal scheduler error: {e!r}"
            try:
                for st in new:
                    self.scheduler.add(st)
                self.scheduler.abort_all(FinishReason.ERROR, message, status=500)
            except BaseException:  # the policy itself is what broke: tell each request directly
                log.exception("could not fail the requests through the scheduler")
                for st in list(self.scheduler.requests.values()) + new:
                    delivery = self._deliveries.pop(st.request.request_id, None)
                    if delivery is not None and not st.finished:
                        waker, box = delivery
                        out = RequestOutput(
                            st.request.request_id,
                            finish_reason=FinishReason.ERROR,
                            error_status=500,
                            error_message=message,
                        )
                        waker.push([(box, out)])
                return
            self._flush()

    def admit_pending(self) -> bool:
        """Hand the requests and aborts that arrived since the last call to the policy; True once stop() was
        called."""
        with self._lock:
            new, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
            stop = self._stop
        for st in new:
            self.scheduler.add(st)
        aborted = [st for st in map(self.scheduler.abort, aborts) if st is not None]
        self._finished(aborted)
        return stop

    def step(self) -> StepStats:
        """schedule -> run -> postprocess, then deliver."""
        # The observer of the step's start: one attached meanwhile (after the start-up warm-up) must not
        # be told about a step it did not see begin.
        observer = self.observer
        batch = self.scheduler.schedule()
        stats = StepStats()
        if batch:
            t0 = time.perf_counter()
            outputs = run_batch(self.engine, batch, self.before_step)
            duration = time.perf_counter() - t0
            stats = self.scheduler.postprocess(batch, outputs)
            self.scheduler.observe(batch, duration)
            stats.duration_s = duration
            stats.bytes_read = self.engine.weight_bytes + self.engine.kv_bytes_per_token * batch.num_positions_read
        self.num_steps += 1
        self._flush(stats)
        if observer is not None:
            observer.on_step(stats)
            if stats.finished:
                observer.on_finished(stats.finished)
        return stats

    def _finished(self, states: list[RequestState]) -> None:
        """Deliver and report requests finished outside a step (aborts, timeouts, shutdown)."""
        self._flush()
        if states and self.observer is not None:
            self.observer.on_finished(states)

    def _flush(self, stats: StepStats | None = None) -> None:
        """Turn the policy's outputs into text and hand them to their event loops: one wake-up per loop, not one
        per output. Sequences that a stop string finished join the step's finished ones."""
        outputs = self.output.process(self.scheduler.take_outputs())
        by_waker: dict[LoopWaker, list[tuple[Mailbox, RequestOutput]]] = {}
        for st, out in outputs:
            rid = st.request.request_id
            delivery = self._deliveries.pop(rid, None) if out.finish_reason else self._deliveries.get(rid)
            if out.finish_reason is not None and stats is not None and st not in stats.finished:
                stats.finished.append(st)
            if delivery is not None:
                waker, box = delivery
                by_waker.setdefault(waker, []).append((box, out))
        for waker, items in by_waker.items():
            if waker.loop.is_closed():  # nobody is listening any more; this thread is its only pusher
                waker.close()
                if self._wakers.get(waker.loop) is waker:
                    del self._wakers[waker.loop]
            else:
                waker.push(items)
