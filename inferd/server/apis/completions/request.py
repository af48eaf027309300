"""The completions request (prompts as text or token ids, echo, legacy logprobs, fill in the middle) and the checks
msgspec cannot express."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta

from inferd.server.apis.openai_fields import ResponseFormat, SamplingRequest, check_common
from inferd.server.protocol import Limits, ProtocolError


class CompletionRequest(SamplingRequest, kw_only=True):
    prompt: str | list[Any]
    echo: bool = False
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    suffix: str | None = None  # fill-in-the-middle: the text after the cursor (inferd.text.fim)
    best_of: Annotated[int, Meta(ge=1)] | None = None
    response_format: ResponseFormat | None = None


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
