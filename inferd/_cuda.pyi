"""Type stub of the compiled extension inferd._cuda (ext/_cuda.pyx): its names are Any to mypy."""

from typing import Any

def __getattr__(name: str) -> Any: ...
