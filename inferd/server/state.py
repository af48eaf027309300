"""What the HTTP handlers share: settings, the loaded model, the scheduler, metrics, and lifecycle status."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from aiohttp import web

from inferd.config import Settings
from inferd.server.protocol import ProtocolError
from inferd.server.systemd import Notifier

from inferd.model.sampling_defaults import LLAMA_CPP, SamplingDefaults

if TYPE_CHECKING:
    from inferd.engine.cuda_engine import CudaEngine
    from inferd.engine.engine import Engine
    from inferd.engine.loop import EngineLoop
    from inferd.model.loader import LoadedModel
    from inferd.server.apis.responses.store import ResponseStore
    from inferd.server.early_load import EarlyStart
    from inferd.server.embedding_service import EmbeddingMetrics, EmbeddingService
    from inferd.server.lora import ServedAdapter
    from inferd.server.metrics import Metrics
    from inferd.engine.prompt_cache_disk import DiskPromptCache
    from inferd.engine.scheduler_tasks import SchedulerTasks
    from inferd.text.chat import ChatTemplate
    from inferd.text.grammar import GrammarCompiler
    from inferd.text.tokenizer import Tokenizer


@dataclass
class ServerState:
    """The chat model's parts are None until start-up has built them (and again after shutdown); handlers run only
    in between (lifecycle_middleware), and read them through the `ready_*` properties."""

    settings: Settings
    notifier: Notifier
    api_key_digests: list[bytes] = field(default_factory=list)  # sha256 of each accepted key
    status: str = "loading"  # loading -> ready -> draining; or failed
    # While draining, /health fails at once but requests are still served for drain_delay_s (a load
    # balancer is still sending some until its checks notice); then this turns False and they get 503.
    accepting: bool = True
    failure: str | None = None
    model: LoadedModel | None = None
    early_start: EarlyStart | None = None  # the model's load and engine begun before the server's imports
    engine: Engine | CudaEngine | None = None
    engine_loop: EngineLoop | None = None
    metrics: Metrics | None = None
    chat_template: ChatTemplate | None = None
    grammar: GrammarCompiler | None = None  # structured output, tool calls
    responses: ResponseStore | None = None  # the Responses API's stored responses
    served_model_name: str = ""
    loras: dict[str, ServedAdapter] = field(default_factory=dict)  # the chat model's LoRA adapters by name
    max_model_len: int = 0
    sampling_defaults: SamplingDefaults = LLAMA_CPP  # for the fields a request leaves out
    created: int = field(default_factory=lambda: int(time.time()))
    system_fingerprint: str = "inferd"
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    ready_event: asyncio.Event = field(default_factory=asyncio.Event)  # set on ready or failed
    embeddings: list[EmbeddingService] = field(default_factory=list)  # the embedding models served
    embedding_metrics: EmbeddingMetrics | None = None
    prompt_cache: DiskPromptCache | None = None  # the prefix cache on disk (prompt_cache_disk_mib > 0)
    scheduler_tasks: SchedulerTasks | None = None  # calls on the scheduler thread (the prompt cache's)
    names: frozenset[str] = frozenset()  # a many-model daemon's model: its name and aliases (never its path)

    @property
    def tokenizer(self) -> Tokenizer:
        return _ready(self.model, "model").tokenizer

    @property
    def ready_loop(self) -> EngineLoop:
        return _ready(self.engine_loop, "engine loop")

    @property
    def ready_template(self) -> ChatTemplate:
        return _ready(self.chat_template, "chat template")

    def model_names(self) -> set[str]:
        """Names a request's `model` field may use: the served name and the name it was started with (one model of
        many: its name and aliases)."""
        if self.names:
            return set(self.names)
        return {self.served_model_name, self.settings.model}


T = TypeVar("T")


def _ready(part: T | None, name: str) -> T:
    if part is None:  # a handler ran before start-up built the chat model or after shutdown let it go
        raise ProtocolError(f"the chat model is not loaded ({name})", status=503, headers={"Retry-After": "5"})
    return part


STATE = web.AppKey("inferd_state", ServerState)
