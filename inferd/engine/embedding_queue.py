"""Embedding requests batched across requests: the policy (EmbeddingQueue: which inputs go into the next encoder
call) and the thread that runs it when no engine loop does (EmbeddingWorker). Beside a chat model, the chat
model's EngineLoop runs the queue's steps between its own (EngineLoop.side_queues), as prefill-only work.

Each step takes inputs first come first served, from as many requests as fit the encoder's batch (tokens and
sequences), so many small requests share one call and a request of thousands of inputs is spread over several
steps without holding the others back for more than a step. A request finishes when its last input has its
vector; an aborted one (the client went away) is dropped before its next input is encoded. Everything here runs
on one thread except submit() and abort(), which only append to or flag what that thread reads under a lock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class QueueFull(Exception):
    pass


class Encoder(Protocol):
    dimensions: int
    max_batch_tokens: int
    max_batch_seqs: int

    def embed(self, seqs: list[list[int]]) -> np.ndarray: ...


@dataclass(eq=False)
class EmbeddingJob:
    rid: str
    inputs: list[list[int]]
    on_done: Callable[[EmbeddingJob], None]  # called on the queue's thread once: vectors set, or error
    arrival: float = field(default_factory=time.monotonic)
    vectors: np.ndarray | None = None
    next_input: int = 0  # inputs handed to steps so far
    error: str | None = None
    aborted: bool = False
    first_step: float | None = None  # when its first input was encoded (queue time ends)

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.inputs)


class EmbeddingQueue:
    def __init__(
        self, encoder: Encoder, max_waiting: int = 1024, observer: Callable[[EmbeddingJob, str], None] | None = None
    ):
        self.encoder = encoder
        self.max_waiting = max_waiting
        self.observer = observer  # metrics: (job, "finished" | "aborted" | "failed")
        self.wake: Callable[[], None] | None = None  # the thread that runs step(), when it is not an EmbeddingWorker
        self.jobs: deque[EmbeddingJob] = deque()
        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)
        self.steps = 0

    def submit(self, job: EmbeddingJob) -> None:
        with self.lock:
            if len(self.jobs) >= self.max_waiting:
                raise QueueFull(f"{len(self.jobs)} embedding requests are waiting already; retry shortly")
            job.vectors = np.empty((len(job.inputs), self.encoder.dimensions), np.float32)
            self.jobs.append(job)
            self.wakeup.notify()
        if self.wake is not None:
            self.wake()

    def abort(self, job: EmbeddingJob) -> None:
        job.aborted = True  # read by the queue's thread at its next step; a plain flag write

    def has_work(self) -> bool:
        return bool(self.jobs)

    def step(self) -> int:
        """One encoder call over the next inputs; returns how many inputs it encoded (0: nothing to do)."""
        picked: list[tuple[EmbeddingJob, int, int]] = []  # (job, first input, end)
        seqs: list[list[int]] = []
        tokens = 0
        with self.lock:
            for job in list(self.jobs):
                if job.aborted:
                    self.jobs.remove(job)
                    self._finish(job, "aborted")
                    continue
                lo = hi = job.next_input
                while hi < len(job.inputs) and len(seqs) < self.encoder.max_batch_seqs:
                    n = len(job.inputs[hi])
                    if seqs and tokens + n > self.encoder.max_batch_tokens:
                        break
                    seqs.append(job.inputs[hi])
                    tokens += n
                    hi += 1
                if hi > lo:
                    picked.append((job, lo, hi))
                    job.next_input = hi
                if hi < len(job.inputs):
                    break  # the batch is full
        if not seqs:
            return 0
        now = time.monotonic()
        try:
            vectors = self.encoder.embed(seqs)
        except Exception as e:  # noqa: BLE001 - a bug, not bad input (inputs were checked): fail these, keep serving
            with self.lock:
                for job, _, _ in picked:
                    if job in self.jobs:
                        self.jobs.remove(job)
                    job.error = f"the encoder failed: {e!r}"
                    self._finish(job, "failed")
            return len(seqs)
        self.steps += 1
        row = 0
        with self.lock:
            for job, lo, hi in picked:
                job.first_step = job.first_step or now
                assert job.vectors is not None  # allocated by submit()
                job.vectors[lo:hi] = vectors[row : row + hi - lo]
                row += hi - lo
                if hi == len(job.inputs) and job in self.jobs:
                    self.jobs.remove(job)
                    self._finish(job, "finished")
        return len(seqs)

    def fail_all(self, message: str) -> None:
        with self.lock:
            while self.jobs:
                job = self.jobs.popleft()
                job.error = message
                self._finish(job, "failed")

    def _finish(self, job: EmbeddingJob, how: str) -> None:
        if self.observer is not None:
            self.observer(job, how)
        if how != "aborted":
            job.on_done(job)


class EmbeddingWorker:
    """A thread that runs the queue's steps whenever it has work (the server's embedding-only mode)."""

    def __init__(self, queue: EmbeddingQueue, watchdog: Callable[[], None] | None = None, idle_wait_s: float = 0.5):
        self.queue = queue
        self.watchdog = watchdog
        self.idle_wait_s = idle_wait_s
        self.stopping = False
        self.dead: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="inferd-embeddings", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.queue.lock:
            self.stopping = True
            self.queue.wakeup.notify()
        self.thread.join()
        self.queue.fail_all("the server is shutting down")

    def _run(self) -> None:
        try:
            while True:
                with self.queue.lock:
                    while not self.queue.jobs and not self.stopping:
                        self.queue.wakeup.wait(self.idle_wait_s)
                        if self.watchdog is not None:
                            self.watchdog()
                    if self.stopping:
                        return
                self.queue.step()
                if self.watchdog is not None:
                    self.watchdog()
        except BaseException as e:  # keep /health honest: a dead worker is reported, not hidden
            self.dead = e
            self.queue.fail_all(f"the embedding worker stopped: {e!r}")
            raise
