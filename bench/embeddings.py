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

Each mode writes its own results file whole after each model (every repeat's figures, the medians and their
ranges), its data beside it as JSON; a run cut short says so. Default files: bench/results/embeddings.md, with
--serve embeddings_served.md, with --llama-server embeddings_llama_server.md (--out names another).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
# bench/profile.py would shadow the standard library's profile module that torch imports
sys.path = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

from bench._common import (  # noqa: E402
    busy_warning, command_line, fmt_median, fmt_ratio, llama_bin, machine, median, partial_note, peer_build, peer_env,
    peer_env_words, ratio_of_medians, results_head, stats, stop_on_sigterm, stop_reason, publish_results, write_results)

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


def ours_run(e: Any, batch: list[str], size: int) -> Callable[[], None]:
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


@dataclass
class EmbeddingsRun:
    """What a run of one mode measured and how: everything its results file says."""
    mode: str                    # in_process, served or llama_server
    title: str
    stamp: str
    host: dict
    peer: str                    # the peer, in words for the file's head
    peer_build: str | None
    commands: list[str]
    planned: list[str]           # model names
    threads: int
    repeats: int
    warning: str | None = None
    stopped: str | None = None   # what cut the run short
    finished: list[str] = field(default_factory=list)    # models done
    # one entry per measured workload: its model, labels and per-repeat seconds ("seconds": {side: [s, ...]})
    measured: list[dict] = field(default_factory=list)
    latency: list[dict] = field(default_factory=list)    # in-process: {"model", "ms": {side: [ms of each call]}}
    notes: list[str] = field(default_factory=list)

    def head(self) -> list[str]:
        lines = results_head(self.title, self.stamp, self.host, self.peer)
        if self.stopped or len(self.finished) < len(self.planned):
            lines += ["", partial_note(len(self.finished), len(self.planned), "models", self.stopped or "the file "
                                       "is rewritten after each model; the run had not finished when it was last "
                                       "written")]
        return lines

    def tail(self) -> list[str]:
        lines = [*self.notes]
        if self.warning:
            lines.append(f"**Warning**: {self.warning}.")
        return ["", *lines, "", "Commands (PORT: a free port):", "", "```", *self.commands, "```", ""]

    def data(self, summary: list[dict]) -> dict:
        return {"kind": "embeddings", "mode": self.mode, "date": self.stamp, "machine": self.host,
                "peer_build": self.peer_build, "commands": self.commands, "threads": self.threads,
                "repeats": self.repeats, "models_planned": self.planned,
                "complete": self.stopped is None and self.finished == self.planned, "stopped": self.stopped,
                "warning": self.warning, "measured": self.measured, "latency": self.latency, "rows": summary}


def rates(entry: dict) -> dict[str, list[float]]:
    """An entry's per-repeat seconds as inputs per second."""
    return {side: [entry["inputs"] / s for s in seconds] for side, seconds in entry["seconds"].items()}


