"""The server's systemd protocol against a fake NOTIFY_SOCKET: READY after loading, watchdog pings from the
scheduler loop, and no pings while the engine hangs (so systemd would restart it)."""

import os
import socket
import time

import pytest

from inferd.server.systemd import Notifier


@pytest.fixture
def notify_socket(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify")
    sock.bind(path)
    yield path, sock
    sock.close()


def read_messages(sock, seconds):
    """(arrival time, message) for everything received in the next `seconds`."""
    out = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            out.append((time.monotonic(), sock.recv(4096).decode()))
        except TimeoutError:
            break
    return out


def test_ready_then_watchdog_pings_stop_while_the_engine_hangs(make_server, notify_socket):
    path, sock = notify_socket
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000", "WATCHDOG_PID": str(os.getpid())})
    srv = make_server(notifier=notifier)
    msgs = [m for _, m in read_messages(sock, 0.2)]
    ready = [m for m in msgs if m.startswith("READY=1")]
    assert ready == [f"READY=1\nSTATUS=serving {srv.state.served_model_name}"]

    # idle: pings keep coming, at least every interval/2 = 0.2 s (the idle loop wakes every 0.1 s)
    pings = [t for t, m in read_messages(sock, 1.0) if m == "WATCHDOG=1"]
    assert len(pings) >= 4
    assert max(b - a for a, b in zip(pings, pings[1:])) < 0.4

    # a hung engine step: no ping for as long as it hangs
    import threading
    import urllib.request
    hanging = threading.Event()

    def hang(states):
        hanging.set()
        time.sleep(1.5)
    srv.state.engine_loop.before_step = hang
    t = threading.Thread(target=lambda: urllib.request.urlopen(urllib.request.Request(
        srv.url + "/v1/completions", data=b'{"prompt": "hi", "max_tokens": 1}',
        headers={"Content-Type": "application/json"}), timeout=30).read())
    t.start()
    assert hanging.wait(10)
    read_messages(sock, 0.01)   # pings sent before the hang began
    hang_pings = [m for _, m in read_messages(sock, 1.2) if m == "WATCHDOG=1"]
    assert hang_pings == []
    t.join()
    srv.state.engine_loop.before_step = None
    assert [m for _, m in read_messages(sock, 0.5) if m == "WATCHDOG=1"]   # fed again once it returns
