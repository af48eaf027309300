"""The chat model's load and engine begun before the server's imports (server/early_load.py): what it builds is
what the server serves, it steps aside where the usual path decides, and its errors reach the user as before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferd.model.errors import ModelLoadError
from inferd.server.early_load import EarlyStart, start_early_load
from tests.model.make_tiny import TinySpec, write_tiny_gguf
from tests.model.make_tiny_embedding import write_tiny_embedding
from tests.model.make_tiny_embedding_gguf import write_tiny_embedding_gguf
from tests.server.conftest import ServerThread, make_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("early") / "tiny.gguf", TinySpec(n_layers=1), "Q8_0")


def test_serve_imports_no_http_stack_before_the_load_starts():
    """`inferd serve` reads its settings and starts the load before aiohttp and the APIs are imported."""
    code = (
        "import sys, inferd.cli, inferd.server.main\n"
        "heavy = sorted(m for m in ('aiohttp', 'inferd.server.app', 'inferd.server.routes', 'llguidance', 'jinja2',"
        " 'numpy', 'tokenizers') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_early_start_builds_the_model_and_engine_the_server_serves(tiny):
    settings = make_settings(model=str(tiny), threads=1, num_kv_blocks=16)
    early = start_early_load(settings)
    assert isinstance(early, EarlyStart)
    model = early.load()
    engine = early.engine_for(model)
    assert engine.num_kv_blocks == 16 and engine.threads == 1
    assert model.tokenizer.decode(model.tokenizer.encode("hello world"), skip_special=True) == "hello world"
    other = EarlyStart(settings).load()  # the same file loaded again: not the model this engine was built for
    assert early.engine_for(other) is None

    srv = ServerThread(settings, early=early).start()
    try:
        assert srv.state.engine is engine and srv.state.model is model
        assert srv.state.early_start is None  # used once
        reply = srv.call(_complete(srv.url), timeout=60)
        assert reply["choices"][0]["finish_reason"] == "length" and reply["usage"]["completion_tokens"] == 3
    finally:
        srv.stop()


async def _complete(url: str) -> dict:
    import aiohttp

    body = {"model": "tiny", "prompt": "hello", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def test_early_start_steps_aside_where_the_usual_path_decides(tiny, tmp_path):
    assert start_early_load(make_settings(model=str(tiny), device="cuda")) is None
    assert start_early_load(make_settings(model=str(tmp_path / "missing.gguf"))) is None
    assert start_early_load(make_settings(model=str(tiny.parent))) is None  # a folder: the loader picks its file
    assert start_early_load(make_settings(model="smollm2-135m-instruct-q4_1")) is None  # a name: may download
    encoder = write_tiny_embedding_gguf(write_tiny_embedding(tmp_path / "bert"), tmp_path / "bert.gguf")
    early = start_early_load(make_settings(model=str(encoder)))
    assert early is not None and early._model.result(timeout=60) is None  # left to the embedding service
    assert early.engine_for(None) is None


def _serve(model: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """`inferd serve MODEL` in a process of its own, with an empty config file; it is expected to fail its start."""
    (tmp_path / "none.toml").write_text("")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFERD_CONFIG": str(tmp_path / "none.toml")}
    return subprocess.run([sys.executable, "-m", "inferd.cli", "serve", str(model), "--port", "0"], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_bad_file_fails_as_it_did(tiny, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(tiny.read_bytes()[:200])
    early = start_early_load(make_settings(model=str(bad)))
    with pytest.raises(ModelLoadError, match="file truncated or corrupt"):
        early.load()
    r = _serve(bad, tmp_path)
    assert r.returncode == 1
    assert "inferd serve: error:" in r.stderr and "file truncated or corrupt" in r.stderr


def test_a_bad_vocabulary_fails_the_start_with_its_error(tiny, tmp_path):
    """serve_main builds the tokenizer itself before the server's imports (EarlyStart.build_tokenizer): its error is
    kept and reported where the server reads the tokenizer, as a failed start that names it."""
    from gguf import GGUFReader

    from tests.model.test_loader import _with_merges

    merges = GGUFReader(str(tiny)).fields["tokenizer.ggml.merges"].contents()
    bad = _with_merges(tiny, tmp_path / "bad.gguf", ["zzzq qqqz"] + merges[1:])
    early = start_early_load(make_settings(model=str(bad)))
    early.wait_repacking()
    early.build_tokenizer()  # the error is kept, not raised here
    with pytest.raises(ModelLoadError, match="does not join"):
        _ = early.load().tokenizer
    r = _serve(bad, tmp_path)
    assert r.returncode == 1
    assert "inferd serve: error:" in r.stderr and "does not join two vocabulary tokens" in r.stderr