def in_process_results(run: EmbeddingsRun) -> tuple[str, dict]:
    """inferd (f32, q8_0) vs sentence-transformers in process: the markdown and the JSON."""
    table = ["| model | workload | tokens/input | inferd f32 sent/s (min-max) | inferd q8_0 sent/s (min-max) | "
             "sentence-transformers sent/s (min-max) | f32 / st (per repeat min-max) | q8_0 / st (per repeat "
             "min-max) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    per_repeat = ["| model | workload | repeat | inferd f32 sent/s | inferd q8_0 sent/s | sentence-transformers "
                  "sent/s |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    summary = []
    for e in run.measured:
        rate = rates(e)
        ratios = {q: ratio_of_medians([[x] for x in rate[q]], [[x] for x in rate["st"]]) for q in ("f32", "q8_0")}
        table.append(f"| {e['model']} | {e['workload']} | {e['tokens_per_input']:.0f} | "
                     + " | ".join(fmt_median(rate[k], ".3g") for k in ("f32", "q8_0", "st")) + " | "
                     + " | ".join(fmt_ratio(*ratios[q]) for q in ("f32", "q8_0")) + " |")
        for i, values in enumerate(zip(rate["f32"], rate["q8_0"], rate["st"])):
            per_repeat.append(f"| {e['model']} | {e['workload']} | {i + 1} | "
                              + " | ".join(f"{v:.3g}" for v in values) + " |")
        summary.append({"model": e["model"], "workload": e["workload"],
                        "sent_s": {k: stats(v) for k, v in rate.items()},
                        **{f"{q}_over_st": {"ratio": r, "per_repeat": per} for q, (r, per) in ratios.items()}})
    lines = run.head() + ["", *table, ""]
    lines += [f"single short query on {x['model']} (median of {len(x['ms']['st'])} calls): inferd f32 "
              f"{median(x['ms']['f32']):.2f} ms, q8_0 {median(x['ms']['q8_0']):.2f} ms, sentence-transformers "
              f"{median(x['ms']['st']):.2f} ms" for x in run.latency]
    lines += ["", "Per repeat (the three sides alternate within each):", "", *per_repeat] + run.tail()
    return "\n".join(lines), run.data(summary)


def served_results(run: EmbeddingsRun) -> tuple[str, dict]:
    """inferd served to closed-loop clients vs inferd in process on the same sentences: the markdown and the JSON."""
    table = ["| model | clients | served sent/s | in-process batch-256 sent/s (min-max) | served / in-process |",
             "| --- | ---: | ---: | ---: | ---: |"]
    summary = []
    for e in run.measured:
        in_process = rates(e)["in_process"]
        ratio, _ = ratio_of_medians([[e["served_sent_s"]]], [in_process])
        table.append(f"| {e['model']} | {e['clients']} | {e['served_sent_s']:.3g} | {fmt_median(in_process, '.3g')} "
                     f"| {ratio:.0%} |")
        summary.append({"model": e["model"], "clients": e["clients"], "served_sent_s": e["served_sent_s"],
                        "in_process_sent_s": stats(in_process), "served_over_in_process": ratio})
    lines = run.head() + ["", *table, "", "The served figure is one run of the clients; in-process: every repeat "
                          "of the same sentences in batches of 256 is in the JSON."] + run.tail()
    return "\n".join(lines), run.data(summary)


def llama_server_results(run: EmbeddingsRun) -> tuple[str, dict]:
    """inferd serve vs llama-server --embedding, requests alternating: the markdown and the JSON."""
    table = ["| model | weights | workload | inferd sent/s (min-max) | llama-server sent/s (min-max) | inferd / llama "
             "(per repeat min-max) | min cos |", "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    per_repeat = ["| model | weights | workload | repeat | inferd sent/s | llama-server sent/s |",
                  "| --- | --- | --- | ---: | ---: | ---: |"]
    summary = []
    for e in run.measured:
        rate = rates(e)
        ratio, per = ratio_of_medians([[x] for x in rate["inferd"]], [[x] for x in rate["llama"]])
        table.append(f"| {e['model']} | {e['weights']} | {e['workload']} | {fmt_median(rate['inferd'], '.3g')} | "
                     f"{fmt_median(rate['llama'], '.3g')} | {fmt_ratio(ratio, per)} | {e['min_cos']:.4f} |")
        for i, (a, b) in enumerate(zip(rate["inferd"], rate["llama"])):
            per_repeat.append(f"| {e['model']} | {e['weights']} | {e['workload']} | {i + 1} | {a:.3g} | {b:.3g} |")
        summary.append({"model": e["model"], "weights": e["weights"], "workload": e["workload"],
                        "sent_s": {k: stats(v) for k, v in rate.items()}, "ratio": ratio, "per_repeat": per,
                        "min_cos": e["min_cos"]})
    lines = run.head() + ["", *table, "", "min cos: the lowest cosine between the two servers' vectors for 4 "
                          "sentences and a passage.", "", "Per repeat (the two servers alternate within each):", "",
                          *per_repeat] + run.tail()
    return "\n".join(lines), run.data(summary)


def measured_run(run: EmbeddingsRun, out: Path, build: Callable[[EmbeddingsRun], tuple[str, dict]],
                 measure: Callable[[str], None]) -> int:
    """measure(model) for each planned model, the results file rewritten after each; a run cut short writes the
    models it finished, marked partial, and exits non-zero."""
    try:
        for name in run.planned:
            measure(name)
            run.finished.append(name)
            write_results(out, *build(run))
    except (Exception, KeyboardInterrupt, SystemExit) as e:
        run.stopped = stop_reason(e)
        if not run.measured:
            raise
    publish_results(out, *build(run))
    return 1 if run.stopped else 0


def new_run(mode: str, title: str, args: argparse.Namespace, peer: str, build: str | None,
            commands: list[str]) -> EmbeddingsRun:
    return EmbeddingsRun(mode, title, time.strftime("%Y-%m-%d %H:%M"), machine(), peer, build,
                         [command_line(["python", *sys.argv]), *commands], args.models.split(","), args.threads,
                         args.repeats, busy_warning())


def serve_bench(args: argparse.Namespace) -> int:
    import subprocess

    from inferd.engine.embedder import Embedder
    from inferd.model.embedding import load_embedding_model

    short = texts(512, 13, 3)
    serve_cmd = [sys.executable, "-m", "inferd.cli", "serve", "FOLDER", "--port", "PORT", "--threads",
                 str(args.threads), "--max-batch-tokens", "8192"]
    run = new_run("served", f"/v1/embeddings served: closed-loop clients, one short sentence per request, "
                  f"weights as stored, {args.threads} threads", args,
                  "Peer: none (inferd served, against inferd in process on the same sentences in the same run)", None,
                  [f"{command_line(serve_cmd)}   # FOLDER: {MODELS}/MODEL",
                   f"# {args.clients} clients on one aiohttp event loop for {args.seconds:.0f} s, each POSTing one "
                   f"sentence per request to /v1/embeddings",
                   f"# in process: Embedder(load_embedding_model(FOLDER), threads={args.threads}), the same "
                   f"{len(short)} sentences in batches of 256, {args.repeats} repeats"])

    def measure(name: str) -> None:
        folder = MODELS / name
        run_in_process = ours_run(Embedder(load_embedding_model(folder), threads=args.threads), short, 256)
        run_in_process()
        seconds = [timed(run_in_process) for _ in range(args.repeats)]
        del run_in_process
        port = free_port()
        cmd = [str(folder) if a == "FOLDER" else str(port) if a == "PORT" else a for a in serve_cmd]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=HERE.parent)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, "inferd serve")
            served = asyncio.run(closed_loop(url, folder.name.lower(), short, args.clients, args.seconds))
        finally:
            proc.terminate()
            proc.wait(30)
        run.measured.append({"model": name, "clients": args.clients, "inputs": len(short),
                             "seconds": {"in_process": seconds}, "served_sent_s": served})
        print(f"{name}: served {served:.3g} sent/s, in process {len(short) / median(seconds):.3g}", flush=True)

    return measured_run(run, args.out or HERE / "results" / "embeddings_served.md", served_results, measure)


