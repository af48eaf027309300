"""What OpenAI's chat completions and completions share: the sampling and constraint fields of their requests (with
the vLLM- and llama-server-style extensions), the checks on them, and the usage object and error event of their
answers."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct

from inferd.engine.request import Usage
from inferd.engine.types import SamplingParams
from inferd.model.sampling_defaults import SamplingDefaults
from inferd.server.apis.sampling import sampling_params
from inferd.server.lora import LoraChoice
from inferd.server.protocol import Limits, ProtocolError
from inferd.server.sse import DONE, sse_event
from inferd.text.tokenizer import Tokenizer

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
TopP = Annotated[float, Meta(ge=0.0, le=1.0)]  # 0: greedy (OpenAI's range is [0, 1])


class StreamOptions(Struct):
    include_usage: bool = False


class ResponseFormat(Struct, forbid_unknown_fields=False):
    """{"type": "text" | "json_object" | "json_schema", "json_schema": {name, schema, strict, description}};
    checked in depth by inferd.text.grammar."""

    type: str
    json_schema: dict[str, Any] | None = None


class StructuredOutputs(Struct, forbid_unknown_fields=False):
    """vLLM's structured_outputs: exactly one of json, regex, choice, grammar, json_object."""

    json: Any = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool | None = None


class SamplingRequest(Struct, kw_only=True):
    model: str | None = None
    max_tokens: Annotated[int, Meta(ge=0)] | None = None
    n: Annotated[int, Meta(ge=1)] = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # extensions (vLLM-style extra fields; the openai SDK sends them with extra_body)
    ignore_eos: bool = False
    speculative: bool | None = None  # prompt-lookup speculative decoding; null: the server's setting
    lora: list[LoraChoice] | None = None  # llama-server's: the LoRA adapter and its scale (inferd.server.lora)
    # constrained output beyond response_format: vLLM's guided_* and structured_outputs, llama-server's grammar
    # (GBNF) and json_schema; one at most (inferd.text.grammar)
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    structured_outputs: StructuredOutputs | None = None
    grammar: str | None = None
    json_schema: Any = None


def check_common(req: SamplingRequest, limits: Limits) -> None:
    if req.n > limits.max_n:
        raise ProtocolError(f"n must be at most {limits.max_n}, got {req.n}", "n")
    if req.stream_options is not None and not req.stream:
        raise ProtocolError("stream_options is only allowed when stream is true", "stream_options")


def stop_list(stop: str | list[str] | None, limits: Limits) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > limits.max_stop:
        raise ProtocolError(f"at most {limits.max_stop} stop sequences are supported, got {len(stops)}", "stop")
    if any(s == "" for s in stops):
        raise ProtocolError("stop sequences must not be empty", "stop")
    return stops


def logit_bias_ids(bias: dict[str, float] | None, limits: Limits) -> dict[int, float] | None:
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        try:
            tok = int(key)
        except ValueError:
            raise ProtocolError(f"logit_bias keys must be token ids, got {key!r}", "logit_bias") from None
        if not 0 <= tok < limits.vocab_size:
            raise ProtocolError(
                f"logit_bias token id {tok} is outside the vocabulary [0, {limits.vocab_size})", "logit_bias"
            )
        out[tok] = value
    return out


def openai_sampling(
    req: SamplingRequest, limits: Limits, defaults: SamplingDefaults, logprobs: int | None, choice: int
) -> SamplingParams:
    return sampling_params(
        defaults,
        choice=choice,
        logprobs=logprobs,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        logit_bias=logit_bias_ids(req.logit_bias, limits),
        seed=req.seed,
    )


def wants_usage(req: SamplingRequest) -> bool:
    return req.stream_options is not None and bool(req.stream_options.include_usage)


# ---- answers ------------------------------------------------------------------------------------------------


class PromptTokensDetails(Struct):
    cached_tokens: int


class CompletionTokensDetails(Struct):
    reasoning_tokens: int


class UsageInfo(Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails | None = None  # models that think aloud


def usage_info(usage: Usage, reasoning_tokens: int | None = None) -> UsageInfo:
    """reasoning_tokens: how many of the completion's tokens were thinking (None: the model does not think aloud)."""
    total = usage.prompt_tokens + usage.completion_tokens
    details = (
        None if reasoning_tokens is None else CompletionTokensDetails(min(reasoning_tokens, usage.completion_tokens))
    )
    return UsageInfo(
        usage.prompt_tokens, usage.completion_tokens, total, PromptTokensDetails(usage.cached_tokens), details
    )


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    """The length of a piece of output in tokens, counted on its text (the thinking of reasoning_tokens)."""
    return len(tokenizer.encode(text, add_special=False)) if text else 0


def token_str(tokenizer: Tokenizer, token_id: int) -> str:
    """A token as logprobs show it: its bytes, special tokens included, invalid UTF-8 replaced."""
    return tokenizer.token_bytes(token_id, skip_special=False).decode("utf-8", errors="replace")


def stream_error(err: ProtocolError) -> bytes:
    """A choice failed once the stream had started: the error's envelope as one more event, then [DONE]."""
    return sse_event(err.body()) + DONE
