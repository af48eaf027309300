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
from inferd.engine.request import Request
from inferd.model.sampling_defaults import resolve as resolve_sampling
from inferd.server import routes
from inferd.server.cors import setup_cors
from inferd.server.middleware import auth_middleware, error_middleware, key_digest, lifecycle_middleware
from inferd.server.openapi_doc import OPENAPI, openapi, openapi_document
from inferd.server.prompt_cache import save_prompt_cache
from inferd.server.state import STATE, ServerState
from inferd.server.systemd import Notifier

if TYPE_CHECKING:
    from inferd.model.loader import LoadedModel

log = logging.getLogger("inferd.server")

# ---- plain endpoints ----------------------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = {"status": state.status}
    if state.engine_loop is not None and state.engine_loop.dead is not None:
        body = {"status": "failed", "error": f"the scheduler stopped: {state.engine_loop.dead!r}"}
        return web.json_response(body, status=503)
    for svc in state.embeddings:
        if svc.worker is not None and svc.worker.dead is not None:
            body = {"status": "failed", "error": f"the {svc.name} embedding worker stopped: {svc.worker.dead!r}"}
            return web.json_response(body, status=503)
    if state.status == "ready":
        return web.json_response(body)
    if state.failure:
        body["error"] = state.failure
    return web.json_response(body, status=503, headers={"Retry-After": "5"})


async def metrics(request: web.Request) -> web.Response:
    from inferd.server.metrics import CONTENT_TYPE

    state = request.app[STATE]
    if state.metrics is None and not state.embeddings:
        return web.Response(status=503, text="# the model is still loading\n", headers={"Retry-After": "5"})
    body = state.metrics.render() if state.metrics is not None else b""
    if state.embedding_metrics is not None:
        body += state.embedding_metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


# ---- start-up -----------------------------------------------------------------------------------------------


def load_model_from_settings(settings: Settings):
    from inferd.model.loader import load_model
    from inferd.model.pull import cache_dir, resolve

    path = resolve(settings.model, progress=False, cache=cache_dir(settings.model_cache_dir))
    # the tokenizer builds while the engine repacks the weights (start_serving reads it after build_engine)
    return load_model(path, quantize=settings.quantize or None, background_tokenizer=True)


async def start_serving(state: ServerState, load: Callable[[], LoadedModel] | None) -> None:
    from inferd.engine.device import build_engine
    from inferd.engine.loop import EngineLoop
    from inferd.engine.scheduler import Scheduler
    from inferd.server.lora import load_adapters
    from inferd.server.memory import pin_mmap_threshold
    from inferd.server.metrics import Metrics
    from inferd.server.prompt_cache import open_prompt_cache
    from inferd.text.chat import ChatTemplate

    loop = asyncio.get_running_loop()
    s = state.settings
    pin_mmap_threshold()  # before the model's big allocations: RSS must not creep up over months
    try:
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
        engine = await loop.run_in_executor(None, build_engine, model, s)
        state.engine = engine
        await load_adapters(state, engine, model)  # the lora_adapters setting's, before any request
        tok = await loop.run_in_executor(None, lambda: model.tokenizer)  # may still be building
        state.served_model_name = s.served_model_name or model.model_name
        state.sampling_defaults = resolve_sampling(s.generation_config, model.sampling, s.override_generation_config)
        state.chat_template = ChatTemplate(model.chat_template, tok.bos_token, tok.eos_token)
        if getattr(engine, "supports_token_masks", False):
            # the grammar vocabulary builds for the first constrained request (on the compiler's pool): ~0.6 s for
            # 150k tokens, all of it holding the GIL (llguidance), which would stall the event loop, the scheduler
            # and its watchdog pings wherever it ran; before ready it delayed /health, after it an idle server
            from inferd.text.grammar import GrammarCompiler

            state.grammar = GrammarCompiler(
                tok, engine.vocab_size, compile_timeout=s.grammar_compile_timeout_s, build_now=False
            )
        state.max_model_len = min(
            s.max_model_len or engine.context_length, engine.context_length, engine.num_kv_blocks * engine.block_size
        )
        scheduler = Scheduler(
            engine,
            max_running=s.max_running,
            max_model_len=state.max_model_len,
            enable_prefix_caching=s.enable_prefix_caching,
            speculative=s.speculative,
            max_prefill_while_decoding=s.max_prefill_while_decoding,
            max_step_latency_s=s.max_step_latency_ms / 1000 or None,
        )
        engine_loop = state.engine_loop = EngineLoop(
            engine,
            scheduler,
            tokenizer=tok,
            max_waiting=s.max_waiting,
            watchdog=state.notifier.watchdog,
            idle_wait_s=idle_wait(state.notifier),
        )
        await open_prompt_cache(state)
        engine_loop.start()
        await warm_up(state)
        metrics = state.metrics = Metrics(state.served_model_name, disk_cache=state.prompt_cache)
        metrics.bind(engine_loop)
        engine_loop.observer = metrics  # after the warm-up, which is not a user request
        if s.embedding_model:
            await start_embeddings(state, s.embedding_model, None)
        if s.rerank_model or s.rerank_prompt != "none":
            from inferd.server.rerank_service import start_rerankers

            await start_rerankers(state)
        if s.pooling != "none":
            await start_chat_embeddings(state)
        state.status = "ready"
        log.info(
            "serving %s: %d KV blocks (%d positions, %s), context %d, %d threads, %s kernels, sampling defaults %s",
            state.served_model_name,
            engine.num_kv_blocks,
            engine.num_kv_blocks * engine.block_size,
            getattr(engine, "kv_cache_dtype", "f16"),
            state.max_model_len,
            engine.threads,
            getattr(engine, "kernel_path", "?"),
            state.sampling_defaults.describe(),
        )
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
    """What no first request needs, done once ready when no request has been in flight for a moment (when_idle):
    the read-bandwidth probe (a few hundred ms of every thread, in C without the GIL; the bandwidth-ratio gauge
    reads 0 until it is done)."""
    from inferd import _cpu

    if state.settings.measure_bandwidth and state.metrics is not None and state.engine is not None:
        await when_idle(state)
        # the C probe, which reads the same kind of pages (huge) as the weights' stream
        threads = state.engine.threads
        bandwidth = await asyncio.get_running_loop().run_in_executor(
            None, _cpu.measure_read_bandwidth, 256 << 20, threads, 3
        )
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


