"""gpt-oss's vocabulary (o200k, tokenizer.ggml.pre "gpt-4o" in its GGUF files) read as a GGUF tokenizer encodes text
as OpenAI's own encoder does: the vocabulary and its ranks come from the copy the `quicktok-v1` package ships, its
merges are derived from the ranks as llama.cpp's converter derives them (each token's byte-pair split under the ranks
below its own), and openai-harmony's encoding (tests/text/tools/harmony_oracle.py) gives the ids to match."""
from __future__ import annotations

import struct

import pytest

from inferd.text.tokenizer import NORMAL, Tokenizer, _bytes_to_unicode
from tests.text.tools.harmony_oracle import _quicktok_vocab, harmony_encoding

TEXTS = [
    "Hello world! This is a test of the tokenizer.",
    "CamelCaseWords and snake_case_words, HTTPServer's URLs; I'M SURE THEY'RE FINE, you'll see.",
    "def f(x):\n    return x ** 2  # squares\n\n\tpath/to/file.py\r\n",
    "Numbers: 1234567890, 3.14159, -42, 1e-5 and 000123.",
    "Unicode: café naïve über straße, 日本語のテキスト, Привет мир, मानक हिन्दी, 🙂🚀 emoji.",
    "   leading spaces, trailing spaces   \n\n\n  and   runs   of   spaces",
    "quotes 'single' \"double\" `back` — dashes – and … ellipses",
]


def _ranks() -> dict[bytes, int]:
    vocab = _quicktok_vocab()
    (count,) = struct.unpack_from("<I", vocab, 0)
    at, ranks = 4, {}
    for _ in range(count):
        (n,) = struct.unpack_from("<H", vocab, at)
        piece = vocab[at + 2 : at + 2 + n]
        (rank,) = struct.unpack_from("<I", vocab, at + 2 + n)
        at += 6 + n
        ranks[piece] = rank
    return ranks


def _merge_of(ranks: dict[bytes, int], token: bytes) -> tuple[bytes, bytes]:
    """The two parts a byte-pair encoding under the ranks below token's own leaves of it."""
    parts, limit = [bytes([b]) for b in token], ranks[token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < limit and (best is None or r < best[1]):
                best = (i, r)
        if best is None:
            break
        i = best[0]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    assert len(parts) == 2, token
    return parts[0], parts[1]


@pytest.fixture(scope="module")
def o200k(tmp_path_factory):
    try:
        oracle = harmony_encoding(tmp_path_factory.mktemp("o200k"))
    except (ImportError, FileNotFoundError) as e:
        pytest.skip(f"openai-harmony or quicktok-v1 is not installed: {e}")
    ranks = _ranks()
    byte_char = _bytes_to_unicode()
    text = {tok: "".join(byte_char[b] for b in tok) for tok in ranks}
    tokens = [text[tok] for tok in sorted(ranks, key=ranks.get)]
    merges = [" ".join(text[p] for p in _merge_of(ranks, tok)) for tok in sorted(ranks, key=ranks.get) if len(tok) > 1]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-4o", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [NORMAL] * len(tokens), "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.add_bos_token": False}
    return Tokenizer.from_gguf(meta), oracle


@pytest.mark.parametrize("text", TEXTS)
def test_o200k_encodes_as_openai(o200k, text):
    ours, oracle = o200k
    want = oracle.encode(text, allowed_special="all")
    assert ours.encode(text, add_special=False) == want
    assert ours.decode(want) == text
