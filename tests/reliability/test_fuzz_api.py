"""Fuzzing the HTTP API with request bodies generated from the server's own /openapi.json.

Valid bodies come from the published JSON schemas (hypothesis-jsonschema); invalid ones from mutating them:
a field replaced by arbitrary JSON, unknown fields, non-objects, truncated or non-UTF-8 text, random bytes.
Every answer must come within a timeout and never be a 5xx: not as a status, and not as an error event inside
a 200 stream. Refusals must use the API's error envelope: OpenAI's, Anthropic's on /v1/messages, or Ollama's
{"error": "..."} under /api/. Afterwards the server is healthy and holds no KV block. The model is a tiny random
one (the API, not the model, is under test), the examples derandomized (a fixed seed) and bounded:
INFERD_FUZZ_EXAMPLES per test (default 30; more
for a deeper run).
"""

from __future__ import annotations

import collections
import http.client
import json
import os
import urllib.request

import pytest

hypothesis = pytest.importorskip("hypothesis")
hjs = pytest.importorskip("hypothesis_jsonschema")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.model.make_tiny_cross_encoder import write_tiny_cross_encoder  # noqa: E402
from tests.reliability.wire import WireError, parse_sse  # noqa: E402
from tests.server.conftest import ServerThread, make_settings  # noqa: E402

EXAMPLES = int(os.environ.get("INFERD_FUZZ_EXAMPLES", "30"))
TIMEOUT_S = 30.0
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def fuzz_server(tiny_model, tmp_path_factory):
    srv = ServerThread(make_settings(max_tokens_limit=4, max_prompt_tokens=64, request_timeout_s=20.0,
                                     sse_keepalive_s=1.0, prompt_cache_disk_mib=16,
                                     prompt_cache_dir=str(tmp_path_factory.mktemp("fuzz-prompt-cache"))),
                       tiny_model).start()
    yield srv
    srv.stop()


def openapi(url: str) -> dict:
    with urllib.request.urlopen(url + "/openapi.json", timeout=10) as r:
        return json.loads(r.read())


def resolve(node, components: dict):
    """The schema with every local $ref replaced by its target (our schemas have no cycles)."""
    if isinstance(node, dict):
        if "$ref" in node:
            return resolve(components[node["$ref"].rsplit("/", 1)[-1]], components)
        return {k: resolve(v, components) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve(v, components) for v in node]
    return node


def body_schemas(url: str) -> dict[str, dict]:
    doc = openapi(url)
    components = doc["components"]["schemas"]
    out = {}
    for path, ops in doc["paths"].items():
        post = ops.get("post")
        if post:
            out[path] = resolve(post["requestBody"]["content"]["application/json"]["schema"], components)
    return out


RERANK_PATHS = ["/v1/rerank", "/v1/score"]
POST_PATHS = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize", "/v1/cache/warm", "/v1/responses",
              "/v1/embeddings", "/v1/messages", "/v1/messages/count_tokens", "/api/chat", "/api/generate",
              "/api/embed", "/api/embeddings", "/api/show", "/v1/cache/save", "/v1/cache/restore",
              "/v1/models/load", "/v1/models/unload"] + RERANK_PATHS
EMBEDDING_PATHS = ("/v1/embeddings", "/api/embed", "/api/embeddings")
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
# named prompt-cache saves need a prompt of a whole KV block (64 tokens), which max_prompt_tokens leaves no room
# for, and restores a saved name: few bodies can succeed here (tests/server/test_prompt_cache.py has the rest)
NAMED_CACHE_PATHS = ("/v1/cache/save", "/v1/cache/restore")


