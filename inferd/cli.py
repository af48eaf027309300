"""`inferd serve | generate | pull | perplexity`: the command line."""

from __future__ import annotations

import argparse
import os
import sys

from inferd.config import DEFAULT_MODEL, ConfigError, Settings, add_arguments, load_settings
from inferd.model.pull import PullError

# the settings `generate` and `perplexity` share with `serve` (same names, same file/env/flag precedence)
ENGINE_SETTINGS = (
    "model",
    "model_cache_dir",
    "quantize",
    "device",
    "threads",
    "cpu_path",
    "kv_cache_dtype",
    "cuda_device",
    "cuda_weights",
    "cuda_kv",
    "cuda_graphs",
    "cuda_pdl",
    "cuda_gemm",
)


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    add_arguments(p, ENGINE_SETTINGS)


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", "--temp", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)


def _load(settings: Settings):
    from inferd.engine.device import check_device
    from inferd.model.loader import load_model
    from inferd.model.pull import cache_dir, resolve

    check_device(settings.device)  # before the download and load: say at once when the GPU cannot be used
    path = resolve(settings.model, cache=cache_dir(settings.model_cache_dir))
    return load_model(path, quantize=settings.quantize or None)


def cmd_pull(args) -> int:
    from inferd.model.pull import cache_dir, resolve

    print(resolve(args.name, cache=cache_dir(load_settings(args).model_cache_dir)))
    return 0


def cmd_generate(args) -> int:
    from inferd.engine.device import build_engine
    from inferd.engine.request import Request
    from inferd.engine.runner import GenerationStats, blocks_needed, generate
    from inferd.engine.types import SamplingParams

    settings = load_settings(args)
    model = _load(settings)
    tok = model.tokenizer
    if args.chat:
        from inferd.text.chat import render_chat

        text = render_chat(
            model.chat_template, [{"role": "user", "content": args.prompt}], tok, add_generation_prompt=True
        )
        prompt = tok.encode(text, add_special=False)
    else:
        prompt = tok.encode(args.prompt)
    params = SamplingParams(
        args.temperature,
        args.top_k,
        args.top_p,
        args.min_p,
        args.repetition_penalty,
        args.presence_penalty,
        args.frequency_penalty,
        seed=args.seed,
    )
    max_tokens = min(args.max_tokens, model.config.context_length - len(prompt))
    engine = build_engine(model, settings, num_kv_blocks=blocks_needed(len(prompt) + max(max_tokens, 1)), max_seqs=1)
    stats = GenerationStats()
    request = Request("generate", prompt, params, max_tokens, stop_token_ids=frozenset(tok.eos_ids))
    for out in generate(engine, request, tokenizer=tok, speculative=args.speculative, stats=stats):
        sys.stdout.write(out.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    print(
        f"prompt {stats.prompt_tokens} tokens, {stats.prefill_tps:.1f} tok/s | generated "
        f"{stats.generated_tokens} tokens, {stats.decode_tps:.1f} tok/s | {engine.threads} threads, "
        f"{engine.kernel_path} kernels",
        file=sys.stderr,
    )
    if args.speculative:
        print(
            f"speculative: {stats.accepted_tokens} of {stats.drafted_tokens} drafted tokens accepted", file=sys.stderr
        )
    return 0


def cmd_perplexity(args) -> int:
    from inferd.engine.device import build_engine
    from inferd.engine.runner import blocks_needed, perplexity

    settings = load_settings(args)
    model = _load(settings)
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    tokens = model.tokenizer.encode(text, add_special=False)
    if args.chunks is not None:
        if args.chunks < 1:
            raise ValueError(f"--chunks {args.chunks}: give a positive number of chunks")
        tokens = tokens[: args.chunks * args.ctx]
    bos = model.tokenizer.bos_id if model.tokenizer.add_bos else None
    batch = min(args.ctx, 512)
    engine = build_engine(
        model,
        settings,
        num_kv_blocks=blocks_needed(args.ctx),
        max_batch_tokens=batch,
        max_seqs=1,
        max_logits_rows=min(batch, args.ctx - args.ctx // 2),  # only each chunk's second half is scored
    )

    def progress(done, total, ppl):
        print(f"[{done}/{total}] ppl {ppl:.4f}", file=sys.stderr)

    r = perplexity(engine, tokens, args.ctx, bos, progress)
    print(f"PPL = {r.ppl:.4f} +/- {r.stderr:.5f} ({r.chunks} chunks of {args.ctx}, {r.scored_tokens} tokens scored)")
    return 0


def cmd_serve(argv: list[str]) -> int:
    from inferd.server.main import serve_main

    return serve_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # before numpy's import: the engine computes on its own thread pool, and OpenBLAS's threads would only spin
    # beside it (at numpy's import alone, about 0.1 s of a core out of the start)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if argv and argv[0] == "serve":  # serve owns its options (config file < env < flags)
        return cmd_serve(argv[1:])
    parser = argparse.ArgumentParser(prog="inferd", description="Self-hosted OpenAI-compatible LLM inference.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the OpenAI-compatible server (inferd serve --help)")

    p = sub.add_parser("pull", help="download a model into the cache and print its path")
    p.add_argument("name", nargs="?", default=DEFAULT_MODEL)
    add_arguments(p, ("model_cache_dir",))
    p.set_defaults(fn=cmd_pull)

    p = sub.add_parser("generate", help="generate text from a prompt")
    _add_engine_args(p)
    _add_sampling_args(p)
    p.add_argument("prompt")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("-n", "--max-tokens", type=int, default=256)
    p.add_argument("--speculative", action="store_true", help="prompt-lookup speculative decoding (same output)")
    p.set_defaults(fn=cmd_generate)

    p = sub.add_parser("perplexity", help="perplexity of a text file (llama.cpp's method)")
    _add_engine_args(p)
    p.add_argument("-f", "--file", required=True)
    p.add_argument("-c", "--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=None, help="score only the first N chunks (llama-perplexity's)")
    p.set_defaults(fn=cmd_perplexity)

    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, OSError, PullError, ConfigError) as e:  # ModelLoadError is a ValueError: one clear line
        print(f"inferd: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
