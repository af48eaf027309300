"""TTFT of a long shared prompt after a restart (its blocks read back from the prompt cache on disk) against a
warm hit (its blocks still in memory), `inferd serve` as a real process.

    python bench/prompt_cache_restart.py [--model smollm2-135m-instruct] [--tokens 2000] [-t 2] [--rounds 4]
                                         [--out bench/results/prompt_cache_restart.md]

The shared prompt is a system prompt of about --tokens tokens; each measured request is that system prompt and a
question no earlier request asked (so only the question's tokens and the blocks the prompt does not fill are
computed), streamed, greedy, one token. Each round measures both sides in ABBA order (round 0: warm first):
  warm     the server already answered the shared prompt once since it started: its blocks are in memory (hit to
           the token; so is a restart's, the disk keeping each sequence's last, partly filled block too)
  restart  the server answered the shared prompt, was stopped with SIGTERM (the drain writes the prompt cache),
           and a new server on the same model and folder was started; the first request after /health says 200
Every request's `cached_tokens` is checked: a side whose hit is smaller than the shared prompt's whole blocks fails
the run instead of reporting a number that measures something else. Without --out the figures are printed only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import (abba, busy_warning, fmt_median, fmt_ratio, machine, ratio_of_medians, results_head,  # noqa: E402
                     stats, write_results)

SIDES = ("warm", "restart")
SENTENCE = ("The harbour office keeps the tide tables, the berth list and the pilot roster for every ship that "
            "calls, and answers in one short sentence with the berth number and the time. ")


class Turn(NamedTuple):
    ttft: float  # seconds to the first streamed token
    cached: int  # usage's cached_tokens
    prompt: int  # usage's prompt_tokens
    text: str  # the answer


def chat_turn(url: str, model: str, messages: list[dict[str, str]], max_tokens: int = 1,
              extra: dict | None = None) -> Turn:
    """One chat request to a server at `url`, streamed, greedy: its time to the first token, usage and answer."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **(extra or {})}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first, cached, prompt, text = None, -1, -1, ""
    with urllib.request.urlopen(req, timeout=3600) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            choice = event["choices"][0] if event.get("choices") else None
            # the first chunk, the role's, leaves before any computing: the first token is the first chunk with
            # text or the one that ends the choice (a token can decode to no text yet)
            if first is None and choice and (choice["delta"].get("content") or choice.get("finish_reason")):
                first = time.perf_counter() - t0
            if choice:
                text += choice["delta"].get("content") or ""
            if event.get("usage"):
                cached = (event["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", -1)
                prompt = event["usage"]["prompt_tokens"]
    if first is None:
        raise SystemExit("the stream had no token")
    return Turn(first, cached, prompt, text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args: argparse.Namespace, folder: Path, log: Path, kv_cache: str = "f16",
                 num_kv_blocks: int = 128):
        self.port = free_port()
        cmd = [sys.executable, "-m", "inferd.cli", "serve", args.model, "--port", str(self.port),
               "-t", str(args.threads), "--prompt-cache-dir", str(folder), "--prompt-cache-disk-mib", "512",
               "--num-kv-blocks", str(num_kv_blocks), "--no-measure-bandwidth", "--drain-timeout-s", "10",
               "--kv-cache-dtype", kv_cache]
        env = {k: v for k, v in os.environ.items() if k != "INFERD_PROMPT_CACHE_DISK_MIB"}
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=HERE.parent)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited with {self.proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.05)
        else:
            raise SystemExit(f"the server was not ready in 300 s; see {log}")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=10) as r:
            self.model = json.loads(r.read())["data"][0]["id"]

    def ttft(self, messages: list[dict[str, str]], max_tokens: int = 1) -> Turn:
        return chat_turn(f"http://127.0.0.1:{self.port}", self.model, messages, max_tokens)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=2000, help="about this many tokens of shared system prompt")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, help="write the results file here (and its JSON beside it)")
    args = ap.parse_args()
    warning = busy_warning()
    system = SENTENCE * max(1, args.tokens // 30)  # about 30 tokens a sentence with SmolLM2's tokenizer
    question = iter(f"Which berth does ship number {i} take tomorrow?" for i in range(10_000))
    samples: dict[str, list[list[float]]] = {side: [] for side in SIDES}
    hits: dict[str, list[int]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="inferd-prompt-cache-") as tmp:
        folder, log = Path(tmp) / "cache", Path(tmp) / "server.log"
        srv = Server(args, folder, log)
        try:
            srv.ttft([{"role": "system", "content": system}, {"role": "user", "content": next(question)}])
            expect = None
            for r in range(args.rounds):
                for side in abba(r, SIDES):
                    if side == "restart":
                        srv.stop()
                        srv = Server(args, folder, log)
                    msgs = [{"role": "system", "content": system}, {"role": "user", "content": next(question)}]
                    t, cached, _, _ = srv.ttft(msgs)
                    expect = expect or cached // 64 * 64  # the shared prompt's whole blocks, at least
                    if cached <= 0 or cached < expect:
                        raise SystemExit(f"{side} round {r}: cached_tokens {cached} (expected {expect}); see {log}")
                    samples[side].append([t])
                    hits[side].append(cached)
                    print(f"round {r} {side:8s} TTFT {t * 1000:7.1f} ms  cached {cached}", flush=True)
        finally:
            srv.stop()
    report(args, samples, hits, ("restart", "warm"), "Prompt cache across a restart: TTFT", f"model {args.model}",
           warning)


def report(args: argparse.Namespace, samples: dict[str, list[list[float]]], hits: dict[str, list[int]],
           sides: tuple[str, str], title: str, about: str, warning: str | None = None,
           computed: dict[str, list[int]] | None = None) -> None:
    """Print each side's TTFT, cached tokens (and prompt tokens computed) and the ratio sides[0] / sides[1]; with
    args.out, write them as a results file (its JSON beside it) with the command line."""
    ratio, per_round = ratio_of_medians(samples[sides[0]], samples[sides[1]])
    flat = {side: [x for rnd in samples[side] for x in rnd] for side in samples}
    lines = [f"{side}: TTFT {fmt_median([x * 1000 for x in flat[side]])} ms, cached tokens {hits[side]}"
             + (f", computed {computed[side]}" if computed else "") for side in samples]
    lines.append(f"{sides[0]} / {sides[1]}: {fmt_ratio(ratio, per_round)}")
    print("\n".join(lines))
    if args.out:
        md = "\n".join(results_head(title, time.strftime("%Y-%m-%d"), machine(), about)
                       + ["", *lines, *(["", f"**Warning**: {warning}."] if warning else []),
                          "", "Command:", "", "```", "python " + " ".join(sys.argv), "```", ""])
        write_results(args.out, md, {"model": args.model, "tokens": args.tokens, "threads": args.threads,
                                     "sides": {side: stats(flat[side]) for side in samples},
                                     "cached_tokens": hits, "computed_tokens": computed, "ratio": ratio,
                                     "per_round": per_round})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