def send(port: int, path: str, raw: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def check_ollama_answer(path: str, where: str, status: int, answer: bytes) -> None:
    """Ollama's refusals are {"error": "..."}; its answers one JSON object, or NDJSON lines of them of which none
    is an error (nothing here fails once an answer has begun) and the last is done."""
    if status >= 400:
        err = json.loads(answer)
        assert set(err) == {"error"} and isinstance(err["error"], str) and err["error"], where
        return
    assert status == 200, where
    lines = [json.loads(line) for line in answer.splitlines()]
    assert lines and not any("error" in line for line in lines), where
    if path in ("/api/chat", "/api/generate"):
        assert lines[-1]["done"] is True and all(line["done"] is False for line in lines[:-1]), where


def check_answer(path: str, raw_body: bytes, status: int, answer: bytes) -> None:
    where = f"POST {path} {raw_body[:300]!r} -> {status} {answer[:300]!r}"
    assert status < 500, where
    if path.startswith("/api/"):
        check_ollama_answer(path, where, status, answer)
        return
    if status >= 400:
        payload = json.loads(answer)
        if path in ANTHROPIC_PATHS:
            assert payload["type"] == "error" and set(payload["error"]) == {"type", "message"}, where
            assert payload["error"]["message"] and payload["error"]["type"] != "api_error", where
            return
        err = payload["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], where
        return
    assert status == 200, where
    if answer.startswith((b"data: ", b": ping", b"event: ")):
        try:
            events = parse_sse(answer)
        except WireError as e:
            raise AssertionError(f"{where}: {e}") from None
        for ev in events:
            if isinstance(ev, dict) and "error" in ev:
                assert ev["error"]["type"] not in ("internal_server_error", "api_error", "overloaded_error"), where
                assert not str(ev["error"].get("type", "")).startswith("service_unavailable"), where
    else:
        json.loads(answer)


def encode(body) -> bytes:
    return json.dumps(body, allow_nan=False).encode()


@pytest.fixture(scope="module")
def schemas(fuzz_server):
    s = body_schemas(fuzz_server.url)
    assert sorted(s) == sorted(POST_PATHS)
    return s


def fuzz_bodies(fuzz_server, path: str, schema: dict) -> list[int]:
    """Sends bodies drawn from `schema` to `path`, checks each answer, returns the statuses."""
    statuses = []

    @FUZZ
    @given(body=hjs.from_schema(schema))
    def run(body):
        raw = encode(body)
        status, answer = send(fuzz_server.port, path, raw)
        check_answer(path, raw, status, answer)
        statuses.append(status)
    run()
    fuzz_server.wait_idle()
    return statuses


@pytest.mark.parametrize("path", POST_PATHS)
def test_valid_bodies_from_the_openapi_schema(fuzz_server, schemas, path):
    fuzz_bodies(fuzz_server, path, schemas[path])


def refine(schema: dict, path: str, vocab: int, model: str) -> dict:
    """The published schema narrowed by what the API's documentation says in words (roles, the served model,
    token ids below the vocabulary size, the server's limits), so that most bodies get past validation and
    reach the engine with every combination of options."""
    schema = json.loads(json.dumps(schema))
    props = schema["properties"]
    short_text = {"type": "string", "maxLength": 40}
    token_ids = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": vocab - 1},
                 "minItems": 1, "maxItems": 40}
    message = {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant"]},
        "content": {"anyOf": [short_text, {"type": "null"}, {"type": "array", "maxItems": 2, "items": {
            "type": "object", "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": short_text}}}]},
        "name": {"anyOf": [short_text, {"type": "null"}]}}}
    narrowed = {
        "model": {"anyOf": [{"const": model}, {"type": "null"}]},
        "messages": {"type": "array", "items": message, "minItems": 1, "maxItems": 3},
        "n": {"type": "integer", "minimum": 1, "maximum": 2},
        "max_tokens": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 4}, {"type": "null"}]},
        "max_completion_tokens": {"type": "null"},
        "best_of": {"type": "null"}, "suffix": {"type": "null"}, "tools": {"type": "null"},
        "functions": {"type": "null"}, "tool_choice": {"enum": [None, "none"]},
        "response_format": {"anyOf": [{"type": "null"}, {"type": "object", "required": ["type"],
                                                         "properties": {"type": {"const": "text"}}}]},
        "stop": {"anyOf": [{"type": "null"}, {"type": "string", "minLength": 1, "maxLength": 5},
                           {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 5},
                            "maxItems": 3}]},
        "logit_bias": {"anyOf": [{"type": "null"}, {"type": "object", "maxProperties": 3,
                                                    "propertyNames": {"pattern": "^[1-4]?[0-9]{1,2}$"},
                                                    "additionalProperties": {"type": "number", "minimum": -100,
                                                                             "maximum": 100}}]},
        "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": vocab - 1},
                   "maxItems": 40},
    }
    if path == "/v1/completions":
        narrowed["prompt"] = {"anyOf": [{**short_text, "minLength": 1}, token_ids,
                                        {"type": "array", "items": {**short_text, "minLength": 1}, "minItems": 1,
                                         "maxItems": 3},
                                        {"type": "array", "items": token_ids, "minItems": 1, "maxItems": 3}]}
    elif "prompt" in props:
        narrowed["prompt"] = {"anyOf": [short_text, {"type": "null"}]}
    if path == "/v1/responses":   # a stored response to chain from would be a 404; formats and tools are theirs
        narrowed.update({"input": {**short_text, "minLength": 1}, "previous_response_id": {"type": "null"},
                         "max_output_tokens": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 4},
                                                         {"type": "null"}]},
                         "text": {"type": "null"}, "instructions": {"anyOf": [short_text, {"type": "null"}]}})
    if path.startswith("/api/"):
        narrowed.update(ollama_fields(path, short_text, token_ids, model))
    if path in ANTHROPIC_PATHS:   # user and assistant turns of text blocks; tools and formats have their own tests
        block = {"type": "object", "required": ["type", "text"],
                 "properties": {"type": {"const": "text"}, "text": {**short_text, "minLength": 1}}}
        content = {"anyOf": [{**short_text, "minLength": 1}, {"type": "array", "items": block, "minItems": 1,
                                                               "maxItems": 2}]}
        narrowed.update({
            "model": {"const": model},
            "messages": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                "type": "object", "required": ["role", "content"],
                "properties": {"role": {"const": "user"}, "content": content}}},
            "system": {"anyOf": [short_text, {"type": "null"}, {"type": "array", "items": block, "maxItems": 2}]},
            "max_tokens": {"type": "integer", "minimum": 0, "maximum": 4},
            "stop_sequences": {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 3,
                                                            "items": {"type": "string", "minLength": 1,
                                                                      "maxLength": 5}}]},
            "thinking": {"anyOf": [{"type": "null"}, {"type": "object", "required": ["type"], "properties": {
                "type": {"enum": ["disabled", "adaptive"]}}}]},
            "output_config": {"type": "null"},
        })
    for name, sub in narrowed.items():
        if name in props:
            props[name] = sub
    schema["additionalProperties"] = False
    return schema


