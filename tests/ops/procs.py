"""Real processes on loopback ports for the operations tests and bench/rolling_restart.py: `inferd serve`
replicas, HAProxy and Prometheus, each started with its own config and files in a temporary folder, every wait
bounded in time, and `stop()` safe to call twice (fixtures call it in teardown, even after a failure)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HAPROXY_CFG = ROOT / "config" / "haproxy" / "inferd.cfg"
APT_HINT = "apt-get update && apt-get install -y prometheus haproxy"


def binary(name: str) -> str | None:
    """The program's path; also looks in the sbin folders (Debian puts haproxy in /usr/sbin, which a normal
    user's PATH may lack)."""
    return shutil.which(name) or shutil.which(name, path="/usr/local/sbin:/usr/sbin:/sbin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes] | None:
    """(status, body), or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None


def wait_for(check: Callable[[], bool], timeout: float, what: str, proc: Process | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and not proc.running():
            raise RuntimeError(f"{what}: the process exited with {proc.popen.returncode}\n{proc.log_tail()}")
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s" + (f"\n{proc.log_tail()}" if proc else ""))


class Process:
    """A child process whose output goes to a log file (appended to across restarts)."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.argv, self.log_path, self.env = argv, log_path, env
        self.popen: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                          stdin=subprocess.DEVNULL)

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def terminate(self, timeout: float) -> int:
        """SIGTERM and wait; SIGKILL if it outlives `timeout`. Returns the exit status."""
        assert self.popen is not None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)
            raise

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


class Replica(Process):
    """One `inferd serve` on 127.0.0.1:port, with no settings file (only the options given)."""

    def __init__(self, model: str, port: int, workdir: Path, *options: str, name: str = "replica"):
        empty = workdir / "empty.toml"
        empty.write_text("")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "INFERD_CONFIG": str(empty)}
        super().__init__([sys.executable, "-m", "inferd.cli", "serve", model, "--host", "127.0.0.1",
                          "--port", str(port), *options], workdir / f"{name}.log", env)
        self.port, self.name = port, name

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        r = http_get(self.url + "/health")
        return r is not None and r[0] == 200

    def wait_ready(self, timeout: float = 120) -> Replica:
        wait_for(self.healthy, timeout, f"{self.name} ready", self)
        return self

    def in_flight_at_last_drain(self) -> int:
        """Requests in flight when the last SIGTERM arrived, from the daemon's own log line."""
        found = re.findall(r"draining: (\d+) requests in flight", self.log_text())
        return int(found[-1]) if found else -1


def haproxy_config(lb_port: int, replica_ports: list[int], stats_socket: Path, stats_port: int,
                   check_inter: str | None = None) -> str:
    """The shipped config/haproxy/inferd.cfg with this run's loopback ports and socket (and, for a quick
    test, a shorter health-check interval); everything else as shipped."""
    text = HAPROXY_CFG.read_text()
    servers = re.findall(r"server (r\d) 127\.0\.0\.1:(\d+) check", text)
    assert len(servers) == len(replica_ports), "the shipped config has one server line per replica"
    for (name, port), new in zip(servers, replica_ports):
        text = text.replace(f"server {name} 127.0.0.1:{port} check", f"server {name} 127.0.0.1:{new} check")
    text = text.replace("bind 127.0.0.1:8000", f"bind 127.0.0.1:{lb_port}")
    text = text.replace("bind 127.0.0.1:8404", f"bind 127.0.0.1:{stats_port}")
    text = text.replace("/run/haproxy/inferd.sock", str(stats_socket))
    if check_inter:
        text = text.replace("default-server inter 1s ", f"default-server inter {check_inter} ")
    return text


class HAProxy(Process):
    def __init__(self, config_text: str, workdir: Path, stats_socket: Path):
        cfg = workdir / "haproxy.cfg"
        cfg.write_text(config_text)
        self.exe = binary("haproxy") or "haproxy"
        super().__init__([self.exe, "-db", "-f", str(cfg)], workdir / "haproxy.log")
        self.cfg, self.stats_socket = cfg, stats_socket

    def start(self) -> None:
        check = subprocess.run([self.exe, "-c", "-f", str(self.cfg)], check=False, capture_output=True, text=True,
                               timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c rejected the config:\n{check.stdout}{check.stderr}")
        super().start()
        wait_for(self._answers, 20, "haproxy stats socket", self)   # the file appears before haproxy listens on it

    def _answers(self) -> bool:
        try:
            return "Name: HAProxy" in self.command("show info")
        except OSError:
            return False

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(self.stats_socket))
            s.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def servers(self, backend: str = "inferd_replicas") -> dict[str, dict[str, str]]:
        """`show stat` rows of the backend's servers, by server name (status, stot, ...)."""
        text = self.command("show stat").lstrip("# ")
        rows = csv.DictReader(io.StringIO(text))
        return {r["svname"]: r for r in rows if r["pxname"] == backend and r["svname"] not in ("FRONTEND", "BACKEND")}

    def status(self, server: str) -> str:
        return self.servers()[server]["status"]


class Prometheus(Process):
    """A Prometheus server with its own config and data folder on a loopback port."""

    def __init__(self, config_text: str, workdir: Path, port: int):
        cfg = workdir / "prometheus.yml"
        cfg.write_text(config_text)
        data = workdir / "prometheus-data"
        data.mkdir(exist_ok=True)
        super().__init__([binary("prometheus") or "prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={data}",
                          f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], workdir / "prometheus.log")
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> None:
        super().start()
        wait_for(lambda: (http_get(self.url + "/-/ready") or (0,))[0] == 200, 60, "prometheus ready", self)

    def api(self, path: str, **params: str) -> dict | list:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        r = http_get(url, timeout=10)
        assert r is not None, f"prometheus did not answer {url}"
        body = json.loads(r[1])
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        assert isinstance(data, dict)
        return data["result"]
