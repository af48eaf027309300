"""Structured-output benchmark: JSON-schema constrained vs free generation, inferd and llama-server on the same
model file, load and threads, in one run.

    python bench/structured.py [-t 2] [-c 8] [--requests 32] [--models smollm2-q4_0,qwen2.5-coder-1.5b-q4_k_m]
                               [--rounds 2] [--bin DIR]

c closed-loop clients send chat completions (a short prompt each, greedy, max_tokens 96): once free (ignore_eos),
once with the same response_format json_schema (a list of at least 40 notes, so every request runs to max_tokens
too). Each round starts each server once and measures both levels; the servers alternate in ABBA order over the
rounds. llama-server runs as in bench/serve.py (`-fa on -cram 0`, quiet logs, `top_k: 1`; by default the build
bench/_common.llama_bin picks). Throughput is output tokens over the wall time of each level. Also printed per
model: the time to compile a 20-property schema and the per-step cost of the masks of 8 sequences (in process),
and what a new schema adds to its first request over HTTP. Writes bench/results/structured.md whole after each model
(every round's figures, the medians and their ranges), its data beside it as JSON; a run cut short says so.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import (  # noqa: E402 (after the sys.path line)
    abba, busy_warning, command_line, fmt_median, fmt_ratio, llama_bin, machine, model_file, partial_note, peer_build,
    peer_env, publish_results, ratio_of_medians, repack_works, results_head, stats, stop_on_sigterm, stop_reason,
    write_results)
from serve import Server, inferd_server, llama_server  # noqa: E402

MAX_TOKENS = 96
# long enough that every constrained request runs to max_tokens, like the free ones with ignore_eos: both sides
# then generate exactly MAX_TOKENS per request and the throughputs compare like for like
NOTES = {"type": "object", "additionalProperties": False, "required": ["name", "notes"],
         "properties": {"name": {"type": "string", "maxLength": 20},
                        "notes": {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 40}}}
WIDE = {"type": "object", "additionalProperties": False, "required": [f"field_{i}" for i in range(20)],
        "properties": {f"field_{i}": ({"type": "string"} if i % 3 == 0 else {"type": "integer"} if i % 3 == 1
                                      else {"enum": ["a", "b", "c"]}) for i in range(20)}}
SIDES = ("inferd", "llama-server")
LEVELS = ("free", "json_schema")
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


async def run_levels(server: Server, args, extras: list[tuple[str, dict]]) -> dict[str, tuple[float, int, int]]:
    server.start(args.log_dir)
    try:
        await server.wait_ready()
        return {label: await level(server.url, args.concurrency, args.requests, extra) for label, extra in extras}
    finally:
        server.stop()


@dataclass
class ModelRounds:
    name: str
    # per round: {side: {level: {"tok_s": output tok/s, "tokens": output tokens, "errors": failed requests}}}
    rounds: list[dict[str, dict[str, dict]]] = field(default_factory=list)
    costs: dict[str, float] = field(default_factory=dict)   # compile_ms, mask_p50_ms, mask_p90_ms, new_schema_ms

    def finished(self) -> list[dict[str, dict[str, dict]]]:
        return [m for m in self.rounds if all(level in m.get(side, {}) for side in SIDES for level in LEVELS)]


@dataclass
class StructuredRun:
    """What a run measured and how: everything its results file says."""
    stamp: str
    host: dict
    peer_build: str
    commands: list[str]
    planned: list[str]           # model names
    concurrency: int
    requests: int
    threads: int
    rounds: int                  # planned, per model
    repack: bool = True
    warning: str | None = None
    log_dir: str = ""
    stopped: str | None = None   # what cut the run short
    models: list[ModelRounds] = field(default_factory=list)

    def complete(self) -> bool:
        return (self.stopped is None and len(self.models) == len(self.planned)
                and all(len(m.finished()) == self.rounds and m.costs for m in self.models))


def results(run: StructuredRun) -> tuple[str, dict]:
    """The results file's markdown and its JSON data, from each model's per-round throughputs."""
    title = (f"Structured output: c={run.concurrency}, {run.requests} requests per level, {run.threads} threads, "
             f"greedy (`top_k: 1` for llama-server), max_tokens {MAX_TOKENS}, {run.rounds} ABBA rounds")
    lines = results_head(title, run.stamp, run.host, f"llama.cpp: {run.peer_build}")
    if not run.complete():
        done = sum(len(m.finished()) == run.rounds and bool(m.costs) for m in run.models)
        lines += ["", partial_note(done, len(run.planned), "models", run.stopped or "the file is rewritten after "
                                   "each model; the run had not finished when it was last written")]
    table = ["| model | server | free tok/s (min-max) | json_schema tok/s (min-max) | json_schema / free "
             "(per round min-max) |", "| --- | --- | ---: | ---: | ---: |"]
    columns = [f"{side} {level} tok/s" for side in SIDES for level in LEVELS]
    per_round = ["| model | round | first | " + " | ".join(columns) + " |",
                 "| --- | ---: | --- |" + " ---: |" * len(columns)]
    notes, summary = [], []
    for m in run.models:
        done = m.finished()
        if not done:
            continue
        tps = {(side, level): [r[side][level]["tok_s"] for r in done] for side in SIDES for level in LEVELS}
        entry: dict = {"model": m.name, "costs": m.costs}
        for side in SIDES:
            free, constrained = tps[(side, "free")], tps[(side, "json_schema")]
            ratio, ratios = ratio_of_medians([[x] for x in constrained], [[x] for x in free])
            entry[side] = {"free": stats(free), "json_schema": stats(constrained), "json_schema_over_free": ratio,
                           "round_ratios": ratios}
            table.append(f"| {m.name} | {side} | {fmt_median(free)} | {fmt_median(constrained)} | "
                         f"{fmt_ratio(ratio, ratios)} |")
        for level in LEVELS:
            ratio, ratios = ratio_of_medians([[x] for x in tps[("inferd", level)]],
                                             [[x] for x in tps[("llama-server", level)]])
            entry[f"inferd_over_llama_server_{level}"] = {"ratio": ratio, "round_ratios": ratios}
            cells = ["", fmt_ratio(ratio, ratios)] if level == "json_schema" else [fmt_ratio(ratio, ratios), ""]
            table.append(f"| {m.name} | inferd / llama-server, {level} | {' | '.join(cells)} | |")
        errors = sum(r[side][level]["errors"] for r in m.rounds for side in r for level in r[side])
        if errors:
            table.append(f"| {m.name} | **{errors} requests failed** (see the server logs in {run.log_dir}) | | | |")
        entry["errors"] = errors
        for i, r in enumerate(done):
            per_round.append(f"| {m.name} | {i + 1} | {abba(i, SIDES)[0]} | "
                             + " | ".join(f"{r[side][level]['tok_s']:.1f}" for side in SIDES for level in LEVELS)
                             + " |")
        if m.costs:
            notes.append(f"{m.name}: a 20-property schema compiles in {m.costs['compile_ms']:.1f} ms (in process); "
                         f"the masks of 8 constrained sequences take a median {m.costs['mask_p50_ms']:.2f} ms per "
                         f"step (p90 {m.costs['mask_p90_ms']:.2f} ms); a new 20-property schema adds "
                         f"{m.costs['new_schema_ms']:.0f} ms to its first request over HTTP.")
        summary.append(entry)
    lines += ["", *table, "", "Per round:", "", *per_round, "", *notes, ""]
    if run.warning:
        lines += [f"**Warning**: {run.warning}", ""]
    if not run.repack:
        lines += ["llama.cpp's weight repacking died with SIGILL on this CPU, so llama-server ran with `-nr`.", ""]
    lines += ["Both servers run each level with c closed-loop clients; free requests set `ignore_eos` and every "
              "constrained one runs to max_tokens (the schema asks for at least 40 notes), so both generate "
              "exactly max_tokens per request.", "", "Commands (PORT: a free port):", "", "```", *run.commands,
              "```", ""]
    data = {"kind": "structured", "date": run.stamp, "machine": run.host, "peer_build": run.peer_build,
            "commands": run.commands, "concurrency": run.concurrency, "requests": run.requests,
            "threads": run.threads, "max_tokens": MAX_TOKENS, "rounds_planned": run.rounds,
            "models_planned": run.planned, "complete": run.complete(), "stopped": run.stopped,
            "repack": run.repack, "warning": run.warning, "rounds": {m.name: m.rounds for m in run.models},
            "models": summary}
    return "\n".join(lines), data


async def bench_model(model: ModelRounds, args, bin_dir: Path, env: dict, repack: bool, commands: list[str]) -> None:
    """Rounds of (inferd, llama-server) in ABBA order, each server measured free then constrained, into
    model.rounds; the servers' commands (of the first round) onto `commands`."""
    path = model_file(model.name, bin_dir)
    per_slot = 1024
    rf = {"response_format": {"type": "json_schema", "json_schema": {"name": "notes", "schema": NOTES}}}
    # llama-server takes OpenAI's response_format as well: both servers get the same request bodies
    servers = {"inferd": lambda: inferd_server(path, args.threads, args.concurrency, per_slot, []),
               "llama-server": lambda: llama_server(bin_dir, path, args.threads, args.concurrency, per_slot, env,
                                                    repack)}
    extras = {"inferd": [("free", {"ignore_eos": True}), ("json_schema", rf)],
              "llama-server": [("free", {"ignore_eos": True, "top_k": 1}), ("json_schema", {**rf, "top_k": 1})]}
    for r in range(args.rounds):
        this: dict[str, dict[str, dict]] = {}
        model.rounds.append(this)
        for side in abba(r, SIDES):
            server = servers[side]()
            if r == 0:
                commands.append(server.shown)
            this[side] = {}
            for label, (tps, tokens, err) in (await run_levels(server, args, extras[side])).items():
                this[side][label] = {"tok_s": tps, "tokens": tokens, "errors": err}
                print(f"{model.name} round {r + 1}/{args.rounds} {side:<12} {label:<11} {tps:7.1f} tok/s", flush=True)