def ollama_fields(path: str, short_text: dict, token_ids: dict, model: str) -> dict:
    """Ollama's fields as its documentation describes them (string contents, options by name, format as "json")."""
    nullable = lambda sub: {"anyOf": [sub, {"type": "null"}]}  # noqa: E731
    message = {"type": "object", "required": ["role", "content"], "additionalProperties": False, "properties": {
        "role": {"enum": ["system", "user", "assistant"]}, "content": short_text}}
    options = {"type": "object", "maxProperties": 4, "properties": {
        "num_predict": {"type": "integer", "minimum": -2, "maximum": 4},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_k": {"type": "integer", "minimum": -1, "maximum": 100},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "seed": {"type": "integer"},
        "stop": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 5}, "maxItems": 3},
        "num_ctx": {"type": "integer", "minimum": 1, "maximum": 512}}}
    fields = {
        "model": {"enum": [model, model + ":latest"]},
        "messages": {"type": "array", "items": message, "maxItems": 3},
        "prompt": nullable(short_text), "system": nullable(short_text), "context": nullable(token_ids),
        "options": nullable(options), "format": {"enum": [None, "", "json"]}, "think": {"enum": [None, False]},
        "keep_alive": {"anyOf": [{"type": "null"}, {"enum": ["5m", "-1", "1h30m", "0"]}, {"type": "number"}]},
        "images": {"type": "null"}, "template": {"type": "null"}, "suffix": {"type": "null"},
        "tools": {"type": "null"},
    }
    return fields


@pytest.fixture(scope="module")
def refined(fuzz_server, schemas):
    vocab = fuzz_server.state.tokenizer.vocab_size
    return {p: refine(s, p, vocab, fuzz_server.state.served_model_name) for p, s in schemas.items()}


# the fuzz server serves a chat model only: the embedding routes refuse there (tests/server/test_embeddings.py and
# test_ollama_embed.py), and so do the rerank routes (their own server below)
@pytest.mark.parametrize("path", [p for p in POST_PATHS
                                  if p not in EMBEDDING_PATHS and p not in RERANK_PATHS and p not in NAMED_CACHE_PATHS])
def test_refined_bodies_reach_the_engine(fuzz_server, refined, path):
    statuses = fuzz_bodies(fuzz_server, path, refined[path])
    print(f"{path}: {len(statuses)} bodies, statuses {dict(sorted(collections.Counter(statuses).items()))}")
    assert statuses.count(200) >= len(statuses) // 3, f"too few bodies got through: {statuses}"


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=20),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children,
                                                                                        max_size=4),
                    max_leaves=12)
EDGE = st.sampled_from([0, -1, 1, 2 ** 31, 2 ** 63 - 1, 2 ** 63, 2 ** 64, -2 ** 63 - 1, 10 ** 30, 1e308, -1e308,
                        5e-324, "", "\u0000", "\ud800", "\U0010ffff" * 50, [], {}, None, True, False, [[]], [-1],
                        [2 ** 63], ["a"] * 50, "x" * 5000])


