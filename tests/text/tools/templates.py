"""The published chat templates of the 2026 tool-call formats, read from llama.cpp's source tree where it is present
(models/templates: Qwen3-Coder, Qwen3.5, GLM-4.6/4.7, DeepSeek V3.1 and R1's distill), for detection and for
rendering past calls the way the model reads them."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

LLAMA_CPP = Path(os.environ.get("INFERD_LLAMA_CPP", Path.home() / ".cache/inferd-peers/llama.cpp-0.3.36"))
TEMPLATES = LLAMA_CPP / "models" / "templates"


def template(name: str) -> str:
    path = TEMPLATES / f"{name}.jinja"
    if not path.is_file():
        pytest.skip(f"{path} not present (llama.cpp's source tree)")
    return path.read_text()
