"""Decode speed on a code-editing prompt: `inferd generate` with and without `--speculative` (prompt-lookup drafts,
the same greedy output) beside llama-server on the same file, prompt, output length and threads, ABBA rounds.

    python bench/speculative.py [--model qwen2.5-coder-1.5b-q4_k_m] [-n 256] [-t 2] [--rounds 2] [--bin DIR]

A code edit is where prompt lookup pays: most of the answer copies the code in the prompt. Each inferd run is a
fresh `inferd generate --chat` (its decode tok/s line); llama-server is started once and asked the same rendered
prompt through /completion with `top_k: 1` (its `timings.predicted_per_second`; `-fa on -cram 0`, quiet logs,
no prompt cache). Writes bench/results/speculative.md whole (every round's figures, the medians and their ranges),
its data beside it as JSON; a run cut short writes the rounds it finished, marked partial.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import (  # noqa: E402
    abba, busy_warning, command_line, fmt_median, fmt_ratio, llama_bin, machine, model_file, partial_note, peer_build,
    peer_env, ratio_of_medians, repack_works, results_head, stats, stop_on_sigterm, stop_reason, publish_results)

CODE = '''def load_users(path):
    users = []
    with open(path) as f:
        for line in f:
            name, age, city = line.strip().split(",")
            users.append({"name": name, "age": int(age), "city": city})
    return users


def adults(users):
    result = []
    for user in users:
        if user["age"] >= 18:
            result.append(user)
    return result


def by_city(users):
    cities = {}
    for user in users:
        cities.setdefault(user["city"], []).append(user)
    return cities
'''
PROMPT = ("Rename the dictionary key \"city\" to \"town\" everywhere in this Python code and add type hints. "
          "Reply with the whole updated code only.\n\n```python\n" + CODE + "```")
DECODE = re.compile(r"generated (\d+) tokens, ([0-9.]+) tok/s")
ACCEPTED = re.compile(r"speculative: (\d+) of (\d+) drafted tokens accepted")
SIDES = ("llama-server", "inferd", "inferd --speculative")


def run_inferd(model: Path, n: int, threads: int, speculative: bool) -> tuple[float, int, str]:
    cmd = [sys.executable, "-m", "inferd.cli", "generate", "-m", str(model), "--chat", "-n", str(n), "-t",
           str(threads), "--top-k", "1", *(["--speculative"] if speculative else []), PROMPT]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"inferd generate failed: {out.stderr[-2000:]}")
    m = DECODE.search(out.stderr)
    if not m:
        raise SystemExit(f"no decode rate in: {out.stderr[-1000:]}")
    a = ACCEPTED.search(out.stderr)
    accepted = f"{a.group(1)} of {a.group(2)} drafts accepted" if a else ""
    return float(m.group(2)), int(m.group(1)), accepted


async def run_llama(url: str, prompt_text: str, n: int) -> tuple[float, int]:
    body = {"prompt": prompt_text, "n_predict": n, "top_k": 1, "temperature": 0.0, "cache_prompt": False}
    async with aiohttp.ClientSession() as session, session.post(url + "/completion", json=body) as r:
        data = await r.json()
        if r.status != 200:
            raise RuntimeError(f"llama-server: HTTP {r.status} {str(data)[:300]}")
        return float(data["timings"]["predicted_per_second"]), int(data["timings"]["predicted_n"])


def rendered_prompt(model: Path) -> str:
    from inferd.model.loader import load_model
    from inferd.text.chat import render_chat

    m = load_model(model)
    return render_chat(m.chat_template, [{"role": "user", "content": PROMPT}], m.tokenizer, add_generation_prompt=True)


def round_order(r: int) -> list[str]:
    """Round r's sides in the order they run: llama-server first or last, the two inferd runs in ABBA order."""
    inferd_pair = abba(r, ["inferd", "inferd --speculative"])
    return ["llama-server", *inferd_pair] if r % 2 == 0 else [*inferd_pair, "llama-server"]


@dataclass
class SpeculativeRun:
    """What a run measured and how: everything its results file says."""
    stamp: str
    host: dict
    peer_build: str
    commands: list[str]
    model: str
    threads: int
    max_tokens: int
    rounds: int                  # planned
    repack: bool = True
    warning: str | None = None
    stopped: str | None = None   # what cut the run short
    # per round: {side: {"tok_s": decode tok/s, "tokens": generated, "accepted": inferd's drafts line or ""}}
    measured: list[dict[str, dict]] = field(default_factory=list)

    def finished(self) -> list[dict[str, dict]]:
        return [m for m in self.measured if all(side in m for side in SIDES)]


