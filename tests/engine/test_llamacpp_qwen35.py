"""inferd's log-probabilities equal llama.cpp's on tiny Qwen3.5 GGUF files (Gated DeltaNet layers beside gated
attention with partial RoPE; and Qwen3.5-MoE, the same with a mixture of experts and a gated shared expert), written
by tests/model/make_tiny.py and read by llama.cpp as its own `qwen35` and `qwen35moe`; and Qwen3-Next, `qwen3next`,
in its files' two layouts: the same
teacher forcing and tolerances as tests/engine/test_llamacpp_tiny.py's dense files (llama.cpp's greedy tokens, the five
most likely tokens' log-probabilities within LOGPROB_TOL at every reported position, the greedy choice equal unless
llama.cpp's top two are within NEAR_TIE). The F32 file is multiplied without quantized activations by both engines.

inferd runs the prompt and llama.cpp's tokens twice: as one prefill chunk, and as chunks of uneven sizes, which must
give the same bits; both then agree with llama.cpp. Measured (llama.cpp 0.3.36): at most 1.1e-3 apart on Qwen3.5,
1.5e-3 on Qwen3.5-MoE, 1.3e-3 on Qwen3-Next and 3.4e-3 on its older layout."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.engine.engine import Engine, SeqInput
from inferd.model.loader import load_model
from tests.engine.test_llamacpp_tiny import (GENERATE, PROMPT_LEN, assert_agrees_with_llama_cpp, llama_cpp_greedy,
                                             llama_server, log_softmax)
from tests.model.make_tiny import make_variant

__all__ = ["llama_server"]   # the module's fixture, shared
PROMPT_SEEDS = {"qwen35": 3, "qwen35moe": 3, "qwen3next": 3, "qwen3next-ssm_in": 3}


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe", "qwen3next", "qwen3next-ssm_in"])
def test_qwen35_logprobs_match_llama_cpp(llama_server, tmp_path, arch):
    path = make_variant(f"{arch}-gguf-f32", tmp_path)
    model = load_model(path)
    prompt = np.random.default_rng(PROMPT_SEEDS[arch]).integers(3, model.config.vocab_size, PROMPT_LEN).tolist()
    token_bytes = lambda t: model.tokenizer.token_bytes(t, False)  # noqa: E731
    theirs, steps = llama_cpp_greedy(llama_server, path, prompt, tmp_path / "llama-server.log", token_bytes)
    assert len(theirs) == GENERATE and sum(s is not None for s in steps) >= GENERATE // 2

    toks = prompt + theirs
    eng = Engine(model, num_kv_blocks=4, max_batch_tokens=256, max_seqs=2, threads=2, max_logits_rows=256)
    whole = eng.step([SeqInput(toks, 0, [0, 1], 0, want_logits=True, state_slot=0)])[0].logits
    chunked, start = [], 0
    for n in (37, 1, PROMPT_LEN - 38 + 5, len(toks) - PROMPT_LEN - 5):
        chunked.append(eng.step([SeqInput(toks[start:start + n], start, [2, 3], 0, want_logits=True,
                                          state_slot=1)])[0].logits)
        start += n
    assert start == len(toks) and np.array_equal(np.concatenate(chunked), whole)

    assert_agrees_with_llama_cpp(log_softmax(whole[PROMPT_LEN - 1:PROMPT_LEN - 1 + GENERATE]), steps, arch)
