"""A client that goes away stops its generation and frees its KV blocks (seen through /metrics and KV stats)."""

import asyncio
import time

import aiohttp
import pytest

LONG = {"prompt": "Write a very long essay about the sea.", "max_tokens": 4000, "ignore_eos": True}


def wait_until(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return time.monotonic()
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


async def test_stream_disconnect_frees_blocks(make_server):
    srv = make_server()
    assert srv.metric("inferd:kv_cache_usage_perc") == 0.0
    async with aiohttp.ClientSession() as s:
        r = await s.post(srv.url + "/v1/completions", json={**LONG, "stream": True})
        for _ in range(6):             # a few tokens in: the request holds blocks and is running
            await r.content.readline()
        assert srv.kv_used() >= 1 and srv.state.engine_loop.num_running == 1
        assert srv.metric("inferd:kv_cache_usage_perc") > 0
        steps_before = srv.state.engine_loop.num_steps
        r.close()
    wait_until(lambda: srv.kv_used() == 0)
    # freed within a few engine steps of the disconnect being noticed, not after 4000 tokens
    assert srv.state.engine_loop.num_steps - steps_before < 50
    srv.wait_idle()
    assert srv.metric("inferd:kv_cache_usage_perc") == 0.0
    assert srv.metric("inferd:num_requests_running") == 0.0
    assert srv.metric("inferd:http_requests_client_disconnected_total") == 1.0
    assert srv.metric("inferd:request_success_total", finished_reason="abort") == 1.0
    assert srv.metric("inferd:request_success_total", finished_reason="length") == 0.0


async def test_non_streaming_disconnect_frees_blocks(make_server):
    srv = make_server()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as s:
        with pytest.raises(asyncio.TimeoutError):
            async with s.post(srv.url + "/v1/chat/completions",
                              json={"messages": [{"role": "user", "content": "Go on forever."}],
                                    "max_tokens": 4000, "ignore_eos": True}) as r:
                await r.read()
    wait_until(lambda: srv.kv_used() == 0 and srv.state.engine_loop.num_running == 0)
    assert srv.metric("inferd:http_requests_client_disconnected_total") == 1.0


async def test_disconnect_of_one_choice_stream_aborts_all_its_choices(make_server):
    srv = make_server()
    async with aiohttp.ClientSession() as s:
        r = await s.post(srv.url + "/v1/completions", json={**LONG, "n": 3, "stream": True, "temperature": 1.0})
        for _ in range(10):
            await r.content.readline()
        assert srv.state.engine_loop.num_running == 3
        r.close()
    wait_until(lambda: srv.kv_used() == 0 and srv.state.engine_loop.num_running == 0)
    assert srv.metric("inferd:request_success_total", finished_reason="abort") == 3.0
