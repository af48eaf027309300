"""Faults injected through the scheduler's `before_step` hook (and one in the scheduler loop itself), and broken
model files at start-up. What tests/server already covers is not repeated here: one failing request beside one
healthy one (test_errors), one stream failing mid-way (test_sse), SIGTERM drains (test_drain), watchdog silence
while the engine hangs (test_sd_notify), a missing model file (test_drain).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from tests.reliability.wire import CMPL, check_response, check_stream, parse_sse

ROOT = Path(__file__).resolve().parents[2]


async def post(url: str, body: dict) -> tuple[int, bytes]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        async with s.post(url, json=body) as r:
            return r.status, await r.read()


async def test_fault_mid_stream_fails_only_the_affected_streams(make_server, tiny_model):
    """Nine concurrent streams; three of them make the engine raise after their third token. Those three end
    with an error event and [DONE]; the six others, which shared the failing batches, finish every token."""
    srv = make_server(model=tiny_model)
    batch_sizes = []

    def inject(states):
        for st in states:
            if st.request.max_tokens == 33 and len(st.output_ids) >= 3:
                batch_sizes.append(len(states))
                raise RuntimeError("injected engine fault")
    srv.state.engine_loop.before_step = inject
    bodies = [{"prompt": f"stream number {i} says", "max_tokens": 33 if i % 3 == 0 else 20, "ignore_eos": True,
               "stream": True, "stream_options": {"include_usage": True}} for i in range(9)]
    results = await asyncio.gather(*(post(srv.url + CMPL, b) for b in bodies))
    assert max(batch_sizes) > 1, "the failing request never shared a batch"
    for body, (status, raw) in zip(bodies, results):
        assert status == 200
        if body["max_tokens"] == 33:
            events = parse_sse(raw)
            err = events[-2]["error"]
            assert err["type"] == "internal_server_error" and "injected engine fault" in err["message"]
            assert any(e["choices"] and e["choices"][0]["text"] for e in events[:-2])   # tokens came first
        else:
            problem, _ = check_stream(CMPL, body, status, raw)
            assert problem is None, problem
    srv.wait_idle()
    srv.state.engine_loop.before_step = None
    status, raw = await post(srv.url + CMPL, {"prompt": "after the fault", "max_tokens": 5, "ignore_eos": True})
    assert check_response(CMPL, {"max_tokens": 5, "ignore_eos": True, "prompt": "x"}, status,
                          json.loads(raw))[0] is None
    assert srv.metric("inferd:request_success_total", finished_reason="error") == 3


async def test_an_engine_down_for_a_while_fails_requests_then_recovers(make_server, tiny_model):
    srv = make_server(model=tiny_model)
    broken = True

    def inject(states):
        if broken:
            raise MemoryError("injected: the engine cannot allocate")
    srv.state.engine_loop.before_step = inject
    results = await asyncio.gather(*(post(srv.url + CMPL, {"prompt": f"request {i}", "max_tokens": 4})
                                     for i in range(5)))
    for status, raw in results:
        assert status == 500
        err = json.loads(raw)["error"]
        assert err["type"] == "internal_server_error" and "cannot allocate" in err["message"]
    srv.wait_idle()
    broken = False
    results = await asyncio.gather(*(post(srv.url + CMPL, {"prompt": f"request {i}", "max_tokens": 4,
                                                           "ignore_eos": True}) for i in range(5)))
    for status, raw in results:
        assert check_response(CMPL, {"prompt": "x", "max_tokens": 4, "ignore_eos": True}, status,
                              json.loads(raw))[0] is None
    assert srv.state.engine_loop.dead is None


async def test_a_hung_engine_step_times_requests_out_with_504(make_server, tiny_model):
    srv = make_server(model=tiny_model, request_timeout_s=0.5)

    def hang(states):
        time.sleep(1.2)
    srv.state.engine_loop.before_step = hang
    status, raw = await post(srv.url + CMPL, {"prompt": "slow", "max_tokens": 50, "ignore_eos": True})
    err = json.loads(raw)["error"]
    assert status == 504 and err["type"] == "timeout_error" and "timed out after 0.5 s" in err["message"]
    srv.state.engine_loop.before_step = None
    srv.wait_idle()
    status, _ = await post(srv.url + CMPL, {"prompt": "fast", "max_tokens": 2})
    assert status == 200


async def test_a_crash_in_the_scheduler_loop_fails_in_flight_requests_and_health(make_server, tiny_model, tmp_path):
    """Not an engine error but a bug in the loop itself (here: the metrics observer raises). In-flight streams
    get an error event, /health turns 503, new requests get 503, and the watchdog is no longer fed, so
    systemd restarts the service."""
    from inferd.server.systemd import Notifier
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "400000",
                         "WATCHDOG_PID": str(os.getpid())})
    try:
        srv = make_server(model=tiny_model, notifier=notifier)
        sched = srv.state.engine_loop
        metrics = sched.observer

        class Exploding:
            def on_step(self, stats):
                if sched.num_steps > steps_at_start + 3:
                    raise RuntimeError("injected scheduler bug")
                metrics.on_step(stats)

            def on_finished(self, states):
                metrics.on_finished(states)

        steps_at_start = sched.num_steps
        sched.observer = Exploding()
        status, raw = await post(srv.url + CMPL, {"prompt": "doomed", "max_tokens": 200, "ignore_eos": True,
                                                  "stream": True})
        events = parse_sse(raw)
        assert status == 200 and "injected scheduler bug" in events[-2]["error"]["message"]
        assert sched.dead is not None
        async with aiohttp.ClientSession() as s:
            async with s.get(srv.url + "/health") as r:
                assert r.status == 503
                assert "injected scheduler bug" in (await r.json())["error"]
        status, raw = await post(srv.url + CMPL, {"prompt": "too late", "max_tokens": 2})
        assert status == 503 and "not accepting requests" in json.loads(raw)["error"]["message"]
        # the dead loop feeds the watchdog no more
        sock.settimeout(0.05)
        try:
            while True:
                sock.recv(4096)
        except TimeoutError:
            pass
        time.sleep(1.0)
        sock.setblocking(False)
        pings = []
        try:
            while True:
                pings.append(sock.recv(4096))
        except BlockingIOError:
            pass
        assert b"WATCHDOG=1" not in pings
    finally:
        sock.close()


# ---- broken model files at start-up -------------------------------------------------------------------------

def serve(model: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    (tmp_path / "none.toml").write_text("")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFERD_CONFIG": str(tmp_path / "none.toml")}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return subprocess.run([sys.executable, "-m", "inferd.cli", "serve", str(model), "--port", str(port),
                           "--no-measure-bandwidth", "--num-kv-blocks", "8"],
                          env=env, capture_output=True, text=True, timeout=120)


def _truncated(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes()[:3000])
    return dst


def _garbage(src: Path, dst: Path) -> Path:
    dst.write_bytes(os.urandom(4096))
    return dst


def _bad_safetensors(src: Path, dst: Path) -> Path:
    from tests.model.make_tiny import TinySpec, write_tiny_hf
    folder = write_tiny_hf(dst, TinySpec(n_layers=1), "f32")
    st = folder / "model.safetensors"
    raw = bytearray(st.read_bytes())
    raw[8:12] = b"{{{{"     # the JSON header no longer parses
    st.write_bytes(bytes(raw))
    return folder


@pytest.mark.parametrize("make_bad, problem", [
    (_truncated, "file truncated or corrupt"),
    (_garbage, "not a GGUF file"),
    (_bad_safetensors, "header is not valid JSON"),
], ids=["truncated-gguf", "garbage", "corrupt-safetensors"])
def test_a_corrupt_model_at_start_up_is_a_clear_error_and_exit_1(make_bad, problem, tmp_path):
    from tests.model.make_tiny import TinySpec, write_tiny_gguf
    good = write_tiny_gguf(tmp_path / "good.gguf", TinySpec(n_layers=1), "Q8_0")
    bad = make_bad(good, tmp_path / ("bad" if make_bad is _bad_safetensors else "bad.gguf"))
    r = serve(bad, tmp_path)
    assert r.returncode == 1, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("inferd serve: error:") and str(bad) in last and problem in last, last
    assert "Traceback" not in r.stderr
