"""The prompt cache on disk, opened when a chat model's engine starts and saved before it stops (shutdown, or the
unload of one model of many). Its named save/restore routes are prompt_cache.py's."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from inferd.engine.prompt_cache_disk import DiskPromptCache, model_fingerprint
from inferd.engine.scheduler_tasks import SchedulerTasks
from inferd.server.state import ServerState

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
