"""A model's weights live in one 2 MB-aligned mapping advised for transparent huge pages (ext/cpu/hugemem.c), so a
decode step's weight stream needs tens of TLB entries instead of tens of thousands. The advice is checked through
/proc/self/smaps (the "hg" flag); whether the kernel then backs it with huge pages depends on its THP setting and on
free memory, so that is not asserted."""
from __future__ import annotations

from pathlib import Path

import pytest

from inferd.engine.weights import build_cpu_model
from tests.reference import random_model

SMAPS = Path("/proc/self/smaps")
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def mapping_of(address: int) -> dict:
    """The smaps entry holding `address`: its start, end and VmFlags."""
    entry = None
    for line in SMAPS.read_text().splitlines():
        first = line.split(maxsplit=1)[0]
        if "-" in first and not first.endswith(":"):       # a mapping's header: start-end perms offset ...
            if entry is not None:
                break
            start, end = (int(x, 16) for x in first.split("-"))
            if start <= address < end:
                entry = {"start": start, "end": end}
        elif entry is not None and first == "VmFlags:":
            entry["flags"] = line.split()[1:]
    assert entry is not None, f"no mapping holds {address:#x}"
    return entry


@pytest.mark.skipif(not SMAPS.exists(), reason="needs /proc/self/smaps (Linux)")
@pytest.mark.parametrize("weight_type", ["Q4_0", "Q8_0", "F16"])
def test_weights_are_one_aligned_mapping_advised_for_huge_pages(weight_type):
    model = random_model(weight_type=weight_type, dim=256, hidden=512, n_layers=4, n_heads=4, n_kv_heads=2,
                         vocab=1000, tie=False)
    cpu = build_cpu_model(model)
    address, size = cpu.weight_buffer
    assert address % (2 << 20) == 0
    assert size >= cpu.weight_bytes > 0                   # every weight the steps read is in it (plus the embedding)
    m = mapping_of(address)
    assert m["end"] - address >= size                     # one mapping holds it all
    if THP.exists() and "[never]" not in THP.read_text():
        assert "hg" in m["flags"]

