"""Hands the scheduler thread's outputs to an asyncio event loop.

`loop.call_soon_threadsafe` wakes the loop with a socket send, and the send releases the GIL. The loop thread, woken
by that very byte, then usually takes the GIL first, and the scheduler thread waits until the loop's Python work for
the step is done (about 150 us per decode step with 8 streams), while neither core computes. Here the byte is written
with the GIL held, so the loop gets the GIL when the scheduler next releases it: in the engine step, where the
loop's work overlaps the kernels. Alternating steps in one process at c = 8: each scheduler iteration 2 to 3%
shorter.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from typing import Any, Protocol

from inferd._waker import write_byte_holding_gil


class Receiver(Protocol):
    """Where the loop puts an output: an asyncio.Queue, or a request's Mailbox (inferd/engine/loop.py)."""

    def put_nowait(self, item: Any, /) -> None: ...


class LoopWaker:
    """One per event loop, made on that loop's thread. push() from the scheduler thread; close() from the
    scheduler thread once it pushes no more (or when the loop is closed)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        # (receiver, output) pairs; deque appends and pops are thread-safe
        self._items: deque[tuple[Receiver, object]] = deque()
        self._signalled = False  # a byte is on its way: later pushes need not write another
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self.closed = False
        loop.add_reader(self._rfd, self._deliver)

    def push(self, items: list) -> None:
        """Queue (receiver, output) pairs for the loop to put, and wake it (scheduler thread)."""
        if self.closed:
            return
        self._items.extend(items)
        if not self._signalled:
            self._signalled = True
            # -1 means EAGAIN: the pipe is full of bytes the loop has not read yet, so it will wake anyway
            write_byte_holding_gil(self._wfd)

    def _deliver(self) -> None:
        """On the loop: drain the pipe, then put everything pushed so far. The flag is cleared before the
        items are taken, so a push that lands after the last pop writes a new byte."""
        try:
            os.read(self._rfd, 4096)
        except BlockingIOError:
            pass
        self._signalled = False
        while self._items:
            queue, out = self._items.popleft()
            queue.put_nowait(out)

    def close(self) -> None:
        """Deliver what is still queued, stop reading and free the pipe. Call it where no push() can run
        concurrently (the scheduler thread, or after it has exited). Done here when the loop is closed, not
        running, or this thread's; otherwise by the loop itself, soon."""
        if self.closed:
            return
        self.closed = True
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if self.loop.is_closed() or on_loop or not self.loop.is_running():
            self._release()
        else:
            self.loop.call_soon_threadsafe(self._release)

    def _release(self) -> None:
        if not self.loop.is_closed():
            self._deliver()
            self.loop.remove_reader(self._rfd)
        os.close(self._rfd)
        os.close(self._wfd)
