"""Soak: many concurrent clients against the real model, with a fixed plan drawn from a fixed seed.

The plan mixes valid requests (chat and completions, streaming and not, n=1/2, list and token-id prompts,
stop strings, logprobs, echo, seeded and greedy sampling) with clients that go away mid-stream, requests
cancelled while they wait for their answer, over-long prompts, max_tokens above the limit and invalid bodies.
Greedy and seeded requests recur (streamed one time, not the next) and must return the same text every time.

After a warm-up (which touches every KV block, so first-touch page faults do not count as growth), the plan runs
in two equal halves. Then: every valid request got a complete, well-formed answer; every bad one got the
error it deserved and nothing got a 5xx; the server is healthy, holds no KV block and no request; no thread
was left behind; resident memory grew less than 5% over the second half; nothing was logged at ERROR.

Marked slow (`pytest -m slow`): short mode, a few hundred requests with small max_tokens; long mode: INFERD_SOAK=long
or --soak-long.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import logging
import random
import threading
import time
from dataclasses import dataclass, field

import aiohttp
import pytest

from tests.reliability.wire import CHAT, CMPL, check_response, check_stream
from tests.server.conftest import ServerThread, make_settings

SEED = 20261129
PLANS = {
    "short": dict(warmup=40, requests=400, concurrency=8, max_tokens=12),
    "long": dict(warmup=200, requests=3000, concurrency=16, max_tokens=40),
}
# 12 blocks of 64 positions: a few long-ish prompts fill it, so preemption and prefix-cache eviction happen.
SERVER = dict(num_kv_blocks=12, max_running=12, max_batch_tokens=256, max_prompt_tokens=256, max_tokens_limit=64,
              request_timeout_s=120.0, sse_keepalive_s=0.5)
MAX_TOKENS_LIMIT = SERVER["max_tokens_limit"]

WORDS = ("the of and to in is was for on that with as by at from they have this are not one had which you were "
         "all we when there can your their said each she do how if will up other about out many then them these "
         "some would make like him into time has look two more write go see number way could people than first "
         "water been call who its now find long down day did get come made may part over new sound take only "
         "little work know place year live back give most very after thing our just name good sentence man think "
         "say great where help through much before line right too mean old any same tell boy follow came want show "
         "also around form three small set put end does another well large must big even such because turn here "
         "why ask went men read need land different home move try kind hand picture again change off play spell "
         "air away animal house point page letter mother answer found study still learn should world high every "
         "near add food between own below country plant last school father keep tree never start city earth eye "
         "light thought head under story saw left few while along might close something seem next hard open "
         "example begin life always those both paper together got group often run important until children side "
         "feet car mile night walk white sea began grow took river four carry state once book hear stop without "
         "second later miss idea enough eat face watch far really almost let above girl sometimes mountain cut "
         "young talk soon list song being leave family").split()

INVALID = [   # (path, raw body, status, param) -- each must be refused, never a 5xx
    (CHAT, b"{not json", 400, None),
    (CHAT, b"", 400, None),
    (CHAT, b"[1, 2, 3]", 400, None),
    (CHAT, b'{"messages": "hello"}', 400, "messages"),
    (CHAT, b'{"messages": []}', 400, "messages"),
    (CHAT, b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "messages[0].role"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "temperature": 7}', 400, "temperature"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "n": 99}', 400, "n"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"x": 1}}', 400, "logit_bias"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "model": "no-such-model"}', 404, "model"),
    (CMPL, b'{"prompt": "x", "suffix": "y"}', 400, "suffix"),
    (CMPL, b'{"prompt": [1, "a"]}', 400, "prompt"),
    (CMPL, b'{"prompt": [99999999]}', 400, "prompt"),
    (CMPL, b'{"prompt": "x", "max_tokens": -3}', 400, "max_tokens"),
    (CMPL, b'{"max_tokens": 3}', 400, "prompt"),
    (CMPL, b'{"prompt": "\xff\xfe"}', 400, None),
]


@dataclass
class Item:
    kind: str              # valid | disconnect | cancel | too_long | over_limit | invalid
    path: str
    body: dict | None = None
    raw: bytes | None = None
    expect_status: int = 200
    expect_param: str | None = None
    after_events: int = 0      # disconnect: data events to read before going away
    cancel_after_s: float = 0.0


@dataclass
class Outcome:
    item: Item
    problem: str | None
    status: int | None = None
    texts: dict = field(default_factory=dict)
    cut_mid_stream: bool = False


# ---- the plan ------------------------------------------------------------------------------------------------

def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def sampling(rng: random.Random, body: dict, max_tokens: int, chat: bool) -> dict:
    key = "max_completion_tokens" if chat and rng.random() < 0.2 else "max_tokens"
    body[key] = rng.randint(1, max_tokens)
    r = rng.random()
    if r < 0.45:
        body["temperature"] = 0
    elif r < 0.8:
        body["temperature"] = rng.choice([0.7, 1.0, 1.3])
        body["seed"] = rng.randrange(1 << 31)
        if rng.random() < 0.4:
            body["top_p"] = 0.9
        if rng.random() < 0.3:
            body["top_k"] = 40
    # else: unseeded sampling, the server's defaults
    if rng.random() < 0.2:
        body["n"] = 2
    if rng.random() < 0.3:
        body["ignore_eos"] = True
    elif rng.random() < 0.2:
        body["stop"] = rng.choice([".", ["\n", " the"], "and"])
    if rng.random() < 0.15:
        body["presence_penalty"] = 0.5
    if rng.random() < 0.5:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    return body


def chat_body(rng: random.Random, systems: list[str], max_tokens: int) -> dict:
    messages = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": rng.choice(systems)})
    for turn in range(rng.choice([1, 1, 2])):
        if turn:
            messages.append({"role": "assistant", "content": words(rng, rng.randint(3, 15))})
        content = words(rng, rng.randint(2, 25))
        messages.append({"role": "user", "content": content if rng.random() < 0.8
                         else [{"type": "text", "text": content}]})
    body = sampling(rng, {"messages": messages}, max_tokens, chat=True)
    if rng.random() < 0.1:
        body["logprobs"] = True
        body["top_logprobs"] = rng.randint(0, 3)
    return body


def completion_body(rng: random.Random, systems: list[str], max_tokens: int) -> dict:
    r = rng.random()
    if r < 0.6:
        prompt = (rng.choice(systems) + " " if rng.random() < 0.4 else "") + words(rng, rng.randint(2, 40))
    elif r < 0.8:
        prompt = [words(rng, rng.randint(2, 20)) for _ in range(2)]
    else:
        prompt = [rng.randrange(100, 40000) for _ in range(rng.randint(1, 60))]
    body = sampling(rng, {"prompt": prompt}, max_tokens, chat=False)
    if rng.random() < 0.1:
        body["echo"] = True
    if rng.random() < 0.1:
        body["logprobs"] = rng.randint(0, 3)
    return body


def deterministic(body: dict) -> bool:
    return body.get("temperature") == 0 or body.get("seed") is not None


def make_plan(seed: int, count: int, max_tokens: int) -> list[Item]:
    rng = random.Random(seed)
    systems = [words(random.Random(seed + i), 70) for i in range(3)]   # shared prefixes: prefix-cache hits
    repeatable: list[tuple[str, dict]] = []
    plan: list[Item] = []
    for _ in range(count):
        r = rng.random()
        if r < 0.70:
            if repeatable and rng.random() < 0.25:   # the same greedy/seeded request again, other framing
                path, prev = rng.choice(repeatable)
                body = json.loads(json.dumps(prev))
                if body.pop("stream", False):
                    body.pop("stream_options", None)
                else:
                    body["stream"] = True
            else:
                path = CHAT if rng.random() < 0.5 else CMPL
                body = (chat_body if path == CHAT else completion_body)(rng, systems, max_tokens)
                if deterministic(body):
                    repeatable.append((path, body))
            plan.append(Item("valid", path, body))
        elif r < 0.78:
            body = {"prompt": words(rng, rng.randint(5, 30)), "max_tokens": MAX_TOKENS_LIMIT, "ignore_eos": True,
                    "stream": True}
            plan.append(Item("disconnect", CMPL, body, after_events=rng.randint(1, 4)))
        elif r < 0.85:
            path = rng.choice([CHAT, CMPL])
            body = ({"messages": [{"role": "user", "content": words(rng, 10)}]} if path == CHAT
                    else {"prompt": words(rng, 10)})
            body.update(max_tokens=MAX_TOKENS_LIMIT, ignore_eos=True)
            plan.append(Item("cancel", path, body, cancel_after_s=rng.uniform(0.15, 0.6)))
        elif r < 0.90:
            text = words(rng, 420)   # > 256 prompt tokens
            if rng.random() < 0.5:
                plan.append(Item("too_long", CMPL, {"prompt": text, "max_tokens": 4}, expect_status=400,
                                 expect_param="prompt"))
            else:
                plan.append(Item("too_long", CHAT, {"messages": [{"role": "user", "content": text}],
                                                    "max_tokens": 4, "stream": rng.random() < 0.5},
                                 expect_status=400, expect_param="messages"))
        elif r < 0.93:
            plan.append(Item("over_limit", CMPL, {"prompt": words(rng, 5),
                                                  "max_tokens": MAX_TOKENS_LIMIT + rng.randint(1, 5000)},
                             expect_status=400, expect_param="max_tokens"))
        else:
            path, raw, status, param = rng.choice(INVALID)
            plan.append(Item("invalid", path, raw=raw, expect_status=status, expect_param=param))
    return plan


# ---- running it ------------------------------------------------------------------------------------------------

async def run_item(session: aiohttp.ClientSession, base: str, item: Item) -> Outcome:
    url = base + item.path
    data = item.raw if item.raw is not None else json.dumps(item.body).encode()
    headers = {"Content-Type": "application/json"}
    if item.kind == "cancel":
        async def call():
            async with session.post(url, data=data, headers=headers) as r:
                return r.status, await r.read()
        task = asyncio.ensure_future(call())
        done, _ = await asyncio.wait([task], timeout=item.cancel_after_s)
        if done:   # answered before we gave up on it: still must be a good answer
            status, raw = task.result()
            problem, _ = check_response(item.path, item.body, status, json.loads(raw))
            return Outcome(item, problem, status)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return Outcome(item, None, cut_mid_stream=True)
    async with session.post(url, data=data, headers=headers) as r:
        if item.kind == "disconnect":
            if r.status != 200:
                return Outcome(item, f"status {r.status}", r.status)
            seen = 0
            while seen < item.after_events:
                line = await r.content.readline()
                if not line:
                    return Outcome(item, "stream ended before the client went away", r.status)
                if line.startswith(b"data: "):
                    if line.strip() == b"data: [DONE]":
                        return Outcome(item, None, r.status)
                    seen += 1
            r.close()   # go away mid-stream: the connection is dropped, not returned to the pool
            return Outcome(item, None, r.status, cut_mid_stream=True)
        raw = await r.read()
        status = r.status
    if item.kind == "valid":
        if item.body.get("stream"):
            problem, texts = check_stream(item.path, item.body, status, raw)
        else:
            try:
                payload = json.loads(raw)
            except ValueError:
                return Outcome(item, f"status {status}, body not JSON: {raw[:200]!r}", status)
            problem, texts = check_response(item.path, item.body, status, payload)
        return Outcome(item, problem, status, texts)
    # refusals: the right status, the OpenAI envelope, the offending parameter named
    try:
        err = json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        return Outcome(item, f"status {status}, no error envelope: {raw[:200]!r}", status)
    if status != item.expect_status:
        return Outcome(item, f"status {status} (expected {item.expect_status}): {err}", status)
    if set(err) != {"message", "type", "param", "code"} or not err["message"]:
        return Outcome(item, f"bad error envelope {err}", status)
    if item.expect_param is not None and err["param"] != item.expect_param:
        return Outcome(item, f"param {err['param']!r} (expected {item.expect_param!r}): {err['message']}", status)
    if item.kind == "too_long" and err["code"] != "context_length_exceeded":
        return Outcome(item, f"code {err['code']!r} for an over-long prompt", status)
    return Outcome(item, None, status)


async def run_plan(base: str, plan: list[Item], concurrency: int, timeout_s: float) -> list[Outcome]:
    queue = collections.deque(plan)
    outcomes: list[Outcome] = []

    async def worker():
        connector = aiohttp.TCPConnector(limit=4)
        async with aiohttp.ClientSession(connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            while queue:
                item = queue.popleft()
                try:
                    outcomes.append(await run_item(session, base, item))
                except TimeoutError:
                    outcomes.append(Outcome(item, f"no answer within {timeout_s} s"))
                except aiohttp.ClientError as e:
                    outcomes.append(Outcome(item, f"{type(e).__name__}: {e}"))
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcomes


def warmup_plan(seed: int, count: int, max_tokens: int) -> list[Item]:
    """The plan's own mix, plus what touches every preallocated buffer once before memory is measured: a dozen
    distinct ~220-token prompts (more KV blocks than the cache holds) and prompt scoring with echo + logprobs
    (a logits row per prompt token: 256 rows x 49152 floats, 48 MiB, paged in on first use)."""
    rng = random.Random(seed)
    fill = [Item("valid", CMPL, {"prompt": words(rng, 200), "max_tokens": 2, "temperature": 0})
            for _ in range(12)]
    fill += [Item("valid", CMPL, {"prompt": [rng.randrange(100, 40000) for _ in range(250)], "max_tokens": 1,
                                  "echo": True, "logprobs": 5, "temperature": 0}),
             Item("valid", CHAT, {"messages": [{"role": "user", "content": words(rng, 20)}], "max_tokens": 4,
                                  "logprobs": True, "top_logprobs": 20, "n": 2, "stream": True})]
    return fill + make_plan(seed + 1, count, max_tokens)


def rss_bytes() -> int:
    gc.collect()
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class ErrorLog(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record):
        self.records.append(f"{record.name}: {record.getMessage()}")


def summarize(outcomes: list[Outcome]) -> dict[str, collections.Counter]:
    table: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for o in outcomes:
        k = o.item.kind
        if k == "valid":
            k = f"valid {'chat' if o.item.path == CHAT else 'completion'} " \
                f"{'stream' if o.item.body.get('stream') else 'plain'}"
        table[k]["sent"] += 1
        table[k]["problems" if o.problem else "ok"] += 1
        if o.cut_mid_stream:
            table[k]["cut by the client"] += 1
    return table


@pytest.mark.slow   # minutes of mixed traffic; `pytest -m slow` (and --soak-long for the long plan)
def test_soak(loaded_model, soak_mode):
    cfg = PLANS[soak_mode]
    t_start = time.monotonic()
    threads_before = set(threading.enumerate())
    errors = ErrorLog()
    logging.getLogger().addHandler(errors)
    srv = ServerThread(make_settings(**SERVER), loaded_model).start()
    try:
        base = srv.url
        timeout = 300.0 if soak_mode == "long" else 90.0
        warm = asyncio.run(run_plan(base, warmup_plan(SEED - 1, cfg["warmup"], cfg["max_tokens"]),
                                    cfg["concurrency"], timeout))
        srv.wait_idle(30)
        rss_warm = rss_bytes()
        plan = make_plan(SEED, cfg["requests"], cfg["max_tokens"])
        half = len(plan) // 2
        first = asyncio.run(run_plan(base, plan[:half], cfg["concurrency"], timeout))
        srv.wait_idle(30)
        rss_mid = rss_bytes()
        threads_mid = set(threading.enumerate())
        second = asyncio.run(run_plan(base, plan[half:], cfg["concurrency"], timeout))
        srv.wait_idle(30)
        rss_end = rss_bytes()
        threads_end = set(threading.enumerate())
        outcomes = first + second

        # --- every request answered as it should be
        table = summarize(outcomes)
        lines = [f"soak ({soak_mode}): {len(outcomes)} requests after a warm-up of {len(warm)}, "
                 f"{cfg['concurrency']} clients, {time.monotonic() - t_start:.0f} s"]
        lines += [f"  {kind:28s} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
                  for kind, c in sorted(table.items())]
        lines.append(f"  RSS: after warm-up {rss_warm >> 20} MiB, middle {rss_mid >> 20} MiB, end {rss_end >> 20} MiB; "
                     f"{srv.state.engine_loop.scheduler.num_preemptions} preemptions, "
                     f"{srv.state.engine_loop.num_steps} steps")
        print("\n".join(lines))
        problems = [f"{o.item.kind} {o.item.path} {json.dumps(o.item.body)[:160] if o.item.body else o.item.raw!r}"
                    f" -> {o.problem}" for o in warm + outcomes if o.problem]
        assert not problems, f"{len(problems)} bad answers:\n" + "\n".join(problems[:20])
        assert len(outcomes) == cfg["requests"]

        # --- greedy and seeded requests gave the same text every time they ran (streamed or not)
        groups: dict[str, list[dict]] = collections.defaultdict(list)
        for o in outcomes:
            if o.item.kind == "valid" and deterministic(o.item.body):
                key = {k: v for k, v in o.item.body.items() if k not in ("stream", "stream_options")}
                groups[o.item.path + json.dumps(key, sort_keys=True)].append(o.texts)
        repeated = [g for g in groups.values() if len(g) > 1]
        assert repeated, "the plan should repeat some deterministic requests"
        for g in repeated:
            assert all(t == g[0] for t in g), f"the same deterministic request gave different texts: {g}"

        # --- the server is healthy and holds nothing
        engine_loop = srv.state.engine_loop
        assert engine_loop.dead is None
        kv = engine_loop.scheduler.kv.stats()
        assert (kv.num_used, kv.num_free) == (0, kv.num_blocks), kv
        assert engine_loop.num_running == engine_loop.num_waiting == 0 and not engine_loop.scheduler.requests
        assert srv.metric("inferd:kv_cache_usage_perc") == 0.0
        assert srv.metric("inferd:num_requests_running") == 0.0
        assert srv.metric("inferd:num_requests_waiting") == 0.0
        cut = sum(1 for o in outcomes if o.cut_mid_stream)
        # a client that leaves before its request reached the handler, or just as its answer ended, is not
        # counted: hence the slack
        assert srv.metric("inferd:http_requests_client_disconnected_total") >= 0.5 * cut
        import urllib.request
        with urllib.request.urlopen(base + "/health", timeout=10) as r:
            assert r.status == 200 and json.loads(r.read()) == {"status": "ready"}
        final = asyncio.run(run_plan(base, [Item("valid", CHAT, {"messages": [{"role": "user", "content": "Hi"}],
                                                                "max_tokens": 3, "temperature": 0})], 1, 60))
        assert final[0].problem is None, final[0].problem

        # --- no growth in the second half
        assert threads_end == threads_mid, f"threads came and stayed: {threads_end ^ threads_mid}"
        assert rss_end - rss_mid < 0.05 * rss_mid, \
            f"RSS grew {(rss_end - rss_mid) >> 20} MiB over the second half ({rss_mid >> 20} -> {rss_end >> 20} MiB)"
        assert not errors.records, "logged at ERROR:\n" + "\n".join(errors.records[:20])
    finally:
        logging.getLogger().removeHandler(errors)
        srv.stop()

    # --- after shutdown, every thread the server started is gone
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        leaked = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        if not leaked:
            break
        time.sleep(0.05)
    assert not leaked, f"threads left after the server stopped: {[t.name for t in leaked]}"
