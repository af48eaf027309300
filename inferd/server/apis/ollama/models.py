"""Ollama's routes that do not generate: the models (/api/tags, /api/show, /api/ps), /api/version, and the
liveness answer at / that clients probe before anything else. Models answer to their served name and its
`name:latest` form; a model that is not here is a 404 in Ollama's envelope."""

from __future__ import annotations

import collections
import hashlib
from datetime import datetime, timedelta, UTC
from pathlib import Path
from typing import Any

from aiohttp import web
from msgspec import Struct

from inferd.server.apis.ollama.request import base_name
from inferd.server.embedding_service import EmbeddingService
from inferd.server.models import ModelManager, manager, use_model
from inferd.server.protocol import ProtocolError, decode
from inferd.server.sse import json_response
from inferd.server.state import STATE, ServerState
from inferd.text.fim import fim_token_ids
from inferd.text.reasoning import detect_reasoning

OLLAMA_VERSION = "0.12.0"  # the Ollama release whose API this follows (clients check it for features)
LIVENESS = "Ollama is running"  # what Ollama answers at /, and clients look for


class Details(Struct):
    format: str
    family: str
    families: list[str]
    parameter_size: str
    quantization_level: str
    parent_model: str = ""


class ModelEntry(Struct):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: Details


class RunningModel(Struct):
    name: str
    model: str
    size: int
    digest: str
    details: Details
    expires_at: str
    size_vram: int
    context_length: int


class ShowRequest(Struct, kw_only=True, forbid_unknown_fields=False):
    model: str | None = None
    name: str | None = None  # the field's older name
    verbose: bool = False


def tag(name: str) -> str:
    """The name as Ollama lists it: with its tag, `latest` unless it has one."""
    return name if ":" in name else f"{name}:latest"


def human_count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


class Described:
    """One model as Ollama's listings show it: its file's size, time and identity, and its details."""

    def __init__(self, name: str, path: str, arch: str, params: int, quant: str, context: int):
        self.name, self.path, self.arch, self.params, self.quant, self.context = (
            name,
            path,
            arch,
            params,
            quant,
            context,
        )
        p = Path(path)
        files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()] if p.is_dir() else []
        self.size = sum(f.stat().st_size for f in files)
        mtime = max((f.stat().st_mtime for f in files), default=0.0)
        self.modified_at = datetime.fromtimestamp(mtime, UTC).isoformat().replace("+00:00", "Z")
        # an identity of the file (path, size, time), not a hash of its bytes: hashing gigabytes per listing is not
        # worth what clients do with it (tell models apart, notice a change)
        self.digest = hashlib.sha256(f"{path}\0{self.size}\0{mtime}".encode()).hexdigest()

    def details(self) -> Details:
        fmt = "gguf" if self.path.endswith(".gguf") else "safetensors"
        return Details(fmt, self.arch, [self.arch], human_count(self.params), self.quant)

    def entry(self) -> ModelEntry:
        return ModelEntry(tag(self.name), tag(self.name), self.modified_at, self.size, self.digest, self.details())


def chat_model(state: ServerState) -> Described | None:
    m = state.model
    if m is None:
        return None
    by_type: collections.Counter[str] = collections.Counter()
    for t in m.tensors.values():
        by_type[t.type] += t.rows * t.cols
    quant = by_type.most_common(1)[0][0].upper() if by_type else ""
    return Described(state.served_model_name, m.path, m.config.arch, sum(by_type.values()), quant, state.max_model_len)


def embedding_model(service: EmbeddingService) -> Described:
    m = service.embedder.model
    params = 0
    for t in getattr(m, "tensors", {}).values():
        params += t[1] * t[2] if isinstance(t, tuple) else int(getattr(t, "size", 0))
    return Described(service.name, getattr(m, "path", ""), getattr(m, "arch", "bert"), params, "F32", m.max_seq_length)


def models(state: ServerState) -> list[tuple[Described, EmbeddingService | None]]:
    chat = chat_model(state)
    out: list[tuple[Described, EmbeddingService | None]] = [(chat, None)] if chat is not None else []
    return out + [(embedding_model(s), s) for s in state.embeddings if s.listed]


def find_model(state: ServerState, name: str | None) -> tuple[Described, EmbeddingService | None]:
    if not name:
        raise ProtocolError("model is required", "model")
    for described, service in models(state):
        names = {described.name, tag(described.name)}
        if service is None:
            names |= state.model_names()
        if name in names or base_name(name) in names:
            return described, service
    raise ProtocolError(f"model '{name}' not found", "model", status=404)


