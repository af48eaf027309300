"""A GGUF adapter written as llama.cpp's convert_lora_to_gguf.py writes it, run by llama.cpp itself
(`llama-server -m BASE --lora-scaled ADAPTER:SCALE`) and by inferd on the same tiny base GGUF: the log-probabilities
agree as the base models' do (tests/engine/test_llamacpp_tiny.py's comparison and tolerances), and the adapter
moves them far more than that. Skipped when llama.cpp is not built."""

from __future__ import annotations

import numpy as np
import pytest

from inferd.engine.engine import Engine, SeqInput
from inferd.model.loader import load_model
from inferd.model.lora import load_adapter
from tests.engine.test_llamacpp_tiny import (GENERATE, LOGPROB_TOL, NEAR_TIE, PROMPT_LEN, llama_cpp_greedy,
                                             llama_server)
from tests.model.make_lora import random_lora, write_gguf_lora
from tests.model.make_tiny import make_variant

__all__ = ["llama_server"]   # test_llamacpp_tiny's fixture, shared


@pytest.mark.parametrize("name", ["llama32-gguf-f16", "qwen3-gguf-f32"])
def test_gguf_adapter_matches_llama_cpp(llama_server, tmp_path, name):
    path = make_variant(name, tmp_path)
    model = load_model(path)
    cfg = model.config
    adapter_path = write_gguf_lora(tmp_path / "adapter.gguf", cfg, random_lora(cfg, 8, seed=7, gain=0.5), alpha=16)
    scale = 0.75
    prompt = np.random.default_rng(3).integers(3, cfg.vocab_size, PROMPT_LEN).tolist()
    token_bytes = lambda t: model.tokenizer.token_bytes(t, False)  # noqa: E731
    theirs, steps = llama_cpp_greedy(llama_server, path, prompt, tmp_path / "llama-server.log", token_bytes,
                                     ("--lora-scaled", f"{adapter_path}:{scale}"))
    assert sum(s is not None for s in steps) >= GENERATE // 2

    eng = Engine(model, num_kv_blocks=4, max_batch_tokens=256, max_seqs=2, threads=2, max_logits_rows=256)
    index = eng.add_adapter(load_adapter(adapter_path, cfg))
    rows = slice(PROMPT_LEN - 1, PROMPT_LEN - 1 + GENERATE)

    def logprobs(lora: int) -> np.ndarray:
        x = eng.step([SeqInput(prompt + theirs, 0, [0, 1], 0, want_logits=True, lora=lora, lora_scale=scale)])
        x = x[0].logits[rows].astype(np.float64)
        return x - (x.max(1, keepdims=True) + np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)))

    ours, base = logprobs(index), logprobs(-1)
    worst = moved = 0.0
    for i, step in enumerate(steps):
        if step is None:
            continue
        top = step["top_logprobs"]
        for entry in top:
            worst = max(worst, abs(ours[i, entry["id"]] - entry["logprob"]))
            moved = max(moved, abs(base[i, entry["id"]] - entry["logprob"]))
        if int(np.argmax(ours[i])) != step["id"]:
            assert top[0]["logprob"] - top[1]["logprob"] < NEAR_TIE, f"{name} token {i}: llama.cpp {step['id']}"
    assert worst < LOGPROB_TOL, f"{name}: log-probabilities with the adapter up to {worst:.4f} from llama.cpp's"
    assert moved > 10 * LOGPROB_TOL, f"{name}: the adapter hardly moves llama.cpp's log-probabilities ({moved:.4f})"
