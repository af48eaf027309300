"""POST /api/generate through the real `ollama` client against SmolLM2: the templated prompt with `system`, a raw
prompt, `context` sent back to continue, `suffix` (fill in the middle) on a model without FIM tokens, `format`,
`logprobs`, the load idiom, and what is refused."""
from __future__ import annotations

import json

import httpx
import ollama
import pytest

GREEDY = {"temperature": 0, "num_predict": 10}


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url)


def test_whole_and_streamed_answers_agree(client, model_name):
    whole = client.generate(model=model_name, prompt="Name a fruit.", options=GREEDY)
    assert whole.done and whole.response.strip() and 0 < whole.eval_count <= 10
    parts = list(client.generate(model=model_name, prompt="Name a fruit.", options=GREEDY, stream=True))
    assert "".join(p.response for p in parts) == whole.response and parts[-1].done
    assert parts[-1].context == whole.context and parts[-1].eval_count == whole.eval_count
    assert all(p.context is None for p in parts[:-1])


def test_context_holds_prompt_and_answer_and_continues(client, model_name, server):
    first = client.generate(model=model_name, prompt="Name a fruit.", options=GREEDY)
    tok = server.state.tokenizer
    assert len(first.context) == first.prompt_eval_count + first.eval_count
    assert first.response in tok.decode(list(first.context))
    follow = client.generate(model=model_name, prompt="And a vegetable?", context=first.context, options=GREEDY)
    alone = client.generate(model=model_name, prompt="And a vegetable?", options=GREEDY)
    assert follow.prompt_eval_count == len(first.context) + alone.prompt_eval_count
    assert follow.context[: len(first.context)] == first.context


def test_system_is_the_templates_and_raw_skips_the_template(client, model_name, server):
    r = client.generate(model=model_name, prompt="Hello", system="You are terse.", options={"num_predict": 1})
    prompt = server.state.tokenizer.decode(list(r.context[: r.prompt_eval_count]), skip_special=False)
    assert "system\nYou are terse." in prompt and "user\nHello" in prompt
    raw = client.generate(model=model_name, prompt="The capital of France is", raw=True, options=GREEDY)
    assert raw.prompt_eval_count <= 8 and raw.response.strip()


def test_format_json_and_logprobs(client, model_name, server):
    schema = {"type": "object", "additionalProperties": False, "required": ["name"],
              "properties": {"name": {"type": "string", "maxLength": 10}}}
    r = client.generate(model=model_name, prompt="A dog's name:", format=schema,
                        options={"temperature": 0.7, "seed": 3})
    assert r.done_reason == "stop" and set(json.loads(r.response)) == {"name"}
    body = {"model": model_name, "prompt": "Hi", "stream": False, "logprobs": True, "top_logprobs": 2,
            "options": {"num_predict": 3, "temperature": 0}}
    out = httpx.post(server.url + "/api/generate", json=body, timeout=30).json()
    assert len(out["logprobs"]) == 3 and "".join(e["token"] for e in out["logprobs"]) == out["response"]
    for e in out["logprobs"]:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 2
        assert e["top_logprobs"][0]["logprob"] == pytest.approx(e["logprob"], abs=1e-4)  # greedy: the top one


def test_empty_prompt_loads(client, model_name):
    r = client.generate(model=model_name, prompt="")
    assert (r.done, r.done_reason, r.response, r.context) == (True, "load", "", None)


@pytest.mark.parametrize(("extra", "words"), [
    ({"template": "{{ .Prompt }}"}, "template"),
    ({"suffix": "return x"}, "fill-in-the-middle"),
    ({"raw": True, "system": "x"}, "raw"),
    ({"images": ["aGVsbG8="]}, "images"),
    ({"context": [10**9]}, "vocabulary"),
    ({"think": "low"}, "thinking"),
    ({"think": "extreme"}, "think"),
    ({"raw": True, "think": True}, "chat template"),
    ({"options": {"num_predict": "ten"}}, "num_predict"),
])
def test_refused_with_a_clear_400(server, model_name, extra, words):
    body = {"model": model_name, "prompt": "Hello", **extra}
    r = httpx.post(server.url + "/api/generate", json=body, timeout=30)
    assert r.status_code == 400 and set(r.json()) == {"error"} and words in r.json()["error"], r.text


def test_an_empty_template_is_absent(client, model_name):
    assert client.generate(model=model_name, prompt="Hi", template="", options={"num_predict": 1}).done


def test_unknown_model(client):
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="llama3:8b", prompt="Hi")
    assert (e.value.status_code, e.value.error) == (404, "model 'llama3:8b' not found")


def test_suffix_fills_in_the_middle_with_the_models_fim_tokens(client, model_name, server, monkeypatch):
    """SmolLM2 has no FIM tokens: three of its special tokens stand in for them, so the prompt's shape is known."""
    from inferd.text.fim import fim_prompt_ids
    tok = server.state.tokenizer
    monkeypatch.setattr(tok, "fim_ids", (1, 2, 0))
    r = client.generate(model=model_name, prompt="def add(a, b):\n    ", suffix="\nprint(add(1, 2))",
                        options={"num_predict": 4, "temperature": 0})
    want = fim_prompt_ids(tok, "def add(a, b):\n    ", "\nprint(add(1, 2))")
    assert list(r.context[: r.prompt_eval_count]) == want and r.eval_count > 0
    assert "insert" in client.show(model_name).capabilities
