"""Cross-encoder rerankers from a sentence-transformers CrossEncoder folder (a Hugging Face
BertForSequenceClassification): the query and a document go in as one pair, [CLS] query [SEP] document [SEP] with
token types 0 then 1, and the score comes from a classification head on the last hidden state of [CLS]:
logits = classifier(tanh(pooler(h_cls))) (BERT's pooler, when the folder has one), then the folder's activation
(sigmoid for one label, as CrossEncoder.predict applies by default; config.json's
sentence_transformers.activation_fn when it names one).

The encoder runs the head as two Dense layers after CLS pooling (tanh after the first), so scoring is the
embedding path: the same C pass, batched the same way, with token types.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from .embedding import EmbeddingModel, _bert, _entries, _Weights
from .errors import ModelLoadError
from .hf import _json
from .quant import check_quantize_arg

CLASSIFIER_ARCHS = ("BertForSequenceClassification",)
ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.Identity": "identity",
}
MAX_LENGTH_UNSET = 1_000_000  # transformers' model_max_length when a tokenizer sets none (a huge int)


@dataclass
class CrossEncoderModel(EmbeddingModel):
    activation: str = "sigmoid"  # applied to each logit: "sigmoid" | "identity"
    labels: list[str] = field(default_factory=list)


def is_cross_encoder_folder(path: str | os.PathLike[str]) -> bool:
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        raw = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and any(a in CLASSIFIER_ARCHS for a in raw.get("architectures") or [])


def _labels(raw: dict) -> list[str]:
    id2label = raw.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            return [str(v) for _, v in sorted(id2label.items(), key=lambda kv: int(kv[0]))]
        except ValueError:
            pass
    n = raw.get("num_labels", 2)  # transformers' default
    return [f"LABEL_{i}" for i in range(int(n))]


def _activation(root: Path, raw: dict, n_labels: int) -> str:
    st = raw.get("sentence_transformers") or {}
    name = st.get("activation_fn") if isinstance(st, dict) else None
    if name is None:  # older CrossEncoder folders: sigmoid for one label, the logits otherwise
        return "sigmoid" if n_labels == 1 else "identity"
    if name not in ACTIVATIONS:
        raise ModelLoadError(root / "config.json", f"activation_fn {name!r} is not supported (Sigmoid or Identity)")
    return ACTIVATIONS[name]


def _max_length(root: Path, raw: dict) -> int:
    positions = int(raw.get("max_position_embeddings", 512))
    tcfg = root / "tokenizer_config.json"
    n = _json(tcfg).get("model_max_length") if tcfg.is_file() else None
    return min(int(n), positions) if isinstance(n, (int, float)) and 1 < n < MAX_LENGTH_UNSET else positions


def load_cross_encoder(path: str | os.PathLike[str], quantize: str | None = None) -> CrossEncoderModel:
    root = Path(path)
    try:
        quantize = check_quantize_arg(quantize)
    except ValueError as e:
        raise ModelLoadError(root, str(e)) from e
    if not is_cross_encoder_folder(root):
        raise ModelLoadError(root, f"a cross-encoder is a folder whose config.json names {', '.join(CLASSIFIER_ARCHS)}")
    raw = _json(root / "config.json")
    if raw.get("model_type") != "bert":
        raise ModelLoadError(root / "config.json", f"model_type {raw.get('model_type')!r}: only BERT cross-encoders")
    labels = _labels(raw)
    activation = _activation(root, raw, len(labels))
    max_len = _max_length(root, raw)
    w = _Weights(root, _entries(root))
    try:
        config, tensors = _bert(raw, w, max_len, quantize)
        dim = config["dim"]
        head, activations = 0, []
        if w.has("pooler.dense.weight"):
            tensors["dense.0"] = w.spec("pooler.dense.weight", None)
            tensors["dense.0.bias"] = w.vector("pooler.dense.bias", dim)
            head, activations = 1, ["tanh"]
        cls = w.tensor("classifier.weight")
        if cls.rows != len(labels) or cls.cols != dim:
            raise ModelLoadError(
                root, f"classifier.weight is ({cls.rows}, {cls.cols}), expected ({len(labels)}, {dim})"
            )
        tensors[f"dense.{head}"] = w.spec("classifier.weight", None)
        tensors[f"dense.{head}.bias"] = w.vector("classifier.bias", len(labels))
    except ModelLoadError:
        raise
    except (KeyError, ValueError, TypeError) as e:
        raise ModelLoadError(root, f"{type(e).__name__}: {e}") from e
    config |= {"pooling": "cls", "normalize": False, "dense_activations": activations + ["identity"]}
    tok_path = root / "tokenizer.json"
    if not tok_path.is_file():
        raise ModelLoadError(root, "no tokenizer.json")
    try:
        tokenizer = HFTokenizer.from_file(str(tok_path))
    except Exception as e:  # tokenizers raises plain Exception for a malformed file
        raise ModelLoadError(tok_path, str(e)) from e
    tokenizer.no_padding()
    # CrossEncoder.predict always truncates a pair to the model's length, the longer text first
    tokenizer.enable_truncation(max_len, strategy="longest_first")
    return CrossEncoderModel(
        path=str(root),
        name=root.name.lower(),
        arch="bert",
        config=config,
        tensors=tensors,
        tokenizer=tokenizer,
        truncating_tokenizer=tokenizer,
        max_seq_length=max_len,
        dimensions=len(labels),
        matryoshka_dims=(),
        pooling="cls",
        activation=activation,
        labels=labels,
    )
