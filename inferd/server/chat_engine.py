"""A chat model's serving parts, built into a ServerState from a loaded model and let go again: its engine, the
scheduler and the engine loop's thread, chat template, grammar compiler, sampling defaults, prompt cache on disk
and metrics. The single-model daemon builds them once at start-up; a many-model daemon (models.py) once per load,
into each model's own state."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from inferd.engine.request import Request
from inferd.model.sampling_defaults import resolve as resolve_sampling
from inferd.server.prompt_cache_files import open_prompt_cache, save_prompt_cache
from inferd.server.state import ServerState
from inferd.server.systemd import Notifier

if TYPE_CHECKING:
    from inferd.model.loader import LoadedModel

log = logging.getLogger("inferd.server")


async def start_chat(state: ServerState, model: LoadedModel) -> None:
    """Engine, scheduler thread, warm-up and metrics for `model`, per `state.settings`; `state.model` is set."""
    from inferd.engine.device import build_engine
    from inferd.engine.loop import EngineLoop
    from inferd.engine.scheduler import Scheduler
    from inferd.server.lora import load_adapters
    from inferd.server.metrics import Metrics
    from inferd.text.chat import ChatTemplate

    loop = asyncio.get_running_loop()
    s = state.settings
    state.model = model
    early, state.early_start = state.early_start, None  # its engine is this model's only, and only once

    def engine_of_model():
        engine = early.engine_for(model) if early is not None else None
        return engine if engine is not None else build_engine(model, s, huge_pages_now=False)

    building = loop.run_in_executor(None, engine_of_model)
    building.add_done_callback(lambda f: f.cancelled() or f.exception())  # its error is awaited below, or moot
    # the tokenizer (may still be building) and the chat template while the weights repack, in C without the GIL
    tok = await loop.run_in_executor(None, lambda: model.tokenizer)
    state.served_model_name = s.served_model_name or model.model_name
    state.sampling_defaults = resolve_sampling(s.generation_config, model.sampling, s.override_generation_config)
    state.chat_template = ChatTemplate(model.chat_template, tok.bos_token, tok.eos_token)
    engine = state.engine = await building
    await load_adapters(state, engine, model)  # the lora_adapters setting's, before any request
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
        step_latency_factor=s.step_latency_factor or None,
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
    if hasattr(engine, "start_huge_pages"):  # off the path to ready: see _cpu.Model.start_huge_pages
        engine.start_huge_pages()
    metrics = state.metrics = Metrics(state.served_model_name, disk_cache=state.prompt_cache)
    metrics.bind(engine_loop)
    engine_loop.observer = metrics  # after the warm-up, which is not a user request


async def stop_chat(state: ServerState) -> None:
    """Save the prompt cache, stop the scheduler thread (failing what is still in flight) and let go of the
    model's memory."""
    if state.engine_loop is not None:
        await save_prompt_cache(state)
        await asyncio.get_running_loop().run_in_executor(None, state.engine_loop.stop)
    if state.grammar is not None:
        state.grammar.close()
        state.grammar = None
    state.engine = state.engine_loop = state.model = state.prompt_cache = state.scheduler_tasks = None
    state.chat_template = None
    if state.metrics is not None:
        state.metrics.engine_loop = None


def describe(state: ServerState) -> str:
    engine = state.engine
    assert engine is not None
    return (
        f"{engine.num_kv_blocks} KV blocks ({engine.num_kv_blocks * engine.block_size} positions, "
        f"{getattr(engine, 'kv_cache_dtype', 'f16')}), context {state.max_model_len}, {engine.threads} threads, "
        f"{getattr(engine, 'kernel_path', '?')} kernels, sampling defaults {state.sampling_defaults.describe()}"
    )


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
