"""Many models in one daemon, against real `inferd serve` processes: three tiny models from a folder (each its own
weights), loaded by the first request that names them, streamed side by side through the openai client, unloaded
when idle (or by Ollama's keep_alive 0) and loaded again, evicted least recently used first under a memory budget
that holds two of the three, a model that can never fit refused with a 4xx naming the budget, names outside the
folder a 404 in each API's envelope, admin load/unload behind the API key, and the daemon's RSS bounded throughout.

Two daemons: `roomy` (a budget for all three, idle_unload_s = 1) and `tight` (a 40 MiB budget: each model takes
its 16 MiB KV cache plus its weights, so two fit; an API key; no idle unload)."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from tests.model.make_tiny import TinySpec, write_tiny_gguf
from tests.ops.procs import ROOT, Process, free_port, http_get, wait_for

NAMES = ("alpha", "beta", "gamma")
KEY = "many-models-key"
PROMPT = [{"role": "user", "content": "Tell me about the sea"}]


def make_folder(root: Path) -> Path:
    folder = root / "models"
    folder.mkdir()
    for seed, name in enumerate(NAMES):
        write_tiny_gguf(folder / f"{name}.gguf", TinySpec(seed=seed + 1), weight_type="Q8_0")
    (folder / "notes.txt").write_text("not a model")  # ignored: only GGUF files and model folders are models
    (folder / ".hidden.gguf").write_text("")  # ignored: hidden
    return folder


class Daemon(Process):
    def __init__(self, workdir: Path, config: str, name: str):
        self.port = free_port()
        cfg = workdir / f"{name}.toml"
        cfg.write_text(config)
        # only the settings file speaks (the test session's INFERD_* variables would win over it)
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERD_")}
        env |= {"PYTHONPATH": str(ROOT), "INFERD_CONFIG": str(cfg)}
        argv = [sys.executable, "-m", "inferd.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        super().__init__(argv, workdir / f"{name}.log", env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> Daemon:
        wait_for(lambda: (http_get(self.url + "/health") or (0,))[0] == 200, 120, "daemon ready", self)
        return self

    def rss_mib(self) -> float:
        assert self.popen is not None
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def post(self, path: str, body: dict, key: str | None = None) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), headers)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def get(self, path: str, key: str | None = None) -> dict:
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {key}"} if key else {})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def states(self, key: str | None = None) -> dict[str, str]:
        return {m["id"]: m["state"] for m in self.get("/v1/models", key)["data"]}

    def wait_state(self, name: str, state: str, key: str | None = None, timeout: float = 30) -> None:
        wait_for(lambda: self.states(key)[name] == state, timeout, f"{name} {state}", self)


BASE = """
kv_cache_mib = 16
max_batch_tokens = 64
max_running = 4
prompt_cache_disk_mib = 0
measure_bandwidth = false
log_requests = false
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_folder(tmp_path_factory.mktemp("many-models"))


@pytest.fixture(scope="module")
def roomy(folder):
    config = f'models_dir = "{folder}"\nidle_unload_s = 1\naliases = {{ "tiny-chat" = "alpha" }}\n' + BASE
    d = Daemon(folder.parent, config, "roomy")
    d.start()
    try:
        yield d.wait_ready()
    finally:
        d.stop()


@pytest.fixture(scope="module")
def tight(folder):
    huge = folder.parent / "elsewhere"
    huge.mkdir(exist_ok=True)
    write_tiny_gguf(huge / "huge.gguf", TinySpec(seed=9), weight_type="Q8_0")
    config = (
        f'models_dir = "{folder}"\nmemory_budget_mib = 40\napi_keys = ["{KEY}"]\n'
        + BASE
        + f'\n[models.huge]\npath = "{huge / "huge.gguf"}"\nkv_cache_mib = 64\n'
    )
    d = Daemon(folder.parent, config, "tight")
    d.start()
    try:
        yield d.wait_ready()
    finally:
        d.stop()


def answer(client: openai.OpenAI, model: str) -> str:
    r = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=12, temperature=0)
    return r.choices[0].message.content or ""


# ---- one folder, three models -----------------------------------------------------------------------------------


def test_the_folder_is_listed_unloaded_and_health_is_200_before_any_load(roomy):
    status, body = http_get(roomy.url + "/health") or (0, b"")
    assert status == 200
    assert json.loads(body)["models"] == {n: "unloaded" for n in NAMES}
    cards = roomy.get("/v1/models")["data"]
    assert [c["id"] for c in cards] == list(NAMES)  # notes.txt and .hidden.gguf are not models
    assert cards[0]["aliases"] == ["tiny-chat"]
    tags = roomy.get("/api/tags")["models"]
    assert sorted(t["name"] for t in tags) == [f"{n}:latest" for n in NAMES]


