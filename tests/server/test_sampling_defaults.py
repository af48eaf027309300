"""A request's missing sampling fields: the model file's recommendation, else llama.cpp's defaults, with the
settings over both; /v1/models says which apply, and a request's own fields win."""

import dataclasses
import json
import urllib.request

import openai
import pytest

from inferd.model.sampling_defaults import LLAMA_CPP, resolve
from inferd.server.apis.sampling import sampling_params


def test_missing_fields_take_the_defaults_and_given_ones_win():
    d = resolve("model", {"temperature": 0.6, "top_k": 20.0})
    p = sampling_params(d)
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty) == (0.6, 20, 0.95, 0.05, 1.0)
    p = sampling_params(d, temperature=1.0, top_k=-1, top_p=0.5, min_p=0.0)
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (1.0, 0, 0.5, 0.0)   # top_k -1: off, as in vLLM
    p = sampling_params(d, top_p=0.0)                                        # OpenAI's top_p 0: greedy
    assert (p.temperature, p.top_p) == (0.0, 1.0)


def test_models_lists_the_defaults_in_use(server, model_name):
    with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as r:
        card = json.load(r)["data"][0]
    # SmolLM2's file recommends nothing: llama.cpp's
    assert card["sampling_defaults"] == {**dataclasses.asdict(LLAMA_CPP)}
    assert card["id"] == model_name


def test_settings_override_the_defaults_for_requests_that_leave_fields_out(make_server, model_name):
    srv = make_server(override_generation_config='{"temperature": 0}')
    assert srv.state.sampling_defaults.source == "llama.cpp + settings"
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    ask = dict(model=model_name, messages=[{"role": "user", "content": "Name three colors."}], max_tokens=24)
    unset = [client.chat.completions.create(**ask).choices[0].message.content for _ in range(2)]
    greedy = client.chat.completions.create(**ask, temperature=0).choices[0].message.content
    assert unset == [greedy, greedy]   # temperature 0 from the settings: greedy, the same every time
    hot = {client.chat.completions.create(**ask, temperature=1.5, seed=s).choices[0].message.content
           for s in range(3)}
    assert hot != {greedy}             # the request's own temperature still wins


@pytest.mark.parametrize("source", ["openai", "llama.cpp"])
def test_the_source_setting_picks_the_base(make_server, source):
    srv = make_server(generation_config=source)
    assert srv.state.sampling_defaults.source == source
    assert srv.state.sampling_defaults.temperature == (1.0 if source == "openai" else 0.8)
