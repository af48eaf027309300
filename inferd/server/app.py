"""The aiohttp application: routes, middlewares (middleware.py) and start-up/shutdown.

The app starts answering at once: /health says 503 while the model loads in a worker thread, then the
scheduler thread starts and the service reports READY=1 to systemd. Shutdown (cleanup_ctx) stops the
scheduler, which fails whatever is still in flight.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING
from collections.abc import Callable, Sequence

from aiohttp import web

from inferd.config import Settings
from inferd.server import routes
from inferd.server.chat_engine import describe as describe_chat
from inferd.server.chat_engine import start_chat, stop_chat
from inferd.server.cors import setup_cors
from inferd.server.early_load import EarlyStart, load_model_from_settings
from inferd.server.model_admin import ModelStates
from inferd.server.models import MODELS, ModelManager
from inferd.server.middleware import auth_middleware, error_middleware, key_digest, lifecycle_middleware
from inferd.server.openapi_doc import OPENAPI, openapi, openapi_document
from inferd.server.state import STATE, ServerState
from inferd.server.systemd import Notifier

if TYPE_CHECKING:
    from inferd.model.loader import LoadedModel

log = logging.getLogger("inferd.server")

# ---- plain endpoints ----------------------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body: dict[str, object] = {"status": state.status}
    if state.engine_loop is not None and state.engine_loop.dead is not None:
        body = {"status": "failed", "error": f"the scheduler stopped: {state.engine_loop.dead!r}"}
        return web.json_response(body, status=503)
    for svc in state.embeddings:
        if svc.worker is not None and svc.worker.dead is not None:
            body = {"status": "failed", "error": f"the {svc.name} embedding worker stopped: {svc.worker.dead!r}"}
            return web.json_response(body, status=503)
    models = request.app.get(MODELS)
    if models is not None:
        body["models"] = {m.name: m.status for m in models.models.values()}
        for m in models.models.values():
            loop = m.state.engine_loop if m.state is not None else None
            if loop is not None and loop.dead is not None:
                body |= {"status": "failed", "error": f"the scheduler of {m.name} stopped: {loop.dead!r}"}
                return web.json_response(body, status=503)
    if state.status == "ready":
        return web.json_response(body)
    if state.failure:
        body["error"] = state.failure
    return web.json_response(body, status=503, headers={"Retry-After": "5"})


async def metrics(request: web.Request) -> web.Response:
    from inferd.server.metrics import CONTENT_TYPE, render_many

    state = request.app[STATE]
    models = request.app.get(MODELS)
    if models is not None:
        loaded = [m.state.metrics for m in models.models.values() if m.state is not None and m.state.metrics]
        body = render_many(loaded, state.embedding_metrics, [ModelStates(models)])
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
    if state.metrics is None and not state.embeddings:
        return web.Response(status=503, text="# the model is still loading\n", headers={"Retry-After": "5"})
    body = state.metrics.render() if state.metrics is not None else b""
    if state.embedding_metrics is not None:
        body += state.embedding_metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


# ---- start-up -----------------------------------------------------------------------------------------------


async def start_serving(
    state: ServerState, load: Callable[[], LoadedModel] | None, models: ModelManager | None = None
) -> None:
    from inferd.server.memory import pin_mmap_threshold

    loop = asyncio.get_running_loop()
    s = state.settings
    pin_mmap_threshold()  # before the model's big allocations: RSS must not creep up over months
    try:
        if models is not None:  # many models: loaded on demand, the pinned and default ones now
            from inferd.server.apis.responses.store import ResponseStore

            state.responses = ResponseStore(s.responses_store_size, s.responses_ttl_s)  # one store for all models
            await models.start()
            if s.embedding_model:
                await start_embeddings(state, s.embedding_model, None)
            state.status = "ready"
            state.notifier.ready(f"serving {len(models.models)} models")
            return
        if state.model is None and is_embedding_folder(s.model):  # the folder decides: an embedding-only server
            from inferd.server import rerank_service

            start = rerank_service.start_reranker if rerank_service.is_reranker(s.model) else start_embeddings
            await start(state, s.model, s.served_model_name or None)
            state.status = "ready"
            state.notifier.ready(f"serving {state.embeddings[0].name}")
            return
        if s.device != "cpu":  # before the model load: a missing GPU should not cost a download first
            from inferd.engine.device import check_device

            await loop.run_in_executor(None, check_device, s.device)
        model = state.model
        if model is None:
            assert load is not None
            state.notifier.status(f"loading model {s.model}")
            model = await loop.run_in_executor(None, load)
            state.model = model
        await start_chat(state, model)
        if s.embedding_model:
            await start_embeddings(state, s.embedding_model, None)
        if s.rerank_model or s.rerank_prompt != "none":
            from inferd.server.rerank_service import start_rerankers

            await start_rerankers(state)
        if s.pooling != "none":
            await start_chat_embeddings(state)
        state.status = "ready"
        log.info("serving %s: %s", state.served_model_name, describe_chat(state))
        state.notifier.ready(f"serving {state.served_model_name}")
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a missing or corrupt model: say so plainly, keep /health answering
        state.status = "failed"
        state.failure = str(e) or type(e).__name__
        log.error("cannot serve: %s", state.failure)
        state.notifier.status(f"failed: {state.failure}")
    finally:
        state.ready_event.set()
    if state.status == "ready" and state.engine is not None:
        await after_ready(state)


async def after_ready(state: ServerState) -> None:
    """What no first request needs, done once ready: the weights' move into 2 MB pages (begun by the load on a
    low-priority thread of its own, ext/cpu/hugemem.c) is followed and logged, then, when no request has been in
    flight for a moment (when_idle), the read-bandwidth probe (a few hundred ms of every thread, in C without the
    GIL; the bandwidth-ratio gauge reads 0 until it is done), which so reads memory as the settled weights are."""
    from inferd import _cpu

    loop = asyncio.get_running_loop()

    def huge_pages() -> str | None:  # the CPU engine's weights; None for a GPU's
        return getattr(state.engine, "huge_pages", None)

    if huge_pages() is not None:
        while huge_pages() == "collapsing":  # polled: a shutdown meanwhile waits for nothing
            await asyncio.sleep(0.1)
        log.info("weights in 2 MB pages: %s", huge_pages())
    if state.settings.measure_bandwidth and state.metrics is not None and state.engine is not None:
        await when_idle(state)
        # the C probe, which reads the same kind of pages (huge) as the weights' stream
        threads = state.engine.threads
        bandwidth = await loop.run_in_executor(None, _cpu.measure_read_bandwidth, 256 << 20, threads, 3)
        state.metrics.read_bandwidth = bandwidth
        log.info("read bandwidth %.1f GB/s", bandwidth / 1e9)


async def when_idle(state: ServerState, quiet_s: float = 0.5) -> None:
    """Returns once no request is in flight, `quiet_s` after the last one ended (or after now)."""
    while True:
        await state.idle.wait()
        await asyncio.sleep(quiet_s)
        if state.in_flight == 0:
            return


async def start_embeddings(state: ServerState, path: str, name: str | None) -> None:
    """Loads an embedding model and starts its queue's thread (see server/embedding_service.py)."""
    from inferd.engine.engine import physical_cores
    from inferd.server.embedding_service import EmbeddingMetrics, start_embedding_service

    s = state.settings
    metrics = state.embedding_metrics
    if metrics is None:
        metrics = state.embedding_metrics = EmbeddingMetrics(state.metrics)
    state.notifier.status(f"loading embedding model {path}")
    service = await asyncio.get_running_loop().run_in_executor(
        None,
        lambda: start_embedding_service(
            path,
            name=name,
            quantize=s.quantize or None,
            threads=s.threads or physical_cores(),
            max_batch_tokens=max(s.max_batch_tokens, 2048),
            max_waiting=s.max_waiting,
            metrics=metrics,
            watchdog=state.notifier.watchdog,
            engine_loop=state.engine_loop,
        ),
    )
    state.embeddings.append(service)
    log.info(
        "serving embedding model %s: %d dimensions, up to %d tokens per input",
        service.name,
        service.embedder.dimensions,
        service.embedder.max_seq_length,
    )


