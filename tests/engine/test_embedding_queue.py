"""EmbeddingQueue's policy with a stand-in encoder that records each call (the real encoder is tested in
test_encoder.py): inputs packed across requests first come first served, limits in tokens and sequences, a
request spread over steps, aborts, failures, and the worker thread."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from inferd.engine.embedding_queue import EmbeddingJob, EmbeddingQueue, EmbeddingWorker, QueueFull


class RecordingEncoder:
    """vector of an input = [its length, its first id]; records the batches"""
    dimensions = 2

    def __init__(self, max_batch_tokens: int = 10, max_batch_seqs: int = 3, fail: bool = False):
        self.max_batch_tokens, self.max_batch_seqs, self.fail = max_batch_tokens, max_batch_seqs, fail
        self.calls: list[list[list[int]]] = []

    def embed(self, seqs):
        self.calls.append([list(s) for s in seqs])
        if self.fail:
            raise RuntimeError("boom")
        return np.array([[len(s), s[0]] for s in seqs], np.float32)


def job(name, inputs, done):
    return EmbeddingJob(name, inputs, done.append)


def test_inputs_of_several_requests_share_steps_in_order():
    enc, done = RecordingEncoder(max_batch_tokens=10, max_batch_seqs=3), []
    q = EmbeddingQueue(enc)
    a, b, c = job("a", [[1, 1], [2, 2, 2]], done), job("b", [[3] * 4, [4]], done), job("c", [[5] * 10], done)
    for j in (a, b, c):
        q.submit(j)
    assert q.step() == 3                                     # a's two, b's first (3 sequences)
    assert done == [a]
    assert q.step() == 1                                     # b's last; c's 10 tokens would pass 10
    assert q.step() == 1
    assert done == [a, b, c] and not q.has_work()
    assert enc.calls == [[[1, 1], [2, 2, 2], [3] * 4], [[4]], [[5] * 10]]
    np.testing.assert_array_equal(b.vectors, [[4, 3], [1, 4]])


def test_an_input_over_the_token_budget_still_runs_alone():
    enc, done = RecordingEncoder(max_batch_tokens=4), []
    q = EmbeddingQueue(enc)
    q.submit(job("a", [[7] * 6, [8]], done))
    assert q.step() == 1 and q.step() == 1
    assert enc.calls == [[[7] * 6], [[8]]] and len(done) == 1


def test_aborted_requests_are_dropped_before_their_next_inputs():
    enc, done, seen = RecordingEncoder(max_batch_seqs=1), [], []
    q = EmbeddingQueue(enc, observer=lambda j, how: seen.append((j.rid, how)))
    a, b = job("a", [[1], [2], [3]], done), job("b", [[4]], done)
    q.submit(a)
    q.submit(b)
    q.step()
    q.abort(a)
    q.step()
    assert enc.calls == [[[1]], [[4]]]
    assert done == [b] and seen == [("a", "aborted"), ("b", "finished")]


def test_full_queue_failures_and_shutdown():
    done: list = []
    q = EmbeddingQueue(RecordingEncoder(fail=True), max_waiting=1)
    q.submit(job("a", [[1]], done))
    with pytest.raises(QueueFull):
        q.submit(job("b", [[1]], done))
    q.step()
    assert done[0].error.startswith("the encoder failed") and not q.has_work()
    q.submit(job("c", [[1]], done))
    q.fail_all("the server is shutting down")
    assert done[1].error == "the server is shutting down"


def test_worker_thread_runs_submitted_jobs():
    finished = threading.Event()
    q = EmbeddingQueue(RecordingEncoder())
    w = EmbeddingWorker(q, idle_wait_s=0.05)
    w.start()
    try:
        q.submit(EmbeddingJob("a", [[1, 2]], lambda j: finished.set()))
        assert finished.wait(10)
    finally:
        w.stop()
    assert w.dead is None and not w.thread.is_alive()
