"""The prompt cache on disk in the server: opened at start-up, saved at shutdown (after a drain or a clean stop),
and the named save/restore routes POST /v1/cache/save and /v1/cache/restore.

The KV pool belongs to the scheduler thread, so every step that reads or writes KV blocks is handed to it as a
task between two engine steps (inferd/engine/scheduler_tasks.py); file reads and writes of named saves run in a
worker thread.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from msgspec import Struct

from inferd.engine.prompt_cache_disk import CacheFileError, DiskPromptCache
from inferd.engine.scheduler_tasks import SchedulerTasks
from inferd.server.apis.chat.request import Message
from inferd.server.generation import check_model
from inferd.server.models import use_model
from inferd.server.openai import warm_ids, warm_prompt_ids
from inferd.server.prompt_cache_files import FOLDER, cache_folder, open_prompt_cache, save_prompt_cache
from inferd.server.protocol import ProtocolError, decode
from inferd.server.sse import json_response
from inferd.server.state import ServerState

log = logging.getLogger("inferd.prompt_cache")

__all__ = ["FOLDER", "add_routes", "cache_folder", "open_prompt_cache", "save_prompt_cache"]

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
    cached_tokens: int  # prompt tokens whose KV the save holds (whole blocks of 64 for a model with recurrent layers)
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
    req = decode(await request.read(), CacheSaveRequest)
    async with use_model(request.app, req.model) as state:  # one model of many: that model's own cache
        return await save_with(state, req)


async def save_with(state: ServerState, req: CacheSaveRequest) -> web.Response:
    check_model(state, req.model)
    disk, tasks = ready_cache(state, req.name)
    ids = await warm_prompt_ids(state, req.prompt, req.messages)
    if len(ids) < state.ready_loop.scheduler.block_size:
        raise ProtocolError("the prompt is shorter than one KV block of 64 tokens: nothing to save", "prompt")
    await warm_ids(state, ids)
    records, num_tokens = await tasks.run(lambda: disk.chain_records(ids))
    try:
        size = await asyncio.get_running_loop().run_in_executor(None, disk.write_named, req.name, records)
    except ValueError as e:
        raise ProtocolError(str(e), "name", status=409, code="too_many_caches") from None
    return json_response(CacheSaveResponse(req.name, num_tokens, size))


async def cache_restore(request: web.Request) -> web.Response:
    req = decode(await request.read(), CacheRestoreRequest)
    async with use_model(request.app, req.model) as state:
        return await restore_with(state, req)


async def restore_with(state: ServerState, req: CacheRestoreRequest) -> web.Response:
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
    return json_response(CacheRestoreResponse(req.name, n))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/cache/save", cache_save)
    app.router.add_post("/v1/cache/restore", cache_restore)