async def start_chat_embeddings(state: ServerState) -> None:
    """The chat model answers /v1/embeddings too (pooling = last | mean)."""
    from inferd.server.embedding_service import EmbeddingMetrics, start_chat_embedding_service

    s = state.settings
    metrics = state.embedding_metrics
    if metrics is None:
        metrics = state.embedding_metrics = EmbeddingMetrics(state.metrics)
    engine, tokenizer = state.engine, state.tokenizer
    assert engine is not None  # started after the chat model's engine
    service = await asyncio.get_running_loop().run_in_executor(
        None,
        lambda: start_chat_embedding_service(
            engine,
            tokenizer,
            s.pooling,
            name=state.served_model_name,
            aliases=frozenset(state.model_names()),
            threads=engine.threads,
            max_batch_tokens=min(max(s.max_batch_tokens, 2048), state.max_model_len),
            max_waiting=s.max_waiting,
            metrics=metrics,
            engine_loop=state.engine_loop,
        ),
    )
    state.embeddings.append(service)
    log.info(
        "the chat model embeds too: %s pooling, up to %d tokens per input", s.pooling, service.embedder.max_seq_length
    )


def is_embedding_folder(path: str) -> bool:
    """An encoder to serve alone: a sentence-transformers folder, an embedding GGUF or a cross-encoder folder."""
    from inferd.model.embedding import is_embedding_folder as check
    from inferd.model.embedding_gguf import is_embedding_gguf

    from inferd.model.cross_encoder import is_cross_encoder_folder

    return check(path) or is_embedding_gguf(path) or is_cross_encoder_folder(path)


