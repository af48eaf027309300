"""`--device cpu|cuda` -> the engine class, with a plain-language reason when CUDA cannot be used.

Both classes take the same constructor arguments (model, num_kv_blocks=, max_batch_tokens=, max_seqs=, threads=,
max_logits_rows=) and have the same step() contract, so callers only pick the class here.
"""
from __future__ import annotations

DEVICES = ("cpu", "cuda")


class DeviceError(ValueError):
    """The requested device cannot be used; the message says why (shown to the user as one line)."""


def check_cuda() -> None:
    """Raises DeviceError unless inferd's CUDA backend is built and sees at least one GPU."""
    try:
        from inferd import _cuda
    except ImportError as e:
        raise DeviceError(f"--device cuda: inferd was built without its CUDA backend (inferd._cuda cannot be "
                          f"imported: {e}); rebuild with nvcc on PATH (INFERD_CUDA=1 makes its absence a build "
                          f"error), or use --device cpu") from None
    try:
        count = _cuda.device_count()
    except Exception as e:   # no driver, a driver older than the toolkit, ...: the runtime says which
        raise DeviceError(f"--device cuda: the CUDA runtime cannot be used: {e}") from None
    if count <= 0:
        raise DeviceError("--device cuda: no CUDA device is visible (no NVIDIA GPU, or CUDA_VISIBLE_DEVICES hides "
                          "them); use --device cpu")


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
