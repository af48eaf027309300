"""sd_notify over $NOTIFY_SOCKET with a plain datagram socket (no libsystemd dependency).

READY=1 once the model is loaded and warmed, STATUS= lines for `systemctl status`, WATCHDOG=1 from the
scheduler loop (so a hung engine stops the pings and systemd restarts the service), STOPPING=1 on drain.
Outside systemd (no NOTIFY_SOCKET) every call is a no-op.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping

log = logging.getLogger("inferd.systemd")


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        self.address = self._address(env.get("NOTIFY_SOCKET", ""))
        self.watchdog_interval_s = self._watchdog_interval(env)
        # Ping at half the deadline: one late step must not look like a hang.
        self._min_ping_gap = self.watchdog_interval_s / 2 if self.watchdog_interval_s else 0.0
        self._last_ping = 0.0
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        if self.address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)

    @staticmethod
    def _address(value: str) -> str | bytes | None:
        if not value:
            return None
        if value.startswith("@"):  # abstract namespace: a leading NUL instead of '@'
            return b"\0" + value[1:].encode()
        if value.startswith("/"):
            return value
        log.warning("ignoring NOTIFY_SOCKET=%r: not a path or an abstract socket name", value)
        return None

    @staticmethod
    def _watchdog_interval(env: Mapping[str, str]) -> float | None:
        usec = env.get("WATCHDOG_USEC")
        if not usec:
            return None
        pid = env.get("WATCHDOG_PID")
        if pid and pid != str(os.getpid()):
            return None  # meant for another process (we were forked or exec'd by a wrapper)
        try:
            value = int(usec)
        except ValueError:
            log.warning("ignoring WATCHDOG_USEC=%r: not an integer", usec)
            return None
        return value / 1e6 if value > 0 else None

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def notify(self, *lines: str) -> bool:
        """Send `lines` as one datagram; False (and a debug log) if systemd is not listening."""
        if self._sock is None or self.address is None:
            return False
        data = "\n".join(lines).encode()
        try:
            with self._lock:
                self._sock.sendto(data, self.address)
            return True
        except OSError as e:
            log.debug("sd_notify %r failed: %s", lines, e)
            return False

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def stopping(self, status: str = "") -> bool:
        return self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for more start-up time (a large model download or load)."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    def watchdog(self) -> None:
        """Called by the scheduler every loop iteration; sends WATCHDOG=1 at most every interval/2."""
        if self._sock is None or self.watchdog_interval_s is None:
            return
        now = time.monotonic()
        if now - self._last_ping >= self._min_ping_gap:
            self._last_ping = now
            self.notify("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