def llama_server_bench(args: argparse.Namespace) -> int:
    """inferd serve vs llama-server on the same workloads, requests alternating between the two."""
    import subprocess
    short, passages, workloads = workload_texts()

    gguf_dir, bin_dir, env = Path(args.gguf), llama_bin(Path(args.bin) if args.bin else None), peer_env()

    def commands(folder: Path, gguf: Path, quant: str, ours_port: object, llama_port: object) -> list[list[str]]:
        ours_cmd = [sys.executable, "-m", "inferd.cli", "serve", str(folder), "--port", str(ours_port),
                    "--threads", str(args.threads), "--max-batch-tokens", "16384"]
        if quant != "f32":
            ours_cmd += ["--quantize", quant]
        # 64 slots of 512 positions, repacking on
        llama_cmd = [str(bin_dir / "llama-server"), "--embedding", "--pooling", "mean", "-m", str(gguf),
                     "-t", str(args.threads), "-tb", str(args.threads), "-c", "32768", "-np", "64",
                     "-b", "16384", "-ub", "16384", "--port", str(llama_port), "--host", "127.0.0.1"]
        return [ours_cmd, llama_cmd]

    run = new_run("llama_server", f"/v1/embeddings: inferd serve vs llama-server --embedding, same "
                  f"threads ({args.threads}), requests alternating, {args.repeats} repeats", args,
                  f"llama.cpp: {peer_build(bin_dir)}, GGUF files from its convert_hf_to_gguf.py "
                  "(--sentence-transformers-dense-modules)", peer_build(bin_dir), [])
    run.notes.append("Batch 1: 32 requests of one sentence; otherwise one request holding the whole batch.")

    def measure(name: str) -> None:
        folder = MODELS / name
        for quant in ("f32", "q8_0"):
            gguf = gguf_dir / f"{name}-{quant}.gguf"
            if not gguf.exists():
                print(f"skipping {name} {quant}: no {gguf}", flush=True)
                run.notes.append(f"{name} {quant}: skipped, no {gguf}.")
                continue
            ours_port, llama_port = free_port(), free_port()
            ours_cmd, llama_cmd = commands(folder, gguf, quant, ours_port, llama_port)
            shown_ours, shown_llama = commands(folder, gguf, quant, "PORT", "PORT")
            run.commands += [command_line(shown_ours), f"{peer_env_words(env)} {command_line(shown_llama)}"]
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
                    def one_pass(url: str, model: str, batch: list[str] = batch, size: int = size) -> None:
                        for i in range(0, len(batch), size):
                            post_embeddings(url, model, batch[i:i + size])
                    for url, model in servers.values():                     # warm-up
                        one_pass(url, model)
                    times: dict[str, list[float]] = {k: [] for k in servers}
                    for _ in range(args.repeats):                           # alternating
                        for k, (url, model) in servers.items():
                            times[k].append(timed(lambda url=url, model=model: one_pass(url, model)))
                    run.measured.append({"model": name, "weights": quant, "workload": label, "inputs": len(batch),
                                         "seconds": times, "min_cos": cos})
                    rate = {k: len(batch) / median(v) for k, v in times.items()}
                    print(f"{name} {quant} {label}: inferd {rate['inferd']:.3g} sent/s, llama-server "
                          f"{rate['llama']:.3g}", flush=True)
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(30)

    return measured_run(run, args.out or HERE / "results" / "embeddings_llama_server.md", llama_server_results,
                        measure)


