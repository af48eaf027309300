"""Ollama's "unload this model" (an empty chat or generate request with keep_alive 0) for a model of a many-model
daemon that is not loaded: answered at once, as Ollama does, rather than loading the model (and perhaps evicting
another) only to unload it."""

from __future__ import annotations

from inferd.server.apis.ollama.encode import AssistantMessage, ChatLine, GenerateLine, timestamp
from inferd.server.apis.ollama.request import ChatRequest, OllamaRequest, keep_alive_seconds
from inferd.server.models import LOADED, ModelManager
from inferd.server.protocol import ProtocolError


def answer_unloaded(models: ModelManager, req: OllamaRequest) -> ChatLine | GenerateLine | None:
    """The whole answer when `req` only asks to unload a model that is not loaded; None otherwise."""
    try:
        if keep_alive_seconds(req.keep_alive) != 0:
            return None
    except ProtocolError:
        return None  # the renderer says what is wrong with it
    if isinstance(req, ChatRequest):
        empty = not req.messages
    else:
        empty = not getattr(req, "prompt", None) and not getattr(req, "suffix", None)
    m = models.lookup(req.model_name)
    if not empty or m.status == LOADED:
        return None
    if isinstance(req, ChatRequest):
        message = AssistantMessage("assistant", "")
        return ChatLine(model=req.model_name, created_at=timestamp(), message=message, done=True, done_reason="unload")
    return GenerateLine(model=req.model_name, created_at=timestamp(), response="", done=True, done_reason="unload")
