"""Ollama's listings through the real `ollama` client: /api/tags, /api/show, /api/ps, /api/version, the liveness
answer at / (GET and HEAD), names with and without `:latest`, 404s in Ollama's envelope, and API keys guarding
/api/ as they guard /v1/."""
from __future__ import annotations

import httpx
import ollama
import pytest


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url)


def test_liveness_at_the_root(server):
    r = httpx.get(server.url + "/", timeout=10)
    assert (r.status_code, r.text) == (200, "Ollama is running")
    assert httpx.head(server.url + "/", timeout=10).status_code == 200


def test_version(server):
    r = httpx.get(server.url + "/api/version", timeout=10)
    major, minor, patch = (int(x) for x in r.json()["version"].split("."))
    assert r.status_code == 200 and (major, minor) >= (0, 6)


def test_tags_list_the_served_model(client, model_name, server):
    (m,) = client.list().models
    assert m.model == model_name + ":latest"
    assert m.size > 1_000_000 and m.modified_at.year >= 1980
    assert len(m.digest) == 64 and int(m.digest, 16) >= 0
    d = m.details
    assert (d.format, d.family, d.quantization_level) == ("gguf", "llama", "Q4_1")
    assert d.parameter_size.endswith("M") and 100 < float(d.parameter_size[:-1]) < 200


def test_show_describes_the_model(client, model_name, server):
    for name in (model_name, model_name + ":latest"):
        s = client.show(name)
        assert s.template == server.state.chat_template.source
        assert s.capabilities == ["completion", "tools"]
        assert s.modelinfo["general.architecture"] == "llama"
        assert s.modelinfo["llama.context_length"] == server.state.max_model_len
        assert "temperature" in s.parameters and s.modelfile.startswith("FROM ")
        assert s.details.family == "llama"


def test_ps_shows_the_loaded_model(client, model_name, server):
    (m,) = client.ps().models
    assert m.model == m.name == model_name + ":latest"
    assert m.context_length == server.state.max_model_len and m.size_vram == 0
    assert m.expires_at.year > 2100  # it stays loaded as long as the server runs


def test_unknown_model_is_a_404_in_ollamas_envelope(client, server):
    with pytest.raises(ollama.ResponseError) as e:
        client.show("llama3.2")
    assert (e.value.status_code, e.value.error) == (404, "model 'llama3.2' not found")
    r = httpx.post(server.url + "/api/show", json={"model": 7}, timeout=10)
    assert r.status_code == 400 and set(r.json()) == {"error"}


def test_api_keys_guard_the_api(make_server):
    srv = make_server(api_keys=["k1"])
    name = srv.state.served_model_name
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=srv.url).chat(model=name, messages=[{"role": "user", "content": "hi"}], stream=False)
    assert e.value.status_code == 401 and "API key" in e.value.error
    keyed = ollama.Client(host=srv.url, headers={"Authorization": "Bearer k1"})
    assert keyed.chat(model=name, messages=[], stream=False).done_reason == "load"
    assert httpx.get(srv.url + "/", timeout=10).text == "Ollama is running"  # the liveness probe needs no key
