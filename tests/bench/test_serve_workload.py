"""bench/serve.py's workloads: the mixed one is seeded per level and client, its lengths stay in range, exactly a
quarter of it shares the system prompt, prompts start at distinct places, and llama-server's slots fit it."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
_spec = importlib.util.spec_from_file_location("bench_serve", BENCH / "serve.py")
serve = importlib.util.module_from_spec(_spec)
sys.modules["bench_serve"] = serve   # dataclasses look their module up there
_spec.loader.exec_module(serve)


def test_mixed_shapes_are_the_same_for_the_same_seed_and_differ_for_another():
    assert serve.mixed_shapes(8, 2, seed=1) == serve.mixed_shapes(8, 2, seed=1)
    assert serve.mixed_shapes(8, 2, seed=1) != serve.mixed_shapes(8, 2, seed=2)


def test_mixed_lengths_stay_in_range_and_a_quarter_is_shared():
    shapes = [s for client in serve.mixed_shapes(32, 2, seed=1) for s in client]
    assert len(shapes) == 64
    assert all(50 <= s.prompt_tokens <= 2000 and 16 <= s.output_tokens <= 256 for s in shapes)
    shared = [s for s in shapes if s.shared]
    assert len(shared) == 16
    assert all(s.prompt_tokens >= serve.SYSTEM_TOKENS + 50 for s in shared)
    assert max(s.prompt_tokens for s in shapes) > 1500 and min(s.prompt_tokens for s in shapes) < 500


def test_render_shares_only_the_system_prompt():
    text = list(range(10_000))
    shapes = serve.mixed_shapes(8, 2, seed=3)
    requests = serve.render(shapes, text, lambda ids: " ".join(map(str, ids)), seed=3)
    flat = [(s, r) for cs, cr in zip(shapes, requests) for s, r in zip(cs, cr)]
    system = " ".join(map(str, range(serve.SYSTEM_TOKENS)))
    for shape, req in flat:
        words = req.prompt.split()
        assert len(words) == shape.prompt_tokens and req.max_tokens == shape.output_tokens
        assert req.prompt.startswith(system + " ") == shape.shared
    own_starts = [r.prompt.split()[serve.SYSTEM_TOKENS if s.shared else 0] for s, r in flat]
    assert len(set(own_starts)) == len(own_starts)


def test_render_refuses_a_text_too_short():
    with pytest.raises(ValueError, match="too few"):
        serve.render(serve.uniform_shapes(4, 1), list(range(50)), str, seed=0)


def test_context_per_slot_holds_the_longest_request():
    shapes = serve.mixed_shapes(32, 2, seed=1)
    per_slot = serve.context_per_slot(shapes)
    longest = max(s.prompt_tokens for c in shapes for s in c) + max(s.output_tokens for c in shapes for s in c)
    assert per_slot % 256 == 0 and per_slot >= longest * 1.05
    assert serve.context_per_slot(serve.uniform_shapes(4, 2)) == 256   # 100 + 64 tokens and the margins


def test_table_gives_each_metric_of_both_servers_and_their_ratio():
    ll = serve.LevelResult("llama-server", 4, requests=4, output_tokens=256, chunks=256, wall_s=2.0,
                           ttfts=[0.2, 0.4], itls=[0.01, 0.03])
    us = serve.LevelResult("inferd", 4, requests=4, output_tokens=256, chunks=128, wall_s=1.0,
                           ttfts=[0.1, 0.2], itls=[0.02, 0.02])
    rows = serve.table({4: {"llama-server": ll, "inferd": us}})
    assert rows[2] == "| 4 | output tok/s | 128.0 | 256.0 | 2.00x |"
    assert rows[3] == "| 4 | TTFT p50 ms | 300.0 | 150.0 | 0.50x |"
    assert rows[-1] == "| 4 | tokens per chunk | 1.00 | 2.00 | 2.00x |"
    assert len(rows) == 2 + len(serve.METRICS)