async def main_async(args) -> int:
    bin_dir = llama_bin(args.bin)
    env = peer_env(args.peer_lib)
    args.log_dir = Path(tempfile.mkdtemp(prefix="inferd-bench-structured-"))
    warning = busy_warning()
    names = args.models.split(",")
    repack = args.repack == "on" or (args.repack == "auto" and
                                     repack_works(bin_dir, model_file(names[0], bin_dir), args.threads, env))
    commands = [command_line([sys.executable, *sys.argv]),
                f"# each level: {args.requests} POST /v1/chat/completions from {args.concurrency} closed-loop clients, "
                f"max_tokens {MAX_TOKENS}, temperature 0; free: ignore_eos; json_schema: response_format NOTES "
                f"(bench/structured.py); llama-server's bodies add top_k 1"]
    run = StructuredRun(time.strftime("%Y-%m-%d %H:%M"), machine(), peer_build(bin_dir), commands, names,
                        args.concurrency, args.requests, args.threads, args.rounds, repack, warning, str(args.log_dir))
    try:
        for name in names:
            model = ModelRounds(name)
            run.models.append(model)
            await bench_model(model, args, bin_dir, env, repack, commands)
            compile_ms, mask_p50, mask_p90 = in_process_costs(model_file(name, bin_dir))
            compile_s = await new_schema_cost(name, args, bin_dir)
            model.costs = {"compile_ms": compile_ms, "mask_p50_ms": mask_p50, "mask_p90_ms": mask_p90,
                           "new_schema_ms": compile_s * 1e3}
            write_results(args.out, *results(run))               # after every model: a cut run keeps its part
    except (Exception, KeyboardInterrupt, SystemExit, asyncio.CancelledError) as e:
        run.stopped = stop_reason(e)
        if not any(m.finished() for m in run.models):
            raise
    report, data = results(run)
    publish_results(args.out, report, data, f"; server logs in {args.log_dir}")
    errors = sum(entry["errors"] for entry in data["models"])
    return 1 if run.stopped or errors else 0


