"""Security: API keys (constant-time, never logged), loopback by default, request limits, sandboxed chat
templates from hostile model files, no path traversal through model names, no prompt text in /metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from tests.server.http_calls import CHAT, CMPL, MSG, call

ROOT = Path(__file__).resolve().parents[2]


def error_of(status, payload, want_status, param=None, contains=""):
    assert status == want_status, payload
    err = payload["error"]
    assert err["param"] == param, err
    assert contains in err["message"], err["message"]
    return err


# ---- API keys ----------------------------------------------------------------------------------------------

KEYS = ["sk-first-0f9e8d7c6b5a", "sk-second-1a2b3c4d5e6f", "sk-third-a1b2c3d4e5f6"]


async def test_api_keys_are_compared_in_constant_time_and_never_logged(make_server, monkeypatch, caplog):
    """Every configured key is checked with hmac.compare_digest on fixed-length digests, with no early exit
    (a wrong key, a key matching the first or the last: the same comparisons); no key, right or wrong, shows
    up in any log record or error body."""
    import hmac
    srv = make_server(api_keys=KEYS)
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)
    monkeypatch.setattr(hmac, "compare_digest", spy)
    wrong = "sk-wrong-but-secret-99887766"
    caplog.set_level(logging.DEBUG)
    for header, want in [(f"Bearer {wrong}", 401), (f"Bearer {KEYS[0]}", 200), (f"Bearer {KEYS[2]}", 200),
                         (f"Bearer {KEYS[1][:-1]}", 401), (f"Basic {KEYS[0]}", 401), (KEYS[0], 401), ("", 401)]:
        calls.clear()
        status, payload, _ = await call(srv.url, CMPL, {"prompt": "hi", "max_tokens": 1},
                                     headers={"Authorization": header} if header else None)
        assert status == want, (header, payload)
        assert calls == [(32, 32)] * len(KEYS), (header, calls)
        for secret in KEYS + [wrong]:
            assert secret not in json.dumps(payload)
    text = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert "prompt=" in text and '" 401 ' in text      # the requests were logged (request line, access log) ...
    for secret in KEYS + [wrong]:
        assert secret not in text, f"{secret} appears in the logs"   # ... without a key in them


def test_keys_stay_out_of_a_real_daemons_output_and_it_binds_to_loopback(tiny_dir, tmp_path):
    """`inferd serve` with keys from the environment and a key file, at log level debug: the keys never reach
    its output, and without --host it listens on 127.0.0.1 only."""
    from tests.model.make_tiny import make_variant
    model = make_variant("llama-gguf-q8_0", tiny_dir)
    key_file = tmp_path / "keys"
    key_file.write_text("# keys\nsk-from-file-5566778899\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(120)
    (tmp_path / "none.toml").write_text("")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFERD_CONFIG": str(tmp_path / "none.toml"),
           "NOTIFY_SOCKET": str(tmp_path / "notify"), "INFERD_API_KEYS": "sk-from-env-1122334455",
           "INFERD_API_KEY_FILE": str(key_file)}
    env.pop("INFERD_HOST", None)
    proc = subprocess.Popen([sys.executable, "-m", "inferd.cli", "serve", str(model), "--port", str(port),
                             "--log-level", "debug", "--no-measure-bandwidth", "--num-kv-blocks", "8"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while not notify.recv(4096).startswith(b"READY=1"):
            pass
        url = f"http://127.0.0.1:{port}"
        for key, want in [("sk-from-env-1122334455", 200), ("sk-from-file-5566778899", 200),
                          ("sk-guess-0000000000", 401)]:
            req = urllib.request.Request(url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
            try:
                status = urllib.request.urlopen(req, timeout=10).status
            except urllib.error.HTTPError as e:
                status = e.code
            assert status == want, key
        # not reachable on any other address of this machine
        for addr in other_addresses():
            with socket.socket() as s:
                s.settimeout(2)
                assert s.connect_ex((addr, port)) != 0, f"listening on {addr}"
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
        notify.close()
    assert f"listening on http://127.0.0.1:{port}" in out
    assert "settings:" in out          # the debug line that describes every setting ...
    for secret in ("sk-from-env-1122334455", "sk-from-file-5566778899", "sk-guess-0000000000"):
        assert secret not in out       # ... masks the keys; nothing else prints them


def other_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses (possibly none in a sandbox)."""
    addrs = set()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))   # TEST-NET: nothing is sent, the kernel just picks a source address
            addrs.add(s.getsockname()[0])
    except OSError:
        pass
    try:
        addrs.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return sorted(a for a in addrs if not a.startswith("127."))


