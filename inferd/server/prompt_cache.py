"""The prompt cache on disk in the server: opened at start-up, saved at shutdown (after a drain or a clean stop),
and the named save/restore routes POST /v1/cache/save and /v1/cache/restore.

The KV pool belongs to the scheduler thread, so every step that reads or writes KV blocks is handed to it as a
task between two engine steps (inferd/engine/scheduler_tasks.py); file reads and writes of named saves run in a
worker thread.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from aiohttp import web
from msgspec import Struct

from inferd.engine.prompt_cache_disk import CacheFileError, DiskPromptCache, model_fingerprint
from inferd.engine.scheduler_tasks import SchedulerTasks
from inferd.server.apis.chat.request import Message
from inferd.server.generation import check_model
from inferd.server.openai import warm_ids, warm_prompt_ids
from inferd.server.protocol import ProtocolError, decode
from inferd.server.sse import json_response
from inferd.server.state import STATE, ServerState

log = logging.getLogger("inferd.prompt_cache")

FOLDER = ".prompt-cache"  # under the model cache folder; hidden, so a scan of that folder for models skips it


def cache_folder(state: ServerState) -> Path:
    from inferd.model.pull import cache_dir

    s = state.settings
    return Path(s.prompt_cache_dir) if s.prompt_cache_dir else cache_dir(s.model_cache_dir) / FOLDER


async def open_prompt_cache(state: ServerState) -> None:
    """At start-up, before the engine loop starts: index the last run's file (when prompt_cache_disk_mib > 0)."""
    s, engine, engine_loop, model = state.settings, state.engine, state.engine_loop, state.model
    if not s.prompt_cache_disk_mib or not s.enable_prefix_caching:
        return
    assert engine is not None and engine_loop is not None and model is not None
    from inferd.engine.engine import Engine

    if not isinstance(engine, Engine):  # the setting's default must not stop a GPU server from starting
        log.warning(
            "the prompt cache on disk is off: it needs device = cpu (the %s engine cannot copy KV blocks out)", s.device
        )
        return
    if engine.num_state_slots:  # the blocks' images would lack the recurrent state
        log.info("the prompt cache on disk is off: this model's prefixes need their recurrent state, kept in memory")
        return
    folder = cache_folder(state)
    loop = asyncio.get_running_loop()
    fingerprint = await loop.run_in_executor(None, model_fingerprint, model.path, s.quantize)
    disk = DiskPromptCache(folder, s.prompt_cache_disk_mib << 20, fingerprint, engine, engine_loop.scheduler.kv)
    await loop.run_in_executor(None, disk.open)
    state.prompt_cache, state.scheduler_tasks = disk, SchedulerTasks(engine_loop)


async def save_prompt_cache(state: ServerState) -> None:
    """At shutdown, before the engine loop stops: write the blocks worth keeping (on the scheduler thread)."""
    disk, tasks = state.prompt_cache, state.scheduler_tasks
    if disk is None or tasks is None:
        return
    try:
        await tasks.run(disk.save)
    except Exception as e:  # a full disk or a dead scheduler must not stop the shutdown
        log.warning("prompt cache not saved: %r", e)


# ---- named save / restore ---------------------------------------------------------------------------------------


class CacheSaveRequest(Struct, kw_only=True):
    name: str
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None


class CacheRestoreRequest(Struct, kw_only=True):
    name: str
    model: str | None = None


class CacheSaveResponse(Struct):
    name: str
    cached_tokens: int  # tokens whose KV the save holds (whole blocks of 64)
    bytes: int


class CacheRestoreResponse(Struct):
    name: str
    cached_tokens: int  # tokens of the save now in the prefix cache


def ready_cache(state: ServerState, name: str) -> tuple[DiskPromptCache, SchedulerTasks]:
    disk, tasks = state.prompt_cache, state.scheduler_tasks
    if disk is None or tasks is None:
        raise ProtocolError(
            "the prompt cache on disk is off on this server (prompt_cache_disk_mib = 0)", status=400, code="cache_off"
        )
    try:
        disk.named_path(name)
    except ValueError as e:
        raise ProtocolError(str(e), "name") from None
    return disk, tasks


async def cache_save(request: web.Request) -> web.Response:
    state = request.app[STATE]
    req = decode(await request.read(), CacheSaveRequest)
    check_model(state, req.model)
    disk, tasks = ready_cache(state, req.name)
    ids = await warm_prompt_ids(state, req.prompt, req.messages)
    if len(ids) < state.ready_loop.scheduler.block_size:
        raise ProtocolError("the prompt is shorter than one KV block of 64 tokens: nothing to save", "prompt")
    await warm_ids(state, ids)
    records = await tasks.run(lambda: disk.chain_records(ids))
    try:
        size = await asyncio.get_running_loop().run_in_executor(None, disk.write_named, req.name, records)
    except ValueError as e:
        raise ProtocolError(str(e), "name", status=409, code="too_many_caches") from None
    bs = state.ready_loop.scheduler.block_size
    return json_response(CacheSaveResponse(req.name, len(records) * bs, size))


async def cache_restore(request: web.Request) -> web.Response:
    state = request.app[STATE]
    req = decode(await request.read(), CacheRestoreRequest)
    check_model(state, req.model)
    disk, tasks = ready_cache(state, req.name)
    try:
        records = await asyncio.get_running_loop().run_in_executor(None, disk.read_named, req.name)
    except FileNotFoundError:
        raise ProtocolError(f"no saved cache named {req.name!r}", "name", status=404, code="cache_not_found") from None
    except (CacheFileError, OSError) as e:
        raise ProtocolError(
            f"the saved cache {req.name!r} cannot be loaded: {e}", "name", code="cache_unusable"
        ) from None
    n = await tasks.run(lambda: disk.insert(records))
    return json_response(CacheRestoreResponse(req.name, n * state.ready_loop.scheduler.block_size))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/cache/save", cache_save)
    app.router.add_post("/v1/cache/restore", cache_restore)
