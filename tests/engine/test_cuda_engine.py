"""What the CUDA engine refuses before it touches a GPU (runs without one): models with switches it lacks."""
from __future__ import annotations

import pytest

from tests.reference import random_model


@pytest.mark.parametrize("arch,needs", [("gemma3", "sliding-window layers"), ("qwen3", "QK-norm")])
def test_cuda_engine_refuses_what_it_cannot_run(arch, needs):
    from inferd.engine.cuda_engine import CudaEngine

    with pytest.raises(ValueError, match=f"does not run {arch} models yet .*{needs}.*--device cpu"):
        CudaEngine(random_model(arch=arch), num_kv_blocks=1)
