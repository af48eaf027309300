"""inferd's logits equal llama.cpp's on the same tiny GGUF files: Gemma 3, Qwen3 and a Llama 3.2-shaped model (the
architectures no small real file at hand covers), written by tests/model/make_tiny.py.

How llama.cpp's side is read: `llama-server -m FILE` (built by ../shared/peers/llama-cpp.sh; skipped when absent),
/completion with the prompt as token ids, greedy, n_probs=5: for each generated token that ends a UTF-8 character,
llama.cpp's token and its five most likely tokens with their log-probabilities (of the raw logits, before
sampling). inferd is fed the prompt plus llama.cpp's tokens (teacher forcing), and at every reported position its
log-probabilities of those five tokens must be within LOGPROB_TOL of llama.cpp's, and its greedy choice must be
llama.cpp's token unless llama.cpp's own top two are within NEAR_TIE.

The prompts are longer than the Gemma model's 40-position window, so its local layers attend to a window that
slides; the weights are F32/F16, which both engines multiply without quantizing activations, so what is left is
float32 arithmetic and the f16 KV cache of both. Measured (llama.cpp 0.3.36): at most 2.9e-3 apart on Gemma 3,
5.8e-3 on Qwen3, 7.0e-3 on the Llama 3.2-shaped model (F16).
"""
from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from inferd.engine.engine import Engine, SeqInput
from inferd.model.loader import load_model
from tests.model.make_tiny import make_variant

LOGPROB_TOL = 0.02
NEAR_TIE = 0.05
PROMPT_LEN = 100
GENERATE = 24
VARIANTS = ["gemma3-gguf-f32", "qwen3-gguf-f32", "llama32-gguf-f16"]


def llama_cpp_tool(name: str) -> Path | None:
    """llama.cpp's tool `name` (llama-server, llama-perplexity) as ../shared/peers/llama-cpp.sh builds it, or in
    $INFERD_LLAMA_CPP_BIN; None when it is not built"""
    env = os.environ.get("INFERD_LLAMA_CPP_BIN")
    pattern = os.path.expanduser(f"~/.cache/inferd-peers/llama.cpp-*/build/bin/{name}")
    found = [Path(env) / name] if env else [Path(p) for p in sorted(glob.glob(pattern))]
    return next((p for p in found if p.is_file() and os.access(p, os.X_OK)), None)


def llama_server_path() -> Path | None:
    return llama_cpp_tool("llama-server")


@pytest.fixture(scope="module")
def llama_server():
    path = llama_server_path()
    if path is None:
        pytest.skip("llama.cpp's llama-server is not built (../shared/peers/llama-cpp.sh builds it)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def ends_characters(token_bytes, tokens: list[int]) -> list[bool]:
    """Per token: whether the generated text after it does not end inside a multi-byte character, by llama-server's
    own test (its last 1-3 bytes hold no lead byte of a longer sequence; continuation bytes are not checked).
    llama-server reports probabilities only for those tokens."""
    out, text = [], b""
    for tok in tokens:
        text += token_bytes(tok)
        cut = False
        for back in range(1, min(4, len(text)) + 1):
            lead = text[-back]
            need = 2 if lead & 0xE0 == 0xC0 else 3 if lead & 0xF0 == 0xE0 else 4 if lead & 0xF8 == 0xF0 else 0
            if need > back:
                cut = True
                break
        out.append(not cut)
    return out


def llama_cpp_greedy(server: Path, model: Path, prompt: list[int], log: Path,
                     token_bytes, args: tuple[str, ...] = ()) -> tuple[list[int], list[dict | None]]:
    """llama.cpp's greedy continuation of `prompt` (token ids) and, per token, its top-5 log-probabilities, or None
    where llama-server reports none: it leaves out tokens that end inside a UTF-8 character (byte tokens), so its
    probability entries go, in order, to the tokens that end a character."""
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", "2",
                                 "-c", "512", "-np", "1", "--no-webui", *args], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"llama-server did not start on {model.name}:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        r = post(f"http://127.0.0.1:{port}/completion",
                 {"prompt": prompt, "n_predict": GENERATE, "temperature": 0, "n_probs": 5, "cache_prompt": False,
                  "ignore_eos": True, "return_tokens": True})
        tokens, entries = r["tokens"], iter(r["completion_probabilities"])
        steps: list[dict | None] = []
        for tok, whole in zip(tokens, ends_characters(token_bytes, tokens)):
            entry = next(entries, None) if whole else None
            assert entry is None or entry["id"] == tok, f"llama.cpp's entry for {entry['id']} is at token {tok}"
            steps.append(entry)
        assert next(entries, None) is None, "a probability entry matched no generated token"
        return tokens, steps
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    peak = logits.max(1, keepdims=True)
    return logits - (peak + np.log(np.exp(logits - peak).sum(1, keepdims=True)))


def assert_agrees_with_llama_cpp(logprobs: np.ndarray, steps: list, what: str) -> None:
    """Our log-probabilities (one row per generated position) within LOGPROB_TOL of every top entry llama.cpp
    reported, and our greedy pick its own wherever its top two are not a near tie."""
    worst = 0.0
    for i, step in enumerate(steps):
        if step is None:
            continue
        top = step["top_logprobs"]
        for entry in top:
            worst = max(worst, abs(logprobs[i, entry["id"]] - entry["logprob"]))
        ours = int(np.argmax(logprobs[i]))
        if ours != step["id"]:
            assert top[0]["logprob"] - top[1]["logprob"] < NEAR_TIE, \
                f"{what} token {i}: we pick {ours}, llama.cpp {step['id']} ({top})"
    assert worst < LOGPROB_TOL, f"{what}: log-probabilities up to {worst:.4f} apart from llama.cpp's"


@pytest.mark.parametrize("name", VARIANTS)
def test_logprobs_match_llama_cpp(llama_server, tmp_path, name):
    path = make_variant(name, tmp_path)
    model = load_model(path)
    prompt = np.random.default_rng(3).integers(3, model.config.vocab_size, PROMPT_LEN).tolist()
    token_bytes = lambda t: model.tokenizer.token_bytes(t, False)  # noqa: E731
    theirs, steps = llama_cpp_greedy(llama_server, path, prompt, tmp_path / "llama-server.log", token_bytes)
    assert len(theirs) == GENERATE and sum(s is not None for s in steps) >= GENERATE // 2

    eng = Engine(model, num_kv_blocks=4, max_batch_tokens=256, max_seqs=1, threads=2, max_logits_rows=256)
    logits = eng.step([SeqInput(prompt + theirs, 0, [0, 1, 2, 3], 0, want_logits=True)])[0].logits
    assert_agrees_with_llama_cpp(log_softmax(logits[PROMPT_LEN - 1:PROMPT_LEN - 1 + GENERATE]), steps, name)