@st.composite
def invalid_bodies(draw, schemas, paths=tuple(POST_PATHS)):
    path = draw(st.sampled_from(paths))
    kind = draw(st.sampled_from(["replace", "replace", "edge", "extra", "drop", "not-object", "truncated",
                                 "bytes", "bad-utf8"]))
    if kind in ("not-object", "bytes"):
        raw = encode(draw(JSON)) if kind == "not-object" else draw(st.binary(max_size=200))
        return path, raw
    body = draw(hjs.from_schema(schemas[path]))
    if not isinstance(body, dict):
        return path, encode(body)
    props = sorted(schemas[path].get("properties", {}))
    if kind in ("replace", "edge") and props:
        body[draw(st.sampled_from(props))] = draw(JSON if kind == "replace" else EDGE)
    elif kind == "extra":
        body[draw(st.text(min_size=1, max_size=10))] = draw(JSON)
    elif kind == "drop" and body:
        body.pop(draw(st.sampled_from(sorted(body))))
    raw = json.dumps(body).encode()   # Python's json writes lone surrogates as \ud800 escapes, 2**64 as digits
    if kind == "truncated":
        raw = raw[:draw(st.integers(0, max(0, len(raw) - 1)))]
    elif kind == "bad-utf8":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"])) + raw[at:]
    return path, raw


def test_invalid_and_mutated_bodies(fuzz_server, schemas):
    statuses = []

    @FUZZ
    @given(case=invalid_bodies(schemas))
    def run(case):
        path, raw = case
        status, answer = send(fuzz_server.port, path, raw)
        check_answer(path, raw, status, answer)
        statuses.append(status)
    run()
    fuzz_server.wait_idle()
    print(f"invalid: {len(statuses)} bodies, statuses {dict(sorted(collections.Counter(statuses).items()))}")
    with urllib.request.urlopen(fuzz_server.url + "/health", timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ready"}
    assert fuzz_server.state.engine_loop.dead is None


@pytest.fixture(scope="module")
def rerank_fuzz_server(tiny_model, tmp_path_factory):
    folder = write_tiny_cross_encoder(tmp_path_factory.mktemp("ce") / "tiny-ce", max_length=32)
    srv = ServerThread(make_settings(rerank_model=str(folder), max_tokens_limit=4, request_timeout_s=20.0),
                       tiny_model).start()
    yield srv
    srv.stop()


def refine_rerank(schema: dict) -> dict:
    """Rerank and score bodies the reranker answers: the served name or none, short texts, few of them."""
    schema = json.loads(json.dumps(schema))
    text = {"type": "string", "maxLength": 60}
    texts = {"anyOf": [text, {"type": "array", "items": text, "minItems": 1, "maxItems": 4}]}
    narrowed = {"model": {"anyOf": [{"const": "tiny-ce"}, {"type": "null"}]}, "query": text,
                "documents": {"type": "array", "minItems": 1, "maxItems": 4, "items": {"anyOf": [
                    text, {"type": "object", "required": ["text"], "properties": {"text": text}}]}},
                "text_1": {"anyOf": [text, {"type": "array", "items": text, "minItems": 1, "maxItems": 1}]},
                "text_2": texts}
    for name, sub in narrowed.items():
        if name in schema["properties"]:
            schema["properties"][name] = sub
    schema["additionalProperties"] = False
    return schema


@pytest.mark.parametrize("path", RERANK_PATHS)
def test_rerank_bodies_from_the_schema_and_refined(rerank_fuzz_server, schemas, path):
    fuzz_bodies(rerank_fuzz_server, path, schemas[path])
    statuses = fuzz_bodies(rerank_fuzz_server, path, refine_rerank(schemas[path]))
    print(f"{path}: {len(statuses)} bodies, statuses {dict(sorted(collections.Counter(statuses).items()))}")
    assert statuses.count(200) >= len(statuses) // 2, f"too few bodies got through: {statuses}"


def test_invalid_and_mutated_rerank_bodies(rerank_fuzz_server, schemas):
    statuses = []

    @FUZZ
    @given(case=invalid_bodies(schemas, tuple(RERANK_PATHS)))
    def run(case):
        path, raw = case
        status, answer = send(rerank_fuzz_server.port, path, raw)
        check_answer(path, raw, status, answer)
        statuses.append(status)
    run()
    rerank_fuzz_server.wait_idle()
    with urllib.request.urlopen(rerank_fuzz_server.url + "/health", timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ready"}
