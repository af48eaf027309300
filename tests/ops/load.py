"""Continuous streaming load through a URL, every stream checked to its end, and a rolling restart of replicas
behind HAProxy under that load (used by tests/ops/test_haproxy.py and bench/rolling_restart.py).

A stream counts as complete when it answered 200, carried no error event, had a choice with a finish_reason,
ended with `data: [DONE]` and its usage says exactly `max_tokens` tokens (requests use ignore_eos). Anything else
is failed (no 200, an error event, a broken connection before any event) or truncated (200, then cut short).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

import aiohttp

from tests.ops.procs import HAProxy, Replica

FILLER = ("The operator keeps three replicas behind one balancer so that a restart never drops a stream. "
          "Each user returns with a longer conversation, and the prefix cache remembers the earlier turns. ")


def user_prompt(user: int, turn: int) -> str:
    """A long shared head per user (prefix-cache hits on the user's replica) plus a short new turn."""
    return f"Conversation of user {user}. " + FILLER * 2 + f"Turn {turn}: tell me more."


@dataclass
class StreamResult:
    status: int = 0
    error: str = ""            # an error event, a non-200 body or a connection error
    done: bool = False         # saw data: [DONE]
    finish_reason: str | None = None
    completion_tokens: int = 0
    replica: str = ""          # X-Inferd-Replica set by HAProxy

    def complete(self, max_tokens: int) -> bool:
        return (self.status == 200 and not self.error and self.done and self.finish_reason is not None
                and self.completion_tokens == max_tokens)

    def truncated(self, max_tokens: int) -> bool:
        return self.status == 200 and not self.error and not self.complete(max_tokens)


@dataclass
class LoadResult:
    max_tokens: int
    streams: list[StreamResult] = field(default_factory=list)
    chunk_times: list[float] = field(default_factory=list)   # monotonic arrival time of every text chunk

    @property
    def failed(self) -> list[StreamResult]:
        return [s for s in self.streams if s.status != 200 or s.error]

    @property
    def truncated(self) -> list[StreamResult]:
        return [s for s in self.streams if s.truncated(self.max_tokens)]

    def tokens_per_second(self, start: float, end: float) -> float:
        n = sum(1 for t in self.chunk_times if start <= t < end)
        return n / (end - start) if end > start else 0.0

    def per_second(self, start: float, end: float) -> list[int]:
        bins = [0] * max(1, int(end - start))
        for t in self.chunk_times:
            i = int(t - start)
            if 0 <= i < len(bins):
                bins[i] += 1
        return bins


async def stream_once(session: aiohttp.ClientSession, url: str, body: dict, result: LoadResult) -> StreamResult:
    out = StreamResult()
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            out.status = resp.status
            out.replica = resp.headers.get("X-Inferd-Replica", "")
            if resp.status != 200:
                out.error = (await resp.text())[:200]
                return out
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    out.done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    out.error = event["error"].get("message", "error event")
                for choice in event.get("choices", []):
                    if choice.get("text"):
                        result.chunk_times.append(time.monotonic())
                    out.finish_reason = choice.get("finish_reason") or out.finish_reason
                if event.get("usage"):
                    out.completion_tokens = event["usage"]["completion_tokens"]
    except (TimeoutError, aiohttp.ClientError) as e:
        if out.status == 0:
            out.error = f"{type(e).__name__}: {e}"
    return out


async def run_load(url: str, stop: asyncio.Event, *, concurrency: int, max_tokens: int, users: int,
                   deadline_s: float) -> LoadResult:
    """`concurrency` closed-loop clients, each sending streaming completions back to back as users
    (client i sends as users i, i+concurrency, ...) until `stop` is set or `deadline_s` passes."""
    result = LoadResult(max_tokens)
    deadline = time.monotonic() + deadline_s
    timeout = aiohttp.ClientTimeout(total=120, sock_read=60)

    async def client(i: int, session: aiohttp.ClientSession) -> None:
        turn = 0
        while not stop.is_set() and time.monotonic() < deadline:
            user = (i + concurrency * turn) % users
            body = {"prompt": user_prompt(user, turn), "max_tokens": max_tokens, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}, "user": f"user-{user}"}
            result.streams.append(await stream_once(session, url, body, result))
            turn += 1

    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(client(i, session) for i in range(concurrency)))
    return result


