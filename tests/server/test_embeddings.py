"""/v1/embeddings through the real openai client: an embedding-only server (the folder decides) on a tiny random
BERT with prompts and Matryoshka dimensions, and a chat server with --embedding-model beside it. Vectors are checked
against the in-process Embedder (the encoder's numerics are tests/engine/test_encoder.py's job)."""
from __future__ import annotations

import base64
import concurrent.futures
import json
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest

from inferd.engine.embedder import Embedder
from inferd.model.embedding import load_embedding_model
from tests.model.make_tiny_embedding import write_tiny_embedding
from tests.server.conftest import ServerThread, make_settings

TEXTS = ["the cat sat on the bank", "stocks fell sharply", "hello world"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_embedding(tmp_path_factory.mktemp("emb") / "tiny-bert", max_seq_length=16,
                                prompts={"query": "query: ", "document": "text: "}, matryoshka_dims=[32, 16])


@pytest.fixture(scope="module")
def reference(folder):
    return Embedder(load_embedding_model(folder), threads=1)


@pytest.fixture(scope="module")
def emb_server(folder):
    srv = ServerThread(make_settings(model=str(folder))).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(emb_server):
    return openai.OpenAI(base_url=emb_server.url + "/v1", api_key="unused", max_retries=0)


def post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/v1/embeddings", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_openai_client_strings_floats_and_base64(client, reference):
    want = reference.embed(reference.tokenize(TEXTS))
    r = client.embeddings.create(model="tiny-bert", input=TEXTS, encoding_format="float")
    assert r.object == "list" and r.model == "tiny-bert"
    assert [d.index for d in r.data] == [0, 1, 2]
    np.testing.assert_array_equal(np.array([d.embedding for d in r.data], np.float32), want)
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(len(x) for x in reference.tokenize(TEXTS))
    # the client's default asks for base64 and decodes it itself
    r64 = client.embeddings.create(model="tiny-bert", input=TEXTS)
    np.testing.assert_array_equal(np.array([d.embedding for d in r64.data], np.float32), want)


def test_single_string_token_ids_and_lists_of_ids(client, reference):
    ids = reference.tokenize(TEXTS)
    one = client.embeddings.create(model="tiny-bert", input=TEXTS[0], encoding_format="float")
    np.testing.assert_array_equal(one.data[0].embedding, reference.embed(ids[:1])[0])
    flat = client.embeddings.create(model="tiny-bert", input=ids[1], encoding_format="float")
    np.testing.assert_array_equal(flat.data[0].embedding, reference.embed(ids[1:2])[0])
    nested = client.embeddings.create(model="tiny-bert", input=ids, encoding_format="float")
    np.testing.assert_array_equal(np.array([d.embedding for d in nested.data], np.float32), reference.embed(ids))
    assert nested.usage.prompt_tokens == sum(len(x) for x in ids)


def test_input_type_prompts_and_matryoshka_dimensions(emb_server, client, reference):
    status, body = post(emb_server.url, {"input": ["hello"], "input_type": "query", "encoding_format": "float"})
    assert status == 200
    np.testing.assert_array_equal(body["data"][0]["embedding"],
                                  reference.embed(reference.tokenize(["query: hello"]))[0])
    r = client.embeddings.create(model="tiny-bert", input=TEXTS, dimensions=16, encoding_format="float")
    v = np.array([d.embedding for d in r.data])
    full = reference.embed(reference.tokenize(TEXTS))
    assert v.shape == (3, 16)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(v, full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("body, param, status", [
    ({"input": []}, "input", 400),
    ({"input": ""}, "input[0]", 400),
    ({"input": ["ok", 3]}, "input", 400),
    ({"input": [[1, 2], []]}, "input[1]", 400),
    ({"input": ["x"] * 2049}, "input", 400),
    ({"input": ["ok", "the cat sat on the bank of the river and the dog ran over the bridge"]}, "input[1]", 400),
    ({"input": [[1, 10**7]]}, "input", 400),
    ({"input": "ok", "dimensions": 0}, "dimensions", 400),
    ({"input": "ok", "dimensions": 4096}, "dimensions", 400),
    ({"input": "ok", "input_type": "passage"}, "input_type", 400),
    ({"input": "ok", "encoding_format": "int8"}, "encoding_format", 400),
    ({"input": "ok", "model": "gpt-4"}, "model", 404),
])
def test_bad_requests_name_the_field(emb_server, body, param, status):
    code, err = post(emb_server.url, body)
    assert code == status, err
    assert err["error"]["param"] == param, err
    assert err["error"]["message"]


def test_truncate_extension(emb_server, reference):
    long = "the cat sat on the bank of the river and the dog ran over the bridge"
    status, body = post(emb_server.url, {"input": [long], "truncate": True, "encoding_format": "float"})
    assert status == 200
    ids = reference.tokenize([long], truncate=True)
    assert len(ids[0]) == 16 and body["usage"]["prompt_tokens"] == 16
    np.testing.assert_array_equal(body["data"][0]["embedding"], reference.embed(ids)[0])


def test_concurrent_requests_are_batched_and_exact(emb_server, client, reference):
    texts = [f"the cat sat {i} times on the bank" for i in range(40)]
    want = reference.embed(reference.tokenize(texts))
    steps0 = emb_server.state.embeddings[0].queue.steps
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda t: client.embeddings.create(model="tiny-bert", input=t, encoding_format="float")
                            .data[0].embedding, texts))
    np.testing.assert_array_equal(np.array(got, np.float32), want)
    assert emb_server.state.embeddings[0].queue.steps - steps0 <= len(texts)


