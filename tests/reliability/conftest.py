"""Reliability fixtures: the server fixtures of tests/server (same in-process ServerThread), a tiny random model for
tests where the model's quality does not matter, and the soak mode.

Soak mode: short (CI, the default) or long: `pytest tests/reliability --soak-long` or INFERD_SOAK=long (the
environment variable works from any directory; the option only when tests/reliability is on the command line,
because pytest reads options from the conftest files it sees at start-up).
"""

from __future__ import annotations

import os

import pytest

from tests.server.conftest import loaded_model, make_server, model_path  # noqa: F401  (fixtures, re-exported)


def pytest_addoption(parser):
    try:
        parser.addoption("--soak-long", action="store_true", default=False,
                         help="run the reliability soak in its long mode (same as INFERD_SOAK=long)")
    except ValueError:   # already added by another conftest
        pass


@pytest.fixture(scope="session")
def soak_mode(pytestconfig) -> str:
    if pytestconfig.getoption("--soak-long", default=False):
        return "long"
    mode = os.environ.get("INFERD_SOAK", "short").lower()
    if mode not in ("short", "long"):
        raise pytest.UsageError(f"INFERD_SOAK must be short or long, got {mode!r}")
    return mode


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random llama (Q8_0 GGUF, 2 layers, 512-token vocabulary, context 512): milliseconds per step."""
    from inferd.model.loader import load_model
    from tests.model.make_tiny import make_variant
    return load_model(make_variant("llama-gguf-q8_0", tmp_path_factory.mktemp("reliability-tiny")))