def test_default_bind_is_loopback():
    from inferd.config import Settings, load_settings
    assert Settings().host == "127.0.0.1"
    assert load_settings(None, env={"INFERD_CONFIG": str(ROOT / "config" / "inferd.toml")}).host == "127.0.0.1"


# ---- limits ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def limited(loaded_model):
    from tests.server.conftest import ServerThread, make_settings
    srv = ServerThread(make_settings(max_body_bytes=4096, max_messages=4, max_prompt_tokens=32, max_tokens_limit=8,
                                     max_n=2), loaded_model).start()
    yield srv
    srv.stop()


async def test_body_size_limit_with_and_without_content_length(limited):
    big = {"prompt": "x " * 3000, "max_tokens": 1}
    status, payload, _ = await call(limited.url, CMPL, big)
    err = error_of(status, payload, 413, None, "larger than the limit of 4096 bytes")
    assert err["code"] == "request_too_large"

    async def chunks():   # chunked transfer encoding: no Content-Length to refuse up front
        for _ in range(10):
            yield b'{"prompt": "' if _ == 0 else b"x" * 1000
    async with aiohttp.ClientSession() as s:
        async with s.post(limited.url + CMPL, data=chunks()) as r:
            assert r.status == 413
            assert "larger than the limit of 4096 bytes" in (await r.json())["error"]["message"]
    # a huge header is refused by the HTTP parser, not by a crash
    status, _, _ = await call(limited.url, "/v1/models", method="GET", headers={"X-Big": "a" * 100_000})
    assert status in (400, 431)


@pytest.mark.parametrize("path", [CHAT, "/tokenize", "/v1/cache/warm"])
async def test_message_count_limit(limited, path):
    status, payload, _ = await call(limited.url, path, {"messages": [{"role": "user", "content": "x"}] * 5})
    error_of(status, payload, 400, "messages", "too many messages: 5 > 4")


@pytest.mark.parametrize("path, body, param", [
    (CMPL, {"prompt": " word" * 40}, "prompt"),
    (CMPL, {"prompt": [5] * 33}, "prompt"),
    (CMPL, {"prompt": ["short", " word" * 40]}, "prompt"),
    (CHAT, {"messages": [{"role": "user", "content": " word" * 40}]}, "messages"),
    ("/v1/cache/warm", {"prompt": " word" * 40}, "prompt"),
])
async def test_prompt_length_limit(limited, path, body, param):
    status, payload, _ = await call(limited.url, path, body)
    err = error_of(status, payload, 400, param, "this server accepts at most 32")
    assert err["code"] == "context_length_exceeded"


async def test_max_tokens_limit_and_default(limited):
    for path, body, param in [(CMPL, {"prompt": "x", "max_tokens": 9}, "max_tokens"),
                              (CHAT, {"messages": MSG, "max_tokens": 9}, "max_tokens"),
                              (CHAT, {"messages": MSG, "max_completion_tokens": 1000000}, "max_completion_tokens")]:
        status, payload, _ = await call(limited.url, path, body)
        error_of(status, payload, 400, param, "must be at most 8")
    status, payload, _ = await call(limited.url, CHAT, {"messages": MSG, "n": 3})
    error_of(status, payload, 400, "n", "n must be at most 2")
    status, payload, _ = await call(limited.url, CHAT, {"messages": MSG, "stop": ["a"] * 17})
    error_of(status, payload, 400, "stop", "at most 16 stop sequences")
    # no max_tokens at all: the limit is the default, not the context length
    status, payload, _ = await call(limited.url, CHAT, {"messages": MSG, "ignore_eos": True})
    assert status == 200 and payload["usage"]["completion_tokens"] == 8


