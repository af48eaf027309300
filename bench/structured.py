"""Structured-output benchmark: JSON-schema constrained vs free generation on the same inferd server, and
llama-server's json_schema on the same load, in one run.

    python bench/structured.py [-t 2] [-c 8] [--requests 32] [--model smollm2 | PATH.gguf]

c closed-loop clients send chat completions (a short prompt each, greedy, max_tokens 96): once free (no constraint,
ignore_eos), once with response_format json_schema (a list of at least 40 notes, so every request runs to
max_tokens too), on one inferd server; then llama-server (-np c) with its `json_schema` field when its binary is
built (../shared/peers/llama-cpp.sh).
Throughput is output tokens over the wall time of each level. Also printed: the time to compile a 20-property
schema (first request with it minus a repeat of the same request) and the server's per-step mask cost is in the
README (measured in-process). Writes bench/results/structured.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from serve import Server, free_port, inferd_server  # noqa: E402 (after the sys.path line)

PEERS = Path.home() / ".cache" / "inferd-peers"


def built_llama_bin() -> Path | None:
    """llama.cpp's bin folder if ../shared/peers/llama-cpp.sh has built it (this script never starts that build)."""
    found = sorted(PEERS.glob("*/build/bin/llama-server"))
    return found[-1].parent if found else None


def model_path(name: str) -> Path:
    if name == "smollm2":
        from inferd.model.pull import DEFAULT_MODEL, resolve
        return Path(resolve(DEFAULT_MODEL, progress=False))
    return Path(name)

MAX_TOKENS = 96
# long enough that every constrained request runs to max_tokens, like the free ones with ignore_eos: both sides
# then generate exactly MAX_TOKENS per request and the throughputs compare like for like
NOTES = {"type": "object", "additionalProperties": False, "required": ["name", "notes"],
         "properties": {"name": {"type": "string", "maxLength": 20},
                        "notes": {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 40}}}
WIDE = {"type": "object", "additionalProperties": False, "required": [f"field_{i}" for i in range(20)],
        "properties": {f"field_{i}": ({"type": "string"} if i % 3 == 0 else {"type": "integer"} if i % 3 == 1
                                      else {"enum": ["a", "b", "c"]}) for i in range(20)}}
PEOPLE = ["Ada Lovelace, 36, London, mathematician and writer", "Alan Turing, 41, Wilmslow, logician",
          "Grace Hopper, 85, Arlington, admiral and programmer", "Linus Torvalds, 54, Portland, kernel hacker",
          "Margaret Hamilton, 88, Boston, software engineer", "Donald Knuth, 86, Stanford, author of TAOCP"]


def messages(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Describe this person as JSON with name, age, city, email, skills and "
                                        f"employed: {PEOPLE[i % len(PEOPLE)]} (request {i})."}]


async def one(session, url: str, body: dict) -> int:
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        data = await r.json()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {str(data)[:300]}")
        return data["usage"]["completion_tokens"]


async def level(url: str, concurrency: int, n: int, extra: dict) -> tuple[float, int, int]:
    """(output tokens/s, tokens, errors) for n requests from `concurrency` closed-loop clients."""
    queue = list(range(n))
    tokens = errors = 0
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await one(session, url, {"messages": messages(999), "max_tokens": 8, **extra})   # warm-up (and compile)

        async def client():
            nonlocal tokens, errors
            while queue:
                i = queue.pop()
                try:   # (await first: `tokens += await ...` would read tokens before the wait and lose updates)
                    n_out = await one(session, url, {"messages": messages(i), "max_tokens": MAX_TOKENS,
                                                     "temperature": 0.0, **extra})
                    tokens += n_out
                except Exception as e:  # counted and reported, never silently dropped
                    errors += 1
                    print("  error:", e, file=sys.stderr)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return tokens / (time.perf_counter() - t0), tokens, errors


