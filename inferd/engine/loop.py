"""The scheduler thread: the Engine's only caller.

Each iteration takes new requests and aborts from the HTTP side (a lock-guarded inbox), expires timeouts, then
runs one step: the policy schedules a batch (inferd/engine/scheduler.py), the engine runs it, the policy
postprocesses the outputs, and the outputs go to each request's event loop through that loop's LoopWaker (one
wake-up per loop per step). Detokenization and stop strings run here, in the policy's postprocess.

Everything except `submit`/`abort`/`stop` (and `RequestHandle`) runs in the scheduler thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Protocol
from collections.abc import Callable, Sequence

from inferd.engine.loop_waker import LoopWaker
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
        max_waiting: int = 256,
        observer: Observer | None = None,
        watchdog: Callable[[], None] | None = None,
        idle_wait_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.engine = engine
        self.scheduler = scheduler
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
        state = RequestState(request=request, arrival_time=self.clock(), waker=waker, queue=Mailbox(loop))
        with self._lock:
            if self.num_waiting >= self.max_waiting:
                raise QueueFull(f"{self.num_waiting} requests are already waiting")
            self._inbox.append(state)
        self._wake.set()
        return RequestHandle(self, state)

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
                    if st.waker is not None and st.queue is not None and not st.finished:
                        st.waker.push(
                            [
                                (
                                    st.queue,
                                    RequestOutput(
                                        st.request.request_id,
                                        finish_reason=FinishReason.ERROR,
                                        error_status=500,
                                        error_message=message,
                                    ),
                                )
                            ]
                        )
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
            stats.duration_s = duration
            stats.bytes_read = self.engine.weight_bytes + self.engine.kv_bytes_per_token * batch.num_positions_read
        self.num_steps += 1
        self._flush()
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

    def _flush(self) -> None:
        """Hand the policy's outputs to their event loops: one wake-up per loop, not one per output."""
        by_waker: dict[LoopWaker, list[tuple[Mailbox, RequestOutput]]] = {}
        for st, out in self.scheduler.take_outputs():
            if st.waker is not None and st.queue is not None:
                by_waker.setdefault(st.waker, []).append((st.queue, out))
        for waker, items in by_waker.items():
            if waker.loop.is_closed():  # nobody is listening any more; this thread is its only pusher
                waker.close()
                if self._wakers.get(waker.loop) is waker:
                    del self._wakers[waker.loop]
            else:
                waker.push(items)


class Mailbox:
    """One request's outputs on its event loop: the LoopWaker puts them, the RequestHandle takes them, all that
    arrived so far at once. Lighter than an asyncio.Queue (one waiter, no getter/putter queues), and the reader's
    keep-alive deadline is one timer per silent interval instead of an `asyncio.timeout` around every token."""

    __slots__ = ("_loop", "_items", "_waiter", "_silence", "_last_event", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._items: deque[RequestOutput] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._silence: float | None = None  # of the wait in progress
        self._last_event = loop.time()
        self._timer: asyncio.TimerHandle | None = None

    def put_nowait(self, item: RequestOutput) -> None:
        """On the loop (LoopWaker._deliver)."""
        self._items.append(item)
        self._last_event = self._loop.time()
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def take_all(self) -> list[RequestOutput]:
        items = list(self._items)
        self._items.clear()
        return items

    async def wait(self, silence: float | None) -> bool:
        """Until something is in the box (True), or `silence` seconds passed since the last put or the last
        silence (False)."""
        if self._items:
            return True
        waiter = self._waiter = self._loop.create_future()
        self._silence = silence
        if silence is not None and self._timer is None:
            self._timer = self._loop.call_at(self._last_event + silence, self._check_silence)
        try:
            await waiter
        finally:
            if self._waiter is waiter:
                self._waiter = None
        return bool(self._items)

    def _check_silence(self) -> None:
        # Puts move the deadline without touching the timer; it fires at the first deadline, and re-arms at the
        # current one if anything came meanwhile.
        self._timer = None
        waiter, silence = self._waiter, self._silence
        if waiter is None or waiter.done() or silence is None:
            return
        due = self._last_event + silence
        now = self._loop.time()
        if now >= due - 1e-3:
            self._last_event = now  # the next silence is counted from this one
            self._waiter = None
            waiter.set_result(None)
        else:
            self._timer = self._loop.call_at(due, self._check_silence)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class RequestHandle:
    """The HTTP side's view of one request: its outputs (an async iterator, `get()` with a timeout, or
    `get_all()`: everything that arrived together), its timings, and abort(). The request's state itself
    belongs to the scheduler thread."""

    def __init__(self, loop: EngineLoop, state: RequestState):
        assert state.queue is not None
        self._loop = loop
        self._state = state
        self._box: Mailbox = state.queue
        self.request_id = state.request.request_id
        self.done = False

    def __aiter__(self) -> RequestHandle:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.done:
            raise StopAsyncIteration
        out = await self.get()
        assert out is not None
        return out

    async def get(self, timeout: float | None = None) -> RequestOutput | None:
        """The next output; None if `timeout` seconds pass without one (counted from the last output)."""
        box = self._box
        if not box._items and not await box.wait(timeout):
            return None
        out = box._items.popleft()
        if out.finish_reason is not None:
            self._finished()
        return out

    async def get_all(self, timeout: float | None = None) -> list[RequestOutput]:
        """Every output that has arrived, at least one; [] if `timeout` seconds pass without one (counted from
        the last output). Waits on the mailbox directly: no task per token."""
        box = self._box
        if not box._items and not await box.wait(timeout):
            return []
        outs = box.take_all()
        if outs[-1].finish_reason is not None:  # nothing follows a finished output
            self._finished()
        return outs

    def _finished(self) -> None:
        self.done = True
        self._box.close()

    @property
    def request(self) -> Request:
        return self._state.request

    @property
    def arrival_time(self) -> float:
        return self._state.arrival_time

    @property
    def first_token_time(self) -> float | None:
        return self._state.first_token_time

    @property
    def finish_time(self) -> float | None:
        return self._state.finish_time

    def abort(self) -> None:
        self._box.close()
        if not self.done:
            self.done = True
            self._loop.abort(self.request_id)