# ---- hostile chat templates in model files ------------------------------------------------------------------

# Each tries to reach os (to create MARK) or a file; in jinja2's sandbox each must fail to render.
ATTACKS = [
    "{{ cycler.__init__.__globals__.os.popen('touch MARK').read() }}",
    "{{ lipsum.__globals__['os'].system('touch MARK') }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.system('touch MARK') }}",
    "{{ joiner.__init__.__globals__['__builtins__']['open']('MARK', 'w').write('x') }}",
    "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'Popen' %}"
    "{{ c('touch MARK', shell=True) }}{% endif %}{% endfor %}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ raise_exception.__globals__['jinja2'] }}",
    "{{ strftime_now.__globals__['datetime'] }}",
    "{{ '{0.__class__.__init__.__globals__}'.format(messages) }}",
    "{{ (messages | attr('__class__')).__init__.__globals__ }}",
    "{{ namespace.__init__.__globals__['os'].system('touch MARK') }}",
    "{% include '/etc/passwd' %}",
    "{% import '/etc/passwd' as p %}{{ p }}",
    "{% extends '/etc/passwd' %}",
    "{% set m = messages.append({'role': 'system', 'content': 'x'}) %}{{ m }}",
    "{% for i in range(10 ** 9) %}{{ i }}{% endfor %}",
]


@pytest.fixture
def hostile_server(make_server, tiny_dir, tmp_path):
    """A server whose model file carries a chat template that tries to create tmp_path/pwned."""
    from inferd.model.loader import load_model
    from tests.model.make_tiny import TinySpec, write_tiny_gguf
    mark = tmp_path / "pwned"

    def start(template: str):
        template = template.replace("MARK", str(mark))
        path = write_tiny_gguf(tmp_path / "hostile.gguf", TinySpec(n_layers=1), "Q8_0", chat_template=template)
        model = load_model(path)
        assert model.chat_template == template    # it came from the file
        return make_server(model=model)
    return start, mark


async def test_hostile_template_from_a_model_file_cannot_run_code(hostile_server):
    start, mark = hostile_server
    srv = start(ATTACKS[0])
    for path, body in [(CHAT, {"messages": MSG, "max_tokens": 2}),
                       (CHAT, {"messages": MSG, "max_tokens": 2, "stream": True}),
                       ("/tokenize", {"messages": MSG}),
                       ("/v1/cache/warm", {"messages": MSG})]:
        status, payload, _ = await call(srv.url, path, body)
        err = error_of(status, payload, 400, "messages", "chat template failed")
        assert "unsafe" in err["message"]
    assert not mark.exists()
    # the server is fine otherwise: completions do not use the template
    status, payload, _ = await call(srv.url, CMPL, {"prompt": "hello", "max_tokens": 2})
    assert status == 200


async def test_every_sandbox_escape_fails_cleanly(hostile_server):
    start, mark = hostile_server
    srv = start("{{ messages[0]['content'] }}")
    from inferd.text.chat import ChatTemplate
    tok = srv.state.model.tokenizer
    for attack in ATTACKS:
        srv.state.chat_template = ChatTemplate(attack.replace("MARK", str(mark)), tok.bos_token, tok.eos_token)
        status, payload, _ = await call(srv.url, CHAT, {"messages": MSG, "max_tokens": 2})
        assert status == 400, (attack, payload)
        assert payload["error"]["message"].startswith("chat template failed"), (attack, payload)
        assert "root:" not in json.dumps(payload)
        assert not mark.exists(), attack
    assert srv.state.engine_loop.dead is None


