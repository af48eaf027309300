"""/api/embed and the older /api/embeddings through the real `ollama` client: an embedding-only server on a tiny
random BERT (Matryoshka dimensions, a 16-token limit), the chat model refusing to embed, and the listings of an
embedding model. Vectors are checked against the in-process Embedder."""
from __future__ import annotations

import httpx
import numpy as np
import ollama
import pytest

from inferd.engine.embedder import Embedder, truncate_dimensions
from inferd.model.embedding import load_embedding_model
from tests.model.make_tiny_embedding import write_tiny_embedding
from tests.server.conftest import ServerThread, make_settings

TEXTS = ["the cat sat on the bank", "stocks fell sharply"]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """The embedding-only server, and the same model in process (the reference)."""
    folder = write_tiny_embedding(tmp_path_factory.mktemp("emb") / "tiny-bert", max_seq_length=16,
                                  matryoshka_dims=[32, 16])
    srv = ServerThread(make_settings(model=str(folder))).start()
    yield srv, Embedder(load_embedding_model(folder), threads=1)
    srv.stop()


@pytest.fixture(scope="module")
def emb_server(tiny_bert):
    return tiny_bert[0]


@pytest.fixture(scope="module")
def reference(tiny_bert):
    return tiny_bert[1]


@pytest.fixture(scope="module")
def client(emb_server):
    return ollama.Client(host=emb_server.url)


def test_embed_a_list_and_a_string(client, reference):
    want = reference.embed(reference.tokenize(TEXTS))
    r = client.embed(model="tiny-bert", input=TEXTS)
    assert r.model == "tiny-bert"
    np.testing.assert_allclose(np.array(r.embeddings, np.float32), want, rtol=0, atol=1e-6)
    assert r.prompt_eval_count == sum(len(x) for x in reference.tokenize(TEXTS)) and r.total_duration > 0
    one = client.embed(model="tiny-bert:latest", input=TEXTS[0])
    np.testing.assert_allclose(one.embeddings[0], want[0], rtol=0, atol=1e-6)


def test_dimensions_and_truncation(client, reference):
    long = " ".join(["word"] * 60)
    cut = reference.embed(reference.tokenize([long], truncate=True))
    r = client.embed(model="tiny-bert", input=long)  # truncate defaults to true, as Ollama's
    np.testing.assert_allclose(r.embeddings[0], cut[0], rtol=0, atol=1e-6)
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="tiny-bert", input=long, truncate=False)
    assert e.value.status_code == 400
    small = client.embed(model="tiny-bert", input=TEXTS, dimensions=16)
    want = truncate_dimensions(reference.embed(reference.tokenize(TEXTS)), 16, reference.model.normalize)
    np.testing.assert_allclose(np.array(small.embeddings, np.float32), want, rtol=0, atol=1e-6)


def test_legacy_embeddings(client, reference):
    r = client.embeddings(model="tiny-bert", prompt=TEXTS[1])
    np.testing.assert_allclose(r.embedding, reference.embed(reference.tokenize(TEXTS[1:]))[0], rtol=0, atol=1e-6)
    assert client.embeddings(model="tiny-bert", prompt="").embedding == []


def test_empty_input_loads_and_bad_input_is_refused(client, emb_server):
    assert client.embed(model="tiny-bert", input=[]).embeddings == []
    for body, status in (({"model": "tiny-bert", "input": [1, 2]}, 400), ({"model": "other", "input": "x"}, 404),
                         ({"model": "tiny-bert", "input": "x", "dimensions": 5000}, 400),
                         ({"model": "tiny-bert", "input": "x", "keep_alive": "later"}, 400)):
        r = httpx.post(emb_server.url + "/api/embed", json=body, timeout=30)
        assert r.status_code == status and set(r.json()) == {"error"}, r.text


def test_an_embedding_model_is_listed_and_shown(client, emb_server):
    (m,) = client.list().models
    assert m.model == "tiny-bert:latest" and m.details.format == "safetensors" and m.size > 0
    s = client.show("tiny-bert")
    dims = emb_server.state.embeddings[0].embedder.dimensions
    assert s.capabilities == ["embedding"] and s.modelinfo["bert.embedding_length"] == dims
    assert [p.model for p in client.ps().models] == ["tiny-bert:latest"]
    with pytest.raises(ollama.ResponseError) as e:  # an embedding-only server does not chat
        client.chat(model="tiny-bert", messages=[{"role": "user", "content": "hi"}], stream=False)
    assert e.value.status_code == 404


def test_the_chat_model_does_not_embed_unless_asked(server, model_name):
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=server.url).embed(model=model_name, input="hi")
    assert e.value.status_code == 400 and "does not support embeddings" in e.value.error
