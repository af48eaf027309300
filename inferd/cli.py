"""`inferd serve | generate | pull | perplexity`: the command line."""
from __future__ import annotations

import argparse
import sys

from inferd.model.pull import PullError

DEFAULT_MODEL = "smollm2-135m-instruct"


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=DEFAULT_MODEL,
                   help=f"model name, GGUF file or Hugging Face folder (default: {DEFAULT_MODEL})")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: physical cores)")
    p.add_argument("--quantize", choices=["q8_0", "q4_0"], default=None,
                   help="quantize a float (Hugging Face) model on load")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="run the model on the CPU (default) or an NVIDIA GPU")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", "--temp", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)


def _load(args):
    from inferd.engine.device import check_device
    from inferd.model.loader import load_model
    from inferd.model.pull import resolve

    check_device(args.device)   # before the download and load: say at once when the GPU cannot be used
    return load_model(resolve(args.model), quantize=args.quantize)


def cmd_pull(args) -> int:
    from inferd.model.pull import resolve

    print(resolve(args.name))
    return 0


def cmd_generate(args) -> int:
    from inferd.engine.device import engine_class
    from inferd.engine.engine import SamplingParams
    from inferd.engine.runner import GenerationStats, blocks_needed, generate
    from inferd.text.tokenizer import IncrementalDetokenizer

    model = _load(args)
    tok = model.tokenizer
    if args.chat:
        from inferd.text.chat import render_chat

        text = render_chat(model.chat_template, [{"role": "user", "content": args.prompt}], tok,
                           add_generation_prompt=True)
        prompt = tok.encode(text, add_special=False)
    else:
        prompt = tok.encode(args.prompt)
    params = SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p, args.repetition_penalty,
                            args.presence_penalty, args.frequency_penalty, seed=args.seed)
    max_tokens = min(args.max_tokens, model.config.context_length - len(prompt))
    engine = engine_class(args.device)(model, num_kv_blocks=blocks_needed(len(prompt) + max(max_tokens, 1)),
                                       max_seqs=1, threads=args.threads)
    stats = GenerationStats()
    detok = IncrementalDetokenizer(tok, prompt)
    for token in generate(engine, prompt, params, max_tokens, tok.eos_ids, stats, args.speculative):
        sys.stdout.write(detok.add(token))
        sys.stdout.flush()
    sys.stdout.write(detok.flush() + "\n")
    sys.stdout.flush()
    print(f"prompt {stats.prompt_tokens} tokens, {stats.prefill_tps:.1f} tok/s | generated "
          f"{stats.generated_tokens} tokens, {stats.decode_tps:.1f} tok/s | {engine.threads} threads, "
          f"{engine.kernel_path} kernels", file=sys.stderr)
    if args.speculative:
        print(f"speculative: {stats.accepted_tokens} of {stats.drafted_tokens} drafted tokens accepted",
              file=sys.stderr)
    return 0


def cmd_perplexity(args) -> int:
    from inferd.engine.device import engine_class
    from inferd.engine.runner import blocks_needed, perplexity

    model = _load(args)
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    tokens = model.tokenizer.encode(text, add_special=False)
    bos = model.tokenizer.bos_id if model.tokenizer.add_bos else None
    batch = min(args.ctx, 512)
    engine = engine_class(args.device)(model, num_kv_blocks=blocks_needed(args.ctx), max_batch_tokens=batch,
                                       max_seqs=1, threads=args.threads, max_logits_rows=batch)

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
    if argv and argv[0] == "serve":   # serve owns its options (config file < env < flags)
        return cmd_serve(argv[1:])
    parser = argparse.ArgumentParser(prog="inferd", description="Self-hosted OpenAI-compatible LLM inference.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the OpenAI-compatible server (inferd serve --help)")

    p = sub.add_parser("pull", help="download a model into the cache and print its path")
    p.add_argument("name", nargs="?", default=DEFAULT_MODEL)
    p.set_defaults(fn=cmd_pull)

    p = sub.add_parser("generate", help="generate text from a prompt")
    _add_model_args(p)
    _add_sampling_args(p)
    p.add_argument("prompt")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("-n", "--max-tokens", type=int, default=256)
    p.add_argument("--speculative", action="store_true", help="prompt-lookup speculative decoding (same output)")
    p.set_defaults(fn=cmd_generate)

    p = sub.add_parser("perplexity", help="perplexity of a text file (llama.cpp's method)")
    _add_model_args(p)
    p.add_argument("-f", "--file", required=True)
    p.add_argument("-c", "--ctx", type=int, default=512)
    p.set_defaults(fn=cmd_perplexity)

    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, OSError, PullError) as e:   # ModelLoadError is a ValueError: one clear line
        print(f"inferd: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
