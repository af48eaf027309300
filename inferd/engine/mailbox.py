"""Delivery to the HTTP side: each request's Mailbox on its event loop, and the RequestHandle that reads it.

The engine loop keeps `request_id -> (LoopWaker, Mailbox)` and puts outputs in; the handle takes them out and
asks for an abort through the function it was given, so nothing here knows the loop or the scheduler."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from inferd.engine.request import Request, RequestOutput, RequestState


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

    def take_one(self) -> RequestOutput:
        return self._items.popleft()

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

    def __init__(self, state: RequestState, box: Mailbox, abort: Callable[[str], None]):
        self._state = state
        self._box = box
        self._abort = abort
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
        if box.empty() and not await box.wait(timeout):
            return None
        out = box.take_one()
        if out.finish_reason is not None:
            self._finished()
        return out

    async def get_all(self, timeout: float | None = None) -> list[RequestOutput]:
        """Every output that has arrived, at least one; [] if `timeout` seconds pass without one (counted from
        the last output). Waits on the mailbox directly: no task per token."""
        box = self._box
        if box.empty() and not await box.wait(timeout):
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
            self._abort(self.request_id)