def test_streams_interleaved_across_three_models_each_answer_as_alone(roomy):
    client = openai.OpenAI(base_url=roomy.url + "/v1", api_key="none", max_retries=0)
    alone = {name: answer(client, name) for name in NAMES}
    assert len(set(alone.values())) == 3  # three models with their own weights
    streams = {
        name: client.chat.completions.create(
            model=name, messages=PROMPT, max_tokens=12, temperature=0, stream=True
        ).__iter__()
        for name in NAMES
    }
    texts = dict.fromkeys(NAMES, "")
    models_seen: dict[str, set[str]] = {n: set() for n in NAMES}
    while streams:  # one chunk of each in turn, so all three are generating at once
        for name in list(streams):
            chunk = next(streams[name], None)
            if chunk is None:
                del streams[name]
                continue
            models_seen[name].add(chunk.model)
            if chunk.choices and chunk.choices[0].delta.content:
                texts[name] += chunk.choices[0].delta.content
    assert texts == alone
    assert models_seen == {n: {n} for n in NAMES}
    assert answer(client, "tiny-chat") == alone["alpha"]  # an alias answers as its model


def test_idle_models_unload_and_load_again_with_the_same_answer(roomy):
    client = openai.OpenAI(base_url=roomy.url + "/v1", api_key="none", max_retries=0)
    first = answer(client, "beta")
    roomy.wait_state("beta", "unloaded")  # idle_unload_s = 1
    assert (http_get(roomy.url + "/health") or (0,))[0] == 200
    assert answer(client, "beta") == first
    assert roomy.states()["beta"] == "loaded"


def test_ollama_keep_alive_zero_unloads_and_a_duration_sets_the_expiry(roomy):
    status, _ = roomy.post("/api/generate", {"model": "gamma", "prompt": "hi", "stream": False,
                                            "options": {"num_predict": 2}, "keep_alive": "1h"})
    assert status == 200
    ps = {m["name"]: m for m in roomy.get("/api/ps")["models"]}
    expires = ps["gamma:latest"]["expires_at"]
    left = time.mktime(time.strptime(expires[:19], "%Y-%m-%dT%H:%M:%S")) - time.mktime(time.gmtime())
    assert 3000 < left <= 3600
    status, body = roomy.post("/api/generate", {"model": "gamma:latest", "keep_alive": 0})
    assert status == 200 and body["done_reason"] == "unload"
    roomy.wait_state("gamma", "unloaded")
    loads = roomy.log_text().count("loaded gamma in")
    # unloading a model that is not loaded answers at once, without loading it first
    status, body = roomy.post("/api/chat", {"model": "gamma", "messages": [], "keep_alive": "0s", "stream": False})
    assert status == 200 and body["done_reason"] == "unload" and body["message"]["content"] == ""
    status, body = roomy.post("/api/generate", {"model": "gamma", "keep_alive": 0})
    assert status == 200 and body["done_reason"] == "unload" and body["model"] == "gamma"
    assert roomy.states()["gamma"] == "unloaded" and roomy.log_text().count("loaded gamma in") == loads
    status, body = roomy.post("/api/generate", {"model": "../gamma", "keep_alive": 0})
    assert status == 404 and set(body) == {"error"}


@pytest.mark.parametrize("name", ["../alpha", "alpha.gguf", "/etc/passwd", "models/alpha", "alpha/../beta", "delta"])
def test_names_outside_the_folder_are_404_in_each_apis_envelope(roomy, folder, name):
    for bad in (name, str(folder / "alpha.gguf")):
        status, body = roomy.post("/v1/chat/completions", {"model": bad, "messages": PROMPT})
        assert status == 404 and body["error"]["code"] == "model_not_found", body
        status, body = roomy.post("/v1/messages", {"model": bad, "max_tokens": 4, "messages": PROMPT})
        assert status == 404 and body["type"] == "error" and body["error"]["type"] == "not_found_error", body
        status, body = roomy.post("/api/chat", {"model": bad, "messages": PROMPT, "stream": False})
        assert status == 404 and set(body) == {"error"}, body
    assert "passwd" not in roomy.log_text()  # nothing tried to open it


# ---- a budget that holds two of three ---------------------------------------------------------------------------


