"""The published chat templates of the 2026 tool-call formats (Qwen3-Coder, Qwen3.5, GLM-4.6/4.7, DeepSeek V3.1
and R1's distill), for detection and for rendering past calls the way the model reads them: the copies in
chat_templates/, else llama.cpp's source tree (models/templates), else the test is skipped."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "chat_templates"
LLAMA_CPP = Path(os.environ.get("INFERD_LLAMA_CPP", Path.home() / ".cache/inferd-peers/llama.cpp-0.3.36"))


def template(name: str) -> str:
    for folder in (HERE, LLAMA_CPP / "models" / "templates"):
        path = folder / f"{name}.jinja"
        if path.is_file():
            return path.read_text()
    pytest.skip(f"{name}.jinja is in neither {HERE} nor llama.cpp's source tree")
