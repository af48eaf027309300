"""OpenAI request and response shapes as msgspec Structs, and request validation.

Decoding a body is one msgspec call: wrong types and out-of-range values come back as a ProtocolError
whose message says what was expected and where (`param`), which the server turns into a 400 with the
OpenAI error envelope. Checks msgspec cannot express (mutually dependent fields, limits that depend on
the model) live in the `check_*` functions below.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

# ---- errors ---------------------------------------------------------------------------------------------


class ErrorInfo(Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Struct):
    error: ErrorInfo


class ProtocolError(Exception):
    """A request the server will not run; becomes an HTTP error with the OpenAI envelope."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        *,
        status: int = 400,
        type: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type or _ERROR_TYPES.get(status, "invalid_request_error")
        self.code = code
        self.headers = headers or {}

    def body(self) -> ErrorResponse:
        return ErrorResponse(ErrorInfo(self.message, self.type, self.param, self.code))


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}

_PATH = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"Object missing required field `([^`]*)`")


def decode(body: bytes, type_: type) -> Any:
    """Decode and type-check a JSON body; any problem raises ProtocolError (400)."""
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as e:
        message = str(e)
        m = _PATH.search(message)
        # msgspec writes `[...]` for a dict value; the dict's own name is the useful param
        param = (m.group(1).replace("[...]", "") or None) if m else None
        missing = _MISSING.match(message)
        if missing:  # name the missing field itself, not the object that lacks it
            param = f"{param}.{missing.group(1)}" if param else missing.group(1)
        raise ProtocolError(message, param) from None
    except msgspec.DecodeError as e:
        raise ProtocolError(f"could not parse the request body as JSON: {e}") from None


# ---- request pieces -----------------------------------------------------------------------------------

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]


class ContentPart(Struct, forbid_unknown_fields=False):
    type: str
    text: str | None = None


class Message(Struct):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # assistant: the calls it made
    tool_call_id: str | None = None  # role "tool": the call this answers


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


class _SamplingRequest(Struct, kw_only=True):
    model: str | None = None
    max_tokens: Annotated[int, Meta(ge=0)] | None = None
    n: Annotated[int, Meta(ge=1)] = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    temperature: Temperature | None = None
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None  # 0: greedy (OpenAI's range is [0, 1])
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


