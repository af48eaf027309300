"""What the HTTP handlers share: settings, the loaded model, the scheduler, metrics, and lifecycle status."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from inferd.config import Settings
from inferd.server.systemd import Notifier


@dataclass
class ServerState:
    settings: Settings
    notifier: Notifier
    api_key_digests: list[bytes] = field(default_factory=list)  # sha256 of each accepted key
    status: str = "loading"  # loading -> ready -> draining; or failed
    # While draining, /health fails at once but requests are still served for drain_delay_s (a load
    # balancer is still sending some until its checks notice); then this turns False and they get 503.
    accepting: bool = True
    failure: str | None = None
    model: Any = None  # LoadedModel
    engine: Any = None
    engine_loop: Any = None  # EngineLoop
    metrics: Any = None  # Metrics
    chat_template: Any = None  # ChatTemplate
    grammar: Any = None  # GrammarCompiler (structured output, tool calls)
    responses: Any = None  # ResponseStore (the Responses API)
    served_model_name: str = ""
    max_model_len: int = 0
    created: int = field(default_factory=lambda: int(time.time()))
    system_fingerprint: str = "inferd"
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    ready_event: asyncio.Event = field(default_factory=asyncio.Event)  # set on ready or failed
    embeddings: list[Any] = field(default_factory=list)  # EmbeddingService: the embedding models served
    embedding_metrics: Any = None  # EmbeddingMetrics

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def model_names(self) -> set[str]:
        """Names a request's `model` field may use: the served name and the name it was started with."""
        return {self.served_model_name, self.settings.model}


STATE = web.AppKey("inferd_state", ServerState)
