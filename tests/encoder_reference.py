"""A float64 numpy reference of the sentence-transformers pipeline for BERT and bidirectional Gemma 3: read straight
from the folder's files with safetensors (not through inferd's loader), written from the Hugging Face modeling code's
definitions, one sequence at a time, no batching tricks. Slow and obvious on purpose."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _rms(x, w, eps):   # Gemma: x / rms * (1 + w)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (1.0 + w)


def _attention(q, k, v, scale, mask):   # q (n, h, d), k/v (n, kvh, d), mask (n, n) bool
    group = q.shape[1] // k.shape[1]
    out = np.empty_like(q)
    for h in range(q.shape[1]):
        s = q[:, h] @ k[:, h // group].T * scale
        s = np.where(mask, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, h // group]
    return out


def _rope(x, theta):   # x (n, h, d), rotate_half convention
    n, _, d = x.shape
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rot * sin


class Reference:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.cfg = json.loads((self.folder / "config.json").read_text())
        raw = load_file(str(self.folder / "model.safetensors"))
        self.w = {k.removeprefix("model.").removeprefix("bert."): v.astype(np.float64) for k, v in raw.items()}
        modules = json.loads((self.folder / "modules.json").read_text())
        pool = json.loads((self.folder / "1_Pooling" / "config.json").read_text())
        self.pooling = ("cls" if pool.get("pooling_mode_cls_token") else
                        "last" if pool.get("pooling_mode_lasttoken") else "mean")
        self.dense = []
        for m in modules:
            if m["type"].endswith("Dense"):
                d = load_file(str(self.folder / m["path"] / "model.safetensors"))
                self.dense.append((d["linear.weight"].astype(np.float64),
                                   d["linear.bias"].astype(np.float64) if "linear.bias" in d else None))
        self.normalize = any(m["type"].endswith("Normalize") for m in modules)

    def hidden(self, ids: list[int], types: list[int] | None = None) -> np.ndarray:
        return self._bert(ids, types) if self.cfg["model_type"] in ("bert", "nomic_bert") else self._gemma(ids)

    def embed(self, ids: list[int]) -> np.ndarray:
        h = self.hidden(ids)
        v = h[0] if self.pooling == "cls" else h[-1] if self.pooling == "last" else h.mean(0)
        for w, b in self.dense:
            v = w @ v + (b if b is not None else 0.0)
        return v / max(np.linalg.norm(v), 1e-12) if self.normalize else v

    def _bert(self, ids, types=None):
        """BERT; nomic-bert (model_type "nomic_bert", a test-only folder in BERT's names): rotary positions on q and k
        (rotary_emb_base) instead of a position table, an FFN down(silu(gate x) * up x) ("intermediate.gate"), and
        linear layers without biases."""
        c, w, n = self.cfg, self.w, len(ids)
        eps, heads = c.get("layer_norm_eps", 1e-12), c["num_attention_heads"]
        hd = c["hidden_size"] // heads
        e = "embeddings."
        rotary = c.get("rotary_emb_base")
        bias = lambda name: w.get(name, 0.0)   # noqa: E731
        x = w[e + "word_embeddings.weight"][ids] + w[e + "token_type_embeddings.weight"][types or [0] * n]
        if not rotary:
            x = x + w[e + "position_embeddings.weight"][:n]
        x = _layernorm(x, w[e + "LayerNorm.weight"], w[e + "LayerNorm.bias"], eps)
        mask = np.ones((n, n), bool)
        for i in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            a = p + "attention.self."
            q, k, v = (x @ w[a + f"{m}.weight"].T + bias(a + f"{m}.bias") for m in ("query", "key", "value"))
            q, k, v = q.reshape(n, heads, hd), k.reshape(n, heads, hd), v.reshape(n, heads, hd)
            if rotary:
                q, k = _rope(q, rotary), _rope(k, rotary)
            att = _attention(q, k, v, 1 / math.sqrt(hd), mask).reshape(n, -1)
            o = att @ w[p + "attention.output.dense.weight"].T + bias(p + "attention.output.dense.bias")
            x = _layernorm(x + o, w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"],
                           eps)
            if p + "intermediate.gate.weight" in w:
                g = x @ w[p + "intermediate.gate.weight"].T
                h = g / (1 + np.exp(-g)) * (x @ w[p + "intermediate.dense.weight"].T)
            else:
                h = _gelu_erf(x @ w[p + "intermediate.dense.weight"].T + w[p + "intermediate.dense.bias"])
            o = h @ w[p + "output.dense.weight"].T + bias(p + "output.dense.bias")
            x = _layernorm(x + o, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
        return x

    def _gemma(self, ids):
        c, w, n = self.cfg, self.w, len(ids)
        eps, heads, kvh, hd = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        x = w["embed_tokens.weight"][ids] * np.float64(np.float32(math.sqrt(c["hidden_size"])))
        dist = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
        for i in range(c["num_hidden_layers"]):
            p = f"layers.{i}."
            a = p + "self_attn."
            sliding = c["layer_types"][i] == "sliding_attention"
            xn = _rms(x, w[p + "input_layernorm.weight"], eps)
            q = (xn @ w[a + "q_proj.weight"].T).reshape(n, heads, hd)
            k = (xn @ w[a + "k_proj.weight"].T).reshape(n, kvh, hd)
            v = (xn @ w[a + "v_proj.weight"].T).reshape(n, kvh, hd)
            q, k = _rms(q, w[a + "q_norm.weight"], eps), _rms(k, w[a + "k_norm.weight"], eps)
            theta = c["rope_local_base_freq"] if sliding else c["rope_theta"]
            q, k = _rope(q, theta), _rope(k, theta)
            # transformers' Gemma3TextConfig: a bidirectional model's window W becomes W // 2 + 1, distance below it
            mask = dist < c["sliding_window"] // 2 + 1 if sliding else np.ones((n, n), bool)
            att = _attention(q, k, v, c["query_pre_attn_scalar"] ** -0.5, mask).reshape(n, -1)
            x = x + _rms(att @ w[a + "o_proj.weight"].T, w[p + "post_attention_layernorm.weight"], eps)
            xn = _rms(x, w[p + "pre_feedforward_layernorm.weight"], eps)
            h = _gelu_tanh(xn @ w[p + "mlp.gate_proj.weight"].T) * (xn @ w[p + "mlp.up_proj.weight"].T)
            x = x + _rms(h @ w[p + "mlp.down_proj.weight"].T, w[p + "post_feedforward_layernorm.weight"], eps)
        return _rms(x, w["norm.weight"], eps)


class CrossEncoderReference(Reference):
    """A BertForSequenceClassification folder (sentence-transformers CrossEncoder): sigmoid (one label) or the raw
    logits of classifier(tanh(pooler(h[CLS]))), as transformers computes them."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.cfg = json.loads((self.folder / "config.json").read_text())
        raw = load_file(str(self.folder / "model.safetensors"))
        self.w = {k.removeprefix("bert."): v.astype(np.float64) for k, v in raw.items()}

    def score(self, ids: list[int], types: list[int]) -> np.ndarray:
        h = self.hidden(ids, types)[0]
        if "pooler.dense.weight" in self.w:
            h = np.tanh(self.w["pooler.dense.weight"] @ h + self.w["pooler.dense.bias"])
        logits = self.w["classifier.weight"] @ h + self.w["classifier.bias"]
        return 1 / (1 + np.exp(-logits)) if logits.shape[0] == 1 else logits
