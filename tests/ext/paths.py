"""The kernel paths this CPU can run, for tests that compare them (every path must give the same bits)."""
from __future__ import annotations

from inferd import _cpu

ALL_PATHS = ("scalar", "avx2", "avx512vnni", "avxvnni")


def available_paths() -> list[str]:
    old, ok = _cpu.get_path(), []
    for p in ALL_PATHS:
        try:
            _cpu.set_path(p)
            ok.append(p)
        except ValueError:
            pass
    _cpu.set_path(old)
    return ok


PATHS = available_paths()
