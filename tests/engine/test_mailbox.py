"""Mailbox and RequestHandle.get_all: outputs come in order, everything that arrived together at once, and a
reader waiting with a silence limit is told once per silent interval (keep-alive pings), not more."""

import asyncio

from inferd.engine.mailbox import Mailbox


async def test_outputs_come_in_order_and_all_that_arrived_at_once():
    box = Mailbox(asyncio.get_running_loop())
    assert box.empty() and box.take_all() == []
    for i in range(3):
        box.put_nowait(i)
    assert await box.wait(None) is True
    assert box.take_all() == [0, 1, 2] and box.empty()


async def test_a_waiting_reader_wakes_on_the_next_put():
    loop = asyncio.get_running_loop()
    box = Mailbox(loop)
    loop.call_later(0.01, box.put_nowait, "x")
    assert await asyncio.wait_for(box.wait(None), 5) is True
    assert box.take_all() == ["x"]


async def test_silence_is_reported_once_per_interval():
    box = Mailbox(asyncio.get_running_loop())
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    silences = 0
    while loop.time() - t0 < 0.35:
        assert await box.wait(0.05) is False
        silences += 1
    assert 3 <= silences <= 8  # about one per 0.05 s, never a busy loop of them
    box.close()


async def test_puts_push_the_silence_back():
    loop = asyncio.get_running_loop()
    box = Mailbox(loop)
    for k in range(1, 6):  # a put every 0.02 s: never 0.1 s of silence
        loop.call_later(0.02 * k, box.put_nowait, k)
    got = []
    while len(got) < 5:
        assert await box.wait(0.1) is True
        got += box.take_all()
    assert got == [1, 2, 3, 4, 5]
    box.close()


async def test_a_wait_without_a_limit_is_not_ended_by_an_earlier_limit():
    loop = asyncio.get_running_loop()
    box = Mailbox(loop)
    loop.call_later(0.01, box.put_nowait, 1)
    assert await box.wait(0.03) is True  # arms a timer for 0.03 s after the put
    box.take_all()
    loop.call_later(0.1, box.put_nowait, 2)
    assert await box.wait(None) is True  # the old timer fires meanwhile and must not end this wait
    assert box.take_all() == [2]
