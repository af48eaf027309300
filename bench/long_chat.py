"""A coding agent's first turns: a chat request with a long system prompt (~18.7k tokens of Qwen's tokenizer by
default), cold, then another question on it and that conversation's next turn, `inferd serve` against llama-server
on the same file, in one run.

    python bench/long_chat.py [--model FILE] [--tokens 16000] [-t 2] [--kv-cache f16,bf16] [--rounds 2]
                              [--bin LLAMA_BIN] [--out bench/results/long_chat.md]

Per round each server starts fresh (llama-server, then inferd with each KV cache format; odd rounds the other way
round) and answers shared_prefix.py's three requests (cold, warm, next), streamed, greedy (`top_k: 1` as well, so
llama-server samples greedily). llama-server runs as its experts run it: one slot of the whole context, `-fa on
-cram 0`, quiet logs, huge pages for its weights (GLIBC_TUNABLES=glibc.malloc.hugetlb=1); it reuses a slot's cached
prompt to the token by itself. inferd: one sequence's KV pool of the same context. The table gives each side's TTFT
(median over rounds) and inferd / llama-server's ratio of TTFTs per KV cache format: below 1 inferd answers sooner.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import (busy_warning, command_line, llama_bin, machine, median, peer_build, peer_env,  # noqa: E402
                     repack_works, results_head, write_results)
from prompt_cache_restart import chat_turn  # noqa: E402
from serve import Server, inferd_server, llama_server  # noqa: E402
from shared_prefix import SIDES, three_turns  # noqa: E402

CONTEXT = 20480  # positions: the longest request (system prompt, two questions, an answer) and room to spare


def run_server(server: Server, log_dir: Path, r: int, tokens: int) -> dict[str, float]:
    """Start `server`, send round r's three requests, stop it; TTFT per side."""
    server.start(log_dir)
    try:
        asyncio.run(server.wait_ready())
        with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        extra = {"top_k": 1}
        print(f"{server.name}:", flush=True)
        turns = three_turns(lambda msgs, n: chat_turn(server.url, model, msgs, n, extra), r, tokens)
        return {side: turn.ttft for side, turn in turns.items()}
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path,
                    default=Path.home() / ".cache/inferd-test-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--tokens", type=int, default=16000, help="about this many words of system prompt")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--kv-cache", default="f16,bf16", help="inferd's KV cache formats, one server each")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bin", type=Path, help="llama.cpp's build/bin (default: the shared peer build)")
    ap.add_argument("--out", type=Path, help="write the results file here (and its JSON beside it)")
    args = ap.parse_args()
    warning = busy_warning()
    bin_dir = llama_bin(args.bin)
    env = peer_env()
    repack = repack_works(bin_dir, args.model, args.threads, env)
    formats = args.kv_cache.split(",")
    servers = {"llama-server": lambda: llama_server(bin_dir, args.model, args.threads, 1, CONTEXT, env, repack)}
    for kv in formats:
        servers[f"inferd {kv}"] = (lambda kv=kv: inferd_server(args.model, args.threads, 1, CONTEXT,
                                                               ["--kv-cache-dtype", kv]))
    ttft: dict[str, dict[str, list[float]]] = {name: {side: [] for side in SIDES} for name in servers}
    shown: dict[str, str] = {}
    log_dir = Path(tempfile.mkdtemp(prefix="inferd-long-chat-"))  # the servers' logs, kept for a failed run
    for r in range(args.rounds):
        for name in (list(servers) if r % 2 == 0 else list(reversed(servers))):
            server = servers[name]()
            server.name = name.replace(" ", "-")
            shown[name] = server.shown
            for side, t in run_server(server, log_dir, r, args.tokens).items():
                ttft[name][side].append(t)
    lines = ["| server | " + " | ".join(f"{side} TTFT s" for side in SIDES) + " | "
             + " | ".join(f"{side} / llama-server" for side in SIDES) + " |",
             "| --- |" + " ---: |" * (2 * len(SIDES))]
    for name in servers:
        cells = [f"{median(ttft[name][side]):.2f} ({', '.join(f'{t:.2f}' for t in ttft[name][side])})"
                 for side in SIDES]
        ratios = ["" if name == "llama-server" else
                  f"{median(ttft[name][side]) / median(ttft['llama-server'][side]):.2f}x" for side in SIDES]
        lines.append(f"| {name} | " + " | ".join(cells + ratios) + " |")
    print("\n".join(lines))
    if args.out:
        about = (f"{args.model.name}, ~{args.tokens} words of system prompt, {args.threads} threads, "
                 f"{args.rounds} round(s); llama.cpp: {peer_build(bin_dir)}")
        md = "\n".join(results_head("A long system prompt's first turns: TTFT, inferd against llama-server",
                                    time.strftime("%Y-%m-%d"), machine(), about)
                       + ["", *lines, *(["", f"**Warning**: {warning}."] if warning else []), "", "Commands:", "",
                          "```", command_line(["python", *sys.argv]), *shown.values(), "```", ""])
        write_results(args.out, md, {"model": str(args.model), "tokens": args.tokens, "threads": args.threads,
                                     "ttft_s": ttft})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
