"""LoRA adapters through the API (the real openai SDK against the real SmolLM2 with two random adapters, one a
PEFT folder, one a llama.cpp GGUF): chosen by `model: "base:NAME"`, the adapter's own name or the `lora` field,
listed in /v1/models with their parent, counted in vllm:lora_requests_info; an unknown adapter is a 404 in
OpenAI's envelope; the prefix cache keeps each adapter's K/V apart from the base model's."""

from __future__ import annotations

import openai
import pytest

from tests.model.make_lora import random_lora, write_gguf_lora, write_peft

QUESTION = [{"role": "user", "content": "Write the numbers from one to ten in words."}]
# long enough for whole 64-token blocks of prefix cache
LONG = [{"role": "system", "content": "You are a careful assistant. " * 30}, *QUESTION]


@pytest.fixture(scope="module")
def adapters(loaded_model, tmp_path_factory):
    cfg = loaded_model.config
    root = tmp_path_factory.mktemp("lora")
    peft = write_peft(root / "shout", random_lora(cfg, 8, targets=("q", "v", "down"), seed=1, gain=0.5),
                      alpha=16, rank=8)
    gguf = write_gguf_lora(root / "whisper.gguf", cfg, random_lora(cfg, 4, targets=("k", "o", "up"), seed=2,
                                                                   gain=0.5), alpha=4)
    return {"shout": str(peft), "whisper": str(gguf)}


@pytest.fixture(scope="module")
def lora_server(loaded_model, adapters):
    from tests.server.conftest import ServerThread, make_settings

    srv = ServerThread(make_settings(lora_adapters=adapters), loaded_model).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(lora_server):
    return openai.OpenAI(base_url=lora_server.url + "/v1", api_key="unused", max_retries=0)


def chat(client, model, messages=QUESTION, **extra):
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0,
                                       extra_body=extra or None)
    return r.choices[0].message.content, r.usage


def test_models_lists_the_adapters_with_their_parent(client, lora_server, adapters):
    base = lora_server.state.served_model_name
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {base, "shout", "whisper"}
    for name in ("shout", "whisper"):
        card = models[name].model_dump()
        assert card["parent"] == base and card["root"] == adapters[name] and card["object"] == "model"
        assert client.models.retrieve(name).model_dump()["parent"] == base
    assert models["shout"].model_dump()["lora"] == {"format": "peft", "rank": 8, "targets": ["q", "v", "down"]}
    assert models["whisper"].model_dump()["lora"]["format"] == "gguf"


def test_every_way_of_choosing_an_adapter_gives_its_output(client, lora_server):
    base = lora_server.state.served_model_name
    plain, _ = chat(client, base)
    shout, _ = chat(client, f"{base}:shout")
    whisper, _ = chat(client, f"{base}:whisper")
    assert len({plain, shout, whisper}) == 3, "each adapter changes the greedy answer"
    assert chat(client, "shout")[0] == shout                                   # the adapter's own name (vLLM)
    chunks = client.chat.completions.create(model=f"{base}:shout", messages=QUESTION, max_tokens=16, temperature=0,
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == shout
    assert chat(client, base, lora=[{"name": "shout", "scale": 1.0}])[0] == shout
    assert chat(client, base, lora=[{"id": 1}])[0] == whisper                  # ids in the setting's order
    assert chat(client, f"{base}:shout", lora=[{"name": "shout", "scale": 0.0}])[0] == plain
    assert chat(client, base, lora=[{"name": "shout", "scale": 0.0}, {"id": 1}])[0] == whisper
    # completions take the same fields
    text = client.completions.create(model=f"{base}:whisper", prompt="One, two,", max_tokens=8, temperature=0)
    again = client.completions.create(model=base, prompt="One, two,", max_tokens=8, temperature=0,
                                      extra_body={"lora": [{"name": "whisper"}]})
    assert text.choices[0].text == again.choices[0].text


def test_unknown_adapters_are_404s_and_bad_lora_fields_400s(client, lora_server):
    base = lora_server.state.served_model_name
    for what, kwargs in (("nope", {"model": f"{base}:nope"}),
                         ("nope", {"model": base, "extra_body": {"lora": [{"name": "nope"}]}}),
                         ("id 7", {"model": base, "extra_body": {"lora": [{"id": 7}]}})):
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(messages=QUESTION, max_tokens=2, **kwargs)
        assert e.value.body["code"] == "model_not_found"
        assert f"The LoRA adapter `{what}` does not exist; this server has shout, whisper" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=base, messages=QUESTION, max_tokens=2,
                                       extra_body={"lora": [{"name": "shout"}, {"name": "whisper"}]})
    assert "one LoRA adapter per request" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=base, messages=QUESTION, max_tokens=2,
                                       extra_body={"lora": [{"scale": 1.0}]})


def test_prefix_cache_keeps_adapters_apart(client, lora_server):
    base = lora_server.state.served_model_name
    first, usage = chat(client, base, LONG)
    cached, usage2 = chat(client, base, LONG)
    assert cached == first and usage2.prompt_tokens_details.cached_tokens >= 64
    # an adapter's own K/V only: at most the chat template's opening its earlier requests (other tests') shared
    shout, usage3 = chat(client, f"{base}:shout", LONG)
    assert usage3.prompt_tokens_details.cached_tokens < 64, "an adapter must not reuse the base model's K/V"
    shout2, usage4 = chat(client, f"{base}:shout", LONG)
    assert shout2 == shout and usage4.prompt_tokens_details.cached_tokens == usage4.prompt_tokens - 1
    half, usage5 = chat(client, base, LONG, lora=[{"name": "shout", "scale": 0.5}])
    assert usage5.prompt_tokens_details.cached_tokens < 64, "another scale is another model"
    assert chat(client, base, LONG)[0] == first


def test_lora_requests_info_names_the_adapters(lora_server):
    series = [k for k in lora_server.metrics() if k[0] == "vllm:lora_requests_info"]
    assert series and all(dict(k[1]).get("max_lora") == "2" for k in series), series


def test_adapters_on_a_model_they_do_not_fit_fail_start_up(make_server, tmp_path, loaded_model):
    from tests.reference import random_model

    other = random_model(arch="llama").config
    folder = write_peft(tmp_path / "other", random_lora(other, 4), alpha=8, rank=4)
    srv = make_server(wait_ready=False, lora_adapters={"other": str(folder)})
    srv.call(srv.state.ready_event.wait(), timeout=120)
    assert srv.state.status == "failed"
    assert "do not fit the base weight" in srv.state.failure


def test_lora_requests_info_lists_running_and_waiting_adapters():
    from types import SimpleNamespace

    from inferd.engine.types import LoraUse
    from inferd.server.metrics import adapters_in_use

    def state(name):
        return SimpleNamespace(request=SimpleNamespace(lora=LoraUse(0, 1.0, f"{name}\0abc") if name else None))

    scheduler = SimpleNamespace(running=[state("b"), state(None), state("a"), state("b")], waiting=[state("c")])
    assert adapters_in_use(scheduler) == ("a,b", "c")
