"""Settings -> an engine: `device` picks the class (with a plain-language reason when CUDA cannot be used), the
kernel and GPU settings configure it. Both classes take the same sizing arguments (num_kv_blocks=,
max_batch_tokens=, max_seqs=, threads=, max_logits_rows=) and have the same step() contract.
"""

from __future__ import annotations

import logging
from typing import Any

from inferd.config import DEVICES, Settings
from inferd.engine.batch import state_bytes_per_seq
from inferd.engine.host_plan import kv_format

log = logging.getLogger("inferd.device")


class DeviceError(ValueError):
    """The requested device cannot be used; the message says why (shown to the user as one line)."""


def check_cuda() -> None:
    """Raises DeviceError unless inferd's CUDA backend is built and sees at least one GPU."""
    try:
        from inferd import _cuda
    except ImportError as e:
        raise DeviceError(
            f"--device cuda: inferd was built without its CUDA backend (inferd._cuda cannot be "
            f"imported: {e}); rebuild with nvcc on PATH (INFERD_CUDA=1 makes its absence a build "
            f"error), or use --device cpu"
        ) from None
    try:
        count = _cuda.device_count()
    except Exception as e:  # no driver, a driver older than the toolkit, ...: the runtime says which
        raise DeviceError(f"--device cuda: the CUDA runtime cannot be used: {e}") from None
    if count <= 0:
        raise DeviceError(
            "--device cuda: no CUDA device is visible (no NVIDIA GPU, or CUDA_VISIBLE_DEVICES hides "
            "them); use --device cpu"
        )


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise DeviceError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda":
        check_cuda()


def engine_class(device: str):
    """Engine (cpu) or CudaEngine (cuda); raises DeviceError when the device cannot be used."""
    check_device(device)
    if device == "cuda":
        from inferd.engine.cuda_engine import CudaEngine

        return CudaEngine
    from inferd.engine.engine import Engine

    return Engine


def kv_budget(config: Any, settings: Settings, max_seqs: int | None = None) -> tuple[int, int]:
    """(bytes of kv_cache_mib left for KV blocks, sequences the engine runs at once). A model with recurrent layers
    keeps one state per running sequence out of the same budget, and with prefix caching as many snapshots of states
    at cached block boundaries (KVCacheManager keeps at most one per slot); when max_running's states would take
    more than half the budget, fewer sequences run, with a log line."""
    budget = settings.kv_cache_mib << 20
    seqs = max_seqs or settings.max_running
    copies = 2 if settings.enable_prefix_caching else 1
    per_seq = copies * state_bytes_per_seq(config)
    if not per_seq:
        return budget, seqs
    fit = (budget // 2) // per_seq
    if fit < 1:
        raise DeviceError(
            f"kv_cache_mib {settings.kv_cache_mib} cannot hold one sequence's recurrent state "
            f"({-(-per_seq >> 20)} MiB{' with its prefix snapshot' if copies > 1 else ''}) in half of it: "
            "raise kv_cache_mib"
        )
    if fit < seqs:
        log.warning(
            "max_running %d -> %d: more recurrent states (%.1f MiB each%s) would take over half of kv_cache_mib %d",
            seqs,
            fit,
            state_bytes_per_seq(config) / (1 << 20),
            ", and as many prefix snapshots" if copies > 1 else "",
            settings.kv_cache_mib,
        )
        seqs = fit
    log.info(
        "recurrent state: %d slots, %d MiB of kv_cache_mib; the rest for KV blocks", seqs, -(-seqs * per_seq >> 20)
    )
    return budget - seqs * per_seq, seqs


def build_engine(
    model: Any,
    settings: Settings,
    *,
    num_kv_blocks: int | None = None,
    max_seqs: int | None = None,
    max_batch_tokens: int | None = None,
    max_logits_rows: int | None = None,
    huge_pages_now: bool = True,
):
    """The engine `settings` describe for `model`; sizes default to the settings' (serving) ones. huge_pages_now:
    False leaves the CPU engine's move of its weights into 2 MB pages to its start_huge_pages()."""
    try:  # before the device's own checks: a setting that cannot work anywhere is named first
        kv_format(settings.device, settings.kv_cache_dtype, settings.cuda_kv)
    except ValueError as e:
        raise DeviceError(str(e)) from None
    engine_cls = engine_class(settings.device)
    kv_bytes, seqs = kv_budget(model.config, settings, max_seqs)
    if num_kv_blocks is None:
        num_kv_blocks = settings.num_kv_blocks or engine_cls.kv_blocks_for_bytes(
            model.config, kv_bytes, settings.kv_cache_dtype
        )
    sizes = dict(
        num_kv_blocks=num_kv_blocks,
        max_batch_tokens=max_batch_tokens or settings.max_batch_tokens,
        max_seqs=seqs,
        threads=settings.threads or None,
        max_logits_rows=max_logits_rows,
    )
    if settings.device == "cuda":
        return engine_cls(
            model,
            **sizes,
            weight_dtype=settings.cuda_weights,
            kv_dtype=settings.cuda_kv,
            device=settings.cuda_device,
            use_graphs=settings.cuda_graphs,
            use_pdl=settings.cuda_pdl,
            gemm=settings.cuda_gemm,
        )
    if settings.cpu_path:
        from inferd import _cpu

        _cpu.set_path(settings.cpu_path)
    from inferd.engine.load_progress import LoadProgress

    progress = LoadProgress()  # a bar on a terminal and a summary line, for loads over a second
    engine = engine_cls(
        model, **sizes, kv_cache_dtype=settings.kv_cache_dtype, progress=progress, huge_pages_now=huge_pages_now
    )
    progress.finish()
    return engine