class ChatCompletionRequest(_SamplingRequest, kw_only=True):
    messages: list[Message]
    max_completion_tokens: Annotated[int, Meta(ge=0)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    add_generation_prompt: bool = True


class CompletionRequest(_SamplingRequest, kw_only=True):
    prompt: str | list[Any]
    echo: bool = False
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    suffix: str | None = None  # fill-in-the-middle: the text after the cursor (inferd.text.fim)
    best_of: Annotated[int, Meta(ge=1)] | None = None
    response_format: ResponseFormat | None = None


class ResponsesRequest(Struct, kw_only=True, forbid_unknown_fields=False):
    """POST /v1/responses (checked in depth by inferd.server.responses; this shape documents it)."""

    input: str | list[dict[str, Any]]
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Temperature | None = None
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    tools: list[dict[str, Any]] | None = None  # {"type": "function", "name", "description", "parameters"}
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema"}}
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    seed: int | None = None


class TokenizeRequest(Struct, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(Struct, kw_only=True):
    model: str | None = None
    tokens: list[Annotated[int, Meta(ge=0)]]


class CacheWarmRequest(Struct, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None


# ---- checks beyond types ------------------------------------------------------------------------------


@dataclass
class Limits:
    vocab_size: int
    max_n: int = 8
    max_messages: int = 256
    max_stop: int = 16


ROLES = ("system", "developer", "user", "assistant", "tool")


def message_text(m: Message, i: int) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    texts = []
    for j, part in enumerate(m.content):
        if part.type != "text" or part.text is None:
            raise ProtocolError(
                f"only text content parts are supported, got type {part.type!r}", f"messages[{i}].content[{j}]"
            )
        texts.append(part.text)
    return "".join(texts)


def check_messages(messages: list[Message] | None, limits: Limits) -> list[dict[str, Any]]:
    """Validated messages as plain {role, content} dicts for the chat template (plus tool_calls, tool_call_id and
    name where given; inferd.text.tools.prepare_messages shapes those for the template)."""
    if not messages:
        raise ProtocolError("messages must contain at least one message", "messages")
    if len(messages) > limits.max_messages:
        raise ProtocolError(f"too many messages: {len(messages)} > {limits.max_messages}", "messages")
    out = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise ProtocolError(f"unsupported role {m.role!r}; use one of {', '.join(ROLES)}", f"messages[{i}].role")
        role = "system" if m.role == "developer" else m.role
        msg: dict[str, Any] = {"role": role, "content": message_text(m, i)}
        if m.tool_calls:
            if role != "assistant":
                raise ProtocolError("only assistant messages have tool_calls", f"messages[{i}].tool_calls")
            msg["tool_calls"] = m.tool_calls
        if role == "tool":
            if not m.tool_call_id:
                raise ProtocolError("a tool message needs the tool_call_id it answers", f"messages[{i}].tool_call_id")
            msg["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            msg["name"] = m.name
        out.append(msg)
    return out


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


def check_common(req: _SamplingRequest, limits: Limits) -> None:
    if req.n > limits.max_n:
        raise ProtocolError(f"n must be at most {limits.max_n}, got {req.n}", "n")
    if req.stream_options is not None and not req.stream:
        raise ProtocolError("stream_options is only allowed when stream is true", "stream_options")


def check_chat(req: ChatCompletionRequest, limits: Limits) -> None:
    check_common(req, limits)
    if req.functions:
        raise ProtocolError("functions (the deprecated form) are not supported; send tools", "functions")
    if req.top_logprobs is not None and not req.logprobs:
        raise ProtocolError("top_logprobs requires logprobs to be true", "top_logprobs")
    for name in ("max_tokens", "max_completion_tokens"):
        if getattr(req, name) == 0:
            raise ProtocolError(f"{name} must be at least 1 for chat completions", name)
    if (
        req.max_tokens is not None
        and req.max_completion_tokens is not None
        and req.max_tokens != req.max_completion_tokens
    ):
        raise ProtocolError("max_tokens and max_completion_tokens disagree; send one of them", "max_completion_tokens")


def check_completion(req: CompletionRequest, limits: Limits) -> list[str | list[int]]:
    """Validated prompts: each a string or a list of token ids."""
    check_common(req, limits)
    if req.suffix is not None and not isinstance(req.prompt, str):
        raise ProtocolError("suffix needs a single text prompt (the code before the cursor)", "suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise ProtocolError("best_of is not supported (it must equal n when given)", "best_of")
    p = req.prompt
    if isinstance(p, str):
        prompts: list[str | list[int]] = [p]
    elif not p:
        raise ProtocolError("prompt must not be an empty list", "prompt")
    elif all(isinstance(x, str) for x in p):
        prompts = list(p)
    elif all(isinstance(x, int) and not isinstance(x, bool) for x in p):
        prompts = [list(p)]
    elif all(isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x) for x in p):
        prompts = [list(x) for x in p]
    else:
        raise ProtocolError(
            "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids", "prompt"
        )
    for item in prompts:
        if isinstance(item, list):
            if not item:
                raise ProtocolError("a token-id prompt must not be empty", "prompt")
            bad = next((t for t in item if not 0 <= t < limits.vocab_size), None)
            if bad is not None:
                raise ProtocolError(f"token id {bad} is outside the vocabulary [0, {limits.vocab_size})", "prompt")
    if len(prompts) * req.n > limits.max_n * 4:
        raise ProtocolError(f"too many prompts x n: {len(prompts)} x {req.n}", "prompt")
    return prompts


# ---- responses ----------------------------------------------------------------------------------------


class PromptTokensDetails(Struct):
    cached_tokens: int


class UsageInfo(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionLogprobs(Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(Struct):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class CompletionResponse(Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    system_fingerprint: str
    object: str = "text_completion"
    usage: UsageInfo | None = None


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Struct):
    content: list[TokenLogprob]


class FunctionCall(Struct):
    name: str
    arguments: str  # JSON text


class ToolCallInfo(Struct):
    id: str
    function: FunctionCall
    type: str = "function"


class ChatMessage(Struct, omit_defaults=True):
    role: str
    content: str | None
    tool_calls: list[ToolCallInfo] | None = None


class ChatChoice(Struct):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionResponse(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    system_fingerprint: str
    object: str = "chat.completion"
    usage: UsageInfo | None = None


class FunctionDelta(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Struct, omit_defaults=True):
    """A streamed tool call: index, id, type and name in the first chunk, then argument fragments."""

    index: int
    id: str | None = None
    type: str | None = None
    function: FunctionDelta | None = None


class Delta(Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(Struct):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    system_fingerprint: str
    object: str = "chat.completion.chunk"
    usage: UsageInfo | None = None


class ModelCard(Struct):
    id: str
    created: int
    owned_by: str
    max_model_len: int
    object: str = "model"


class ModelList(Struct):
    data: list[ModelCard]
    object: str = "list"


class TokenizeResponse(Struct):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(Struct):
    prompt: str


class CacheWarmResponse(Struct):
    prompt_tokens: int  # tokens of the warmed text that were sent for prefill
    cached_tokens: int  # of those, now in the prefix cache (whole blocks of 64)
    computed_tokens: int  # computed by this call (the rest was cached already)


def usage_info(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageInfo:
    return UsageInfo(
        prompt_tokens, completion_tokens, prompt_tokens + completion_tokens, PromptTokensDetails(cached_tokens)
    )


REQUEST_TYPES: dict[str, type] = {
    "CompletionRequest": CompletionRequest,
    "ChatCompletionRequest": ChatCompletionRequest,
    "TokenizeRequest": TokenizeRequest,
    "DetokenizeRequest": DetokenizeRequest,
    "CacheWarmRequest": CacheWarmRequest,
    "ResponsesRequest": ResponsesRequest,
}