def test_models_metrics_and_chat_paths(emb_server, client):
    (card,) = client.models.list().data
    assert card.id == "tiny-bert"
    assert card.model_extra["dimensions"] == 64 and card.model_extra["matryoshka_dimensions"] == [32, 16]
    assert client.models.retrieve("tiny-bert").id == "tiny-bert"
    before = emb_server.metrics().get(("inferd:embedding_requests_total",
                                       (("model_name", "tiny-bert"), ("status", "finished"))), 0)
    client.embeddings.create(model="tiny-bert", input=["a", "b"])
    m = emb_server.metrics()
    assert m[("inferd:embedding_requests_total", (("model_name", "tiny-bert"), ("status", "finished")))] == before + 1
    assert m[("inferd:embedding_inputs_total", (("model_name", "tiny-bert"),))] >= 2
    assert ("inferd:embedding_num_requests_waiting", (("model_name", "tiny-bert"),)) in m
    # the shared request and token families the dashboards read, labelled by the embedding model
    success = ("inferd:request_success_total", (("finished_reason", "stop"), ("model_name", "tiny-bert")))
    tokens = ("inferd:prompt_tokens_total", (("model_name", "tiny-bert"),))
    assert m[success] == before + 1 and m[tokens] >= 2
    assert m[("inferd:e2e_request_latency_seconds_count", (("model_name", "tiny-bert"),))] == before + 1
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="tiny-bert", messages=[{"role": "user", "content": "hi"}])
    assert "/v1/embeddings" in e.value.body["message"]


