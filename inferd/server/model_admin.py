"""A many-model daemon's admin routes, POST /v1/models/load and /v1/models/unload (under /v1/: behind the API
keys), and the models' gauges on /metrics."""

from __future__ import annotations

import msgspec
from aiohttp import web
from prometheus_client.core import GaugeMetricFamily

from inferd.server.metrics import P
from inferd.server.models import LOADED, Managed, ModelManager, manager
from inferd.server.protocol import ProtocolError, decode
from inferd.server.sse import json_response


class ModelRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str


async def _admin_target(request: web.Request) -> tuple[ModelManager, Managed]:
    models = manager(request.app)
    if models is None:
        raise ProtocolError("this server serves one model; set models_dir or [models] to load and unload", status=404)
    req = decode(await request.read(), ModelRequest)
    return models, models.lookup(req.model)


async def load_model(request: web.Request) -> web.Response:
    """POST /v1/models/load {"model": NAME}: load it now (waits for the load); answers its card."""
    models, m = await _admin_target(request)
    await models.wait_loaded(m)
    return json_response(models.card(m))


async def unload_model(request: web.Request) -> web.Response:
    """POST /v1/models/unload {"model": NAME}: unload it now, or once the requests using it end (state still
    `loaded` in the answer); a pinned model too."""
    models, m = await _admin_target(request)
    await models.unload(m, "asked to")
    return json_response(models.card(m))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/models/load", load_model)
    app.router.add_post("/v1/models/unload", unload_model)


class ModelStates:
    """A many-model daemon's /metrics: each model's state and what it counts against the budget, and the budget."""

    def __init__(self, models: ModelManager):
        self.models = models

    def collect(self) -> list[GaugeMetricFamily]:
        loaded = GaugeMetricFamily(P + "model_loaded", "1 while the model is loaded, else 0.", labels=["model_name"])
        memory = GaugeMetricFamily(
            P + "model_memory_bytes", "What the model counts against memory_budget_mib.", labels=["model_name"]
        )
        for m in self.models.models.values():
            loaded.add_metric([m.name], 1.0 if m.status == LOADED else 0.0)
            memory.add_metric([m.name], float(m.bytes))
        budget = GaugeMetricFamily(P + "memory_budget_bytes", "The loaded models' memory budget.")
        budget.add_metric([], float(self.models.budget_bytes))
        return [loaded, memory, budget]
