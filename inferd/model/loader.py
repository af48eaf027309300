"""load_model: a GGUF file or a Hugging Face folder -> LoadedModel, or a ModelLoadError (never half a model)."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..text.chat_templates import default_template
from ..text.tokenizer import Tokenizer
from .model_config import ModelConfig
from .errors import ModelLoadError
from .gguf import MAGIC, load_gguf
from .hf import load_hf_dir
from . import sampling_defaults
from .quant import check_quantize_arg, convert_all
from .tensor import Tensor

__all__ = ["LoadedModel", "Tensor", "load_model", "ModelLoadError"]


@dataclass
class LoadedModel:
    path: str
    config: ModelConfig
    tensors: dict[str, Tensor]  # GGUF names, engine-native types (see tensor.py for the layout)
    _tokenizer: Tokenizer | _Deferred
    chat_template: str | None
    model_name: str
    sampling: dict[str, float] = field(default_factory=dict)  # what the file recommends (sampling_defaults.py)

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer; of a model loaded with deferred_tokenizer, built by the first caller (its ModelLoadError
        if bad, to every caller)."""
        if isinstance(self._tokenizer, _Deferred):
            self._tokenizer = self._tokenizer.get()
        return self._tokenizer


class _Deferred:
    """A tokenizer built once, by whichever thread asks for it first; its error is every asker's."""

    def __init__(self, build: Callable[[], Tokenizer]):
        self._build: Callable[[], Tokenizer] | None = build
        self._lock = threading.Lock()
        self._value: Tokenizer | None = None
        self._error: BaseException | None = None

    def get(self) -> Tokenizer:
        with self._lock:
            if self._build is not None:
                build, self._build = self._build, None
                try:
                    self._value = build()
                except Exception as e:
                    self._error = e
            if self._error is not None:
                raise self._error
            assert self._value is not None
            return self._value


def load_model(
    path_or_dir: str | os.PathLike[str], quantize: str | None = None, *, deferred_tokenizer: bool = False
) -> LoadedModel:
    """Load a .gguf file, or a folder holding config.json + safetensors (or exactly one .gguf).

    quantize: None, "q8_0" or "q4_0" — quantize float weights on load (see quant.py for what goes where).
    deferred_tokenizer: a GGUF file's tokenizer is built by the first reader of `.tokenizer` instead of here, so
    that the caller can start the engine's repack (C without the GIL) first and build the tokenizer (~0.5 s of Python
    for a 150k-token vocabulary) beside it; a bad vocabulary then raises its ModelLoadError from `.tokenizer`.
    Built in a thread of its own from here instead, it took the GIL from everything else the start does in Python
    (imports, the engine's setup): each of their many brief waits for the GIL became a wait of the interpreter's
    switch interval, and they took several times their CPU time.
    """
    with _gc_paused():
        return _load_model(path_or_dir, quantize, deferred_tokenizer)


_gc_lock = threading.Lock()
_gc_pauses = 0  # loads (and deferred tokenizer builds) running now
_gc_was_enabled = False


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No garbage collection while loading: a vocabulary makes some 10^6 objects (tokens, merges, their tables),
    none of them garbage, and each full collection on the way would walk all of them again (~0.1 s of a start).
    Counted, so that loads and deferred tokenizer builds on several threads keep it off until the last is done."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


def _load_model(path_or_dir: str | os.PathLike[str], quantize: str | None, deferred: bool) -> LoadedModel:
    try:
        quantize = check_quantize_arg(quantize)
    except ValueError as e:
        raise ModelLoadError(path_or_dir, str(e)) from e
    path = Path(path_or_dir)
    if not path.exists():
        raise ModelLoadError(path, "no such file or folder")
    if path.is_dir():
        if (path / "config.json").is_file():
            return _load_hf(path, quantize)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return _load_gguf(ggufs[0], quantize, deferred)
        raise ModelLoadError(path, f"folder has no config.json and not exactly one .gguf file ({len(ggufs)} found)")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(path, f"cannot read file: {e.strerror or e}") from e
    if magic != MAGIC and path.suffix == ".safetensors":
        raise ModelLoadError(path, "a lone .safetensors file is not a model; pass the folder holding config.json")
    return _load_gguf(path, quantize, deferred)


def _load_gguf(path: Path, quantize: str | None, deferred: bool) -> LoadedModel:
    model = load_gguf(path)

    def tokenizer_of_model() -> Tokenizer:
        with _gc_paused():
            try:
                tokenizer = Tokenizer.from_gguf(model.metadata)
            except ValueError as e:
                raise ModelLoadError(path, f"tokenizer: {e}") from e
            _check_vocab(path, model.config, tokenizer)
            return tokenizer

    tokenizer = _Deferred(tokenizer_of_model) if deferred else tokenizer_of_model()
    tensors = _convert(path, model.tensors.values(), quantize)
    template = model.metadata.get("tokenizer.chat_template")
    if not isinstance(template, str):
        template = default_template(model.config.arch)  # Gemma base models ship none; their turns are known
    sampling = sampling_defaults.from_gguf(model.metadata)
    return LoadedModel(str(path), model.config, tensors, tokenizer, template, path.stem, sampling)


def _load_hf(path: Path, quantize: str | None) -> LoadedModel:
    model = load_hf_dir(path)
    _check_vocab(path, model.config, model.tokenizer)
    tensors = _convert(path, model.tensors.values(), quantize)
    sampling = sampling_defaults.from_hf_folder(path)
    return LoadedModel(
        str(path), model.config, tensors, model.tokenizer, model.chat_template, _folder_name(path), sampling
    )


def _folder_name(path: Path) -> str:
    """The folder's name, or "org/name" for a Hugging Face cache snapshot (models--org--name/snapshots/<commit>)."""
    path = path.resolve()
    repo = path.parent.parent.name
    if path.parent.name == "snapshots" and repo.startswith("models--"):
        return repo[len("models--") :].replace("--", "/")
    return path.name


def _convert(path: Path, tensors, quantize: str | None) -> dict[str, Tensor]:
    try:
        return convert_all(tensors, quantize)
    except ValueError as e:
        raise ModelLoadError(path, str(e)) from e


def _check_vocab(path: Path, config: ModelConfig, tokenizer: Tokenizer) -> None:
    # The embedding may have spare rows (Qwen2 pads to a multiple of 128), but every token must have a row.
    if tokenizer.vocab_size > config.vocab_size:
        raise ModelLoadError(
            path, f"tokenizer has {tokenizer.vocab_size} tokens but the embedding only {config.vocab_size} rows"
        )
    for name, tid in (("bos", tokenizer.bos_id), *(("eos", i) for i in sorted(tokenizer.eos_ids))):
        if tid is not None and not 0 <= tid < tokenizer.vocab_size:
            raise ModelLoadError(path, f"{name} token id {tid} is outside the vocabulary")
