"""Type stub of the compiled extension inferd._cpu (ext/_cpu.pyx): its names are Any to mypy."""

from typing import Any

def __getattr__(name: str) -> Any: ...