def capabilities(state: ServerState, service: EmbeddingService | None) -> list[str]:
    if service is not None:
        return ["embedding"]
    caps = ["completion", "tools"]  # any template can call tools here (a generic tools block where it has none)
    if detect_reasoning(state.ready_template.source) is not None:
        caps.append("thinking")
    if fim_token_ids(state.tokenizer) is not None:
        caps.append("insert")  # generate's suffix
    if any(not s.listed for s in state.embeddings):  # the chat model embeds too (pooling)
        caps.append("embedding")
    return caps


def parameters_text(state: ServerState) -> str:
    """The sampling defaults a request's missing options get, as a Modelfile's PARAMETER lines list them."""
    d = state.sampling_defaults
    pairs = [("temperature", d.temperature), ("top_k", d.top_k), ("top_p", d.top_p), ("min_p", d.min_p)]
    pairs.append(("repeat_penalty", d.repetition_penalty))
    return "\n".join(f"{k:<15} {v:g}" for k, v in pairs)


def show_body(state: ServerState, described: Described, service: EmbeddingService | None) -> dict[str, Any]:
    arch = described.arch
    info: dict[str, Any] = {
        "general.architecture": arch,
        "general.parameter_count": described.params,
        f"{arch}.context_length": described.context,
    }
    body: dict[str, Any] = {
        "license": "",
        "details": described.details(),
        "model_info": info,
        "capabilities": capabilities(state, service),
        "modified_at": described.modified_at,
    }
    if service is not None:
        info[f"{arch}.embedding_length"] = service.embedder.dimensions
        body |= {"modelfile": f"FROM {described.path}\n", "parameters": "", "template": ""}
        return body
    assert state.model is not None  # a chat model is described only while loaded
    c = state.model.config
    info |= {f"{arch}.embedding_length": c.dim, f"{arch}.block_count": c.n_layers}
    info |= {f"{arch}.attention.head_count": c.n_heads, f"{arch}.attention.head_count_kv": c.n_kv_heads}
    template = state.ready_template.source
    params = parameters_text(state)
    parameter_lines = "".join(f"PARAMETER {line}\n" for line in params.splitlines())
    body |= {
        "modelfile": f'FROM {described.path}\nTEMPLATE """{template}"""\n{parameter_lines}',
        "parameters": params,
        "template": template,  # Jinja (the model's chat template), not a Go template
    }
    return body


# ---- handlers -----------------------------------------------------------------------------------------------


async def liveness(request: web.Request) -> web.Response:
    return web.Response(text=LIVENESS)


async def version(request: web.Request) -> web.Response:
    return json_response({"version": OLLAMA_VERSION})


def managed_models(many: ModelManager) -> list[Described]:
    """A many-model daemon's models: a loaded one as its model describes it, the others by their files."""
    out = []
    for m in many.models.values():
        loaded = chat_model(m.state) if m.state is not None else None
        out.append(loaded or Described(m.name, m.entry.path, "", 0, "", 0))
    return out


async def tags(request: web.Request) -> web.Response:
    state = request.app[STATE]
    many = manager(request.app)
    listed = [d for d, _ in models(state)]
    if many is not None:
        listed = managed_models(many) + listed
    return json_response({"models": [d.entry() for d in listed]})


async def show(request: web.Request) -> web.Response:
    state = request.app[STATE]
    req = decode(await request.read(), ShowRequest)
    name = req.model or req.name
    if manager(request.app) is not None and not any(s.answers_to(name or "") for s in state.embeddings):
        async with use_model(request.app, name) as state:  # described as loaded: the model is loaded for it
            described = chat_model(state)
            assert described is not None
            return json_response(show_body(state, described, None))
    described, service = find_model(state, name)
    return json_response(show_body(state, described, service))


async def running(request: web.Request) -> web.Response:
    """The models loaded now: a many-model daemon's until their idle limit, the others with the server."""
    state = request.app[STATE]
    on_gpu = state.settings.device != "cpu"
    forever = (datetime.now(UTC) + timedelta(days=365 * 100)).isoformat().replace("+00:00", "Z")
    running = [(d, forever) for d, _ in models(state)]
    many = manager(request.app)
    if many is not None:  # the loaded models, each until its idle limit (keep_alive) runs out
        for m in many.models.values():
            described = chat_model(m.state) if m.state is not None else None
            if described is not None:
                expires = many.expires_at(m)
                when = forever if expires == float("inf") else iso_time(expires)
                running.insert(0, (described, when))
    out = [
        RunningModel(tag(d.name), tag(d.name), d.size, d.digest, d.details(), t, d.size if on_gpu else 0, d.context)
        for d, t in running
    ]
    return json_response({"models": out})


def iso_time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", liveness)  # HEAD / too (aiohttp answers HEAD for every GET route)
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/tags", tags)
    app.router.add_post("/api/show", show)
    app.router.add_get("/api/ps", running)
