"""bench/_common.py: the ABBA order, the spread, the choice of llama.cpp's best setting, llama-bench's JSON and
the environment llama.cpp's tools get (no OpenMP variables leak into it)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _common  # noqa: E402


def test_abba_alternates_which_side_goes_first():
    assert [_common.abba(r, ("A", "B")) for r in range(4)] == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]


def test_abba_orders_pairs_only():
    with pytest.raises(ValueError, match="pair"):
        _common.abba(0, ("A", "B", "C"))


def test_spread_and_median():
    assert _common.spread([3.0, 1.5, 2.0]) == (1.5, 3.0)
    assert _common.fmt_range([1.234, 2.0, 1.5], 2) == "1.23-2.00"
    assert _common.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    with pytest.raises(ValueError):
        _common.spread([])
    with pytest.raises(ValueError):
        _common.median([])


def test_best_config_is_the_highest_median_not_the_best_sample():
    samples = {"fa0 ub256": [100.0, 100.0, 300.0], "fa1 ub512": [150.0, 140.0, 145.0]}
    assert _common.best_config(samples) == "fa1 ub512"
    assert _common.best_config({"a": [1.0], "b": [1.0]}) == "a"
    with pytest.raises(ValueError):
        _common.best_config({})


def test_peer_env_drops_openmp_and_asks_for_huge_pages():
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "GOMP_SPINCOUNT": "0", "KMP_AFFINITY": "x",
            "LD_LIBRARY_PATH": "/usr/lib"}
    env = _common.peer_env(None, base)
    assert env == {"PATH": "/bin", "LD_LIBRARY_PATH": "/usr/lib", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    env = _common.peer_env(Path("/opt/noamx"), base)
    assert env["LD_LIBRARY_PATH"] == "/opt/noamx:/usr/lib"
    assert "OMP_NUM_THREADS" not in env


def test_peer_env_words_say_what_was_removed(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    words = _common.peer_env_words({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    assert words.startswith("env ")
    assert "-u OMP_NUM_THREADS" in words and "GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in words


def test_test_sizes_read_llama_bench_names():
    assert _common.test_sizes("pp512") == (512, 0)
    assert _common.test_sizes("tg128") == (0, 128)
    for bad in ("pp", "tg0", "pg512", "pp-1", "512"):
        with pytest.raises(ValueError, match="ppN"):
            _common.test_sizes(bad)


def _row(n_prompt, n_gen, depth, fa, ub, samples):
    return {"n_prompt": n_prompt, "n_gen": n_gen, "n_depth": depth, "flash_attn": fa, "n_ubatch": ub,
            "samples_ts": samples, "avg_ts": sum(samples) / len(samples)}


def test_parse_llama_bench_keys_by_test_depth_and_setting():
    text = json.dumps([_row(512, 0, 0, False, 256, [10.0, 11.0]), _row(512, 0, 0, True, 512, [12.0, 13.0]),
                       _row(0, 128, 4096, True, 512, [5.0, 6.0])])
    got = _common.parse_llama_bench(text)
    assert got == {("pp512", 0): {"fa0 ub256": [10.0, 11.0], "fa1 ub512": [12.0, 13.0]},
                   ("tg128", 4096): {"fa1 ub512": [5.0, 6.0]}}


def test_parse_llama_bench_refuses_mixed_tests():
    with pytest.raises(ValueError, match="unexpected"):
        _common.parse_llama_bench(json.dumps([_row(512, 128, 0, True, 512, [1.0])]))
