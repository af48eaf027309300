"""inferd's encoder vs sentence-transformers (torch CPU), same machine, same threads, in one run.

    python bench/embeddings.py [-t 2] [-r 3] [--models all-MiniLM-L6-v2,embeddinggemma-300m] [--out FILE]
    python bench/embeddings.py --serve [--clients 32] [--seconds 20] [--models all-MiniLM-L6-v2]
    python bench/embeddings.py --llama-server [--bin DIR] [--gguf DIR] [-r 3] [--models ...]

Workloads: sentences/s for a batch of 1 (one short sentence per call, 32 calls), 32 and 256 short sentences
(~16 tokens), and 64 passages of ~256 tokens; plus the latency of one short query (median of 50 calls). Each
workload runs inferd (weights as stored, and --quantize q8_0) and sentence-transformers (torch.set_num_threads(t),
inference_mode, its own length-sorted batching with batch_size = the workload's size) alternately, -r repeats,
median. Tokenization is included on both sides. --serve instead starts `inferd serve MODEL` and runs closed-loop
clients (each POSTs one short sentence per request to /v1/embeddings), against the in-process rate of the same
sentences in batches of 256, measured in the same run. --llama-server instead serves each model with both
`inferd serve` and llama.cpp's `llama-server --embedding --pooling mean` (the GGUF files its converter makes:
--gguf DIR holds MODEL-f32.gguf and MODEL-q8_0.gguf, from `convert_hf_to_gguf.py FOLDER --outtype f32|q8_0
--sentence-transformers-dense-modules`: without that flag EmbeddingGemma's file lacks its 2_Dense/3_Dense
projections and llama-server returns the pooled hidden state, cosine ~0 to the model's vectors),
same weights type and threads, and times the same workloads as /v1/embeddings requests (batch 1: 32 requests of
one sentence; otherwise one request holding the whole batch), the two servers alternating, -r repeats, median;
the vectors of the two servers are compared too (cosine). Models come from ~/.cache/inferd-test-models
(../shared/models/fetch.sh all-minilm-l6-v2 embeddinggemma-300m).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
# bench/profile.py would shadow the standard library's profile module that torch imports
sys.path = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

from bench._common import busy_warning, command_line, llama_bin, peer_env  # noqa: E402
from inferd.engine.embedder import Embedder  # noqa: E402
from inferd.model.embedding import load_embedding_model  # noqa: E402

MODELS = Path(os.environ.get("INFERD_TEST_MODELS", Path.home() / ".cache" / "inferd-test-models"))
WORDS = ("river bank money city market doctor patient music guitar quickly slowly never always because although "
         "computer network protein energy climate forest ocean mountain history language science the a of and to in "
         "is was with for on at by from that this it they we you he she").split()


def texts(n: int, words: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, words)).capitalize() + "." for _ in range(n)]


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def workload_texts() -> tuple[list[str], list[str], list[tuple[str, list[str], int]]]:
    """The short sentences, the passages and the workloads (label, inputs, batch size) of the in-process and
    llama-server runs."""
    short, passages = texts(256, 13, 1), texts(64, 220, 2)
    return short, passages, [("batch 1", short[:32], 1), ("batch 32", short[:32], 32), ("batch 256", short, 256),
                             ("64 passages x ~256 tok", passages, 64)]


def ours_run(e: Embedder, batch: list[str], size: int) -> Callable[[], None]:
    def run() -> None:
        for i in range(0, len(batch), size):
            e.embed(e.tokenize(batch[i:i + size], truncate=True))
    return run


def st_run(st: Any, batch: list[str], size: int) -> Callable[[], None]:
    import torch

    def run() -> None:
        with torch.inference_mode():
            for i in range(0, len(batch), size):
                st.encode(batch[i:i + size], batch_size=size)
    return run


async def closed_loop(url: str, model: str, sentences: list[str], clients: int, seconds: float) -> float:
    """`clients` concurrent closed-loop clients on one event loop (aiohttp: far less of the two cores than a thread
    per client with urllib, which the server would compete with); each POSTs one sentence per request. Returns
    requests/s."""
    import aiohttp

    done = 0

    async def client(k: int, session: aiohttp.ClientSession, deadline: float) -> None:
        nonlocal done
        i = k
        while time.monotonic() < deadline:
            body = {"model": model, "input": sentences[i % len(sentences)], "encoding_format": "base64"}
            async with session.post(url + "/v1/embeddings", json=body) as r:
                r.raise_for_status()
                await r.read()
            done += 1
            i += clients

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(k, session, time.monotonic() + seconds) for k in range(clients)))
        return done / (time.perf_counter() - t0)


def serve_bench(args: argparse.Namespace) -> None:
    import subprocess

    warning = busy_warning()
    short = texts(512, 13, 3)
    lines = []
    for name in args.models.split(","):
        folder = MODELS / name
        run = ours_run(Embedder(load_embedding_model(folder), threads=args.threads), short, 256)
        run()
        in_process = len(short) / statistics.median(timed(run) for _ in range(args.repeats))
        del run
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "inferd.cli", "serve", str(folder), "--port", str(port),
                                 "--threads", str(args.threads), "--max-batch-tokens", "8192"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=HERE.parent)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, "inferd serve")
            served = asyncio.run(closed_loop(url, folder.name.lower(), short, args.clients, args.seconds))
        finally:
            proc.terminate()
            proc.wait(30)
        lines.append(f"| {name} | {args.clients} | {served:.3g} | {in_process:.3g} | {served / in_process:.0%} |")
        print(lines[-1], flush=True)
    text = ("\n## served: closed-loop clients, one short sentence per request\n\n"
            f"Weights as stored, threads {args.threads}, {args.seconds:.0f} s of clients on one aiohttp event loop; "
            f"in-process: batches of 256 of the same sentences, median of {args.repeats}. "
            + (f"**Warning**: {warning}. " if warning else "Nothing else ran on the machine. ")
            + f"Command: `{command_line(sys.argv)}`\n\n"
            "| model | clients | served sent/s | in-process batch-256 sent/s | served / in-process |\n"
            "| --- | --- | --- | --- | --- |\n" + "\n".join(lines) + "\n")
    with open(args.out, "a") as f:
        f.write(text)
    print(text)


def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, proc: Any, what: str, timeout: float = 300.0) -> None:
    import urllib.request
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not become ready in {timeout:.0f} s")


def post_embeddings(url: str, model: str, inputs: list[str]) -> np.ndarray:
    import json
    import urllib.request
    body = json.dumps({"model": model, "input": inputs, "encoding_format": "float"}).encode()
    req = urllib.request.Request(url + "/v1/embeddings", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        data = json.loads(r.read())["data"]
    return np.array([d["embedding"] for d in sorted(data, key=lambda d: d["index"])], np.float32)


def llama_server_bench(args: argparse.Namespace) -> None:
    """inferd serve vs llama-server on the same workloads, requests alternating between the two."""
    import subprocess
    short, passages, workloads = workload_texts()

    gguf_dir, bin_dir, env = Path(args.gguf), llama_bin(Path(args.bin) if args.bin else None), peer_env()
    warning = busy_warning()
    lines = []
    for name in args.models.split(","):
        folder = MODELS / name
        for quant in ("f32", "q8_0"):
            gguf = gguf_dir / f"{name}-{quant}.gguf"
            if not gguf.exists():
                print(f"skipping {name} {quant}: no {gguf}", flush=True)
                continue
            ours_port, llama_port = free_port(), free_port()
            ours_cmd = [sys.executable, "-m", "inferd.cli", "serve", str(folder), "--port", str(ours_port),
                        "--threads", str(args.threads), "--max-batch-tokens", "16384"]
            if quant != "f32":
                ours_cmd += ["--quantize", quant]
            # 64 slots of 512 positions, repacking on
            llama_cmd = [str(bin_dir / "llama-server"), "--embedding", "--pooling", "mean", "-m", str(gguf),
                         "-t", str(args.threads), "-tb", str(args.threads), "-c", "32768", "-np", "64",
                         "-b", "16384", "-ub", "16384", "--port", str(llama_port), "--host", "127.0.0.1"]
            procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=HERE.parent,
                                      env=e) for cmd, e in ((ours_cmd, None), (llama_cmd, env))]
            ours_url, llama_url = f"http://127.0.0.1:{ours_port}", f"http://127.0.0.1:{llama_port}"
            try:
                wait_healthy(ours_url, procs[0], "inferd serve")
                wait_healthy(llama_url, procs[1], "llama-server")
                servers = {"inferd": (ours_url, name.lower()), "llama": (llama_url, gguf.name)}
                probe = short[:4] + passages[:1]
                a, b = (post_embeddings(u, m, probe) for u, m in servers.values())
                cos = float(np.min((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))
                for label, batch, size in workloads:
                    def run(url: str, model: str, batch: list[str] = batch, size: int = size) -> None:
                        for i in range(0, len(batch), size):
                            post_embeddings(url, model, batch[i:i + size])
                    for url, model in servers.values():                     # warm-up
                        run(url, model)
                    times: dict[str, list[float]] = {k: [] for k in servers}
                    for _ in range(args.repeats):                           # alternating
                        for k, (url, model) in servers.items():
                            times[k].append(timed(lambda url=url, model=model: run(url, model)))
                    rate = {k: len(batch) / statistics.median(v) for k, v in times.items()}
                    lines.append(f"| {name} | {quant} | {label} | {rate['inferd']:.3g} | {rate['llama']:.3g} "
                                 f"| {rate['inferd'] / rate['llama']:.2f}x | {cos:.4f} |")
                    print(lines[-1], flush=True)
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(30)
    text = ("\n## served: inferd serve vs llama-server --embedding (/v1/embeddings, same threads, alternating)\n\n"
            f"threads {args.threads}, repeats {args.repeats} (median); llama-server from {bin_dir} (its environment "
            "without OMP_*, huge-page malloc), --pooling mean, GGUF from llama.cpp's convert_hf_to_gguf.py "
            "(--sentence-transformers-dense-modules). "
            f"{'**Warning**: ' + warning + '. ' if warning else ''}Command: `{command_line(sys.argv)}`. min cos: the "
            "lowest cosine between the two servers' vectors for 4 sentences and a passage.\n\n"
            "| model | weights | workload | inferd sent/s | llama-server sent/s | inferd / llama | min cos |\n"
            "| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(lines) + "\n")
    with open(args.out, "a") as f:
        f.write(text)
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--models", default="all-MiniLM-L6-v2,embeddinggemma-300m")
    ap.add_argument("--out", default=str(HERE / "results" / "embeddings.md"))
    ap.add_argument("--serve", action="store_true", help="served throughput instead (appended to --out)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--llama-server", action="store_true",
                    help="inferd serve vs llama-server --embedding, served (appended to --out)")
    ap.add_argument("--bin", default=None, help="llama.cpp's tools (default: bench/_common.llama_bin's choice)")
    ap.add_argument("--gguf", default=str(MODELS / "gguf-embed"), help="MODEL-f32.gguf and MODEL-q8_0.gguf")
    args = ap.parse_args()
    if args.serve:
        serve_bench(args)
        return
    if args.llama_server:
        llama_server_bench(args)
        return

    import torch
    from sentence_transformers import SentenceTransformer
    torch.set_num_threads(args.threads)

    short, _, workloads = workload_texts()
    warning = busy_warning()
    lines = [f"threads {args.threads}, repeats {args.repeats} (median), torch {torch.__version__}, the three sides "
             f"alternating. " + (f"**Warning**: {warning}." if warning else "Nothing else ran on the machine.")
             + f" Command: `{command_line(sys.argv)}`", "",
             "| model | workload | tokens/input | inferd f32 sent/s | inferd q8_0 sent/s "
             "| sentence-transformers sent/s | f32 / st | q8_0 / st |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    latency_lines = []
    for name in args.models.split(","):
        folder = MODELS / name
        st = SentenceTransformer(str(folder), device="cpu")
        ours = {q: Embedder(load_embedding_model(folder, quantize=q), threads=args.threads) for q in (None, "q8_0")}
        for label, batch, size in workloads:
            ntok = statistics.mean(len(x) for x in ours[None].tokenize(batch, truncate=True))
            runs = {"f32": ours_run(ours[None], batch, size), "q8_0": ours_run(ours["q8_0"], batch, size),
                    "st": st_run(st, batch, size)}
            for fn in runs.values():                                         # warm-up
                fn()
            reps = 1 if "passages" in label and "gemma" in name else args.repeats
            times: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(reps):                                            # alternating
                for k, fn in runs.items():
                    times[k].append(timed(fn))
            rate = {k: len(batch) / statistics.median(v) for k, v in times.items()}
            lines.append(f"| {name} | {label} | {ntok:.0f} | {rate['f32']:.3g} | {rate['q8_0']:.3g} | {rate['st']:.3g} "
                         f"| {rate['f32'] / rate['st']:.2f}x | {rate['q8_0'] / rate['st']:.2f}x |")
            print(lines[-1], flush=True)
        if "MiniLM" in name:
            query = ["How do I reset my password?"]
            lat = {}
            for key, fn in (("f32", ours_run(ours[None], query, 1)), ("q8_0", ours_run(ours["q8_0"], query, 1)),
                            ("st", st_run(st, query, 1))):
                for _ in range(5):
                    fn()
                lat[key] = statistics.median(timed(fn) for _ in range(50)) * 1e3
            latency_lines.append(f"single short query on {name} (median of 50): inferd f32 {lat['f32']:.2f} ms, "
                                 f"q8_0 {lat['q8_0']:.2f} ms, sentence-transformers {lat['st']:.2f} ms")
            print(latency_lines[-1], flush=True)
    text = "# /v1/embeddings encoder vs sentence-transformers\n\n" + "\n".join(lines + [""] + latency_lines) + "\n"
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
