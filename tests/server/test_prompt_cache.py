"""The prompt cache on disk through real servers: a server stopped after a long prompt leaves its blocks in the
folder, the next server on the same model answers that prompt from them (cached_tokens, the same greedy text and
logprobs); damaged and foreign files are skipped with a log line; named save/restore and its bad names."""

import json
import logging
import shutil
import urllib.error
import urllib.request

import openai
import pytest

from inferd.engine.prompt_cache_disk import CacheFile, record_size, write_cache_file

SYSTEM = ("You are the dispatcher of a small taxi company in a harbour town. Confirm pick-up addresses, repeat "
          "times back to the caller, never promise a car in under ten minutes at night, and keep every answer "
          "to two short sentences. Fares: 3 euros plus 2 per kilometre, 5 more after midnight. ") * 6
QUESTION = "Can I get a car to the ferry terminal at 23:40?"


def messages(question=QUESTION):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def ask(srv, question=QUESTION):
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model=srv.state.served_model_name, messages=messages(question),
                                       max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    lps = [(t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs]) for t in r.choices[0].logprobs.content]
    return r.choices[0].message.content, lps, r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens


def post(srv, path, body):
    req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def first_run(loaded_model, tmp_path_factory):
    """A server that answered QUESTION once and was stopped: its answer and the folder it left."""
    from tests.server.conftest import ServerThread, make_settings

    folder = tmp_path_factory.mktemp("prompt-cache")
    srv = ServerThread(make_settings(prompt_cache_dir=str(folder), prompt_cache_disk_mib=64), loaded_model).start()
    answer = ask(srv)
    disk = srv.state.prompt_cache
    written = srv.metric("inferd:prompt_cache_disk_written_bytes_total")
    srv.stop()
    return answer, folder, disk.path, written, (disk.fingerprint, disk.layout)


