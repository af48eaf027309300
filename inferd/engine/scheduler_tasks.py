"""Calls run on the scheduler thread between two engine steps: the way for the HTTP side to touch what only that
thread may (the KV pool, the KV manager) without a lock. One of the engine loop's side queues."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from inferd.engine.loop import EngineLoop

T = TypeVar("T")
TASK_TIMEOUT_S = 60.0


class SchedulerTasks:
    """Calls run on the scheduler thread between engine steps (an EngineLoop side queue)."""

    def __init__(self, engine_loop: EngineLoop):
        self.engine_loop = engine_loop
        self._lock = threading.Lock()
        self._pending: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = deque()
        engine_loop.side_queues.append(self)

    def has_work(self) -> bool:
        return bool(self._pending)

    def step(self) -> int:
        with self._lock:
            pending, self._pending = self._pending, deque()
        for fn, fut in pending:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:
                    fut.set_exception(e)
        return len(pending)

    async def run(self, fn: Callable[[], T]) -> T:
        if self.engine_loop.dead is not None:
            raise RuntimeError("the scheduler is not running")
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            self._pending.append((fn, fut))
        self.engine_loop.wake()
        return await asyncio.wait_for(asyncio.wrap_future(fut), TASK_TIMEOUT_S)
