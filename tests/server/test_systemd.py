"""sd_notify against a fake NOTIFY_SOCKET: a datagram socket we bind and read ourselves."""

import os
import socket
import time
import uuid

import pytest

from inferd.server.systemd import Notifier


@pytest.fixture
def fake_systemd(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify")
    sock.bind(path)
    sock.settimeout(2)
    yield path, sock
    sock.close()


def recv_all(sock):
    msgs = []
    sock.settimeout(0.05)
    try:
        while True:
            msgs.append(sock.recv(4096).decode())
    except (TimeoutError, BlockingIOError):
        pass
    return msgs


def test_ready_status_stopping(fake_systemd):
    path, sock = fake_systemd
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready("serving smollm2")
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving smollm2"
    n.status("loading model")
    assert sock.recv(4096) == b"STATUS=loading model"
    n.extend_timeout(90)
    assert sock.recv(4096) == b"EXTEND_TIMEOUT_USEC=90000000"
    n.stopping("draining 2 requests")
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=draining 2 requests"
    n.close()


def test_abstract_namespace_socket():
    name = f"inferd-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2)
    try:
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.ready()
        assert sock.recv(4096) == b"READY=1"
    finally:
        sock.close()


def test_watchdog_is_rate_limited_to_half_the_interval(fake_systemd):
    path, sock = fake_systemd
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid())})
    assert n.watchdog_interval_s == 0.2
    t_end = time.monotonic() + 0.35
    while time.monotonic() < t_end:
        n.watchdog()
        time.sleep(0.005)
    msgs = recv_all(sock)
    assert set(msgs) == {"WATCHDOG=1"}
    assert 2 <= len(msgs) <= 4            # at 0, 0.1, 0.2, 0.3 s: not once per call


def test_watchdog_for_another_pid_is_ignored(fake_systemd):
    path, sock = fake_systemd
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"})
    assert n.watchdog_interval_s is None
    n.watchdog()
    assert recv_all(sock) == []


def test_without_systemd_everything_is_a_no_op(tmp_path):
    n = Notifier({})
    assert not n.enabled
    assert n.ready() is False
    n.watchdog()
    assert Notifier({"NOTIFY_SOCKET": "relative/path"}).enabled is False
    # systemd gone (socket removed): no exception, just False
    gone = Notifier({"NOTIFY_SOCKET": str(tmp_path / "missing")})
    assert gone.ready() is False
