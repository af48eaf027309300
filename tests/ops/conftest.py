"""Fixtures for the operations tests: a tiny generated model (quick to load and to run, so three replicas fit
on a busy 2-core machine) and a skip that names the apt-get command when a binary is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ops.procs import APT_HINT, binary


def require(name: str) -> str:
    path = binary(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian: {APT_HINT})")
    return path


@pytest.fixture(scope="session")
def tiny_model(tiny_dir) -> Path:
    from tests.model.make_tiny import make_variant
    return make_variant("llama-gguf-q8_0", tiny_dir)
