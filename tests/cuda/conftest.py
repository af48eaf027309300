"""Fixtures for the CUDA tests. Every test that needs a GPU takes the `cu` fixture, which skips (with the reason)
when inferd._cuda is not built or no CUDA device is visible; only test_compile.py runs without one.

Inputs are fresh random numbers on every run: the seed is printed, and INFERD_TEST_SEED=<n> replays a failure."""
from __future__ import annotations

import os
import secrets

import numpy as np
import pytest


def cuda_module_or_skip():
    try:
        from inferd import _cuda
    except ImportError as e:
        pytest.skip(f"inferd._cuda is not built ({e})")
    if _cuda.device_count() == 0:
        pytest.skip("no CUDA device is visible")
    return _cuda


@pytest.fixture(scope="session")
def cu():
    return cuda_module_or_skip()


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("INFERD_TEST_SEED", secrets.randbits(32)))
    print(f"{request.node.nodeid}: INFERD_TEST_SEED={seed}")
    return np.random.default_rng(seed)

