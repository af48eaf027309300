"""A stopped server lets go of its engines: aiohttp keeps Application objects alive in a module-level cache of
middleware chains, so without this every stopped app (a test's, or an embedded server's) would hold its KV cache,
weight tiles and grammar compiler for the life of the process."""

import gc
import json
import urllib.request
import weakref

from tests.model.make_tiny_embedding import write_tiny_embedding
from tests.server.conftest import ServerThread, make_settings


def test_a_stopped_server_frees_its_engine_and_compiler(loaded_model):
    srv = ServerThread(make_settings(), loaded_model).start()
    body = json.dumps({"prompt": "hello " * 300, "max_tokens": 2, "ignore_eos": True}).encode()
    req = urllib.request.Request(srv.url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        assert json.load(r)["usage"]["completion_tokens"] == 2
    engine, loop, grammar = weakref.ref(srv.state.engine), weakref.ref(srv.state.engine_loop), srv.state.grammar
    assert engine() is not None and loop() is not None and grammar is not None
    grammar = weakref.ref(grammar)
    srv.stop()
    gc.collect()
    assert srv.app is not None                      # the app object itself may live on (aiohttp's cache) ...
    assert engine() is None and loop() is None      # ... but not what it served with
    assert grammar() is None


def test_a_stopped_server_frees_its_embedding_models(tmp_path):
    folder = write_tiny_embedding(tmp_path / "tiny-bert", max_seq_length=16)
    srv = ServerThread(make_settings(model=str(folder))).start()
    body = json.dumps({"model": "tiny-bert", "input": ["hello world"]}).encode()
    req = urllib.request.Request(srv.url + "/v1/embeddings", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        assert len(json.load(r)["data"]) == 1
    embedders = [weakref.ref(s.embedder) for s in srv.state.embeddings]
    assert len(embedders) == 1 and embedders[0]() is not None
    srv.stop()
    gc.collect()
    assert embedders[0]() is None                   # not kept by the metrics' gauge of queued requests
