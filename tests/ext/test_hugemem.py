"""A model's weights live in one 2 MB-aligned mapping (ext/cpu/hugemem.c), first written on 4 KB pages and then moved
into transparent huge pages by a low-priority thread, so a decode step's weight stream needs tens of TLB entries
instead of tens of thousands. The advice is checked through /proc/self/smaps (the "hg" flag); whether the kernel
then backs the mapping with huge pages depends on its version, its THP setting and free memory, so it is asserted
only where the collapse says it moved every page. The weights give the same bits before, during and after the
move, and a model dropped while its collapse still runs stops and joins that thread first."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from inferd import _cpu
from inferd.engine.engine import Engine
from inferd.engine.types import SeqInput
from inferd.engine.weights import build_cpu_model
from tests.reference import random_model

SMAPS = Path("/proc/self/smaps")
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
HUGE = 2 << 20


def mapping_of(address: int) -> dict:
    """The smaps entry holding `address`: its start, end, VmFlags and AnonHugePages (bytes)."""
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
        elif entry is not None and first == "AnonHugePages:":
            entry["huge"] = int(line.split()[1]) * 1024
    assert entry is not None, f"no mapping holds {address:#x}"
    return entry


def threads_of_process() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not SMAPS.exists(), reason="needs /proc/self/smaps (Linux)")
@pytest.mark.parametrize("weight_type", ["Q4_0", "Q8_0", "F16"])
def test_weights_are_one_aligned_mapping_moved_into_huge_pages(weight_type):
    model = random_model(weight_type=weight_type, dim=256, hidden=512, n_layers=4, n_heads=4, n_kv_heads=2,
                         vocab=1000, tie=False)
    cpu = build_cpu_model(model)
    address, size = cpu.weight_buffer
    assert address % HUGE == 0
    assert size >= cpu.weight_bytes > 0                   # every weight the steps read is in it (plus the embedding)
    assert cpu.huge_pages in ("collapsing", "all", "partly", "none")
    state = cpu.wait_huge_pages()
    assert state == cpu.huge_pages
    m = mapping_of(address)
    assert m["end"] - address >= size                     # one mapping holds it all
    if THP.exists() and "[never]" not in THP.read_text():
        assert state in ("all", "partly", "none")         # "none": a kernel without MADV_COLLAPSE
        assert "hg" in m["flags"]                         # advised either way, for khugepaged
        if state == "all":
            assert m["huge"] >= (size + HUGE - 1) // HUGE * HUGE
    else:
        assert state == "none"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc/self/task (Linux)")
def test_a_deferred_move_waits_for_its_start_with_no_thread():
    """A server builds its engine with huge_pages_now=False and starts the move once ready: until then there is no
    collapsing thread; started twice, one; waited for without a start, it starts."""
    model = random_model(weight_type="Q8_0", dim=256, hidden=512, n_layers=2, n_heads=4, n_kv_heads=2, vocab=1000)
    before = threads_of_process()
    cpu = build_cpu_model(model, huge_pages_now=False)
    assert cpu.huge_pages == "waiting" and threads_of_process() == before
    cpu.start_huge_pages()
    cpu.start_huge_pages()
    assert cpu.huge_pages != "waiting"
    assert cpu.wait_huge_pages() in ("all", "partly", "none")
    waited = build_cpu_model(model, huge_pages_now=False)
    assert waited.wait_huge_pages() in ("all", "partly", "none")
    del cpu, waited
    assert threads_of_process() == before


def test_logits_are_the_same_bits_while_the_weights_move_and_after():
    model = random_model(weight_type="Q4_0", dim=1024, hidden=2816, n_layers=6, n_heads=8, n_kv_heads=4,
                         vocab=4000, tie=False, seed=3)
    prompt = SeqInput(list(range(7, 40)), 0, [0], want_logits=True)
    engine = Engine(model, num_kv_blocks=2, max_batch_tokens=64, max_seqs=1, threads=2)
    first = engine.step([prompt])[0].logits                # most likely while the collapse still runs
    engine.wait_huge_pages()
    np.testing.assert_array_equal(engine.step([prompt])[0].logits, first)
    settled = Engine(model, num_kv_blocks=2, max_batch_tokens=64, max_seqs=1, threads=1)
    settled.wait_huge_pages()
    np.testing.assert_array_equal(settled.step([prompt])[0].logits, first)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc/self/task (Linux)")
def test_a_model_dropped_while_collapsing_stops_and_joins_its_thread():
    model = random_model(weight_type="Q8_0", dim=1024, hidden=2816, n_layers=8, n_heads=8, n_kv_heads=4,
                         vocab=4000, tie=False)
    before = threads_of_process()
    for _ in range(4):
        cpu = build_cpu_model(model)                      # its collapse (tens of MB) has just begun
        del cpu                                           # stopped between two pages, joined, then unmapped
        assert threads_of_process() == before
    cpu = build_cpu_model(model)
    assert cpu.wait_huge_pages() == cpu.wait_huge_pages()  # waiting twice is fine
    del cpu
    assert threads_of_process() == before


def test_the_bandwidth_probe_reads_memory_after_its_collapse():
    assert 1e8 < _cpu.measure_read_bandwidth(8 << 20, 1, 1) < 1e13    # bytes/s: a memory, not an error