async def new_schema_cost(name: str, args, bin_dir: Path) -> float:
    server = inferd_server(model_file(name, bin_dir), args.threads, args.concurrency, 1024, [])
    server.start(args.log_dir)
    try:
        await server.wait_ready()
        # one constrained request first: a fresh server builds the grammar vocabulary for its first one (0.2-0.6 s,
        # once per process), which is not the cost of a new schema
        rf = {"response_format": {"type": "json_schema", "json_schema": {"name": "notes", "schema": NOTES}}}
        async with aiohttp.ClientSession() as session:
            await one(session, server.url, {"messages": messages(0), "max_tokens": 1, **rf})
        return await compile_time(server.url)
    finally:
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32, help="requests per level")
    ap.add_argument("--models", default="smollm2-q4_0,qwen2.5-coder-1.5b-q4_k_m",
                    help="bench model names (vs_llamacpp.py's)")
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds")
    ap.add_argument("--bin", type=Path, default=None, help="folder of llama.cpp's tools")
    ap.add_argument("--peer-lib", type=Path, default=None, help="folder put first on llama.cpp's LD_LIBRARY_PATH")
    ap.add_argument("--repack", choices=["auto", "on", "off"], default="auto",
                    help="llama.cpp's weight repacking; auto: on unless a short run dies with SIGILL")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "structured.md")
    args = ap.parse_args()
    stop_on_sigterm()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
