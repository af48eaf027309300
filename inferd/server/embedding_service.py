"""An embedding model as the server runs it: loaded from its folder, its queue, the thread that runs the queue's
steps, and its Prometheus metrics. Those are its own names under `inferd:embedding_*` (label model_name, in their
own registry appended to /metrics), and the shared request and token families every dashboard reads,
`inferd:request_success_total` (finished_reason stop / abort / error), `inferd:prompt_tokens_total`,
`inferd:e2e_request_latency_seconds` and `inferd:request_queue_time_seconds`, labelled with the embedding model's
name: the chat model's families when one is served (a family must appear once in /metrics), else families of the
same names in the embedding registry."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from inferd.engine.chat_embedder import ChatEmbedder
from inferd.engine.embedder import Embedder
from inferd.engine.embedding_queue import EmbeddingJob, EmbeddingQueue, EmbeddingWorker
from inferd.model.embedding_gguf import load_embedding
from inferd.server import metrics as chat_metrics

P = "inferd:"
LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
OUTCOME_REASON = {"finished": "stop", "aborted": "abort", "failed": "error"}  # request_success's finished_reason


class EmbeddingMetrics:
    def __init__(self, shared: chat_metrics.Metrics | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        if shared is not None:
            self.request_success: Counter = shared.request_success
            self.prompt_tokens: Counter = shared.prompt_tokens_family
            self.e2e: Histogram = shared.e2e_family
            self.request_queue_time: Histogram = shared.queue_time_family
        else:
            self.request_success = Counter(
                P + "request_success",
                "Finished requests by finish reason.",
                ["model_name", "finished_reason"],
                registry=r,
            )
            self.prompt_tokens = Counter(
                P + "prompt_tokens", "Prompt tokens of finished requests.", ["model_name"], registry=r
            )
            buckets = chat_metrics.LATENCY_BUCKETS
            self.e2e = Histogram(
                P + "e2e_request_latency_seconds", "Arrival to finish.", ["model_name"], buckets=buckets, registry=r
            )
            self.request_queue_time = Histogram(
                P + "request_queue_time_seconds",
                "Arrival to first scheduled step.",
                ["model_name"],
                buckets=buckets,
                registry=r,
            )
        self.requests = Counter(
            P + "embedding_requests",
            "Embedding requests by outcome (finished, aborted: the client went away, failed).",
            ["model_name", "status"],
            registry=r,
        )
        self.inputs = Counter(P + "embedding_inputs", "Inputs embedded.", ["model_name"], registry=r)
        self.tokens = Counter(
            P + "embedding_prompt_tokens", "Tokens of the inputs embedded.", ["model_name"], registry=r
        )
        self.latency = Histogram(
            P + "embedding_request_latency_seconds",
            "From queued to vectors ready.",
            ["model_name"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            P + "embedding_request_queue_time_seconds",
            "From queued to first encoded.",
            ["model_name"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.services: list[EmbeddingService] = []
        r.register(self)

    def observer(self, name: str) -> Callable[[EmbeddingJob, str], None]:
        for reason in OUTCOME_REASON.values():  # present from the start, so rate() works on the first request
            self.request_success.labels(name, reason)
        self.prompt_tokens.labels(name)

        def observe(job: EmbeddingJob, how: str) -> None:
            self.requests.labels(name, how).inc()
            self.request_success.labels(name, OUTCOME_REASON[how]).inc()
            if how == "finished":
                self.inputs.labels(name).inc(len(job.inputs))
                self.tokens.labels(name).inc(job.num_tokens)
                self.prompt_tokens.labels(name).inc(job.num_tokens)
                now = time.monotonic()
                self.latency.labels(name).observe(now - job.arrival)
                self.queue_time.labels(name).observe((job.first_step or now) - job.arrival)
                self.e2e.labels(name).observe(now - job.arrival)
                self.request_queue_time.labels(name).observe((job.first_step or now) - job.arrival)

        return observe

    def collect(self):  # state read at scrape time
        g = GaugeMetricFamily(
            P + "embedding_num_requests_waiting", "Embedding requests queued or being encoded.", labels=["model_name"]
        )
        for s in self.services:
            g.add_metric([s.name], len(s.queue.jobs))
        yield g

    def describe(self):
        return []

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class EmbeddingService:
    kind: ClassVar[str] = "embedding"  # "rerank": a cross-encoder's scores (server/rerank_service.py)
    name: str
    embedder: Embedder | ChatEmbedder
    queue: EmbeddingQueue
    worker: EmbeddingWorker | None = None  # None when a scheduler loop runs the queue's steps
    extra: dict[str, Any] = field(default_factory=dict)
    aliases: frozenset[str] = frozenset()  # other names a request's `model` may use (the chat model's)
    listed: bool = True  # its own entry in /v1/models (not for the chat model, which has one)

    def answers_to(self, name: str) -> bool:
        return name == self.name or name in self.aliases

    def card(self) -> dict[str, Any]:
        m = self.embedder.model
        return {
            "id": self.name,
            "object": "model",
            "owned_by": "inferd",
            "type": "embedding",
            "max_model_len": m.max_seq_length,
            "dimensions": m.dimensions,
            "matryoshka_dimensions": list(m.matryoshka_dims),
            "input_types": sorted(m.prompts),
        }

    def stop(self) -> None:
        """After the engine loop (if any) has stopped: fails whatever is still queued."""
        if self.worker is not None:
            self.worker.stop()
        self.queue.fail_all("the server is shutting down")


def start_embedding_service(
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
) -> EmbeddingService:
    """Loads the folder or GGUF file and builds the encoder (blocking: call it off the event loop). Its queue's
    steps run on `engine_loop`'s thread when given (beside a chat model), else on a thread of its own."""
    model = load_embedding(path, quantize=quantize)
    embedder = Embedder(model, threads=threads, max_batch_tokens=max_batch_tokens)
    service_name = name or model.name  # the folder's name, or the file's without .gguf
    queue = EmbeddingQueue(embedder, max_waiting=max_waiting, observer=metrics.observer(service_name))
    embedder.embed(embedder.tokenize(["warm up"]))  # first-touch page faults before the first user request
    if engine_loop is not None:
        queue.wake = engine_loop.wake
        engine_loop.side_queues.append(queue)
        service = EmbeddingService(service_name, embedder, queue)
    else:
        worker = EmbeddingWorker(queue, watchdog)
        service = EmbeddingService(service_name, embedder, queue, worker)
        worker.start()
    metrics.services.append(service)
    return service


def start_chat_embedding_service(
    engine: Any,
    tokenizer: Any,
    pooling: str,
    *,
    name: str,
    aliases: frozenset[str],
    threads: int,
    max_batch_tokens: int,
    max_waiting: int,
    metrics: EmbeddingMetrics,
    engine_loop: Any,
) -> EmbeddingService:
    """The chat model embedding too (the pooling setting): its queue's steps run on the engine loop's thread,
    between the chat model's own steps."""
    embedder = ChatEmbedder(engine, tokenizer, pooling, name=name, threads=threads, max_batch_tokens=max_batch_tokens)
    queue = EmbeddingQueue(embedder, max_waiting=max_waiting, observer=metrics.observer(name))
    embedder.embed(embedder.tokenize(["warm up"]))
    queue.wake = engine_loop.wake
    engine_loop.side_queues.append(queue)
    service = EmbeddingService(name, embedder, queue, aliases=aliases, listed=False)
    metrics.services.append(service)
    return service