def results(run: SpeculativeRun) -> tuple[str, dict]:
    """The results file's markdown and its JSON data, from the run's per-round rates."""
    done = run.finished()
    title = (f"Decode on a code-editing prompt: {run.model}, {run.threads} threads, greedy, {run.max_tokens} tokens, "
             f"{run.rounds} ABBA rounds")
    lines = results_head(title, run.stamp, run.host, f"llama.cpp: {run.peer_build}")
    if run.stopped:
        lines += ["", partial_note(len(done), run.rounds, "rounds", run.stopped)]
    rates = {side: [m[side]["tok_s"] for m in done] for side in SIDES}
    base = [[x] for x in rates["llama-server"]]
    table = ["| engine | decode tok/s (min-max) | / llama-server (per round min-max) | drafts accepted (last round) |",
             "| --- | ---: | ---: | --- |"]
    summary = {}
    for side in SIDES if done else ():
        ratio, ratios = ratio_of_medians([[x] for x in rates[side]], base)
        accepted = done[-1][side].get("accepted", "")
        summary[side] = {"tok_s": stats(rates[side]), "vs_llama_server": ratio, "round_ratios": ratios,
                         "accepted": accepted}
        table.append(f"| {side} | {fmt_median(rates[side])} | {fmt_ratio(ratio, ratios)} | {accepted} |")
    per_round = ["| round | order | " + " | ".join(f"{side} tok/s (tokens)" for side in SIDES) + " |",
                 "| ---: | --- |" + " ---: |" * len(SIDES)]
    for r, m in enumerate(done):
        per_round.append(f"| {r + 1} | {', '.join(round_order(r))} | "
                         + " | ".join(f"{m[side]['tok_s']:.1f} ({m[side]['tokens']})" for side in SIDES) + " |")
    lines += ["", *table, "", "Per round:", "", *per_round, "",
              "The prompt asks to rename a key and add type hints to a 23-line function file, so most of the answer "
              "copies the prompt: prompt-lookup drafts are checked by the batched kernels, which give the same bits "
              "as single-token decoding, so the text is the same with and without `--speculative`."]
    if not run.repack:
        lines += ["", "llama.cpp's weight repacking died with SIGILL on this CPU (AMX the VM does not grant), so "
                      "llama-server ran with `-nr`."]
    if run.warning:
        lines += ["", f"**Warning**: {run.warning}"]
    lines += ["", "Commands (PORT: a free port; PROMPT: bench/speculative.py's PROMPT, rendered with the model's chat "
              "template for llama-server's /completion):", "", "```", *run.commands, "```", ""]
    data = {"kind": "speculative", "date": run.stamp, "machine": run.host, "peer_build": run.peer_build,
            "commands": run.commands, "model": run.model, "threads": run.threads, "max_tokens": run.max_tokens,
            "rounds_planned": run.rounds, "complete": run.stopped is None, "stopped": run.stopped,
            "repack": run.repack, "warning": run.warning, "prompt": PROMPT, "rounds": run.measured,
            "engines": summary}
    return "\n".join(lines), data


async def main_async(args) -> int:
    from serve import llama_server

    bin_dir = llama_bin(args.bin)
    env = peer_env()
    model = model_file(args.model, bin_dir)
    warning = busy_warning()
    repack = repack_works(bin_dir, model, args.threads, env)
    text = rendered_prompt(model)
    server = llama_server(bin_dir, model, args.threads, 1, 4096, env, repack)
    inferd_cmd = ["python", "-m", "inferd.cli", "generate", "-m", str(model), "--chat", "-n", str(args.max_tokens),
                  "-t", str(args.threads), "--top-k", "1"]
    commands = [command_line([sys.executable, *sys.argv]), server.shown, f"{command_line(inferd_cmd)} PROMPT",
                f"{command_line(inferd_cmd)} --speculative PROMPT",
                f"# llama-server: POST /completion {{prompt: PROMPT, n_predict: {args.max_tokens}, top_k: 1, "
                f"temperature: 0, cache_prompt: false}}; its timings.predicted_per_second"]
    run = SpeculativeRun(time.strftime("%Y-%m-%d %H:%M"), machine(), peer_build(bin_dir), commands, model.name,
                         args.threads, args.max_tokens, args.rounds, repack, warning)
    log_dir = Path("/tmp") / f"inferd-bench-speculative-{int(time.time())}"
    log_dir.mkdir(parents=True, exist_ok=True)
    server.start(log_dir)
    try:
        await server.wait_ready()
        for r in range(args.rounds):
            this: dict[str, dict] = {}
            run.measured.append(this)
            for side in round_order(r):
                accepted = ""
                if side == "llama-server":
                    tps, n = await run_llama(server.url, text, args.max_tokens)
                else:
                    tps, n, accepted = run_inferd(model, args.max_tokens, args.threads, side.endswith("speculative"))
                this[side] = {"tok_s": tps, "tokens": n, "accepted": accepted}
                print(f"round {r + 1}/{args.rounds} {side:<22} {tps:6.1f} tok/s ({n} tokens)", flush=True)
    except (Exception, KeyboardInterrupt, SystemExit, asyncio.CancelledError) as e:
        run.stopped = stop_reason(e)
        if not run.finished():
            raise
    finally:
        server.stop()
    report, data = results(run)
    publish_results(args.out, report, data)
    return 1 if run.stopped else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-q4_k_m")
    ap.add_argument("-n", "--max-tokens", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bin", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "speculative.md")
    args = ap.parse_args()
    stop_on_sigterm()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
