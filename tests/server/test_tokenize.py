"""/tokenize, /detokenize and /openapi.json."""

import json
import urllib.error
import urllib.request


def request(srv, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(srv.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_tokenize_detokenize_round_trip(server):
    tok = server.state.tokenizer
    text = "Héllo, wörld! 你好 🙂"
    status, r = request(server, "/tokenize", {"prompt": text})
    assert status == 200
    assert r["tokens"] == tok.encode(text) and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == 8192
    status, d = request(server, "/detokenize", {"tokens": r["tokens"]})
    assert (status, d) == (200, {"prompt": text})


def test_tokenize_messages_uses_the_chat_template(server):
    msgs = [{"role": "user", "content": "Hi there"}]
    status, r = request(server, "/tokenize", {"messages": msgs})
    text = server.state.chat_template.render(msgs, add_generation_prompt=True)
    assert r["tokens"] == server.state.tokenizer.encode(text, add_special=False)
    # the chat endpoint counts exactly these tokens
    status, c = request(server, "/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
    assert c["usage"]["prompt_tokens"] == r["count"]


def test_tokenize_and_detokenize_errors(server):
    status, r = request(server, "/tokenize", {})
    assert status == 400 and "exactly one of prompt or messages" in r["error"]["message"]
    status, r = request(server, "/detokenize", {"tokens": [1, 10 ** 7]})
    assert status == 400 and r["error"]["param"] == "tokens" and "10000000" in r["error"]["message"]
    status, r = request(server, "/detokenize", {"tokens": [-3]})
    assert status == 400 and r["error"]["param"] == "tokens[0]"


def test_openapi_document_describes_the_request_bodies(server):
    status, doc = request(server, "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    schemas = doc["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]
    assert "messages" in chat["required"]
    assert chat["properties"]["temperature"]["anyOf"][0]["maximum"] == 2.0
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize", "/v1/cache/warm",
                 "/v1/responses"):
        ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.split("/")[-1] in schemas
    # structured output, tools, FIM and the Responses API are described
    for field in ("response_format", "tools", "tool_choice", "parallel_tool_calls", "guided_json", "guided_regex",
                  "guided_choice", "guided_grammar", "structured_outputs", "grammar", "json_schema"):
        assert field in chat["properties"], field
    assert "suffix" in schemas["CompletionRequest"]["properties"]
    assert {"input", "instructions", "text", "previous_response_id"} <= set(schemas["ResponsesRequest"]["properties"])
    assert set(doc["paths"]["/v1/responses/{response_id}"]) == {"get", "delete"}
