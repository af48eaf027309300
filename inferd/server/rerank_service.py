"""A reranker as the server runs it: a cross-encoder folder loaded into a Reranker, with the embedding models'
queue, thread and metrics (its pairs are batched across requests exactly as texts are for /v1/embeddings). It sits
in ServerState.embeddings beside them with kind "rerank": health, shutdown and /metrics treat it as one of them,
/v1/embeddings never picks it, /v1/rerank and /v1/score pick only it."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from inferd.engine.embedding_queue import EmbeddingQueue, EmbeddingWorker
from inferd.engine.llm_reranker import LLMReranker
from inferd.engine.reranker import Reranker
from inferd.model.cross_encoder import is_cross_encoder_folder, load_cross_encoder
from inferd.server.embedding_service import EmbeddingMetrics, EmbeddingService
from inferd.server.state import ServerState

log = logging.getLogger("inferd.server")


@dataclass
class RerankService(EmbeddingService):
    kind: ClassVar[str] = "rerank"

    def card(self) -> dict[str, Any]:
        m = self.embedder.model
        return {
            "id": self.name,
            "object": "model",
            "owned_by": "inferd",
            "type": "rerank",
            "max_model_len": m.max_seq_length,
            "labels": list(getattr(m, "labels", [])),
        }


def start_rerank_service(
    path: str,
    *,
    name: str | None,
    quantize: str | None,
    threads: int,
    max_batch_tokens: int,
    max_waiting: int,
    metrics: EmbeddingMetrics,
    watchdog: Callable[[], None] | None = None,
    engine_loop: Any = None,
) -> RerankService:
    """Loads the folder and builds the encoder (blocking: call it off the event loop); its queue's steps run on
    `engine_loop`'s thread when given, else on a thread of its own."""
    reranker = Reranker(load_cross_encoder(path, quantize=quantize), threads=threads, max_batch_tokens=max_batch_tokens)
    service_name = name or os.path.basename(os.path.normpath(path)).lower()
    queue = EmbeddingQueue(reranker, max_waiting=max_waiting, observer=metrics.observer(service_name))
    reranker.embed(reranker.tokenize_pairs([("warm", "up")]))  # first-touch page faults before the first request
    if engine_loop is not None:
        queue.wake = engine_loop.wake
        engine_loop.side_queues.append(queue)
        service = RerankService(service_name, reranker, queue)
    else:
        worker = EmbeddingWorker(queue, watchdog)
        service = RerankService(service_name, reranker, queue, worker)
        worker.start()
    metrics.services.append(service)
    return service


def is_reranker(path: str) -> bool:
    return is_cross_encoder_folder(path)


async def start_rerankers(state: ServerState) -> None:
    """Beside a chat model: the --rerank-model folder, and the chat model itself under --rerank-prompt."""
    if state.settings.rerank_model:
        await start_reranker(state, state.settings.rerank_model, None)
    if state.settings.rerank_prompt != "none":
        await start_chat_reranker(state)


async def start_reranker(state: ServerState, path: str, name: str | None) -> None:
    """Loads a cross-encoder and starts its queue (beside a chat model: on the engine loop's thread)."""
    from inferd.engine.engine import physical_cores

    s = state.settings
    metrics = state.embedding_metrics
    if metrics is None:
        metrics = state.embedding_metrics = EmbeddingMetrics(state.metrics)
    state.notifier.status(f"loading reranker {path}")
    service = await asyncio.get_running_loop().run_in_executor(
        None,
        lambda: start_rerank_service(
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
        "serving reranker %s: up to %d tokens per query and document", service.name, service.embedder.max_seq_length
    )


async def start_chat_reranker(state: ServerState) -> None:
    """The chat model reranks too (rerank_prompt = qwen3): its queue's steps run on the engine loop's thread,
    between the chat model's own steps."""
    s = state.settings
    metrics = state.embedding_metrics
    if metrics is None:
        metrics = state.embedding_metrics = EmbeddingMetrics(state.metrics)
    engine, loop = state.engine, state.engine_loop
    assert engine is not None and loop is not None  # started after the chat model's engine

    def start() -> RerankService:
        reranker = LLMReranker(
            engine,
            state.tokenizer,
            name=state.served_model_name,
            threads=engine.threads,
            max_batch_tokens=min(max(s.max_batch_tokens, 2048), state.max_model_len),
        )
        queue = EmbeddingQueue(reranker, max_waiting=s.max_waiting, observer=metrics.observer(state.served_model_name))
        reranker.embed(reranker.tokenize_pairs([("warm", "up")]))
        queue.wake = loop.wake
        loop.side_queues.append(queue)
        service = RerankService(  # the queue and the rerank handlers use only the interface it shares with Reranker
            state.served_model_name,
            reranker,  # type: ignore[arg-type]
            queue,
            aliases=frozenset(state.model_names()),
            listed=False,
        )
        metrics.services.append(service)
        return service

    service = await asyncio.get_running_loop().run_in_executor(None, start)
    state.embeddings.append(service)
    log.info(
        "the chat model reranks too: %s prompt, up to %d tokens per pair",
        s.rerank_prompt,
        service.embedder.max_seq_length,
    )
