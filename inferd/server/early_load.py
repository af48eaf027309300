"""The chat model's load and its engine's build, started before the server's own imports.

`inferd serve` spends its first part importing the HTTP stack, the APIs and their parsers: Python on one core.
The load that followed is the header walk and the tokenizer (Python) and the weights' repack (C without the GIL on
every thread), so the repack began only once the imports were done, and a core sat idle through them. Started
first, in a thread of its own, the load and the repack run beside those imports. Only where nothing the start
decides could change the outcome: the CPU engine, one model, a local GGUF file that is not an encoder (an embedding
or reranker GGUF is served by other code). Everything else loads as before, once the server listens.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from inferd.config import Settings

if TYPE_CHECKING:
    from inferd.model.loader import LoadedModel


def load_model_from_settings(settings: Settings) -> LoadedModel:
    """Pull (when named) and load the settings' chat model; its tokenizer is built by its first reader
    (EarlyStart.build_tokenizer, beside the engine's repack; start_chat where the model loads the usual way)."""
    from inferd.model.loader import load_model
    from inferd.model.pull import cache_dir, resolve

    path = resolve(settings.model, progress=False, cache=cache_dir(settings.model_cache_dir))
    return load_model(path, quantize=settings.quantize or None, deferred_tokenizer=True)


class EarlyStart:
    """A thread loading the settings' model, then building its engine. `load` is what create_app takes for the
    model (the model, or the load's error); `engine_for(model)` the engine built for it (or the build's error)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._model: Future[LoadedModel | None] = Future()
        self._engine: Future[Any] = Future()
        self._repacking = threading.Event()  # the header is read: what is left is C without the GIL, mostly
        threading.Thread(target=self._run, name="model-load", daemon=True).start()

    @staticmethod
    def wanted(settings: Settings) -> bool:
        model = settings.model
        return settings.device == "cpu" and not settings.many_models and bool(model) and os.path.isfile(model)

    def _run(self) -> None:
        try:
            # the engine's modules first, while this is the only thread importing: once the header is read the
            # main thread imports the server, and both importing at once made each wait on the other's locks
            from inferd.engine import device, engine, load_progress  # noqa: F401
            from inferd.model.embedding_gguf import is_embedding_gguf

            # an encoder is not this code's to load: start_serving sends it to the embedding service
            model = None if is_embedding_gguf(self.settings.model) else load_model_from_settings(self.settings)
        except BaseException as e:  # the server's start raises it from load() and reports it as it always did
            self._model.set_exception(e)
            self._engine.set_result(None)
            self._repacking.set()
            return
        self._model.set_result(model)
        self._repacking.set()
        if model is None:
            self._engine.set_result(None)
            return
        try:
            from inferd.engine.device import build_engine

            self._engine.set_result(build_engine(model, self.settings, huge_pages_now=False))  # start_chat starts it
        except BaseException as e:
            self._engine.set_exception(e)

    def wait_repacking(self) -> None:
        """Returns once the header is read (or the load failed): the repack that follows runs beside Python work,
        while the header walk beside the imports would only share the GIL with them and start the repack later."""
        self._repacking.wait()

    def build_tokenizer(self) -> None:
        """Builds the loaded model's tokenizer on this thread (after wait_repacking, before the server's imports):
        its Python runs beside the repack's C, and its transient memory comes while the weights' arena is still
        mostly untouched, not on top of all of it. A bad vocabulary's error is kept by the model and raised where
        start_chat reads the tokenizer, as before."""
        if not self._model.done() or self._model.exception() is not None:
            return
        model = self._model.result()
        if model is not None:
            with contextlib.suppress(Exception):
                _ = model.tokenizer

    def load(self) -> LoadedModel:
        model = self._model.result()
        return model if model is not None else load_model_from_settings(self.settings)

    def engine_for(self, model: LoadedModel) -> Any:
        """The engine this thread built for `model`; None for another model (the caller builds its own)."""
        if not self._model.done() or self._model.exception() is not None or self._model.result() is not model:
            return None
        return self._engine.result()


def start_early_load(settings: Settings) -> EarlyStart | None:
    """An EarlyStart already at work on the settings' model, or None where the model loads the usual way."""
    return EarlyStart(settings) if EarlyStart.wanted(settings) else None