def test_eviction_unloads_the_least_recently_used_and_rss_stays_bounded(tight):
    client = openai.OpenAI(base_url=tight.url + "/v1", api_key=KEY, max_retries=0)
    start_rss = tight.rss_mib()
    answer(client, "alpha")
    answer(client, "beta")
    assert tight.states(KEY) == {"alpha": "loaded", "beta": "loaded", "gamma": "unloaded", "huge": "unloaded"}
    answer(client, "alpha")  # beta is now the least recently used
    answer(client, "gamma")
    assert tight.states(KEY) == {"alpha": "loaded", "beta": "unloaded", "gamma": "loaded", "huge": "unloaded"}
    cycle_rss = tight.rss_mib()
    peaks = []
    for _ in range(3):  # every request evicts one model and loads another
        for name in ("beta", "alpha", "gamma"):
            answer(client, name)
            peaks.append(tight.rss_mib())
            assert sum(s == "loaded" for s in tight.states(KEY).values()) == 2
    # two models' KV caches (16 MiB each) and weights at most, whatever was loaded and unloaded before; and nine
    # loads later no more than the first ones took
    assert max(peaks) < start_rss + 2 * 17 + 24, (start_rss, cycle_rss, peaks)
    assert peaks[-1] < cycle_rss + 4, (cycle_rss, peaks)


def test_a_model_that_can_never_fit_is_a_4xx_naming_the_budget(tight):
    before = tight.states(KEY)
    status, body = tight.post("/v1/chat/completions", {"model": "huge", "messages": PROMPT}, KEY)
    assert status == 400 and body["error"]["code"] == "model_too_large", body
    assert "memory budget of 40 MiB" in body["error"]["message"] and "64 MiB" in body["error"]["message"]
    status, body = tight.post("/api/chat", {"model": "huge", "messages": PROMPT, "stream": False}, KEY)
    assert status == 400 and "memory budget of 40 MiB" in body["error"]
    assert tight.states(KEY) == before  # nothing was evicted for it


def test_admin_load_and_unload_need_the_key(tight):
    for path in ("/v1/models/load", "/v1/models/unload"):
        status, _ = tight.post(path, {"model": "beta"})
        assert status == 401
        status, _ = tight.post(path, {"model": "beta"}, "wrong")
        assert status == 401
    status, card = tight.post("/v1/models/load", {"model": "beta"}, KEY)
    assert status == 200 and card["id"] == "beta" and card["state"] == "loaded" and card["max_model_len"] == 512
    status, card = tight.post("/v1/models/unload", {"model": "beta"}, KEY)
    assert status == 200 and card["state"] == "unloaded"
    assert tight.states(KEY)["beta"] == "unloaded"
    status, body = tight.post("/v1/models/load", {"model": "../beta"}, KEY)
    assert status == 404


def test_every_route_that_names_a_model_runs_on_that_model(roomy):
    status, body = roomy.post("/tokenize", {"model": "beta", "prompt": "the sea"})
    assert status == 200 and body["count"] > 0
    status, body = roomy.post("/v1/messages/count_tokens", {"model": "gamma", "messages": PROMPT})
    assert status == 200 and body["input_tokens"] > 0
    status, body = roomy.post("/api/show", {"model": "alpha"})
    assert status == 200 and body["model_info"]["general.architecture"] == "llama"
    status, body = roomy.post("/tokenize", {"model": "../beta", "prompt": "the sea"})
    assert status == 404


