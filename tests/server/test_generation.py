"""The one generation pipeline (inferd.server.generation), seen through a toy API that is nothing but a trio: a
request Struct, a renderer and an encoder with its own error envelope and an NDJSON stream. Registering it is one
`Api(...)`; it then generates what /v1/completions generates for the same prompt, streams it, answers max_tokens 0
without the engine, and names its own fields in its own envelope."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import msgspec
import pytest

from inferd.server.apis.sampling import sampling_params
from inferd.server.choices import Generation
from inferd.server.generation import Api, PromptText, Rendered
from inferd.server.protocol import ProtocolError

from .conftest import ServerThread, make_settings

PROMPT = "The capital of France is"


class ToyRequest(msgspec.Struct, kw_only=True):
    prompt: str
    length: int | None = None
    model: str | None = None
    stream: bool = False


async def render_toy(state, req: ToyRequest) -> Rendered[str]:
    if not req.prompt.strip():
        raise ProtocolError("prompt must have some text", "prompt")
    greedy = sampling_params(state.sampling_defaults, temperature=0.0)
    return Rendered([PromptText(req.prompt, add_special=True)], lambda j: greedy,
                    "toy context", "prompt", max_tokens=req.length, max_tokens_param="length")


class ToyEncoder:
    content_type = "application/x-ndjson"

    def __init__(self, gen: Generation, req: ToyRequest, rendered: Rendered[str]):
        self.gen, self.context = gen, rendered.context

    def full(self):
        c, u = self.gen.choices[0], self.gen.usage()
        return {"text": c.text, "finish": c.finish_reason, "context": self.context,
                "usage": [u.prompt_tokens, u.completion_tokens]}

    async def stream(self) -> AsyncIterator[bytes]:
        async for item in self.gen.outputs(5.0):
            if item is not None:
                yield json.dumps({"text": item[1].text, "done": item[0].finish_reason is not None}).encode() + b"\n"

    def stream_error(self, err: ProtocolError) -> bytes:
        return json.dumps({"failed": err.message}).encode() + b"\n"

    def stream_end(self) -> bytes:
        return b""


def toy_error(err: ProtocolError) -> dict:
    return {"type": "error", "error": {"field": err.param, "message": err.message}}


TOY = Api("/toy", ToyRequest, render_toy, ToyEncoder, "toy", error_body=toy_error)


@pytest.fixture(scope="module")
def toy_server(loaded_model):
    srv = ServerThread(make_settings(), loaded_model)
    srv.app.router.add_post(TOY.path, TOY.handle)
    yield srv.start()
    srv.stop()


def post(srv, path, body):
    req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read(), r.headers["Content-Type"]
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers["Content-Type"]


def test_a_trio_generates_what_completions_generate(toy_server):
    status, body, _ = post(toy_server, "/toy", {"prompt": PROMPT, "length": 6})
    assert status == 200
    toy = json.loads(body)
    _, body, _ = post(toy_server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0})
    completion = json.loads(body)
    assert toy["text"] == completion["choices"][0]["text"] and toy["text"]
    assert toy["finish"] == completion["choices"][0]["finish_reason"] == "length"
    assert toy["usage"] == [completion["usage"]["prompt_tokens"], 6]
    assert toy["context"] == "toy context"


def test_its_stream_is_its_own_format_and_carries_the_same_text(toy_server):
    status, body, content_type = post(toy_server, "/toy", {"prompt": PROMPT, "length": 6, "stream": True})
    assert status == 200 and content_type == "application/x-ndjson"
    lines = [json.loads(line) for line in body.decode().splitlines()]
    _, full, _ = post(toy_server, "/toy", {"prompt": PROMPT, "length": 6})
    assert "".join(x["text"] for x in lines) == json.loads(full)["text"]
    assert [x["done"] for x in lines] == [False] * (len(lines) - 1) + [True]


def test_nothing_to_generate_is_answered_without_the_engine(toy_server):
    prompt_tokens = len(toy_server.state.tokenizer.encode(PROMPT, add_special=True))
    status, body, _ = post(toy_server, "/toy", {"prompt": PROMPT, "length": 0})
    assert status == 200
    assert json.loads(body) == {"text": "", "finish": "length", "context": "toy context", "usage": [prompt_tokens, 0]}


def test_errors_name_its_fields_in_its_envelope(toy_server):
    status, body, _ = post(toy_server, "/toy", {"prompt": "  "})
    assert status == 400 and json.loads(body) == {"type": "error", "error": {
        "field": "prompt", "message": "prompt must have some text"}}
    status, body, _ = post(toy_server, "/toy", {"prompt": PROMPT, "length": 10 ** 6})
    assert status == 400 and json.loads(body)["error"]["field"] == "length"
    assert json.loads(body)["error"]["message"].startswith("length must be at most ")
    status, body, _ = post(toy_server, "/toy", {"prompt": PROMPT, "model": "nope"})
    assert status == 404 and json.loads(body)["error"]["field"] == "model"
    status, body, _ = post(toy_server, "/toy", {"prompt": 5})
    assert status == 400 and json.loads(body)["error"]["field"] == "prompt"
