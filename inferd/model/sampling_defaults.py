"""The sampling a request gets for the fields it leaves out.

A request without sampling fields must still give sensible text: OpenAI's own defaults (temperature 1, nothing
truncated) make a small model ramble until the context ends. So the defaults come from the model when its file
says (GGUF `general.sampling.*` keys, a Hugging Face folder's `generation_config.json`), else llama.cpp's
(temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), as llama-server answers the same request; the
`generation_config` setting picks the source and `override_generation_config` (a JSON object, vLLM's name and
form) sets any of them for the whole server. A request's own fields always win.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

SOURCES = ("model", "llama.cpp", "openai")
GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}


@dataclass(frozen=True)
class SamplingDefaults:
    temperature: float
    top_k: int  # 0: off
    top_p: float
    min_p: float
    repetition_penalty: float
    source: str  # where they came from, as /v1/models shows it

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def describe(self) -> str:
        return (
            f"temperature {self.temperature:g}, top_k {self.top_k}, top_p {self.top_p:g}, min_p {self.min_p:g}, "
            f"repetition_penalty {self.repetition_penalty:g} ({self.source})"
        )


LLAMA_CPP = SamplingDefaults(0.8, 40, 0.95, 0.05, 1.0, "llama.cpp")
OPENAI = SamplingDefaults(1.0, 0, 1.0, 0.0, 1.0, "openai")


def from_gguf(metadata: dict[str, Any]) -> dict[str, float]:
    """The sampling a GGUF file recommends: the `general.sampling.*` keys it has."""
    return {name: float(metadata[key]) for key, name in GGUF_KEYS.items() if _is_number(metadata.get(key))}


def from_hf_folder(folder: str | Path) -> dict[str, float]:
    """The sampling a Hugging Face folder recommends (its generation_config.json); `do_sample: false` is greedy."""
    path = Path(folder) / "generation_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    if config.get("do_sample") is False:
        return {"temperature": 0.0}
    return {k: float(config[k]) for k in GGUF_KEYS.values() if _is_number(config.get(k))}


RULES = {
    "temperature": (lambda v: 0.0 <= v <= 100.0, "between 0 and 100"),
    "top_k": (lambda v: v >= 0 and v == int(v), "0 (off) or a positive whole number"),
    "top_p": (lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
    "min_p": (lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
    "repetition_penalty": (lambda v: 0.0 < v <= 10.0, "in (0, 10]"),
}


def resolve(source: str, recommended: dict[str, float], overrides: str = "") -> SamplingDefaults:
    """The server's defaults: `source`'s (the model's recommendation over llama.cpp's, or one of those bases),
    then `overrides` (a JSON object of the same fields). A recommendation the sampler cannot take is left out;
    a bad override raises ValueError naming its field."""
    if source not in SOURCES:
        raise ValueError(f"generation_config must be one of {', '.join(SOURCES)}; got {source!r}")
    base = OPENAI if source == "openai" else LLAMA_CPP
    values = {k: v for k, v in recommended.items() if source == "model" and RULES[k][0](v)}
    label = "model" if values else base.source
    if overrides.strip():
        values.update(parse_overrides(overrides))
        label += " + settings"
    typed: dict[str, Any] = {k: (int(v) if k == "top_k" else float(v)) for k, v in values.items()}
    return replace(base, **typed, source=label)


def parse_overrides(text: str) -> dict[str, float]:
    """`override_generation_config`'s JSON object; raises ValueError naming what is wrong."""
    try:
        extra = json.loads(text)
    except ValueError as e:
        raise ValueError(f"override_generation_config is not JSON: {e}") from None
    if not isinstance(extra, dict):
        raise ValueError('override_generation_config must be a JSON object, e.g. {"temperature": 0.7}')
    for key, value in extra.items():
        if key not in RULES:
            raise ValueError(f"override_generation_config: unknown field {key!r} (known: {', '.join(RULES)})")
        ok, rule = RULES[key]
        if not _is_number(value) or not ok(value):
            raise ValueError(f"override_generation_config: {key} must be {rule}, got {value!r}")
    return extra


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
