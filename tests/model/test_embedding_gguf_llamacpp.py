"""inferd's vectors equal llama.cpp's on the same tiny embedding GGUFs (bert, nomic-bert, gemma-embedding: the
files of make_tiny_embedding_gguf.py), so the architectures no real file at hand covers (nomic-bert's rotary
positions and SwiGLU) and the parts short real inputs never reach (Gemma's sliding window, here shorter than the
inputs) are held to a second implementation, not only to tests/encoder_reference.py.

llama.cpp's side: `llama-server -m FILE --embedding --pooling mean` (built by ../shared/peers/llama-cpp.sh; skipped
when absent), /v1/embeddings with the inputs as token ids (the same ids both sides), L2-normalized as inferd's."""
from __future__ import annotations

import subprocess
import time
import urllib.request

import numpy as np
import pytest

from inferd.engine.embedder import Embedder
from inferd.model.embedding_gguf import load_embedding
from tests.engine.test_llamacpp_tiny import free_port, llama_server_path, post
from tests.model.make_tiny_embedding import write_tiny_embedding
from tests.model.make_tiny_embedding_gguf import write_tiny_embedding_gguf

TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world",
         "a cat sat on the bank of the river and the dog ran over the bridge to the city market"]


@pytest.fixture(scope="module")
def llama_server():
    path = llama_server_path()
    if path is None:
        pytest.skip("llama.cpp's llama-server is not built (../shared/peers/llama-cpp.sh builds it)")
    return path


def llama_cpp_vectors(server, model, ids: list[list[int]], log) -> np.ndarray:
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", "1",
                                 "-c", "128", "-b", "128", "-ub", "128", "-np", "1", "--embedding", "--pooling",
                                 "mean", "--no-webui"], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"llama-server did not start on {model.name}:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        data = post(f"http://127.0.0.1:{port}/v1/embeddings", {"input": ids})["data"]
        return np.array([d["embedding"] for d in sorted(data, key=lambda d: d["index"])], np.float32)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("arch, kw", [("bert", {}), ("nomic", {}), ("gemma3", {"sliding_window": 6, "n_layers": 3})])
def test_vectors_equal_llama_cpp(llama_server, tmp_path, arch, kw):
    path = write_tiny_embedding_gguf(write_tiny_embedding(tmp_path / arch, arch=arch, **kw), tmp_path / "m.gguf")
    emb = Embedder(load_embedding(path), threads=1)
    ids = emb.tokenize(TEXTS)
    assert max(map(len, ids)) > 8                     # Gemma: inputs longer than the window, which slides
    theirs = llama_cpp_vectors(llama_server, path, ids, tmp_path / "llama-server.log")
    mine = emb.embed(ids)
    cos = (theirs * mine).sum(-1) / np.linalg.norm(theirs, axis=-1) / np.linalg.norm(mine, axis=-1)
    assert cos.min() > 0.99999, cos
