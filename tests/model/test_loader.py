"""load_model's start-up paths: the tokenizer built in the background while the caller builds the weights, and
garbage collection paused while loading."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from inferd.model.errors import ModelLoadError
from inferd.model.loader import load_model
from tests.model.make_tiny import TinySpec, write_tiny_gguf


@pytest.fixture
def tiny(tmp_path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec(n_layers=1), "Q8_0")


def _with_merges(src: Path, dst: Path, merges: list[str]) -> Path:
    """A copy of `src` with another tokenizer.ggml.merges."""
    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = merges if name == "tokenizer.ggml.merges" else f.contents()
        if f.types[0] == GGUFValueType.ARRAY:
            w.add_key_value(name, value, f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(name, value, f.types[0])
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_deferred_tokenizer_is_the_same_tokenizer(tiny):
    now, later = load_model(tiny), load_model(tiny, deferred_tokenizer=True)
    text = "Hello world, <|im_start|>user\nhi 12345 ünïcödé"
    assert later.tokenizer.encode(text) == now.tokenizer.encode(text) != []
    assert later.tokenizer.vocab_size == now.tokenizer.vocab_size
    assert (later.tokenizer.bos_id, later.tokenizer.eos_ids) == (now.tokenizer.bos_id, now.tokenizer.eos_ids)
    assert later.tokenizer is later.tokenizer  # built once


def test_deferred_tokenizer_is_built_once_for_readers_on_several_threads(tiny):
    from concurrent.futures import ThreadPoolExecutor

    model = load_model(tiny, deferred_tokenizer=True)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: model.tokenizer, range(8)))
    assert all(t is got[0] for t in got) and got[0].vocab_size == model.config.vocab_size


def test_deferred_tokenizer_raises_its_load_error_to_every_reader(tiny, tmp_path):
    merges = GGUFReader(str(tiny)).fields["tokenizer.ggml.merges"].contents()
    bad = _with_merges(tiny, tmp_path / "bad.gguf", ["zzzq qqqz"] + merges[1:])
    with pytest.raises(ModelLoadError, match=r"tokenizer: tokenizer.ggml.merges entry 'zzzq qqqz' does not join"):
        load_model(bad)
    model = load_model(bad, deferred_tokenizer=True)  # the weights load; the tokenizer's error comes when read
    assert model.tensors["token_embd.weight"].rows == model.config.vocab_size
    with pytest.raises(ModelLoadError, match=r"tokenizer: tokenizer.ggml.merges entry 'zzzq qqqz' does not join") as e:
        _ = model.tokenizer  # reading it raises the build's error
    assert str(bad) in str(e.value)
    with pytest.raises(ModelLoadError, match=r"does not join"):
        _ = model.tokenizer  # and so does every later read


def test_garbage_collection_is_back_on_after_loads(tiny):
    assert gc.isenabled()
    load_model(tiny)
    assert gc.isenabled()
    model = load_model(tiny, deferred_tokenizer=True)
    assert gc.isenabled()
    _ = model.tokenizer  # built now, with collection paused while it runs
    assert gc.isenabled()
    gc.disable()
    try:
        load_model(tiny)
        assert not gc.isenabled()  # a caller's own choice is kept
    finally:
        gc.enable()