def in_process_costs(path: Path) -> tuple[float, float, float]:
    """(ms to compile WIDE, median and p90 ms to fill the masks of 8 sequences at staggered points of a NOTES
    document), measured in this process with the model's vocabulary (no server, no HTTP)."""
    import numpy as np

    from inferd.engine.constraints import Constraint, StepMasks
    from inferd.model.loader import load_model
    from inferd.text.grammar import GrammarCompiler, json_schema_grammar
    tok = load_model(path).tokenizer
    compiler = GrammarCompiler(tok)
    compiler.wait_ready()
    t0 = time.perf_counter()
    compiler.compile_sync(json_schema_grammar(WIDE, "bench"))
    compile_ms = (time.perf_counter() - t0) * 1e3
    constraint = Constraint(compiler.compile_sync(json_schema_grammar(NOTES, "bench")))
    doc = json.dumps({"name": "Ada Lovelace", "notes": [f"note number {i}" for i in range(40)]}, indent=2)
    ids = tok.encode(doc, add_special=False)
    matchers = [constraint.new_matcher() for _ in range(8)]
    for k, m in enumerate(matchers):
        for t in ids[:k * 7]:
            m.advance(t)
    masks = StepMasks(compiler.vocab_size, 8)
    times = []
    for step in range(len(ids) - 8 * 7):
        t0 = time.perf_counter()
        masks.build(matchers)
        times.append((time.perf_counter() - t0) * 1e3)
        for k, m in enumerate(matchers):
            m.advance(ids[k * 7 + step])
    compiler.close()
    return compile_ms, float(np.median(times)), float(np.percentile(times, 90))


async def compile_time(url: str) -> float:
    """Seconds a new 20-property schema adds to a request: first use minus a repeat (cached)."""
    schema = {**WIDE, "description": f"run {time.time()}"}          # a schema the server has not seen
    body = {"messages": messages(0), "max_tokens": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "wide", "schema": schema}}}
    async with aiohttp.ClientSession() as session:
        t0 = time.perf_counter()
        await one(session, url, body)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        await one(session, url, body)
        return first - (time.perf_counter() - t0)


async def main_async(args) -> int:
    bin_dir = built_llama_bin()
    path = model_path(args.model)
    log_dir = Path(tempfile.mkdtemp(prefix="inferd-bench-structured-"))
    rf = {"response_format": {"type": "json_schema", "json_schema": {"name": "notes", "schema": NOTES}}}
    rows = []
    server = inferd_server(path, args.threads, args.concurrency, [])
    server.start(log_dir)
    try:
        await server.wait_ready()
        free = await level(server.url, args.concurrency, args.requests, {"ignore_eos": True})
        constrained = await level(server.url, args.concurrency, args.requests, rf)
        compile_s = await compile_time(server.url)
    finally:
        server.stop()
    rows.append(("inferd, free", free))
    rows.append(("inferd, json_schema", constrained))
    llama = None
    llama_failure = "not built (../shared/peers/llama-cpp.sh)" if bin_dir is None else ""
    if bin_dir is not None and (bin_dir / "llama-server").exists():
        port = free_port()
        cmd = [str(bin_dir / "llama-server"), "-m", str(path), "--host", "127.0.0.1", "--port", str(port),
               "-np", str(args.concurrency), "-c", str(1024 * args.concurrency), "-t", str(args.threads)]
        llama = Server("llama-server", cmd, port, {})
        llama.start(log_dir)
        try:
            await llama.wait_ready()
            rows.append(("llama-server, json_schema", await level(llama.url, args.concurrency, args.requests,
                                                                  {"json_schema": NOTES})))
        except RuntimeError as e:   # a peer that cannot start is reported, not fatal to inferd's numbers
            llama_failure = str(e)
        finally:
            llama.stop()
    lines = [f"Structured output, {path.name}, c={args.concurrency}, {args.requests} requests, {args.threads} "
             f"threads, greedy, max_tokens {MAX_TOKENS} (a shared machine: compare within a run only)", "",
             "| server | output tok/s | tokens | errors |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {name} | {tps:.1f} | {n} | {err} |" for name, (tps, n, err) in rows]
    compile_ms, mask_p50, mask_p90 = in_process_costs(path)
    lines += ["", f"constrained / free (inferd): {constrained[0] / free[0]:.2f}",
              f"new 20-property schema adds {compile_s * 1e3:.0f} ms to its first request over HTTP "
              f"(compiling it in process: {compile_ms:.1f} ms)",
              f"masks of 8 constrained sequences per step: median {mask_p50:.2f} ms, p90 {mask_p90:.2f} ms"]
    if llama is not None and len(rows) == 3 and rows[2][1][0]:
        lines.append(f"inferd json_schema / llama-server json_schema: {constrained[0] / rows[2][1][0]:.2f}x")
    if llama_failure:
        lines.append(f"llama-server: {llama_failure}")
    text = "\n".join(lines)
    print(text)
    out = HERE / "results" / "structured.md"
    out.write_text(text + "\n")
    print(f"written to {out}; server logs in {log_dir}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--model", default="smollm2")
    args = ap.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
