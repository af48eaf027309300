"""Many models in one daemon: each model of the catalog (catalog.py) is loaded by the first request that names it,
unloaded when idle (idle_unload_s, Ollama's keep_alive) or evicted, least recently used first, when a load needs
its room in the memory budget.

Each loaded model is a ServerState of its own (chat_engine.py builds it): its engine, its scheduler thread and
engine loop, its metrics. A request holds its model for as long as it runs (`use`), so a model is only ever
unloaded while no request uses it. Loads and unloads run one at a time under one lock, so the budget is checked
against what is really loaded; a request for a model that is already loaded never waits for that lock.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

from inferd.config import DEFAULT_MODEL
from inferd.server.catalog import MIB, CatalogEntry, alias_table, build_catalog, memory_budget_bytes
from inferd.server.chat_engine import describe, start_chat, stop_chat
from inferd.server.protocol import ProtocolError
from inferd.server.state import STATE, ServerState

log = logging.getLogger("inferd.models")

REAP_INTERVAL_S = 0.25  # how often idle models are looked for (cheap: a pass over a small dict)
LOADED, LOADING, UNLOADED = "loaded", "loading", "unloaded"


@dataclass
class Managed:
    entry: CatalogEntry
    status: str = UNLOADED
    state: ServerState | None = None  # while loaded
    active: int = 0  # requests using the model now
    waiting: int = 0  # requests waiting for it to load
    last_used: float = 0.0  # time.monotonic() of the last request's end (or the load)
    loaded_at: float = 0.0  # time.time() of the load
    keep_alive_s: float | None = None  # the last Ollama keep_alive (seconds; negative: forever); None: idle_unload_s
    unload_when_idle: bool = False
    load_task: asyncio.Future[None] | None = None
    names: frozenset[str] = field(default_factory=frozenset)
    measured_bytes: int = 0  # what its last load took: its engine's weights + KV pool, or the process's growth

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def bytes(self) -> int:
        """What the model counts against the budget: its estimate (file bytes + KV pool), or what its last load
        was seen to take if that was more (weights converted at load, the tokenizer)."""
        return max(self.entry.estimate_bytes, self.measured_bytes)

    def idle_limit_s(self, default: float) -> float:
        """Seconds of idleness after which the model is unloaded (inf: never)."""
        if self.entry.spec.pinned:
            return math.inf
        limit = default if self.keep_alive_s is None else self.keep_alive_s
        return math.inf if limit < 0 or (limit == 0 and self.keep_alive_s is None) else limit


class ModelManager:
    def __init__(self, app_state: ServerState):
        self.app_state = app_state
        self.settings = app_state.settings
        self.models: dict[str, Managed] = {}
        self.aliases: dict[str, str] = {}
        self.budget_bytes = 0
        self.loads = 0  # loads done by this process
        self.lock = asyncio.Lock()
        self._reaper: asyncio.Task[None] | None = None

    # ---- start and stop -------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the catalog (a ConfigError says what is wrong), load the pinned models and the default one."""
        catalog = await asyncio.get_running_loop().run_in_executor(None, build_catalog, self.settings)
        if not catalog:
            raise ValueError(f"models_dir {self.settings.models_dir} holds no GGUF file or model folder")
        self.aliases = alias_table(self.settings, catalog)
        self.budget_bytes = memory_budget_bytes(self.settings)
        for name, entry in catalog.items():
            names = {name} | {a for a, target in self.aliases.items() if target == name}
            self.models[name] = Managed(entry, names=frozenset(names))
        log.info(
            "serving %d models (%s) within a memory budget of %d MiB",
            len(catalog),
            ", ".join(f"{n} ~{e.estimate_bytes // MIB} MiB" for n, e in catalog.items()),
            self.budget_bytes // MIB,
        )
        first = [m for m in self.models.values() if m.entry.spec.pinned]
        default = self.default_model()
        named = self.aliases.get(self.settings.model, self.settings.model)
        if self.settings.model != DEFAULT_MODEL and named not in self.models:
            log.warning("model %s is not one of the models served by name; it is not loaded", self.settings.model)
        if default is not None and default not in first:
            first.append(default)
        for m in first:
            await self.load(m)
        self._reaper = asyncio.create_task(self._reap())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        for m in self.models.values():
            if m.load_task is not None:
                await asyncio.gather(m.load_task, return_exceptions=True)
        async with self.lock:
            for m in self.models.values():
                if m.status == LOADED:
                    await self._unload(m, "shutting down")

    # ---- look-up --------------------------------------------------------------------------------------------

    def default_model(self) -> Managed | None:
        """The model of a request that names none: the `model` setting when it is one of ours, or the only one."""
        name = self.aliases.get(self.settings.model, self.settings.model)
        if name in self.models:
            return self.models[name]
        return next(iter(self.models.values())) if len(self.models) == 1 else None

    def lookup(self, name: str | None) -> Managed:
        """The model a request's `model` field names (a name, an alias, Ollama's `name:latest`, `name:ADAPTER`, whose
        adapter the handler checks); a 404 otherwise,
        whatever the name holds: it is never opened as a path."""
        if name is None or name == "":
            m = self.default_model()
            if m is None:
                raise ProtocolError(f"model is required; this server serves {self.listing()}", "model")
            return m
        base, colon, _ = name.partition(":")  # `name:latest` (Ollama's), or `name:ADAPTER` (the model's LoRA adapter)
        for candidate in (name, base if colon else None):
            if candidate is None:
                continue
            target = self.aliases.get(candidate, candidate)
            if target in self.models:
                return self.models[target]
        raise ProtocolError(
            f"The model `{name}` does not exist; this server serves {self.listing()}",
            "model",
            status=404,
            code="model_not_found",
        )

    def listing(self) -> str:
        return ", ".join(f"`{n}`" for n in self.models)

    # ---- requests -------------------------------------------------------------------------------------------

    @asynccontextmanager
    async def use(self, name: str | None, keep_alive_s: float | None = None) -> AsyncIterator[ServerState]:
        """The named model's state, loaded first if it is not; the model stays loaded until the block ends.
        keep_alive_s (Ollama's): how long it stays loaded once idle (0: unloaded at once; negative: forever)."""
        m = self.lookup(name)
        await self.wait_loaded(m)
        assert m.state is not None
        m.active += 1
        try:
            yield m.state
        finally:
            m.active -= 1
            m.last_used = time.monotonic()
            if keep_alive_s is not None:
                m.keep_alive_s = keep_alive_s
            if (keep_alive_s == 0 or m.unload_when_idle) and m.active == 0 and not m.entry.spec.pinned:
                asyncio.ensure_future(self.unload(m, "keep_alive 0" if keep_alive_s == 0 else "asked to"))

    async def wait_loaded(self, m: Managed) -> None:
        """Start the model's load unless it is loaded or loading, and wait for it (bounded: at most max_waiting
        requests wait, each at most model_load_timeout_s)."""
        if m.status == LOADED and not m.unload_when_idle:
            return
        m.unload_when_idle = False
        if m.waiting >= self.settings.max_waiting:
            raise ProtocolError(
                f"too many requests are waiting for `{m.name}` to load; retry shortly",
                status=503,
                code="queue_full",
                headers={"Retry-After": "5"},
            )
        task = self._load_task(m)
        m.waiting += 1
        try:
            await asyncio.wait_for(asyncio.shield(task), self.settings.model_load_timeout_s)
        except TimeoutError:
            raise ProtocolError(
                f"`{m.name}` is still loading after {self.settings.model_load_timeout_s:g} s; retry shortly",
                status=503,
                headers={"Retry-After": "5"},
            ) from None
        finally:
            m.waiting -= 1
        if m.status != LOADED:  # unloaded again before this request got it (keep_alive 0 of a request beside)
            await self.wait_loaded(m)

    async def load(self, m: Managed) -> None:
        await self._load_task(m)

    def _load_task(self, m: Managed) -> asyncio.Future[None]:
        if m.load_task is None or m.load_task.done():
            if m.status == UNLOADED:
                m.status = LOADING  # listed as loading from the first request on, also while earlier loads run
            m.load_task = asyncio.ensure_future(self._load(m))
            # a load nobody waits for any more (every waiter timed out) must not log "exception never retrieved"
            m.load_task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return m.load_task

    async def unload(self, m: Managed, reason: str) -> bool:
        """Unload `m` now if no request uses it (True), else once the last one ends (False)."""
        async with self.lock:
            if m.status != LOADED:
                return True
            if m.active:
                m.unload_when_idle = True
                return False
            await self._unload(m, reason)
            return True

    # ---- loading, unloading, eviction -----------------------------------------------------------------------

    def loaded_bytes(self, but: Managed | None = None) -> int:
        return sum(x.bytes for x in self.models.values() if x.status == LOADED and x is not but)

    async def _load(self, m: Managed) -> None:
        async with self.lock:
            if m.status == LOADED:
                return
            m.status = LOADING
            try:
                await self._make_room(m)
            except BaseException:
                m.status = UNLOADED
                raise
            started, rss_before = time.monotonic(), rss_bytes()
            child = ServerState(
                settings=m.entry.settings,
                notifier=self.app_state.notifier,
                status="ready",
                names=m.names,
                responses=self.app_state.responses,
            )
            try:
                model = await asyncio.get_running_loop().run_in_executor(None, self._read_model, m)
                await start_chat(child, model)
            except asyncio.CancelledError:
                await stop_chat(child)
                m.status = UNLOADED
                raise
            except Exception as e:
                await stop_chat(child)
                m.status = UNLOADED
                log.error("cannot load %s: %s", m.name, e)
                raise ProtocolError(
                    f"the model `{m.name}` failed to load: {e}", status=500, code="model_load_failed"
                ) from None
            child.served_model_name = m.name
            # what the engine holds, or what the process grew by when that is more (the tokenizer and template
            # beside the weights); the first load of a process also pays for imports and thread pools: not counted
            grew = rss_bytes() - rss_before if self.loads else 0
            m.measured_bytes = max(engine_bytes(child), grew)
            self.loads += 1
            m.state, m.status, m.last_used, m.loaded_at = child, LOADED, time.monotonic(), time.time()
            m.keep_alive_s, m.unload_when_idle = None, False
            log.info(
                "loaded %s in %.1f s, counted as %d MiB: %s",
                m.name,
                time.monotonic() - started,
                m.bytes // MIB,
                describe(child),
            )

    @staticmethod
    def _read_model(m: Managed):
        from inferd.model.loader import load_model

        s = m.entry.settings
        return load_model(m.entry.path, quantize=s.quantize or None, deferred_tokenizer=True)

    async def _make_room(self, m: Managed) -> None:
        """Unload idle models, least recently used first, until `m` fits the budget; a 4xx if it never can (it is
        larger than the budget less the pinned models), a 503 if the room is held by models in use."""
        need = m.bytes
        pinned = sum(x.bytes for x in self.models.values() if x.entry.spec.pinned and x is not m)
        if need > self.budget_bytes - pinned:
            held = f" ({pinned // MIB} MiB of it held by pinned models)" if pinned else ""
            raise ProtocolError(
                f"the model `{m.name}` needs about {need // MIB} MiB (weights {m.entry.weights_bytes // MIB} MiB + "
                f"KV cache {m.entry.kv_bytes // MIB} MiB), more than the memory budget of "
                f"{self.budget_bytes // MIB} MiB{held} (memory_budget_mib)",
                "model",
                status=400,
                code="model_too_large",
            )
        while self.loaded_bytes(but=m) + need > self.budget_bytes:
            idle = [
                x
                for x in self.models.values()
                if x.status == LOADED and x.active == 0 and not x.entry.spec.pinned and x is not m
            ]
            if not idle:
                busy = ", ".join(x.name for x in self.models.values() if x.status == LOADED and x is not m)
                raise ProtocolError(
                    f"the model `{m.name}` needs about {need // MIB} MiB and the memory budget of "
                    f"{self.budget_bytes // MIB} MiB is held by models in use ({busy}); retry shortly",
                    status=503,
                    headers={"Retry-After": "5"},
                )
            victim = min(idle, key=lambda x: x.last_used)
            await self._unload(victim, f"evicted for {m.name}")

    async def _unload(self, m: Managed, reason: str) -> None:
        """Under the lock, with no request using `m`."""
        state, m.state, m.status = m.state, None, UNLOADED
        m.unload_when_idle = False
        if state is not None:
            await stop_chat(state)
            state.metrics = None
        gc.collect()  # the engine's buffers go back to the OS now, not at some later collection
        log.info("unloaded %s (%s)", m.name, reason)

    async def _reap(self) -> None:
        """Unload models idle for longer than their limit (idle_unload_s, or their last keep_alive); feed the
        watchdog while no model is loaded."""
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            if not any(m.status == LOADED for m in self.models.values()):
                self.app_state.notifier.watchdog()  # no scheduler thread runs to feed systemd's watchdog
            now = time.monotonic()
            for m in list(self.models.values()):
                if m.status != LOADED or m.active:
                    continue
                limit = m.idle_limit_s(self.settings.idle_unload_s)
                if now - m.last_used >= limit:
                    await self.unload(m, f"idle for {limit:g} s")

    # ---- listings -------------------------------------------------------------------------------------------

    def card(self, m: Managed) -> dict[str, object]:
        """/v1/models' entry: OpenAI's fields, then the model's state and what it takes."""
        card: dict[str, object] = {
            "id": m.name,
            "object": "model",
            "created": self.app_state.created,
            "owned_by": "inferd",
            "state": m.status,
            "aliases": sorted(m.names - {m.name}),
            "pinned": m.entry.spec.pinned,
            "memory_mib": m.bytes // MIB,
        }
        if m.state is not None:
            card["max_model_len"] = m.state.max_model_len
            card["sampling_defaults"] = m.state.sampling_defaults.as_dict()
        return card

    def expires_at(self, m: Managed) -> float:
        """time.time() at which an idle `m` is unloaded (inf: never)."""
        limit = m.idle_limit_s(self.settings.idle_unload_s)
        return math.inf if math.isinf(limit) else time.time() + limit - (time.monotonic() - m.last_used)


def engine_bytes(state: ServerState) -> int:
    """What a loaded CPU engine holds: its repacked weights (more than the file where parts were converted) and
    its whole KV pool (its pages arrive as it fills); 0 where the engine does not say (CUDA)."""
    engine = state.engine
    weights = getattr(engine, "weight_bytes", 0)
    layout = getattr(engine, "kv_layout", None)
    if engine is None or not weights or layout is None:
        return 0
    return int(weights) + engine.num_kv_blocks * int(layout()["block_bytes"])


def rss_bytes() -> int:
    """This process's resident memory (0 where /proc cannot say)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


MODELS = web.AppKey("inferd_models", ModelManager)


def manager(app: web.Application) -> ModelManager | None:
    return app.get(MODELS)


@asynccontextmanager
async def use_model(
    app: web.Application, name: str | None, keep_alive_s: float | None = None
) -> AsyncIterator[ServerState]:
    """The state a request for model `name` runs against: the one model's (the handler checks the name), or, in a
    many-model daemon, the named model's, loaded on demand and held until the block ends."""
    models = manager(app)
    if models is None:
        yield app[STATE]
        return
    async with models.use(name, keep_alive_s) as state:
        yield state
