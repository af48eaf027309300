"""inferd's log-probabilities equal llama.cpp's on tiny mixture-of-experts GGUF files of every MoE architecture
(Qwen3-MoE, Qwen2-MoE with its shared expert, OLMoE, Mixtral, gpt-oss), written by tests/model/make_tiny.py; read and
held to the same tolerances as tests/engine/test_llamacpp_tiny.py's dense files (teacher forcing on llama.cpp's greedy
tokens, the five most likely tokens' log-probabilities within LOGPROB_TOL at every reported position). The weights are
F32, so neither engine quantizes activations. Measured (llama.cpp 0.3.36): at most 7.1e-3 apart, as on the dense
files (gpt-oss: 6.8e-3). gpt-oss's MXFP4 file is held to the quantized tolerances below.

One thing dense files do not have: a router whose k-th and (k+1)-th logits are nearly equal picks either expert,
depending on float32 rounding in each engine (measured, with routers three times as sharp as these: a margin of
1.3e-3 flipped in one position of 250 routing decisions, moving that token's log-probabilities by 0.56). So the
float64 reference measures every position's margin (tests/reference.py), each prompt is one whose positions all
route with a margin over ROUTE_MARGIN, and positions are compared up to the first near tie among llama.cpp's tokens
(a flip there changes the keys and values later positions read)."""
from __future__ import annotations

import numpy as np
import pytest

from inferd.engine.engine import Engine, SeqInput
from inferd.model.loader import load_model
from tests.engine.test_llamacpp_tiny import (GENERATE, LOGPROB_TOL, NEAR_TIE, PROMPT_LEN, llama_cpp_greedy,
                                             llama_server)
from tests.model.make_tiny import make_variant
from tests.reference import Reference

__all__ = ["llama_server"]   # the module's fixture, shared
ROUTE_MARGIN = 0.003
# each file and the seed of a prompt that routes clear of ties on it
PROMPT_SEEDS = {"qwen3moe-gguf-f32": 13, "qwen2moe-gguf-f32": 4, "olmoe-gguf-f32": 12, "mixtral-gguf-f32": 13,
                "gpt-oss-gguf-f32": 2, "gpt-oss-gguf-mxfp4": 95}
# gpt-oss's MXFP4 experts (and Q8_0 matrices) take 8-bit activations in both engines, each rounding them its own way
# (llama.cpp's block scale an f16 and its halves rounded away from zero, inferd's a float32 and halves to even), which
# moves router logits by hundredths: margins are measured with the reference's activations rounded as inferd's, ties
# are QUANT_ROUTE_MARGIN wide, log-probabilities are held to QUANT_LOGPROB_TOL and greedy choices may part where
# llama.cpp's top two are within QUANT_NEAR_TIE. Measured: 0.15 apart at most; against the float64 reference with
# inferd's 8-bit activations, inferd is within 0.043 and llama.cpp within 0.12, as llama.cpp is on the same model
# written with Q8_0 experts (0.12): its distance is its activations' rounding, not MXFP4's.
QUANT_ROUTE_MARGIN = 0.01
QUANT_LOGPROB_TOL = 0.25
QUANT_NEAR_TIE = 0.3   # tests/engine/test_llamacpp_agreement.py's, for 8-bit activations
MIN_COMPARED = 8


def clear_routing_until(model, tokens: list[int], act_quant: bool = False, margin: float = ROUTE_MARGIN) -> int:
    """The first position whose routing, in some layer, is within `margin` of a tie (len(tokens) if none); act_quant:
    in the reference whose quantized matmuls take 8-bit activations, as both engines' do."""
    ref = Reference(model.config, model.tensors)
    ref.forward(tokens, kv_dtype=np.float16, logit_rows=[len(tokens) - 1], act_quant=act_quant)
    near = np.flatnonzero(np.min(np.stack(ref.route_margins), axis=0) < margin)
    return int(near[0]) if near.size else len(tokens)


@pytest.mark.parametrize("arch", list(PROMPT_SEEDS))
def test_moe_logprobs_match_llama_cpp(llama_server, tmp_path, arch):
    path = make_variant(arch, tmp_path)
    model = load_model(path)
    prompt = np.random.default_rng(PROMPT_SEEDS[arch]).integers(3, model.config.vocab_size, PROMPT_LEN).tolist()
    token_bytes = lambda t: model.tokenizer.token_bytes(t, False)  # noqa: E731
    theirs, steps = llama_cpp_greedy(llama_server, path, prompt, tmp_path / "llama-server.log", token_bytes)
    assert len(theirs) == GENERATE and sum(s is not None for s in steps) >= GENERATE // 2
    quantized = arch.endswith("mxfp4")
    clear = clear_routing_until(model, prompt + theirs, quantized, QUANT_ROUTE_MARGIN if quantized else ROUTE_MARGIN)
    assert clear >= PROMPT_LEN, f"{arch}: the prompt routes within {ROUTE_MARGIN} of a tie at position {clear}"
    compared = [i for i, s in enumerate(steps) if s is not None and PROMPT_LEN - 1 + i < clear]
    assert len(compared) >= MIN_COMPARED, f"{arch}: only {len(compared)} positions route clear of ties"

    eng = Engine(model, num_kv_blocks=4, max_batch_tokens=256, max_seqs=1, threads=2, max_logits_rows=256)
    logits = eng.step([SeqInput(prompt + theirs, 0, [0, 1, 2, 3], 0, want_logits=True)])[0].logits
    logits = logits[PROMPT_LEN - 1:PROMPT_LEN - 1 + GENERATE].astype(np.float64)
    peak = logits.max(1, keepdims=True)
    logprobs = logits - (peak + np.log(np.exp(logits - peak).sum(1, keepdims=True)))
    worst = 0.0
    for i in compared:
        step = steps[i]
        top = step["top_logprobs"]
        for entry in top:
            worst = max(worst, abs(logprobs[i, entry["id"]] - entry["logprob"]))
        # the tokens llama.cpp ranks above its greedy choice are the end-of-generation ones ignore_eos bans
        rank = [e["id"] for e in top].index(step["id"])
        row = logits[i].copy()
        row[[e["id"] for e in top[:rank]]] = -np.inf
        ours = int(np.argmax(row))
        if ours != step["id"]:
            assert top[rank]["logprob"] - top[rank + 1]["logprob"] < (QUANT_NEAR_TIE if quantized else NEAR_TIE), \
                f"{arch} token {i}: we pick {ours}, llama.cpp {step['id']} ({top})"
    tol = QUANT_LOGPROB_TOL if quantized else LOGPROB_TOL
    assert worst < tol, f"{arch}: log-probabilities up to {worst:.4f} apart from llama.cpp's"