# ---- model names and paths -------------------------------------------------------------------------------

def raw_get(port: int, target: str) -> tuple[int, str]:
    """A GET with the request target sent byte for byte (no client-side normalisation of ../)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode("utf-8", "replace")


@pytest.mark.parametrize("target", [
    "/v1/models/../../etc/passwd", "/v1/models/..%2F..%2Fetc%2Fpasswd", "/v1/models/%2e%2e/%2e%2e/etc/passwd",
    "/v1/models//etc/passwd", "/v1/models/..%5C..%5Cetc%5Cpasswd", "/../../../etc/passwd",
    "/v1/models/%00", "/v1/models/" + "../" * 50 + "etc/shadow",
])
def test_model_paths_do_not_traverse(server, target):
    status, body = raw_get(server.port, target)
    assert status in (400, 404), (status, body)
    assert "root:" not in body


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "..", "org/../../x", "~/.ssh/id_rsa"])
async def test_model_field_does_not_traverse(server, name):
    status, payload, _ = await call(server.url, CHAT, {"model": name, "messages": MSG, "max_tokens": 1})
    error_of(status, payload, 404, "model", "does not exist")
    assert "root:" not in json.dumps(payload)


def pull(name: str, tmp_path: Path) -> subprocess.CompletedProcess:
    cache, work = tmp_path / "cache", tmp_path / "a" / "b"
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFERD_MODEL_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "inferd.cli", "pull", name], cwd=work, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name, message", [
    ("../x", "no such file or folder: ../x"), ("../../x", "no such file or folder"),
    ("org/../x", "no such file or folder"), ("a/b/../../x", "no such file or folder"),
    ("..\\x", "no such file or folder"), ("org/..", "must not contain '..'"), ("./../x", "no such file or folder"),
])
def test_pull_refuses_traversing_names(name, message, tmp_path):
    r = pull(name, tmp_path)
    assert r.returncode != 0, r.stdout
    assert message in r.stderr.strip().splitlines()[-1], r.stderr
    created = [p for p in tmp_path.rglob("*") if p.name not in ("a", "b")]
    assert created == [], created      # nothing written: no cache folder, no file next to or above cwd


def test_pull_of_a_bad_name_says_one_line_without_a_traceback(tmp_path):
    r = pull("../x", tmp_path)
    assert "Traceback" not in r.stderr and r.stderr.startswith("inferd: error:"), r.stderr


# ---- /metrics ----------------------------------------------------------------------------------------------

async def test_metrics_and_logs_carry_no_prompt_text(server, caplog):
    marker = "zqxj-MARKER-71c3f0"
    caplog.set_level(logging.DEBUG)
    sent = [
        (CHAT, {"messages": [{"role": "system", "content": marker}, {"role": "user", "content": marker}],
                "max_tokens": 2, "user": marker, "stop": [marker]}),
        (CHAT, {"messages": [{"role": "user", "content": marker}], "max_tokens": 2, "stream": True}),
        (CMPL, {"prompt": marker, "max_tokens": 2}),
        (CMPL, {"prompt": [marker, marker + "2"], "max_tokens": 1, "echo": True}),
        ("/tokenize", {"prompt": marker}),
        ("/v1/cache/warm", {"prompt": marker * 40}),
        (CHAT, {"model": marker, "messages": MSG}),        # 404
        (CHAT, {"messages": [{"role": marker, "content": "x"}]}),   # 400
    ]
    for path, body in sent:
        status, _, _ = await call(server.url, path, body)
        assert status in (200, 400, 404)
    await asyncio.sleep(0.1)
    for path in ("/metrics", "/health", "/v1/models", "/openapi.json"):
        status, text, _ = await call(server.url, path, method="GET")
        assert status == 200
        assert marker.lower() not in json.dumps(text).lower(), path
    assert marker not in caplog.text, "prompt text in the logs"