def test_a_restarted_server_answers_from_the_disk_cache(first_run, make_server):
    (text, lps, cached, prompt_tokens), folder, path, written, (_, layout) = first_run
    assert cached == 0 and prompt_tokens > 300
    assert written == 0  # nothing is written before shutdown
    assert path.exists() and path.parent == folder
    srv = make_server(prompt_cache_dir=str(folder), prompt_cache_disk_mib=64)
    text2, lps2, cached2, _ = ask(srv)
    assert cached2 == prompt_tokens - 1  # every whole block of the prompt, then the rest out of the first run's tail
    assert (text2, lps2) == (text, lps)
    assert srv.metric("inferd:prompt_cache_disk_hits_total") == cached2
    assert srv.metric("inferd:prompt_cache_disk_read_bytes_total") == (cached2 // 64 + 1) * record_size(layout)
    assert srv.metric("vllm:prefix_cache_hits_total") == cached2
    # another question after the same system prompt hits the blocks read from disk, now in memory
    _, _, cached3, _ = ask(srv, "And one to the station at 6?")
    assert cached3 >= len(SYSTEM) // 8 // 64 * 64 and srv.metric("inferd:prompt_cache_disk_hits_total") == cached2


def damage_truncate(path, fingerprint, layout):
    path.write_bytes(path.read_bytes()[:-100])


def damage_flip(path, fingerprint, layout):
    f = CacheFile(path, fingerprint, layout)
    first = min(f.index.values())  # the first block a prompt asks for
    f.close()
    raw = bytearray(path.read_bytes())
    raw[first + record_size(layout) // 2] ^= 0x04  # inside its KV image
    path.write_bytes(bytes(raw))


def damage_foreign(path, fingerprint, layout):
    f = CacheFile(path, fingerprint, layout)
    records = list(f.records())
    f.close()
    write_cache_file(path, "0" * 32, layout, records)  # the same blocks, said to be another model's


@pytest.mark.parametrize("damage, logged", [(damage_truncate, "torn or truncated"), (damage_flip, "checksum"),
                                            (damage_foreign, "another model")])
def test_a_damaged_or_foreign_file_is_skipped_with_a_log_line(first_run, make_server, tmp_path, caplog, damage,
                                                              logged):
    (text, lps, _, _), folder, path, _, (fingerprint, layout) = first_run
    shutil.copy(path, tmp_path / path.name)
    damage(tmp_path / path.name, fingerprint, layout)
    with caplog.at_level(logging.WARNING, "inferd.prompt_cache"):
        srv = make_server(prompt_cache_dir=str(tmp_path), prompt_cache_disk_mib=64)
        text2, lps2, cached, _ = ask(srv)
    lines = [r.getMessage() for r in caplog.records if r.name == "inferd.prompt_cache"]
    assert len(lines) == 1 and logged in lines[0] and str(tmp_path / path.name) in lines[0]
    assert cached == 0 and (text2, lps2) == (text, lps)
    assert srv.metric("inferd:prompt_cache_disk_skipped_files_total") == 1


def test_named_save_and_restore(make_server, tmp_path):
    a = make_server(prompt_cache_dir=str(tmp_path), prompt_cache_disk_mib=64)
    status, saved = post(a, "/v1/cache/save", {"name": "taxi-1", "messages": messages()})
    assert status == 200 and saved["name"] == "taxi-1"
    assert saved["cached_tokens"] >= 320 and saved["cached_tokens"] % 64  # whole blocks and the prompt's tail
    assert (tmp_path / "named" / "taxi-1.kvc").stat().st_size == saved["bytes"]
    a.stop()
    for f in tmp_path.glob("*.kvc"):  # the shutdown save: the next server must owe its hit to the restore
        f.unlink()
    b = make_server(prompt_cache_dir=str(tmp_path), prompt_cache_disk_mib=64)
    status, restored = post(b, "/v1/cache/restore", {"name": "taxi-1"})
    assert status == 200 and restored == {"name": "taxi-1", "cached_tokens": saved["cached_tokens"]}
    _, _, cached, _ = ask(b)
    assert cached == saved["cached_tokens"]  # to the token
    assert b.metric("inferd:prompt_cache_disk_hits_total") == 0  # hits on restored blocks are memory hits


@pytest.mark.parametrize("name", ["../escape", "a/b", "", ".hidden", "x" * 65, "sp ace", "nul\u0000", "..", "ü"])
def test_bad_names_are_400(make_server, tmp_path, name):
    srv = make_server(prompt_cache_dir=str(tmp_path), prompt_cache_disk_mib=64)
    for path, body in (("/v1/cache/save", {"name": name, "prompt": SYSTEM}), ("/v1/cache/restore", {"name": name})):
        status, err = post(srv, path, body)
        assert status == 400 and err["error"]["param"] == "name" and "a cache name" in err["error"]["message"]
    assert not any(tmp_path.parent.glob("escape*")) and list(tmp_path.rglob("*.kvc")) == []


def test_restore_errors_are_4xx(make_server, tmp_path):
    srv = make_server(prompt_cache_dir=str(tmp_path), prompt_cache_disk_mib=64)
    status, err = post(srv, "/v1/cache/restore", {"name": "never-saved"})
    assert status == 404 and err["error"]["code"] == "cache_not_found"
    (tmp_path / "named").mkdir()
    (tmp_path / "named" / "junk.kvc").write_bytes(b"INFERDKV" + bytes(40))
    status, err = post(srv, "/v1/cache/restore", {"name": "junk"})
    assert status == 400 and err["error"]["code"] == "cache_unusable"
    status, err = post(srv, "/v1/cache/save", {"name": "short", "prompt": "Hi"})
    assert status == 400 and "shorter than one KV block" in err["error"]["message"]
    off = make_server()
    status, err = post(off, "/v1/cache/save", {"name": "x", "prompt": SYSTEM})
    assert status == 400 and err["error"]["code"] == "cache_off"


def test_an_engine_without_kv_block_copies_turns_the_disk_cache_off_and_says_so(caplog):
    import asyncio
    from types import SimpleNamespace

    from inferd.config import Settings
    from inferd.server.prompt_cache import open_prompt_cache
    from inferd.server.state import ServerState
    from inferd.server.systemd import Notifier

    state = ServerState(settings=Settings(device="cuda", prompt_cache_disk_mib=64), notifier=Notifier())
    state.engine, state.engine_loop, state.model = SimpleNamespace(), SimpleNamespace(), SimpleNamespace()
    asyncio.run(open_prompt_cache(state))
    assert state.prompt_cache is None
    assert "the prompt cache on disk is off: it needs device = cpu (the cuda engine" in caplog.text


def test_the_routes_need_the_api_key(make_server, tmp_path):
    srv = make_server(api_keys=["sk-cache"], prompt_cache_dir=str(tmp_path), prompt_cache_disk_mib=64)
    for path in ("/v1/cache/save", "/v1/cache/restore"):
        status, err = post(srv, path, {"name": "x", "prompt": SYSTEM})
        assert status == 401 and err["error"]["code"] == "invalid_api_key"
    assert list(tmp_path.rglob("*.kvc")) == []
