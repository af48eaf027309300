"""Completions' renderer: each prompt as text (tokenized with BOS), as the token ids given, or as a fill-in-the-middle
prompt around `suffix`; n choices per prompt; and the prompts' text for echo."""

from __future__ import annotations

from inferd.server.apis.completions.request import CompletionRequest, check_completion
from inferd.server.apis.openai_fields import openai_sampling, stop_list
from inferd.server.generation import Prompt, PromptText, Rendered, limits
from inferd.server.protocol import ProtocolError
from inferd.server.state import ServerState
from inferd.server.structured import prepare_completion
from inferd.text.fim import FimUnsupported, fim_prompt_ids


async def render(state: ServerState, req: CompletionRequest) -> Rendered[list[str]]:
    """The context is each prompt's text, as echo returns it."""
    lim = limits(state)
    raw_prompts = check_completion(req, lim)
    stops = stop_list(req.stop, lim)
    prompts: list[Prompt] = []
    texts: list[str] = []
    for p in raw_prompts:
        if req.suffix is not None:  # fill in the middle: the code before the cursor, then after it
            try:
                prompts.append(fim_prompt_ids(state.tokenizer, str(p), req.suffix))
            except FimUnsupported as e:
                raise ProtocolError(str(e), "suffix") from None
        else:
            prompts.append(PromptText(p, add_special=True) if isinstance(p, str) else p)
        texts.append(p if isinstance(p, str) else state.tokenizer.decode(p))
    prompt_logprobs = req.logprobs if req.echo and req.logprobs is not None else None
    # max_tokens 0 without echo logprobs is answered without the engine: no constraint to compile for it
    generates = req.max_tokens != 0 or prompt_logprobs is not None
    return Rendered(
        prompts,
        lambda j: openai_sampling(req, lim, state.sampling_defaults, req.logprobs, j),
        texts,
        "prompt",
        n=req.n,
        max_tokens=req.max_tokens,
        default_max_tokens=16,  # OpenAI's
        stop=stops,
        ignore_eos=req.ignore_eos,
        prompt_logprobs=prompt_logprobs,
        speculative=req.speculative,
        constraint=await prepare_completion(state, req) if generates else None,
    )
