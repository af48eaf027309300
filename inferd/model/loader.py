"""load_model: a GGUF file or a Hugging Face folder -> LoadedModel, or a ModelLoadError (never half a model)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..text.chat import default_template
from ..text.tokenizer import Tokenizer
from .arch import ModelConfig
from .errors import ModelLoadError
from .gguf import MAGIC, load_gguf
from .hf import load_hf_dir
from .quant import check_quantize_arg, convert_all
from .tensor import Tensor

__all__ = ["LoadedModel", "Tensor", "load_model", "ModelLoadError"]


@dataclass
class LoadedModel:
    path: str
    config: ModelConfig
    tensors: dict[str, Tensor]  # GGUF names, engine-native types (see tensor.py for the layout)
    tokenizer: Tokenizer
    chat_template: str | None
    model_name: str


def load_model(path_or_dir: str | os.PathLike[str], quantize: str | None = None) -> LoadedModel:
    """Load a .gguf file, or a folder holding config.json + safetensors (or exactly one .gguf).

    quantize: None, "q8_0" or "q4_0" — quantize float weights on load (see quant.py for what goes where).
    """
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
            return _load_gguf(ggufs[0], quantize)
        raise ModelLoadError(path, f"folder has no config.json and not exactly one .gguf file ({len(ggufs)} found)")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(path, f"cannot read file: {e.strerror or e}") from e
    if magic != MAGIC and path.suffix == ".safetensors":
        raise ModelLoadError(path, "a lone .safetensors file is not a model; pass the folder holding config.json")
    return _load_gguf(path, quantize)


def _load_gguf(path: Path, quantize: str | None) -> LoadedModel:
    model = load_gguf(path)
    try:
        tokenizer = Tokenizer.from_gguf(model.metadata)
    except ValueError as e:
        raise ModelLoadError(path, f"tokenizer: {e}") from e
    _check_vocab(path, model.config, tokenizer)
    tensors = _convert(path, model.tensors.values(), quantize)
    template = model.metadata.get("tokenizer.chat_template")
    if not isinstance(template, str):
        template = default_template(model.config.arch)  # Gemma base models ship none; their turns are known
    return LoadedModel(str(path), model.config, tensors, tokenizer, template, path.stem)


def _load_hf(path: Path, quantize: str | None) -> LoadedModel:
    model = load_hf_dir(path)
    _check_vocab(path, model.config, model.tokenizer)
    tensors = _convert(path, model.tensors.values(), quantize)
    return LoadedModel(str(path), model.config, tensors, model.tokenizer, model.chat_template, _folder_name(path))


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
