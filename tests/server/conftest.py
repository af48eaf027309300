"""Server fixtures: the real model and engine behind a real aiohttp server on a free port.

Each server runs its own event loop in a background thread, so tests can use the synchronous openai
client, the async one, raw aiohttp and plain sockets against it alike. The model is loaded once per
session; every server builds its own Engine from it (cheap), so servers with special settings (API keys,
tiny limits) can run beside the shared one.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from aiohttp import web

from inferd.config import Settings
from inferd.server.app import create_app
from inferd.server.state import STATE

# 128 blocks = 8192 positions: the model's whole context fits, and tests stay around 200 MB of KV cache.
# The prompt cache on disk is off: a server must not start with blocks another test's server left behind.
BASE = dict(port=0, num_kv_blocks=128, max_batch_tokens=256, max_running=16, measure_bandwidth=False,
            sse_keepalive_s=15.0, prompt_cache_disk_mib=0)


@pytest.fixture(scope="session")
def model_path(request):
    return os.environ.get("INFERD_TEST_MODEL") or str(request.getfixturevalue("smollm2_path"))


@pytest.fixture(scope="session")
def loaded_model(request, model_path):
    if not os.environ.get("INFERD_TEST_MODEL"):
        return request.getfixturevalue("smollm2_model")   # the session's one SmolLM2
    from inferd.model.loader import load_model
    return load_model(model_path)


class ServerThread:
    def __init__(self, settings: Settings, model=None, *, api_keys=(), load=None, notifier=None, early=None):
        self.settings = settings
        self.app = create_app(settings, api_keys=list(api_keys), model=model, load=load, notifier=notifier,
                              early=early)
        self.state = self.app[STATE]
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-server", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as e:   # surfaces in start()
            self._error = e
            self._started.set()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self.runner = web.AppRunner(self.app, handler_cancellation=True, shutdown_timeout=2)
        await self.runner.setup()
        self.site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await self.site.start()
        self.port = self.site.port
        self._started.set()
        await self._stop.wait()
        await self.runner.cleanup()

    def start(self, wait_ready: bool = True) -> ServerThread:
        self.thread.start()
        self._started.wait(30)
        if self._error:
            raise self._error
        if wait_ready:
            self.call(self.state.ready_event.wait(), timeout=120)
            assert self.state.status == "ready", self.state.failure
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def use_template(self, source: str) -> ServerThread:
        """Serve `source` as the model's chat template (one that thinks aloud, that knows tools, ...)."""
        from inferd.text.chat import ChatTemplate
        tok = self.state.tokenizer
        self.state.chat_template = ChatTemplate(source, tok.bos_token, tok.eos_token)
        return self

    def call(self, coro, timeout: float = 30):
        """Run a coroutine on the server's loop (to read or change server state safely)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self._stop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(30)
        self.loop.close()

    def metrics(self) -> dict[tuple, float]:
        """/metrics parsed by prometheus-client's own parser: {(sample name, (label pairs...)): value}."""
        import urllib.request
        from prometheus_client.parser import text_string_to_metric_families
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    def metric(self, name: str, **labels) -> float:
        labels.setdefault("model_name", self.state.served_model_name)
        return self.metrics()[(name, tuple(sorted(labels.items())))]

    # ---- state helpers (read from the test thread; plain ints, safe under the GIL) -----------------------

    def kv_used(self) -> int:
        return self.state.engine_loop.scheduler.kv.stats().num_used

    def wait_idle(self, timeout: float = 20.0) -> None:
        """Until nothing runs, waits or holds a KV block (aborts are handled a step later)."""
        import time
        s = self.state.engine_loop
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if s.num_running == 0 and s.num_waiting == 0 and self.kv_used() == 0:
                return
            time.sleep(0.02)
        raise AssertionError(f"not idle: running={s.num_running} waiting={s.num_waiting} kv_used={self.kv_used()}")


def with_template(srv: ServerThread, source: str) -> ServerThread:
    """`srv`, rendering chats with the template `source` instead of its model's (a started server)."""
    from inferd.text.chat import ChatTemplate
    tok = srv.state.tokenizer
    srv.state.chat_template = ChatTemplate(source, tok.bos_token, tok.eos_token)
    return srv


def make_settings(**overrides) -> Settings:
    return Settings(**{**BASE, **overrides})


@pytest.fixture(scope="module")
def server(loaded_model):
    srv = ServerThread(make_settings(), loaded_model).start()
    yield srv
    srv.stop()


@pytest.fixture
def make_server(loaded_model):
    """Start extra servers with their own settings; stopped after the test."""
    started = []

    def make(model=loaded_model, wait_ready=True, **kw):
        api_keys = kw.pop("api_keys", ())
        load = kw.pop("load", None)
        notifier = kw.pop("notifier", None)
        srv = ServerThread(make_settings(**kw), model, api_keys=api_keys, load=load, notifier=notifier)
        started.append(srv)
        return srv.start(wait_ready)
    yield make
    for srv in started:
        srv.stop()


@pytest.fixture
def model_name(server):
    return server.state.served_model_name
