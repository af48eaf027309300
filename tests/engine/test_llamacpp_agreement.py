"""SmolLM2's greedy output equals llama.cpp's.

How the expected tokens were recorded: llama.cpp 0.3.36 (built by ../shared/peers/llama-cpp.sh), `llama-server -m
SmolLM2-135M-Instruct.Q4_1.gguf -t 2`; each prompt below was rendered with the model's ChatML template (with its
default system prompt), tokenized by the server's /tokenize, and completed by /completion with
{"prompt": ids, "n_predict": 32, "temperature": 0, "cache_prompt": false}; `tokens` is the server's answer.

Both engines quantize activations to 8 bits per 32 values before every Q4_1 matmul; llama.cpp in addition rounds the
query and the softmax weights to f16 inside attention, which we keep in f32. Quantization turns a tiny difference
into a different rounding of a few activations, so the logits of the two engines differ by up to a few tenths. Where
llama.cpp's top two tokens are that close, greedy paths may part. llama.cpp's own log-probabilities at each place
where ours differ (top two, /completion with n_probs=2):
  capital of France, token 7:  2828 -2.677 vs 12693 -2.746 (margin 0.07)
  capital of France, token 15: 26261 -2.068 vs 28 -2.101 (margin 0.03)
  capital of France, token 16: 651 -2.888 vs 11708 -3.011 (margin 0.12)
  haiku, token 9:               22873 -2.994 vs 6122 -3.000 (margin 0.006)
  sky is blue, token 11:        24484 -0.417 vs 2147 -1.265 (margin 0.85: "Sc|attering" vs "Sc|av")
So the test feeds llama.cpp's tokens (teacher forcing) and requires, at every one of the 32 positions, that our
greedy choice is llama.cpp's token, or that llama.cpp's token is within NEAR_TIE logits of our choice. It also
requires the free-running greedy output to equal llama.cpp's up to the first such near tie.
"""
from __future__ import annotations

import pytest

from inferd.engine.engine import Engine
from inferd.text.chat import render_chat
from tests.engine.agreement import assert_greedy_agrees

# logits. The largest gap seen at a disagreement: 0.246 at "france" token 15 (GEMM-shaped attention),
# where the float64 reference without 8-bit activations prefers our token by 0.285 and, with them, llama.cpp's by
# 0.39: which side a near tie falls on is the activations' rounding, not an error.
NEAR_TIE = 0.3

CASES = [
    ('What is the capital of France?',
     [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2, 198,
      1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
     [60, 23, 39614, 1141, 552, 28, 2618, 2828, 313, 7712, 769, 28, 2618, 2849, 1558, 26261, 651, 89, 28, 2618, 2849,
      1558, 26261, 651, 89, 28, 2618, 2849, 1558, 26261, 651, 89]),
    ('Write a haiku about the ocean.',
     [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2, 198,
      1, 4093, 198, 19161, 253, 421, 30614, 563, 260, 5065, 30, 2, 198, 1, 520, 9531, 198],
     [788, 260, 16862, 282, 260, 5065, 28, 253, 13879, 22873, 28, 253, 13879, 22873, 28, 253, 13879, 22873, 28, 253,
      13879, 22873, 28, 253, 13879, 22873, 28, 253, 13879, 22873, 28, 253]),
    ('Explain in two sentences why the sky is blue.',
     [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2, 198,
      1, 4093, 198, 36971, 281, 827, 8545, 1701, 260, 6376, 314, 4461, 30, 2, 198, 1, 520, 9531, 198],
     [504, 6376, 314, 4461, 975, 282, 253, 980, 1217, 13739, 43464, 24484, 28, 837, 1420, 13242, 5383, 6756, 282, 1512,
      284, 314, 753, 6475, 411, 601, 30, 1550, 8118, 9732, 653, 5264]),
]


@pytest.fixture(scope="module")
def smollm2(smollm2_model):
    model = smollm2_model
    engine = Engine(model, num_kv_blocks=8, max_batch_tokens=128, max_seqs=1, max_logits_rows=128)
    return model, engine


@pytest.mark.parametrize("prompt,prompt_ids,expected", CASES, ids=["france", "haiku", "sky"])
def test_greedy_matches_llama_cpp(smollm2, prompt, prompt_ids, expected):
    model, engine = smollm2
    text = render_chat(model.chat_template, [{"role": "user", "content": prompt}], model.tokenizer,
                       add_generation_prompt=True)
    assert model.tokenizer.encode(text, add_special=False) == prompt_ids

    assert_greedy_agrees(engine, prompt_ids, expected, NEAR_TIE, 7, list(range(4)))
