"""Fill-in-the-middle prompts (`suffix` on /v1/completions): the model's FIM tokens around the code before and
after the cursor, in prefix-suffix-middle order as llama.cpp's infill builds them:

    [BOS] <prefix-token> PREFIX <suffix-token> SUFFIX <middle-token>   -> the model writes the middle

The tokens come from the GGUF metadata (tokenizer.ggml.fim_{pre,suf,mid}_token_id, or the older
tokenizer.ggml.{prefix,suffix,middle}_token_id) or, failing that, from the vocabulary's known FIM token texts
(Qwen2.5-Coder and StarCoder's <|fim_prefix|>, CodeLlama's <PRE>, DeepSeek-Coder's, Codestral's). A model
without them cannot fill in a middle: FimUnsupported (a 400 naming `suffix`).
"""

from __future__ import annotations

from inferd.text.tokenizer import Tokenizer

# (prefix, suffix, middle) texts, in the order they are tried
KNOWN_FIM_TEXTS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, CodeGemma, Granite
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder
    ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),  # CodeLlama (SentencePiece)
    ("<PRE>", "<SUF>", "<MID>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
    ("[PREFIX]", "[SUFFIX]", "[MIDDLE]"),  # Codestral
)


class FimUnsupported(ValueError):
    param = "suffix"


def fim_token_ids(tokenizer: Tokenizer) -> tuple[int, int, int] | None:
    """(prefix, suffix, middle) token ids, or None when the model has no FIM tokens."""
    if tokenizer.fim_ids is not None:
        return tokenizer.fim_ids
    for texts in KNOWN_FIM_TEXTS:
        pre, suf, mid = (tokenizer.hf.token_to_id(t) for t in texts)
        if pre is not None and suf is not None and mid is not None:
            return pre, suf, mid
    return None


def fim_prompt_ids(tokenizer: Tokenizer, prefix: str, suffix: str) -> list[int]:
    """The token ids of a fill-in-the-middle prompt; FimUnsupported for a model without FIM tokens."""
    ids = fim_token_ids(tokenizer)
    if ids is None:
        raise FimUnsupported(
            "this model has no fill-in-the-middle tokens, so `suffix` cannot be used "
            "(a code model such as Qwen2.5-Coder or StarCoder has them)"
        )
    pre, suf, mid = ids
    out = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    out += [pre] + tokenizer.encode(prefix, add_special=False)
    out += [suf] + tokenizer.encode(suffix, add_special=False)
    out.append(mid)
    return out
