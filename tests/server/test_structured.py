"""Structured output end to end through the real openai SDK against SmolLM2: response_format (json_object,
json_schema, and `chat.completions.parse` with pydantic models of several shapes), the vLLM / llama-server
extensions, logprobs after masking, determinism alone and in a batch, streaming = non-streaming, top_p 0."""
from __future__ import annotations

import asyncio
import datetime
import json
import re
from enum import StrEnum
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

MSG = [{"role": "user", "content": "Describe a cat called Tom who is 3 years old and likes fish and naps."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def aclient(server):
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def chat(client, model_name, **kw):
    kw.setdefault("max_tokens", 300)
    kw.setdefault("temperature", 0.0)
    return client.chat.completions.create(model=model_name, messages=kw.pop("messages", MSG), **kw)


def test_json_object_gives_an_object(client, model_name):
    r = chat(client, model_name, response_format={"type": "json_object"}, temperature=0.7, seed=1)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)


PET = {"type": "object", "additionalProperties": False, "required": ["name", "age", "likes", "kind"],
       "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0,
                                                                         "maximum": 30},
                      "likes": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1,
                                "maxItems": 3},
                      "kind": {"enum": ["cat", "dog", "bird"]}}}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_output_always_validates(client, model_name, seed):
    r = chat(client, model_name, temperature=1.0, seed=seed,
             response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": PET, "strict": True}})
    doc = json.loads(r.choices[0].message.content)
    assert set(doc) == {"name", "age", "likes", "kind"}
    assert isinstance(doc["name"], str) and len(doc["name"]) <= 12
    assert isinstance(doc["age"], int) and 0 <= doc["age"] <= 30
    assert 1 <= len(doc["likes"]) <= 3 and all(isinstance(x, str) and len(x) <= 12 for x in doc["likes"])
    assert doc["kind"] in ("cat", "dog", "bird")


# ---- the SDK's parse() with pydantic models ------------------------------------------------------------------
class Kind(StrEnum):
    cat = "cat"
    dog = "dog"


class Toy(BaseModel):
    name: str = Field(max_length=10)
    squeaks: bool


class Owner(BaseModel):
    first_name: str = Field(max_length=10)
    code: str = Field(pattern=r"^[A-Z]{3}-[0-9]{2}$")


class Pet(BaseModel):
    name: str = Field(max_length=10)
    kind: Kind
    age: int
    toys: list[Toy] = Field(min_length=1, max_length=2)
    owner: Owner
    previous_owner: Owner | None                 # anyOf with null, the Owner schema through $ref/$defs
    size: Literal["small", "large"]
    nickname: str | int                          # anyOf of two types


class Event(BaseModel):
    title: str = Field(max_length=12)
    day: str = Field(pattern=r"^2025-0[1-9]-[0-2][0-9]$")
    starts: datetime.datetime                    # string formats: date-time, date, email
    ends_on: datetime.date
    contact: str = Field(json_schema_extra={"format": "email"}, max_length=30)
    tags: list[Literal["work", "home", "fun"]] = Field(min_length=1, max_length=3)


@pytest.mark.parametrize("model_cls", [Pet, Event])
def test_sdk_parse_returns_a_parsed_model(client, model_name, model_cls):
    for seed in (1, 2):
        r = client.chat.completions.parse(model=model_name, messages=MSG, response_format=model_cls,
                                          max_tokens=400, temperature=0.8, seed=seed)
        parsed = r.choices[0].message.parsed
        assert isinstance(parsed, model_cls), r.choices[0].message.content
        if isinstance(parsed, Pet):
            assert 1 <= len(parsed.toys) <= 2 and re.fullmatch(r"[A-Z]{3}-[0-9]{2}", parsed.owner.code)
            assert parsed.previous_owner is None or isinstance(parsed.previous_owner, Owner)
        else:
            assert isinstance(parsed.starts, datetime.datetime) and isinstance(parsed.ends_on, datetime.date)
            assert re.fullmatch(r"[^@\s]+@[^@\s]+", parsed.contact), parsed.contact


# ---- the extensions -------------------------------------------------------------------------------------------
def test_vllm_and_llama_server_extensions(client, model_name):
    r = client.completions.create(model=model_name, prompt="The answer is", max_tokens=20, temperature=1.0, seed=4,
                                  extra_body={"guided_regex": r"(yes|no), [0-9]{2}"})
    assert re.fullmatch(r"(yes|no), [0-9]{2}", r.choices[0].text) and r.choices[0].finish_reason == "stop"
    r = chat(client, model_name, extra_body={"guided_choice": ["purr", "meow", "hiss"]}, temperature=1.0, seed=5)
    assert r.choices[0].message.content in ("purr", "meow", "hiss")
    r = chat(client, model_name, extra_body={"grammar": 'root ::= "[" [0-9]+ ("," [0-9]+)* "]"'}, max_tokens=40)
    text = r.choices[0].message.content
    assert re.fullmatch(r"\[[0-9]+(,[0-9]+)*\]", text) or r.choices[0].finish_reason == "length", text
    r = chat(client, model_name, extra_body={"json_schema": {"type": "object", "properties": {
        "ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}})
    assert isinstance(json.loads(r.choices[0].message.content)["ok"], bool)
    r = chat(client, model_name, extra_body={"structured_outputs": {"choice": ["A", "B"]}})
    assert r.choices[0].message.content in ("A", "B")
    r = chat(client, model_name, extra_body={"guided_json": json.dumps({"type": "array", "items": {"type": "integer"},
                                                                         "maxItems": 3})}, max_tokens=60)
    assert isinstance(json.loads(r.choices[0].message.content), list)


def test_logprobs_are_over_the_allowed_tokens(client, model_name):
    r = chat(client, model_name, extra_body={"guided_choice": ["yes", "no"]}, logprobs=True, top_logprobs=20)
    first = r.choices[0].logprobs.content[0]
    allowed_first = {"yes", "no", "y", "n", "ye"}
    assert {t.token for t in first.top_logprobs} <= allowed_first | {"Ġyes", "Ġno"}  # never a masked token
    assert len(first.top_logprobs) < 20                                 # fewer tokens are allowed than asked for
    total = sum(pow(2.718281828459045, t.logprob) for t in first.top_logprobs)
    assert total == pytest.approx(1.0, abs=1e-3)                        # they carry all the probability


def test_top_p_zero_is_greedy(client, model_name):
    a = chat(client, model_name, max_tokens=16, temperature=0.0).choices[0].message.content
    b = chat(client, model_name, max_tokens=16, temperature=1.5, top_p=0, seed=9).choices[0].message.content
    assert a == b


# ---- determinism and streaming ----------------------------------------------------------------------------------
RF = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET}}


def test_seeded_constrained_request_is_the_same_alone_and_in_a_batch_of_8(aclient, model_name):
    async def one(seed):
        r = await aclient.chat.completions.create(model=model_name, messages=MSG, max_tokens=200, temperature=0.9,
                                                  seed=seed, response_format=RF)
        return r.choices[0].message.content

    async def main():
        alone = await one(42)
        batch = await asyncio.gather(*(one(s) for s in [42, 1, 2, 3, 4, 5, 6, 7]))
        return alone, batch

    alone, batch = asyncio.run(main())
    assert batch[0] == alone
    json.loads(alone)


def test_streamed_constrained_output_equals_the_whole_one(client, model_name):
    whole = chat(client, model_name, response_format=RF, temperature=0.9, seed=11).choices[0].message.content
    stream = chat(client, model_name, response_format=RF, temperature=0.9, seed=11, stream=True,
                  stream_options={"include_usage": True})
    pieces, usage_chunks = [], 0
    for chunk in stream:
        if chunk.usage is not None:
            usage_chunks += 1
        for ch in chunk.choices:
            pieces.append(ch.delta.content or "")
    assert "".join(pieces) == whole and usage_chunks == 1


def test_stream_has_no_usage_unless_asked(client, model_name):
    stream = chat(client, model_name, max_tokens=4, stream=True)
    assert all(chunk.usage is None for chunk in stream)


def test_constrained_requests_do_not_speculate(server, client, model_name):
    """Prompt-lookup drafts are not checked against the grammar, so a constrained request never drafts: asking
    for speculation changes nothing in its output and no draft token is proposed for it."""
    drafts = server.metric("inferd:spec_decode_num_draft_tokens_total")
    kw = {"response_format": RF, "temperature": 0.0, "max_tokens": 120}
    plain = chat(client, model_name, **kw).choices[0].message.content
    spec = chat(client, model_name, extra_body={"speculative": True}, **kw).choices[0].message.content
    assert spec == plain and json.loads(spec)
    assert server.metric("inferd:spec_decode_num_draft_tokens_total") == drafts


def test_a_constrained_first_request_on_a_fresh_server(make_server):
    """The grammar vocabulary is built for the first constrained request (not at start-up): that request, sent
    the moment /health turns 200, gets output that follows its regex."""
    srv = make_server()
    assert not srv.state.grammar.started
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    r = c.completions.create(model=srv.state.served_model_name, prompt="The answer is", max_tokens=20,
                             temperature=1.0, seed=4, extra_body={"guided_regex": r"(yes|no), [0-9]{2}"})
    assert re.fullmatch(r"(yes|no), [0-9]{2}", r.choices[0].text) and r.choices[0].finish_reason == "stop"
    assert srv.state.grammar.started