def idle_wait(notifier: Notifier) -> float:
    # an idle scheduler still wakes often enough to ping the watchdog several times per interval
    interval = notifier.watchdog_interval_s
    return min(0.5, interval / 4) if interval else 0.5


async def warm_up(state: ServerState) -> None:
    """One tiny generation so the first user request does not pay for first-touch page faults."""
    ids = state.tokenizer.encode("Hello", add_special=True) or [0]
    handle = state.ready_loop.submit(Request("warmup", ids, max_tokens=1, detokenize=False))
    async for out in handle:
        if out.error_message:
            raise RuntimeError(f"warm-up generation failed: {out.error_message}")


def create_app(
    settings: Settings,
    *,
    api_keys: Sequence[str] = (),
    model=None,
    load: Callable[[], LoadedModel] | None = None,
    notifier: Notifier | None = None,
) -> web.Application:
    """`model`: an already loaded model (tests); otherwise `load()` (default: pull + load per settings)
    runs in a worker thread after the server starts listening."""
    app = web.Application(
        client_max_size=settings.max_body_bytes, middlewares=[error_middleware, auth_middleware, lifecycle_middleware]
    )
    state = ServerState(
        settings=settings,
        notifier=notifier or Notifier(),
        api_key_digests=[key_digest(k) for k in api_keys],
        model=model,
    )
    state.idle.set()
    app[STATE] = state
    app[OPENAPI] = openapi_document()
    routes.add_routes(app)
    setup_cors(app, settings.cors_allowed_origins)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    load = load or (lambda: load_model_from_settings(settings))

    async def lifecycle(app: web.Application):
        task = asyncio.create_task(start_serving(state, load))
        yield
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if state.engine_loop is not None:
            await save_prompt_cache(state)
            await asyncio.get_running_loop().run_in_executor(None, state.engine_loop.stop)
        for svc in state.embeddings:
            await asyncio.get_running_loop().run_in_executor(None, svc.stop)
        if state.grammar is not None:
            state.grammar.close()
            state.grammar = None
        # aiohttp caches each app's middleware chains in a module-level lru_cache (aiohttp.web_app), so a stopped
        # app can live on: let go of what is big here, so the engines' memory leaves with the server.
        state.engine = state.engine_loop = state.model = state.prompt_cache = state.scheduler_tasks = None
        state.embeddings = []
        if state.metrics is not None:
            state.metrics.engine_loop = None
        if state.embedding_metrics is not None:
            state.embedding_metrics.services = []

    app.cleanup_ctx.append(lifecycle)
    return app
