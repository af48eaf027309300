"""Three `inferd serve` replicas behind HAProxy running the shipped config/haproxy/inferd.cfg (only its loopback
ports, socket and check interval changed): health checks take a draining or loading replica out of rotation,
`user` / X-Inferd-Affinity keep a user on one replica (and its prefix cache), and a rolling restart under
continuous streaming load fails no request and cuts no stream."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

from tests.ops.conftest import require
from tests.ops.load import rolling_restart, summary_rows, user_prompt
from tests.ops.procs import HAProxy, Replica, free_port, haproxy_config

# Quick checks (every 250 ms, 2 failures) so a test run stays short; drain_delay_s covers 2 intervals x 2.
CHECK_INTER = "250ms"
REPLICA_OPTIONS = ("--served-model-name", "tiny", "--threads", "1", "--num-kv-blocks", "64",
                   "--no-measure-bandwidth", "--no-log-requests", "--drain-delay-s", "1.5", "--drain-timeout-s", "30")


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory):
    require("haproxy")
    work = tmp_path_factory.mktemp("haproxy")
    replicas = [Replica(str(tiny_model), free_port(), work, *REPLICA_OPTIONS, name=f"r{i + 1}") for i in range(3)]
    socket_path = work / "stats.sock"
    lb_port = free_port()
    haproxy = HAProxy(haproxy_config(lb_port, [r.port for r in replicas], socket_path, free_port(), CHECK_INTER),
                      work, socket_path)
    try:
        for r in replicas:
            r.start()
        for r in replicas:
            r.wait_ready()
        haproxy.start()
        asyncio.run(wait_all_up(haproxy, [r.name for r in replicas]))
        yield replicas, haproxy, f"http://127.0.0.1:{lb_port}"
    finally:
        haproxy.stop()
        for r in replicas:
            r.stop()


async def wait_all_up(haproxy: HAProxy, names: list[str]) -> None:
    from tests.ops.load import wait_up
    for name in names:
        await wait_up(haproxy, name, 30)


def complete(url: str, user: str | None = None, header: str | None = None, conversation: int = 7) -> tuple[str, dict]:
    body = {"prompt": user_prompt(conversation, 0), "max_tokens": 2, "ignore_eos": True}
    if user is not None:
        body["user"] = user
    headers = {"Content-Type": "application/json"}
    if header is not None:
        headers["X-Inferd-Affinity"] = header
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.headers["X-Inferd-Replica"], json.loads(r.read())


def test_every_ready_replica_is_in_rotation(cluster):
    _, haproxy, url = cluster
    assert {name: row["status"] for name, row in haproxy.servers().items()} == {"r1": "UP", "r2": "UP", "r3": "UP"}
    # with neither a header nor a user, requests go round-robin: all three answer
    assert {complete(url)[0] for _ in range(6)} == {"r1", "r2", "r3"}


def test_a_user_stays_on_one_replica_and_finds_its_prefix_cached(cluster):
    url = cluster[2]
    answers = [complete(url, user="alice", conversation=1000) for _ in range(4)]
    assert len({replica for replica, _ in answers}) == 1
    # a prompt no replica has seen (but for the opening every prompt shares); sent again, it is found in the prefix
    # cache of the replica it stays on, all but its last token
    cached = [body["usage"]["prompt_tokens_details"]["cached_tokens"] for _, body in answers]
    prompt_tokens = answers[0][1]["usage"]["prompt_tokens"]
    assert cached[0] < 64 and cached[1:] == [prompt_tokens - 1] * 3
    # the header wins over the body's user, and pins just as well
    assert len({complete(url, user=f"u{i}", header="conversation-42")[0] for i in range(4)}) == 1
    # different users spread over the replicas
    assert len({complete(url, user=f"user-{i}")[0] for i in range(24)}) >= 2


def test_rolling_restart_under_streaming_load_loses_nothing(cluster):
    replicas, haproxy, url = cluster
    report = asyncio.run(rolling_restart(replicas, haproxy, url, concurrency=6, max_tokens=48, users=12,
                                         warmup_s=2.0, settle_s=1.5, drain_timeout_s=30))
    for name, value in summary_rows(report):
        print(f"{name}: {value}")
    load = report.load
    assert len(load.streams) >= 20
    assert [(s.status, s.error) for s in load.failed] == []
    assert [(s.replica, s.finish_reason, s.done, s.completion_tokens) for s in load.truncated] == []
    assert [r.exit_code for r in report.restarts] == [0, 0, 0]
    # the drain order: each replica left the rotation (health 503) while it was still finishing streams
    assert all(r.out_before_exit for r in report.restarts)
    # streams were running on the replicas when they were told to stop, and they all finished
    assert sum(r.in_flight for r in report.restarts) > 0
    assert {s.replica for s in load.streams} == {"r1", "r2", "r3"}