def test_embedding_model_beside_a_chat_model(make_server, folder, reference):
    srv = make_server(embedding_model=str(folder))
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    chat_name = srv.state.served_model_name
    assert {m.id for m in client.models.list().data} == {chat_name, "tiny-bert"}
    r = client.embeddings.create(model="tiny-bert", input=TEXTS, encoding_format="float")
    np.testing.assert_array_equal(np.array([d.embedding for d in r.data], np.float32),
                                  reference.embed(reference.tokenize(TEXTS)))
    status, body = post(srv.url, {"input": "hello", "encoding_format": "base64"})     # no model: the embedding one
    assert status == 200 and body["model"] == "tiny-bert"
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), "<f4"),
                                  reference.embed(reference.tokenize(["hello"]))[0])
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=chat_name, input="hello")
    assert e.value.body["code"] == "model_not_embedding"
    # the shared families hold both models, each family once in /metrics (the parser would refuse a repeat)
    m = srv.metrics()
    for name in (chat_name, "tiny-bert"):
        assert ("inferd:prompt_tokens_total", (("model_name", name),)) in m
        assert ("inferd:request_success_total", (("finished_reason", "stop"), ("model_name", name))) in m
    assert m[("inferd:prompt_tokens_total", (("model_name", "tiny-bert"),))] > 0
    with urllib.request.urlopen(srv.url + "/metrics") as r:
        text = r.read().decode()
    assert (text.count("# TYPE inferd:prompt_tokens_total counter")
            + text.count("# TYPE inferd:prompt_tokens counter")) == 1
    # one thread for both models: the chat model's engine loop runs the embedding steps between its own
    service = srv.state.embeddings[0]
    assert service.worker is None and service.queue in srv.state.engine_loop.side_queues
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        chats = [pool.submit(client.chat.completions.create, model=chat_name, max_tokens=8,
                             messages=[{"role": "user", "content": "hi"}]) for _ in range(2)]
        embeds = [pool.submit(client.embeddings.create, model="tiny-bert", input=TEXTS, encoding_format="float")
                  for _ in range(4)]
        for f in chats:
            assert f.result().choices[0].message.content is not None
        for f in embeds:
            np.testing.assert_array_equal(np.array([d.embedding for d in f.result().data], np.float32),
                                          reference.embed(reference.tokenize(TEXTS)))


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_chat_model_embeds_with_pooling(make_server, pooling):
    """--pooling: the chat model answers /v1/embeddings under its own name (listed once in /v1/models), with the
    vectors of the in-process ChatEmbedder on the same weights; chats keep working beside it."""
    from inferd.engine.chat_embedder import ChatEmbedder

    srv = make_server(pooling=pooling)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    chat_name = srv.state.served_model_name
    assert [m.id for m in client.models.list().data] == [chat_name]
    r = client.embeddings.create(model=chat_name, input=TEXTS, encoding_format="float")
    got = np.array([d.embedding for d in r.data], np.float32)
    local = ChatEmbedder(srv.state.engine, srv.state.model.tokenizer, pooling, name="x", threads=1)
    ids = local.tokenize(TEXTS)
    np.testing.assert_array_equal(got, local.embed(ids))
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-6)
    assert r.usage.prompt_tokens == sum(map(len, ids)) and r.model == chat_name
    assert client.chat.completions.create(model=chat_name, max_tokens=4,
                                          messages=[{"role": "user", "content": "hi"}]).choices
    status, body = post(srv.url, {"model": chat_name, "input": "x", "dimensions": 8})
    assert status == 400 and body["error"]["param"] == "dimensions"


def test_chat_model_without_pooling_says_how(make_server):
    srv = make_server()
    status, body = post(srv.url, {"model": srv.state.served_model_name, "input": "hello"})
    assert status == 400 and body["error"]["code"] == "model_not_embedding"
    assert "--pooling" in body["error"]["message"]


def test_an_embedding_gguf_serves_alone(tmp_path):
    """a GGUF made from the tiny folder: an embedding-only server named after the file, the folder's vectors"""
    from inferd.model.embedding_gguf import load_embedding
    from tests.model.make_tiny_embedding_gguf import write_tiny_embedding_gguf

    path = write_tiny_embedding_gguf(write_tiny_embedding(tmp_path / "f"), tmp_path / "tiny-bert-f16.gguf", "F16")
    ref = Embedder(load_embedding(path), threads=1)
    srv = ServerThread(make_settings(model=str(path))).start()
    try:
        status, body = post(srv.url, {"input": TEXTS})
        assert status == 200 and body["model"] == "tiny-bert-f16"
        np.testing.assert_array_equal(np.array([d["embedding"] for d in body["data"]], np.float32),
                                      ref.embed(ref.tokenize(TEXTS)))
    finally:
        srv.stop()