def in_process_bench(args: argparse.Namespace) -> int:
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    from inferd.engine.embedder import Embedder
    from inferd.model.embedding import load_embedding_model
    torch.set_num_threads(args.threads)

    short, _, workloads = workload_texts()
    peer = f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}"
    run = new_run("in_process", f"/v1/embeddings encoder vs sentence-transformers, in process, {args.threads} "
                  f"threads, {args.repeats} repeats, the three sides alternating", args, f"Peer: {peer}", peer,
                  [f"# inferd f32: Embedder(load_embedding_model(FOLDER), threads={args.threads}), "
                   "embed(tokenize(batch, truncate=True)) per batch; q8_0: load_embedding_model(FOLDER, "
                   "quantize='q8_0')",
                   f"# sentence-transformers: torch.set_num_threads({args.threads}); SentenceTransformer(FOLDER, "
                   "device='cpu').encode(batch, batch_size=size) under torch.inference_mode()",
                   f"# FOLDER: {MODELS}/MODEL; one warm-up pass of each side before each workload's repeats"])

    def measure(name: str) -> None:
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
            if reps < args.repeats:
                run.notes.append(f"{name}, {label}: 1 repeat (the slowest workload).")
            times: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(reps):                                            # alternating
                for k, fn in runs.items():
                    times[k].append(timed(fn))
            run.measured.append({"model": name, "workload": label, "tokens_per_input": ntok, "inputs": len(batch),
                                 "seconds": times})
            rate = {k: len(batch) / median(v) for k, v in times.items()}
            print(f"{name} {label}: f32 {rate['f32']:.3g}, q8_0 {rate['q8_0']:.3g}, st {rate['st']:.3g} sent/s",
                  flush=True)
        if "MiniLM" in name:
            query = ["How do I reset my password?"]
            lat = {}
            for key, fn in (("f32", ours_run(ours[None], query, 1)), ("q8_0", ours_run(ours["q8_0"], query, 1)),
                            ("st", st_run(st, query, 1))):
                for _ in range(5):
                    fn()
                lat[key] = [timed(fn) * 1e3 for _ in range(50)]
            run.latency.append({"model": name, "ms": lat})

    return measured_run(run, args.out or HERE / "results" / "embeddings.md", in_process_results, measure)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--models", default="all-MiniLM-L6-v2,embeddinggemma-300m")
    ap.add_argument("--out", type=Path, default=None, help="results file (default: bench/results/embeddings.md; "
                    "with --serve embeddings_served.md, with --llama-server embeddings_llama_server.md)")
    ap.add_argument("--serve", action="store_true", help="served throughput instead")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--llama-server", action="store_true", help="inferd serve vs llama-server --embedding, served")
    ap.add_argument("--bin", default=None, help="llama.cpp's tools (default: bench/_common.llama_bin's choice)")
    ap.add_argument("--gguf", default=str(MODELS / "gguf-embed"), help="MODEL-f32.gguf and MODEL-q8_0.gguf")
    args = ap.parse_args()
    stop_on_sigterm()
    if args.serve:
        return serve_bench(args)
    if args.llama_server:
        return llama_server_bench(args)
    return in_process_bench(args)


if __name__ == "__main__":
    sys.exit(main())