def create_app(
    settings: Settings,
    *,
    api_keys: Sequence[str] = (),
    model=None,
    load: Callable[[], LoadedModel] | None = None,
    notifier: Notifier | None = None,
    early: EarlyStart | None = None,
) -> web.Application:
    """`model`: an already loaded model (tests); otherwise `load()` (default: pull + load per settings)
    runs in a worker thread after the server starts listening; `early`: the model's load and engine already under
    way (server/early_load.py), which then stands in for both."""
    app = web.Application(
        client_max_size=settings.max_body_bytes, middlewares=[error_middleware, auth_middleware, lifecycle_middleware]
    )
    state = ServerState(
        settings=settings,
        notifier=notifier or Notifier(),
        api_key_digests=[key_digest(k) for k in api_keys],
        model=model,
        early_start=early,
    )
    state.idle.set()
    app[STATE] = state
    app[OPENAPI] = openapi_document()
    routes.add_routes(app)
    setup_cors(app, settings.cors_allowed_origins)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    load = load or (early.load if early is not None else lambda: load_model_from_settings(settings))
    models = ModelManager(state) if settings.many_models and model is None else None
    if models is not None:
        app[MODELS] = models

    async def lifecycle(app: web.Application):
        task = asyncio.create_task(start_serving(state, load, models))
        yield
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if models is not None:
            await models.close()
        await stop_chat(state)
        for svc in state.embeddings:
            await asyncio.get_running_loop().run_in_executor(None, svc.stop)
        # aiohttp caches each app's middleware chains in a module-level lru_cache (aiohttp.web_app), so a stopped
        # app can live on: let go of what is big here, so the engines' memory leaves with the server.
        state.embeddings = []
        if state.embedding_metrics is not None:
            state.embedding_metrics.services = []

    app.cleanup_ctx.append(lifecycle)
    return app
