"""The OpenAI-compatible routes that do not generate, and their shapes: models, tokenize, detokenize and cache warm.
(Chat completions, completions and responses are APIs on the pipeline: inferd/server/apis/.)

The handlers do the requests' text work (templates, tokenizing, JSON) on the event loop side; the scheduler
thread is given token ids (its output processor, inferd/engine/output.py, turns generated ids back into text).
"""

from __future__ import annotations

import unicodedata
import uuid

from typing import Annotated, Any

import msgspec
from aiohttp import web
from msgspec import Meta, Struct

from inferd.engine.request import Request
from inferd.server.apis.chat.render import render_chat
from inferd.server.apis.chat.request import Message, check_messages
from inferd.server.choices import output_error
from inferd.server.generation import check_model, check_prompt_len, encode, limits, submit_all
from inferd.server.protocol import ProtocolError, decode
from inferd.server.lora import adapter_cards
from inferd.server.sse import json_response
from inferd.server.models import manager, use_model
from inferd.server.state import STATE, ServerState

WARM_SENTINEL = "\ue000inferd-warm\ue001"  # private-use characters no real message contains


def error_response(e: ProtocolError) -> web.Response:
    return json_response(e.body(), status=e.status, headers=e.headers)


class TokenizeRequest(Struct, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class TokenizeResponse(Struct):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(Struct, kw_only=True):
    model: str | None = None
    tokens: list[Annotated[int, Meta(ge=0)]]


class DetokenizeResponse(Struct):
    prompt: str


class CacheWarmRequest(Struct, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None


class CacheWarmResponse(Struct):
    prompt_tokens: int  # tokens of the warmed text that were sent for prefill
    cached_tokens: int  # of those, now in the prefix cache (all; whole blocks of 64 on cuda and for recurrent models)
    computed_tokens: int  # computed by this call (the rest was cached already)


class ModelCard(Struct):
    id: str
    created: int
    owned_by: str
    max_model_len: int
    sampling_defaults: dict[str, Any]  # what a request's missing sampling fields become, and their source
    object: str = "model"


# ---- models, tokenize, detokenize, cache warm ---------------------------------------------------------------


def model_card(state: ServerState) -> ModelCard:
    return ModelCard(
        state.served_model_name, state.created, "inferd", state.max_model_len, state.sampling_defaults.as_dict()
    )


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    models = manager(request.app)
    if models is not None:
        cards = []
        for m in models.models.values():
            cards.append(models.card(m))
            cards += adapter_cards(m.state, cards[-1]) if m.state is not None else []
    else:
        cards = [msgspec.to_builtins(model_card(state))] if state.model is not None else []
        cards += adapter_cards(state, cards[0]) if cards else []
    return json_response({"object": "list", "data": cards + [e.card() for e in state.embeddings if e.listed]})


async def get_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    name = request.match_info["model"]
    for e in state.embeddings:
        if e.name == name and e.listed:
            return json_response(e.card())
    models = manager(request.app)
    if models is not None:
        return json_response(models.card(models.lookup(name)))
    if state.model is not None and name in state.loras:
        return json_response(
            adapter_cards(state, msgspec.to_builtins(model_card(state)))[list(state.loras).index(name)]
        )
    if state.model is None or name not in state.model_names():
        raise ProtocolError(f"The model `{name}` does not exist", "model", status=404, code="model_not_found")
    return json_response(model_card(state))


async def tokenize(request: web.Request) -> web.Response:
    req = decode(await request.read(), TokenizeRequest)
    async with use_model(request.app, req.model) as state:
        return await tokenize_with(state, req)


async def tokenize_with(state: ServerState, req: TokenizeRequest) -> web.Response:
    check_model(state, req.model)
    if (req.prompt is None) == (req.messages is None):
        raise ProtocolError("send exactly one of prompt or messages", "prompt")
    if req.messages is not None:
        text = render_chat(state, check_messages(req.messages, limits(state)), req.add_generation_prompt)
        ids = await encode(state, text, add_special=False)
    else:
        assert req.prompt is not None  # exactly one of the two, checked above
        ids = await encode(state, req.prompt, add_special=req.add_special_tokens)
    return json_response(TokenizeResponse(len(ids), state.max_model_len, ids))


async def detokenize(request: web.Request) -> web.Response:
    req = decode(await request.read(), DetokenizeRequest)
    async with use_model(request.app, req.model) as state:
        check_model(state, req.model)
        vocab = state.tokenizer.vocab_size
        bad = next((t for t in req.tokens if t >= vocab), None)
        if bad is not None:
            raise ProtocolError(f"token id {bad} is outside the vocabulary [0, {vocab})", "tokens")
        return json_response(DetokenizeResponse(state.tokenizer.decode(req.tokens)))


def _ends_at_boundary(text: str) -> bool:
    return bool(text) and unicodedata.category(text[-1]).startswith("P")


def stable_prefix(state: ServerState, text: str, ids: list[int], add_special: bool) -> list[int]:
    """The tokens of `text` that should stay the same whatever the user types next.

    BPE may merge the last token with what follows (" " + "world" -> " world"; with GPT-2-style
    vocabularies a trailing space is such a token too), so it is held back unless the text ends in
    punctuation; then typical continuations (a space, a letter, a newline, a digit) confirm the kept tokens
    do not move. A wrong guess costs only a cache miss on one block, never a wrong answer: blocks are
    matched by their token ids.
    """
    keep = len(ids) if _ends_at_boundary(text) else len(ids) - 1
    for probe in (" a", "a", "\n", "1"):
        probe_ids = state.tokenizer.encode(text + probe, add_special=add_special)
        while keep > 0 and probe_ids[:keep] != ids[:keep]:
            keep -= 1
    return ids[: max(keep, 0)]


async def cache_warm(request: web.Request) -> web.Response:
    req = decode(await request.read(), CacheWarmRequest)
    async with use_model(request.app, req.model) as state:
        return await warm_with(state, req)


async def warm_with(state: ServerState, req: CacheWarmRequest) -> web.Response:
    check_model(state, req.model)
    ids = await warm_prompt_ids(state, req.prompt, req.messages)
    granule = state.ready_loop.scheduler.cache_granule
    target = len(ids) // granule * granule
    if target == 0:
        return json_response(CacheWarmResponse(len(ids), 0, 0))
    hit = await warm_ids(state, ids)
    return json_response(CacheWarmResponse(len(ids), target, target - hit))


async def warm_prompt_ids(state: ServerState, prompt: str | None, messages: list[Message] | None) -> list[int]:
    """The token ids of a prompt or of a conversation so far, as its next request will start (checked)."""
    if (prompt is None) == (messages is None):
        raise ProtocolError("send exactly one of prompt or messages", "prompt")
    if messages is not None:
        checked = check_messages(messages, limits(state))
        # Render with a marker in place of the last message's text and cut there: what follows the draft
        # (end-of-turn, the assistant header) does not exist yet.
        marked = checked[:-1] + [{**checked[-1], "content": WARM_SENTINEL}]
        rendered = render_chat(state, marked, add_generation_prompt=False)
        cut = rendered.find(WARM_SENTINEL)
        if cut < 0:
            raise ProtocolError("the chat template drops the last message's text; cannot warm it", "messages")
        text, add_special = rendered[:cut] + checked[-1]["content"], False
    else:
        assert prompt is not None
        text, add_special = prompt, True
    ids = stable_prefix(state, text, await encode(state, text, add_special), add_special)
    check_prompt_len(state, len(ids), "messages" if messages is not None else "prompt")
    return ids


async def warm_ids(state: ServerState, ids: list[int]) -> int:
    """Compute `ids` into the prefix cache (up to the cache granule); returns how many tokens were cached already."""
    (handle,) = submit_all(
        state,
        [
            Request(
                f"warm-{uuid.uuid4().hex}",
                ids,
                max_tokens=0,
                warm=True,
                timeout_s=state.settings.request_timeout_s or None,
            )
        ],
    )
    try:
        out = await handle.get()
    finally:
        handle.abort()
    assert out is not None  # get() without a timeout always returns one
    err = output_error(out)
    if err is not None:
        raise err
    return out.usage.cached_tokens if out.usage else 0


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_post("/v1/cache/warm", cache_warm)
