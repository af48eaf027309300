"""/v1/rerank (Jina/Cohere shape, also /rerank and /v2/rerank) and /v1/score (vLLM's) on a reranker-only server (the
cross-encoder folder decides), a chat server with --rerank-model beside it, and an embedding server with none.
Scores are checked against the in-process Reranker (its numerics are tests/engine/test_reranker.py's job)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest

from inferd.engine.reranker import Reranker
from inferd.model.cross_encoder import load_cross_encoder
from tests.model.make_tiny_cross_encoder import write_tiny_cross_encoder
from tests.model.make_tiny_embedding import write_tiny_embedding
from tests.server.conftest import ServerThread, make_settings

QUERY = "where did the fox run"
DOCS = ["The quick brown fox jumps over the lazy dog.", "hello", "the fox ran to the river",
        "stocks fell sharply and money rose in the city market"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_cross_encoder(tmp_path_factory.mktemp("ce") / "tiny-ce", max_length=24)


@pytest.fixture(scope="module")
def reference(folder):
    return Reranker(load_cross_encoder(folder), threads=1)


@pytest.fixture(scope="module")
def rr_server(folder):
    srv = ServerThread(make_settings(model=str(folder))).start()
    yield srv
    srv.stop()


def post(url: str, path: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _scores(reference, query, docs):
    return reference.embed(reference.tokenize_pairs([(query, d) for d in docs]))[:, 0]


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_sorts_by_score(rr_server, reference, path):
    want = _scores(reference, QUERY, DOCS)
    docs = [DOCS[0], {"text": DOCS[1]}, DOCS[2], {"text": DOCS[3]}]
    status, body = post(rr_server.url, path, {"model": "tiny-ce", "query": QUERY, "documents": docs})
    assert status == 200, body
    order = sorted(range(len(DOCS)), key=lambda i: -want[i])
    assert [r["index"] for r in body["results"]] == order
    np.testing.assert_array_equal(np.float32([r["relevance_score"] for r in body["results"]]), want[order])
    assert [r["document"]["text"] for r in body["results"]] == [DOCS[i] for i in order]
    tokens = sum(len(p) for p in reference.tokenize_pairs([(QUERY, d) for d in DOCS]))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens} and body["model"] == "tiny-ce"
    assert body["id"].startswith("rerank-")


def test_rerank_top_n_and_no_documents(rr_server, reference):
    want = _scores(reference, QUERY, DOCS)
    status, body = post(rr_server.url, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2,
                                                      "return_documents": False})
    assert status == 200
    assert [r["index"] for r in body["results"]] == sorted(range(len(DOCS)), key=lambda i: -want[i])[:2]
    assert all("document" not in r for r in body["results"])
    _, big = post(rr_server.url, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 50})
    assert len(big["results"]) == len(DOCS)


def test_long_documents_are_cut_not_refused(rr_server, reference):
    long = "the river " * 100
    status, body = post(rr_server.url, "/v1/rerank", {"query": QUERY, "documents": [long]})
    assert status == 200 and body["usage"]["total_tokens"] == 24
    assert body["results"][0]["relevance_score"] == pytest.approx(float(_scores(reference, QUERY, [long])[0]))


def test_score_pairs_like_vllm(rr_server, reference):
    status, body = post(rr_server.url, "/v1/score", {"model": "tiny-ce", "text_1": QUERY, "text_2": DOCS})
    assert status == 200, body
    assert [d["index"] for d in body["data"]] == list(range(len(DOCS))) and body["object"] == "list"
    assert all(d["object"] == "score" for d in body["data"])
    np.testing.assert_array_equal(np.float32([d["score"] for d in body["data"]]), _scores(reference, QUERY, DOCS))
    status, pairwise = post(rr_server.url, "/score", {"text_1": ["hello", "money"], "text_2": ["world", "city"]})
    assert status == 200
    want = reference.embed(reference.tokenize_pairs([("hello", "world"), ("money", "city")]))[:, 0]
    np.testing.assert_array_equal(np.float32([d["score"] for d in pairwise["data"]]), want)
    _, one = post(rr_server.url, "/v1/score", {"text_1": "hello", "text_2": "world"})
    assert one["data"][0]["score"] == pairwise["data"][0]["score"]


@pytest.mark.parametrize("path, body, status, param", [
    ("/v1/rerank", {"query": QUERY, "documents": []}, 400, "documents"),
    ("/v1/rerank", {"query": QUERY}, 400, None),
    ("/v1/rerank", {"query": 3, "documents": ["a"]}, 400, None),
    ("/v1/rerank", {"query": QUERY, "documents": [{"title": "x"}]}, 400, None),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"], "top_n": 0}, 400, None),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"] * 2049}, 400, "documents"),
    ("/v1/rerank", {"model": "nope", "query": QUERY, "documents": ["a"]}, 404, "model"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, 400, "text_2"),
    ("/v1/score", {"text_1": [], "text_2": ["a"]}, 400, "text_1"),
    ("/v1/score", {"text_1": "a", "text_2": [1]}, 400, None),
    ("/v1/embeddings", {"input": "a"}, 404, "model"),
])
def test_bad_requests_are_4xx_in_the_openai_envelope(rr_server, path, body, status, param):
    got, err = post(rr_server.url, path, body)
    assert got == status, err
    assert err["error"]["message"] and (param is None or err["error"]["param"] == param)


def test_the_reranker_is_listed_and_chat_is_refused(rr_server):
    client = openai.OpenAI(base_url=rr_server.url + "/v1", api_key="unused", max_retries=0)
    cards = [m.model_dump() for m in client.models.list().data]
    assert [(c["id"], c["type"]) for c in cards] == [("tiny-ce", "rerank")]
    with pytest.raises(openai.NotFoundError, match="only /v1/rerank"):
        client.chat.completions.create(model="tiny-ce", messages=[{"role": "user", "content": "hi"}])


def test_beside_a_chat_model(make_server, folder, reference):
    srv = make_server(rerank_model=str(folder))
    status, body = post(srv.url, "/v1/rerank", {"model": "tiny-ce", "query": QUERY, "documents": DOCS})
    assert status == 200
    np.testing.assert_array_equal(np.float32(sorted((r["relevance_score"] for r in body["results"]), reverse=True)),
                                  np.sort(_scores(reference, QUERY, DOCS))[::-1])
    ids = [m["id"] for m in json.loads(urllib.request.urlopen(srv.url + "/v1/models").read())["data"]]
    assert "tiny-ce" in ids and len(ids) == 2


def test_an_embedding_server_without_a_reranker_says_so(tmp_path):
    srv = ServerThread(make_settings(model=str(write_tiny_embedding(tmp_path / "emb")))).start()
    try:
        status, err = post(srv.url, "/v1/rerank", {"query": "a", "documents": ["b"]})
        message = err["error"]["message"]
        assert status == 404 and "no reranker" in message and "--rerank-model" in message
        status, _ = post(srv.url, "/v1/score", {"text_1": "a", "text_2": "b"})
        assert status == 404
    finally:
        srv.stop()


def test_the_chat_model_reranks_with_the_qwen3_prompt(make_server):
    srv = make_server(rerank_prompt="qwen3")
    name = srv.state.served_model_name
    status, body = post(srv.url, "/v1/rerank", {"model": name, "query": QUERY, "documents": DOCS})
    assert status == 200, body
    service = next(e for e in srv.state.embeddings if e.kind == "rerank")
    want = service.embedder.embed(service.embedder.tokenize_pairs([(QUERY, d) for d in DOCS]))[:, 0]
    order = sorted(range(len(DOCS)), key=lambda i: -want[i])
    assert [r["index"] for r in body["results"]] == order
    np.testing.assert_array_equal(np.float32([r["relevance_score"] for r in body["results"]]), want[order])
    assert all(0 < r["relevance_score"] < 1 for r in body["results"])
    status, scored = post(srv.url, "/v1/score", {"text_1": QUERY, "text_2": DOCS[0]})
    assert status == 200 and scored["data"][0]["score"] == float(want[0])
    ids = [m["id"] for m in json.loads(urllib.request.urlopen(srv.url + "/v1/models").read())["data"]]
    assert ids == [name]                                     # no second entry: the chat model's own
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.choices[0].message.content is not None