@pytest.fixture(scope="module")
def listed(tmp_path_factory):
    """Models from [models.NAME] tables only: a default one (loaded at start-up) and a broken file; the prompt
    cache on disk is on."""
    root = tmp_path_factory.mktemp("listed")
    write_tiny_gguf(root / "one.gguf", TinySpec(seed=5), weight_type="Q8_0")
    (root / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    base = BASE.replace("prompt_cache_disk_mib = 0", f'prompt_cache_disk_mib = 16\nprompt_cache_dir = "{root / "pc"}"')
    config = (
        'model = "first"\n' + base + f'\n[models.first]\npath = "{root / "one.gguf"}"\naliases = ["uno"]\n'
        f'\n[models.broken]\npath = "{root / "broken.gguf"}"\n'
    )
    d = Daemon(root, config, "listed")
    d.start()
    try:
        yield d.wait_ready()
    finally:
        d.stop()


def test_tables_without_a_folder_the_default_model_and_a_broken_file(listed):
    assert listed.states() == {"broken": "unloaded", "first": "loaded"}  # `model` is loaded at start-up
    status, body = listed.post("/v1/completions", {"prompt": "the sea", "max_tokens": 3})  # no model: the default
    assert status == 200 and body["model"] == "first"
    status, body = listed.post("/v1/completions", {"model": "uno", "prompt": "the sea", "max_tokens": 3})
    assert status == 200 and body["model"] == "first"
    status, body = listed.post("/v1/chat/completions", {"model": "broken", "messages": PROMPT})
    assert status == 500 and body["error"]["code"] == "model_load_failed" and "broken" in body["error"]["message"]
    assert listed.states() == {"broken": "unloaded", "first": "loaded"}
    assert (http_get(listed.url + "/health") or (0,))[0] == 200


def test_the_prefix_cache_survives_an_unload(listed):
    prompt = "the sea and the ships " * 30  # several whole KV blocks of 64 tokens, within the 512 of context
    request = {"model": "first", "prompt": prompt, "max_tokens": 4, "temperature": 0}
    status, body = listed.post("/v1/completions", request)
    assert status == 200, body
    status, _ = listed.post("/v1/models/unload", {"model": "first"})
    assert status == 200 and listed.states()["first"] == "unloaded"
    saved = list((listed.log_path.parent / "pc" / "first").glob("*.kvc"))
    assert saved  # written on unload, in the model's own folder
    status, again = listed.post("/v1/completions", request)
    assert status == 200 and again["choices"][0]["text"] == body["choices"][0]["text"]
    usage = again["usage"]  # every prompt token but the one sampled from: whole blocks and the tail, from disk
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1, usage


def test_a_request_that_waits_longer_than_the_load_timeout_gets_503_and_the_load_goes_on(folder):
    config = f'models_dir = "{folder}"\nmodel_load_timeout_s = 0.001\n' + BASE  # shorter than any load
    d = Daemon(folder.parent, config, "impatient")
    d.start()
    try:
        d.wait_ready()
        status, body = d.post("/v1/completions", {"model": "beta", "prompt": "the sea", "max_tokens": 2})
        assert status == 503 and "still loading after 0.001 s" in body["error"]["message"], body
        d.wait_state("beta", "loaded")  # the load was not abandoned with the request
        status, body = d.post("/v1/completions", {"model": "beta", "prompt": "the sea", "max_tokens": 2})
        assert status == 200 and body["model"] == "beta"
        assert (http_get(d.url + "/health") or (0,))[0] == 200
    finally:
        d.stop()


def test_metrics_carry_each_loaded_model_once_per_family(tight):
    from prometheus_client.parser import text_string_to_metric_families

    client = openai.OpenAI(base_url=tight.url + "/v1", api_key=KEY, max_retries=0)
    for name in ("alpha", "beta"):
        answer(client, name)
    with urllib.request.urlopen(tight.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert len(families) == len(list(text_string_to_metric_families(text)))  # one HELP/TYPE per family
    success = families["inferd:request_success"]
    assert {s.labels["model_name"] for s in success.samples if s.value > 0} == {"alpha", "beta"}  # the loaded ones
    loaded = {s.labels["model_name"]: s.value for s in families["inferd:model_loaded"].samples}
    assert loaded == {"alpha": 1.0, "beta": 1.0, "gamma": 0.0, "huge": 0.0}
    memory = {s.labels["model_name"]: s.value for s in families["inferd:model_memory_bytes"].samples}
    assert memory["huge"] >= 64 << 20 and 16 << 20 <= memory["alpha"] < 20 << 20
    assert families["inferd:memory_budget_bytes"].samples[0].value == 40 << 20


# ---- a model's own LoRA adapters ---------------------------------------------------------------------------------


def test_a_models_table_gives_it_adapters_chosen_as_name_colon_adapter(tmp_path):
    from inferd.model.loader import load_model
    from tests.model.make_lora import random_lora, write_peft

    folder = make_folder(tmp_path)
    cfg = load_model(str(folder / "alpha.gguf")).config
    shout = write_peft(tmp_path / "shout", random_lora(cfg, 4, targets=("q", "v", "down"), seed=3, gain=1.0),
                       alpha=8, rank=4)
    config = f'models_dir = "{folder}"\n' + BASE + f'\n[models.alpha]\nlora_adapters = {{ shout = "{shout}" }}\n'
    d = Daemon(tmp_path, config, "adapters")
    d.start()
    try:
        d.wait_ready()
        client = openai.OpenAI(base_url=d.url + "/v1", api_key="none", max_retries=0)

        def first_logprobs(model: str) -> list[float]:
            r = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=1, temperature=0,
                                               logprobs=True, top_logprobs=5)
            return [t.logprob for t in r.choices[0].logprobs.content[0].top_logprobs]

        base, adapted = first_logprobs("alpha"), first_logprobs("alpha:shout")
        assert max(abs(a - b) for a, b in zip(base, adapted)) > 1e-3  # the adapter moves alpha's output
        assert first_logprobs("alpha") == base  # and only the requests that name it
        cards = {c["id"]: c for c in d.get("/v1/models")["data"]}
        assert cards["shout"]["parent"] == "alpha" and "shout" not in {c.get("parent") for c in cards.values()}
        for model in ("alpha:nope", "beta:shout"):  # an adapter alpha lacks; beta has none
            with pytest.raises(openai.NotFoundError):
                first_logprobs(model)
    finally:
        d.stop()