@dataclass
class Restart:
    name: str
    in_flight: int          # requests on the replica when SIGTERM arrived (its own log line)
    exit_code: int
    out_before_exit: bool   # HAProxy marked it DOWN while the process was still draining
    drain_s: float          # SIGTERM -> process exit
    rejoin_s: float         # start again -> marked UP by HAProxy's checks
    sigterm_at: float = 0.0  # seconds since the load started


@dataclass
class RollingReport:
    load: LoadResult
    restarts: list[Restart]
    baseline_tps: float     # tokens/s before the first SIGTERM
    rolling_tps: float      # tokens/s from the first SIGTERM to the last replica back UP
    after_tps: float        # tokens/s after that
    min_second: int         # fewest tokens in one second while rolling
    rolling_s: float
    per_second: list[int] = field(default_factory=list)   # tokens in each second since the load started


async def rolling_restart(replicas: list[Replica], haproxy: HAProxy, url: str, *, concurrency: int,
                          max_tokens: int, users: int, warmup_s: float, settle_s: float, drain_timeout_s: float,
                          start_timeout_s: float = 120.0) -> RollingReport:
    """Streaming load through `url` the whole time; after `warmup_s`, each replica in turn gets SIGTERM, is
    waited for, started again and waited for until HAProxy has it UP; `settle_s` more of load, then stop."""
    stop = asyncio.Event()
    deadline = warmup_s + settle_s + len(replicas) * (drain_timeout_s + start_timeout_s + 30)
    load_task = asyncio.create_task(run_load(url, stop, concurrency=concurrency, max_tokens=max_tokens,
                                             users=users, deadline_s=deadline))
    t_start = time.monotonic()
    restarts: list[Restart] = []
    try:
        await asyncio.sleep(warmup_s)
        t_roll = time.monotonic()
        for r in replicas:
            t0 = time.monotonic()
            exiting = asyncio.create_task(asyncio.to_thread(r.terminate, drain_timeout_s + 30))
            out_before_exit = False
            while not exiting.done():
                out_before_exit |= haproxy.status(r.name).startswith("DOWN") and r.running()
                await asyncio.sleep(0.05)
            code = await exiting
            t1 = time.monotonic()
            r.start()
            await asyncio.to_thread(r.wait_ready, start_timeout_s)
            await wait_up(haproxy, r.name, 30)
            restarts.append(Restart(r.name, r.in_flight_at_last_drain(), code, out_before_exit, t1 - t0,
                                    time.monotonic() - t1, t0 - t_start))
        t_back = time.monotonic()
        await asyncio.sleep(settle_s)
    finally:
        stop.set()
        load = await load_task
    t_end = time.monotonic()
    rolling = load.per_second(t_roll, t_back)
    return RollingReport(load, restarts, baseline_tps=load.tokens_per_second(t_start + 1.0, t_roll),
                         rolling_tps=load.tokens_per_second(t_roll, t_back),
                         after_tps=load.tokens_per_second(t_back, t_end - 0.5), min_second=min(rolling),
                         rolling_s=t_back - t_roll, per_second=load.per_second(t_start, t_end))


async def wait_up(haproxy: HAProxy, server: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if haproxy.status(server) == "UP":
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"haproxy did not mark {server} UP within {timeout:.0f} s: {haproxy.status(server)}")


def summary_rows(report: RollingReport) -> list[tuple[str, str]]:
    load = report.load
    dip = 1 - report.rolling_tps / report.baseline_tps if report.baseline_tps else 0.0
    drains = [r.drain_s for r in report.restarts]
    rejoins = [r.rejoin_s for r in report.restarts]
    return [
        ("streams sent", str(len(load.streams))),
        ("failed requests", str(len(load.failed))),
        ("truncated streams", str(len(load.truncated))),
        ("streams in flight at each SIGTERM", ", ".join(str(r.in_flight) for r in report.restarts)),
        ("replica exit codes", ", ".join(str(r.exit_code) for r in report.restarts)),
        ("out of rotation before exiting", ", ".join("yes" if r.out_before_exit else "no" for r in report.restarts)),
        ("drain (SIGTERM -> exit), median s", f"{statistics.median(drains):.2f}"),
        ("restart -> back in rotation, median s", f"{statistics.median(rejoins):.2f}"),
        ("throughput before, tok/s", f"{report.baseline_tps:.0f}"),
        (f"throughput while rolling ({report.rolling_s:.0f} s), tok/s", f"{report.rolling_tps:.0f}"),
        ("throughput after, tok/s", f"{report.after_tps:.0f}"),
        ("dip while rolling", f"{dip:.0%}"),
        ("slowest second while rolling, tok", str(report.min_second)),
    ]
