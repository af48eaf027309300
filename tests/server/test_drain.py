"""`inferd serve` as a real process: READY over NOTIFY_SOCKET, then SIGTERM drains running streams and exits 0."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def daemon(model_path, tmp_path):
    procs = []

    def start(*extra):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(tmp_path / f"notify{len(procs)}"))
        port = free_port()
        env = {**os.environ, "NOTIFY_SOCKET": sock.getsockname(), "PYTHONPATH": str(ROOT),
               "INFERD_CONFIG": str(tmp_path / "none.toml")}
        (tmp_path / "none.toml").write_text("")
        proc = subprocess.Popen([sys.executable, "-m", "inferd.cli", "serve", str(model_path), "--port", str(port),
                                 "--num-kv-blocks", "64", "--no-measure-bandwidth", *extra],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append((proc, sock))
        sock.settimeout(120)
        while True:
            msg = sock.recv(4096).decode()
            if msg.startswith("READY=1"):
                break
        return proc, sock, f"http://127.0.0.1:{port}"
    yield start
    for proc, sock in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()


def open_stream(url, max_tokens):
    body = json.dumps({"prompt": "Count slowly:", "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=60)


def read_events(resp):
    return [line[6:].strip() for line in resp.read().decode().split("\n") if line.startswith("data: ")]


def test_sigterm_lets_running_streams_finish_then_exits_0(daemon):
    proc, sock, url = daemon("--drain-timeout-s", "30")
    resp = open_stream(url, 40)
    first = resp.readline()
    assert first.startswith(b"data: ")
    proc.send_signal(signal.SIGTERM)
    sock.settimeout(10)
    assert sock.recv(4096).decode().startswith("STOPPING=1\nSTATUS=draining 1 requests")
    # new connections are refused while the old stream goes on
    time.sleep(0.3)
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/health", timeout=5)
    events = [first[6:].decode().strip()] + read_events(resp)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    # every token arrived (counted by usage: a token that ends inside a UTF-8 character sends no text event)
    assert chunks[-1]["usage"]["completion_tokens"] == 40
    assert proc.wait(30) == 0
    assert "draining: 1 requests in flight" in proc.stdout.read()


def test_drain_grace_period_ends_long_streams(daemon):
    proc, sock, url = daemon("--drain-timeout-s", "1")
    resp = open_stream(url, 4000)
    resp.readline()
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert time.monotonic() - t0 < 15
    events = read_events(resp)
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["message"] == "the server is shutting down" and err["type"] == "service_unavailable_error"


def test_missing_model_exits_non_zero_with_a_clear_error(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFERD_CONFIG": str(tmp_path / "none.toml")}
    (tmp_path / "none.toml").write_text("")
    r = subprocess.run([sys.executable, "-m", "inferd.cli", "serve", str(tmp_path / "missing.gguf"),
                        "--port", str(free_port())], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "no such file or folder" in r.stderr


def test_bad_setting_exits_2(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFERD_PORT": "not-a-port"}
    r = subprocess.run([sys.executable, "-m", "inferd.cli", "serve"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert "INFERD_PORT: expected int, got 'not-a-port'" in r.stderr


def test_drain_delay_fails_health_first_while_still_serving(daemon):
    """The order a load balancer needs: /health says 503 at once, new requests are still served during
    drain_delay_s, then the listener closes and the process exits 0."""
    proc, sock, url = daemon("--drain-timeout-s", "10", "--drain-delay-s", "3")
    proc.send_signal(signal.SIGTERM)
    sock.settimeout(10)
    assert sock.recv(4096).decode().startswith("STOPPING=1")
    with pytest.raises(urllib.error.HTTPError) as health:
        urllib.request.urlopen(url + "/health", timeout=5)
    assert health.value.code == 503 and json.loads(health.value.read())["status"] == "draining"
    events = read_events(open_stream(url, 4))   # a request routed here before the balancer noticed
    assert events[-1] == "[DONE]" and json.loads(events[-2])["usage"]["completion_tokens"] == 4
    assert proc.wait(30) == 0
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/health", timeout=5)
