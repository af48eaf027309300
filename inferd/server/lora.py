"""LoRA adapters in the server: loaded at start-up from the `lora_adapters` setting (name -> PEFT folder or
llama.cpp adapter GGUF), listed in /v1/models as models whose `parent` is the base model, and chosen per request:
`model: "base:NAME"` (or the adapter's own name, as vLLM serves them), and/or a `lora` field,
`[{"name": NAME or "id": N, "scale": S}]` (llama-server's shape; id in the order of the setting). One adapter a
request: entries of scale 0 are left out, and two with a nonzero scale are a 400. An unknown adapter is a 404."""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any

from msgspec import Struct

from inferd.engine.types import LoraUse
from inferd.server.protocol import ProtocolError

log = logging.getLogger("inferd.server")


class LoraChoice(Struct, kw_only=True, forbid_unknown_fields=True):
    """One entry of a request's `lora` list."""

    name: str | None = None
    id: int | None = None
    scale: float = 1.0


@dataclass(frozen=True)
class ServedAdapter:
    name: str
    path: str
    index: int  # the engine's (Engine.add_adapter)
    rank: int
    targets: tuple[str, ...]
    format: str  # "peft" or "gguf"
    nbytes: int
    fingerprint: str  # of the matrices (Adapter.fingerprint)

    def use(self, scale: float) -> LoraUse:
        return LoraUse(self.index, scale, f"{self.name}\0{self.fingerprint}")


async def load_adapters(state: Any, engine: Any, model: Any) -> None:
    """Reads every configured adapter for the chat model and hands it to the engine; raises (start-up fails with
    the message) for an adapter that cannot be read or does not fit the model."""
    from inferd.model.lora import load_adapter

    adapters = state.settings.lora_adapters
    if not adapters:
        return
    if not getattr(engine, "supports_lora", False):
        raise ValueError("LoRA adapters (lora_adapters) run on the CPU engine only (device = cpu)")
    loop = asyncio.get_running_loop()
    base_names = {state.settings.served_model_name or model.model_name, state.settings.model}
    for name, path in adapters.items():
        if name in base_names:
            raise ValueError(f"lora_adapters: the adapter name {name!r} is the base model's")
        adapter = await loop.run_in_executor(None, load_adapter, path, model.config)
        index = engine.add_adapter(adapter)
        fingerprint = await loop.run_in_executor(None, adapter.fingerprint)
        served = ServedAdapter(
            name, path, index, adapter.rank, tuple(adapter.targets), adapter.format, adapter.nbytes, fingerprint
        )
        state.loras[name] = served
        log.info(
            "LoRA adapter %s: %s (%s, rank %d, %s; %.1f MiB)",
            name,
            path,
            served.format,
            served.rank,
            "/".join(served.targets),
            served.nbytes / 2**20,
        )


def split_model(state: Any, name: str | None) -> tuple[bool, ServedAdapter | None]:
    """(whether `name` is served, the adapter it names): a base name, `base:ADAPTER` or an adapter's own name.
    `base:UNKNOWN` and unknown names are not served."""
    if name is None:
        return True, None
    if name in state.model_names():
        return True, None
    if name in state.loras:
        return True, state.loras[name]
    base, sep, adapter = name.rpartition(":")
    if sep and base in state.model_names() and adapter in state.loras:
        return True, state.loras[adapter]
    return False, None


def unknown_adapter(state: Any, what: str, param: str) -> ProtocolError:
    have = ", ".join(sorted(state.loras)) or "none"
    return ProtocolError(
        f"The LoRA adapter `{what}` does not exist; this server has {have}", param, status=404, code="model_not_found"
    )


def request_lora(state: Any, model: str | None, lora: list[LoraChoice] | None) -> LoraUse | None:
    """The adapter and scale a request runs with (None: the base model), from its `model` and `lora` fields."""
    _, by_model = split_model(state, model)
    scales: dict[str, float] = {by_model.name: 1.0} if by_model else {}
    for i, entry in enumerate(lora or ()):
        param = f"lora[{i}]"
        if (entry.name is None) == (entry.id is None):
            raise ProtocolError("each lora entry needs a name or an id (one of them)", param)
        if not math.isfinite(entry.scale):
            raise ProtocolError("a lora scale must be a finite number", f"{param}.scale")
        if entry.name is not None:
            if entry.name not in state.loras:
                raise unknown_adapter(state, entry.name, f"{param}.name")
            chosen = entry.name
        else:
            names = list(state.loras)
            if entry.id is None or not 0 <= entry.id < len(names):
                raise unknown_adapter(state, f"id {entry.id}", f"{param}.id")
            chosen = names[entry.id]
        scales[chosen] = entry.scale
    active = {n: s for n, s in scales.items() if s != 0.0}
    if len(active) > 1:
        raise ProtocolError(f"one LoRA adapter per request; this one asks for {', '.join(sorted(active))}", "lora")
    if not active:
        return None
    ((name, scale),) = active.items()
    return state.loras[name].use(scale)


def adapter_cards(state: Any, base_card: dict[str, Any]) -> list[dict[str, Any]]:
    """/v1/models entries of the adapters: the base model's card under the adapter's name, with `parent` (vLLM's
    field) naming the base model and `root` the adapter's path."""
    return [
        {**base_card, "id": name, "parent": state.served_model_name, "root": a.path, "lora": {
            "format": a.format, "rank": a.rank, "targets": list(a.targets)}}
        for name, a in state.loras.items()
    ]  # fmt: skip
