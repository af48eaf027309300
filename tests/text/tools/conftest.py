"""The vocabularies the tool-call tests walk grammars with: the real Qwen2.5-Coder file (its chat template and
vocabulary, where the file is present) and the tiny Mistral GGUF with Mistral's control tokens
(tests/text/mistral_v11.py)."""
from __future__ import annotations

import pytest
from gguf import GGUFReader

from inferd.text.grammar import GrammarCompiler
from inferd.text.tokenizer import Tokenizer
from tests.text.mistral_v11 import write_tiny_mistral
from tests.text.tools.calls import QWEN


@pytest.fixture(scope="session")
def qwen():
    if not QWEN.is_file():
        pytest.skip(f"{QWEN} not fetched")
    from inferd.model.gguf import validate_gguf

    metadata = validate_gguf(str(QWEN)).metadata
    tok = Tokenizer.from_gguf(metadata)
    template = metadata["tokenizer.chat_template"]
    compiler = GrammarCompiler(tok, tok.vocab_size)
    yield tok, template, compiler
    compiler.close()


@pytest.fixture(scope="session")
def mistral(tmp_path_factory):
    path = write_tiny_mistral(tmp_path_factory.mktemp("mistral") / "tiny-mistral.gguf")
    tok = Tokenizer.from_gguf(GGUFReader(str(path)).fields)
    compiler = GrammarCompiler(tok, tok.vocab_size)
    yield tok, compiler
    compiler.close()


@pytest.fixture(scope="session")
def tiny_vocab(tmp_path_factory):
    """format name -> (tokenizer, grammar compiler) of a tiny GGUF with that format's markers as control tokens."""
    from tests.text.tools.tiny import write_tiny

    made: dict = {}

    def get(fmt: str):
        if fmt not in made:
            path = write_tiny(tmp_path_factory.mktemp(fmt), fmt)
            tok = Tokenizer.from_gguf(GGUFReader(str(path)).fields)
            made[fmt] = (tok, GrammarCompiler(tok, tok.vocab_size))
        return made[fmt]

    yield get
    for _, compiler in made.values():
        compiler.close()
