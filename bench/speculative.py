"""Decode speed on a code-editing prompt: `inferd generate` with and without `--speculative` (prompt-lookup drafts,
the same greedy output) beside llama-server on the same file, prompt, output length and threads, ABBA rounds.

    python bench/speculative.py [--model qwen2.5-coder-1.5b-q4_k_m] [-n 256] [-t 2] [--rounds 2] [--bin DIR]

A code edit is where prompt lookup pays: most of the answer copies the code in the prompt. Each inferd run is a
fresh `inferd generate --chat` (its decode tok/s line); llama-server is started once and asked the same rendered
prompt through /completion with `top_k: 1` (its `timings.predicted_per_second`; `-fa on -cram 0`, quiet logs,
no prompt cache). Writes bench/results/speculative.md.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import (  # noqa: E402
    abba, busy_warning, command_line, fmt_range, llama_bin, median, model_file, peer_env, repack_works)
from serve import llama_server  # noqa: E402

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


async def main_async(args) -> None:
    bin_dir = llama_bin(args.bin)
    env = peer_env()
    model = model_file(args.model, bin_dir)
    warning = busy_warning()
    repack = repack_works(bin_dir, model, args.threads, env)
    text = rendered_prompt(model)
    server = llama_server(bin_dir, model, args.threads, 1, 4096, env, repack)
    log_dir = Path("/tmp") / f"inferd-bench-speculative-{int(time.time())}"
    log_dir.mkdir(parents=True, exist_ok=True)
    server.start(log_dir)
    rates: dict[str, list[float]] = {"llama-server": [], "inferd": [], "inferd --speculative": []}
    notes: dict[str, str] = {}
    try:
        await server.wait_ready()
        for r in range(args.rounds):
            inferd_pair = abba(r, ["inferd", "inferd --speculative"])
            for side in (["llama-server", *inferd_pair] if r % 2 == 0 else [*inferd_pair, "llama-server"]):
                if side == "llama-server":
                    tps, n = await run_llama(server.url, text, args.max_tokens)
                else:
                    tps, n, accepted = run_inferd(model, args.max_tokens, args.threads, side.endswith("speculative"))
                    if accepted:
                        notes[side] = accepted
                rates[side].append(tps)
                print(f"round {r + 1}/{args.rounds} {side:<22} {tps:6.1f} tok/s ({n} tokens)", flush=True)
    finally:
        server.stop()
    base = median(rates["llama-server"])
    rows = [f"| {side} | {median(v):.1f} ({fmt_range(v)}) | {median(v) / base:.2f}x | {notes.get(side, '')} |"
            for side, v in rates.items()]
    lines = [f"# Decode on a code-editing prompt ({time.strftime('%Y-%m-%d %H:%M')}, {model.name}, {args.threads} "
             f"threads, greedy, {args.max_tokens} tokens, {args.rounds} ABBA rounds, medians (min-max))", "",
             "| engine | decode tok/s | / llama-server | |", "| --- | ---: | ---: | --- |", *rows, "",
             "The prompt asks to rename a key and add type hints to a 23-line function file, so most of the answer "
             "copies the prompt: prompt-lookup drafts are checked by the batched kernels, which give the same bits "
             "as single-token decoding, so the text is the same with and without `--speculative`."]
    if warning:
        lines += ["", f"**Warning**: {warning}"]
    lines += ["", "Commands:", "", "```", command_line([sys.executable, *sys.argv]), server.shown,
              f"python -m inferd.cli generate -m {model} --chat -n {args.max_tokens} -t {args.threads} --top-k 1 "
              "[--speculative] PROMPT", "```", ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-q4_k_m")
    ap.add_argument("-n", "--max-tokens", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bin", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "speculative.md")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
