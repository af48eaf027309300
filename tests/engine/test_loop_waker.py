"""LoopWaker: outputs pushed from another thread reach their asyncio queues, in order, with no lost wake-up,
and closing delivers what is queued and frees the pipe."""

import asyncio
import os
import threading

from inferd import _waker
from inferd.engine.loop_waker import LoopWaker


def fd_is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


async def test_pushes_from_another_thread_arrive_in_order():
    waker = LoopWaker(asyncio.get_running_loop())
    queues = [asyncio.Queue() for _ in range(3)]
    n = 3000

    def producer():
        for i in range(0, n, 3):     # batches of three, like one step's outputs for three requests
            waker.push([(queues[j], i + j) for j in range(3)])

    t = threading.Thread(target=producer)
    t.start()
    got = [[], [], []]
    for j, q in enumerate(queues):
        while len(got[j]) < n // 3:
            got[j].append(await asyncio.wait_for(q.get(), 10))
    t.join()
    assert got == [list(range(j, n, 3)) for j in range(3)]
    waker.close()


async def test_one_wake_up_carries_every_push_before_it():
    waker = LoopWaker(asyncio.get_running_loop())
    q = asyncio.Queue()
    for i in range(5):                 # on the loop's own thread: nothing runs until we yield
        waker.push([(q, i)])
    assert q.empty()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert [q.get_nowait() for _ in range(5)] == [0, 1, 2, 3, 4]
    waker.push([(q, 5)])               # the flag was cleared: a later push wakes the loop again
    assert await asyncio.wait_for(q.get(), 5) == 5
    waker.close()


async def test_close_on_the_loop_delivers_what_is_queued_and_frees_the_pipe():
    waker = LoopWaker(asyncio.get_running_loop())
    q = asyncio.Queue()
    waker.push([(q, "last words")])
    fds = (waker._rfd, waker._wfd)
    waker.close()
    assert q.get_nowait() == "last words"
    assert not any(fd_is_open(fd) for fd in fds)
    waker.push([(q, "ignored")])       # after close: dropped, no error
    await asyncio.sleep(0)
    assert q.empty()


async def test_close_from_another_thread_is_done_by_the_loop():
    waker = LoopWaker(asyncio.get_running_loop())
    q = asyncio.Queue()
    fds = (waker._rfd, waker._wfd)

    def scheduler_side():
        waker.push([(q, 1)])
        waker.close()

    t = threading.Thread(target=scheduler_side)
    t.start()
    t.join()
    assert await asyncio.wait_for(q.get(), 5) == 1
    await asyncio.sleep(0)
    assert not any(fd_is_open(fd) for fd in fds)


def test_close_after_the_loop_closed():
    loop = asyncio.new_event_loop()
    waker = LoopWaker(loop)
    fds = (waker._rfd, waker._wfd)
    loop.close()
    waker.close()
    assert not any(fd_is_open(fd) for fd in fds)


def test_write_byte_holding_gil_reports_a_full_pipe():
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        assert _waker.write_byte_holding_gil(w) == 1
        assert os.read(r, 10) == b"\0"
        while _waker.write_byte_holding_gil(w) == 1:   # fill the pipe: then -1 (EAGAIN), no exception, no block
            pass
        assert _waker.write_byte_holding_gil(w) == -1
    finally:
        os.close(r)
        os.close(w)
