"""TTFT of a request whose system prompt an earlier request already sent (a prefix-cache hit) against a cold one,
`inferd serve` as a real process: the figure a chat UI or an agent sees on its second turn.

    python bench/shared_prefix.py [--model smollm2-135m-instruct | FILE.gguf] [--tokens 1000] [-t 2] [--rounds 4]
                                  [--kv-cache f16|bf16|q8_0] [--num-kv-blocks 128]
                                  [--out bench/results/shared_prefix.md]

Each round makes a system prompt of about --tokens tokens that no earlier request used (its first sentence names
the round), then sends, streamed, greedy:
  cold  that system prompt and a question (one token): nothing of it is cached but the chat template's opening
  warm  the same system prompt and another question (an answer of up to 24 tokens): the system prompt is a
        prefix-cache hit, up to the block it ends in, or past it where hits within a block copy that block
  next  the warm conversation's next turn (its answer, a third question; one token): all of the warm request's
        computed tokens are a hit, whole blocks or within one
The three are sent back to back, so each round's ratio compares requests in the same phase of a noisy machine; each
line also says how many prompt tokens were computed (prompt tokens - cached).
A hybrid model (recurrent layers) hits only up to a block whose end has a state snapshot: every request's
`cached_tokens` is checked (cold less than a block, the others at least the whole blocks before their new tokens
but one), and a round whose hit is smaller fails the run instead of reporting a number that measures something else.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import busy_warning  # noqa: E402
from prompt_cache_restart import SENTENCE, Server, Turn, report  # noqa: E402

SIDES = ("cold", "warm", "next")
BLOCK = 64  # tokens per KV block: what a disk or hybrid hit is made of, and the floors below


def three_turns(ask: Callable[[list[dict[str, str]], int], Turn], r: int, tokens: int) -> dict[str, Turn]:
    """Round r's cold, warm and next requests (the module's docstring), each sent with ask(messages, max_tokens)
    when the one before has finished; printed as they come."""
    opening = f"Harbour office number {r} opens at {6 + r % 4} o'clock. "
    system = [{"role": "system", "content": opening + SENTENCE * max(1, tokens // 30)}]
    questions = [f"Which berth does ship number {3 * r} take tomorrow?",
                 f"When does the pilot for the tanker {3 * r + 1} come aboard, and at which gate?",
                 f"Thanks. Is berth {3 * r + 2} deep enough for her at low tide?"]
    warm = system + [{"role": "user", "content": questions[1]}]
    turns = {"cold": ask(system + [{"role": "user", "content": questions[0]}], 1), "warm": ask(warm, 24)}
    turns["next"] = ask(warm + [{"role": "assistant", "content": turns["warm"].text},
                                {"role": "user", "content": questions[2]}], 1)
    for side, turn in turns.items():
        print(f"round {r} {side} TTFT {turn.ttft * 1000:8.1f} ms  prompt {turn.prompt}  cached {turn.cached}  "
              f"computed {turn.prompt - turn.cached}", flush=True)
    return turns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a model name `inferd serve` takes, or a path")
    ap.add_argument("--tokens", type=int, default=1000, help="about this many tokens of system prompt")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--kv-cache", default="f16", help="the server's kv_cache_dtype")
    ap.add_argument("--num-kv-blocks", type=int, default=128, help="the server's KV blocks of 64 positions")
    ap.add_argument("--out", type=Path, help="write the results file here (and its JSON beside it)")
    args = ap.parse_args()
    warning = busy_warning()
    samples: dict[str, list[list[float]]] = {side: [] for side in SIDES}
    hits: dict[str, list[int]] = {side: [] for side in SIDES}
    computed: dict[str, list[int]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="inferd-shared-prefix-") as tmp:
        log = Path(tmp) / "server.log"
        srv = Server(args, Path(tmp) / "cache", log, args.kv_cache, args.num_kv_blocks)
        try:
            srv.ttft([{"role": "user", "content": "Warm up."}])
            for r in range(args.rounds):
                turns = three_turns(srv.ttft, r, args.tokens)
                # cached_tokens: cold at most the chat template's opening, shared with every earlier request; warm at
                # least the system prompt's whole blocks but one; next the warm prompt's
                floors = {"cold": 0, "warm": (args.tokens * 9 // 10) // BLOCK * BLOCK - BLOCK,
                          "next": turns["warm"].prompt // BLOCK * BLOCK - BLOCK}
                for side, turn in turns.items():
                    if turn.cached < floors[side] or (side == "cold" and turn.cached >= BLOCK):
                        raise SystemExit(f"round {r} {side}: cached_tokens {turn.cached} (expected "
                                         f"{f'< {BLOCK}' if side == 'cold' else f'>= {floors[side]}'}); see {log}")
                    samples[side].append([turn.ttft])
                    hits[side].append(turn.cached)
                    computed[side].append(turn.prompt - turn.cached)
        finally:
            srv.stop()
    report(args, samples, hits, ("warm", "cold"),
           "A shared system prompt: TTFT of a prefix-cache hit against a cold request",
           f"model {args.model}, ~{args.tokens} tokens of system prompt, {args.threads} threads, KV cache "
           f"{args.kv_cache}", warning, computed)


if __name__ == "__main__":
    main()
