"""Chat completions' renderer: checked messages, tools and answer format -> the chat template's text (one prompt),
each of the n choices' sampling, and the tool-call settings the encoder parses the answer with."""

from __future__ import annotations

from typing import Any

from inferd.server.apis.chat.request import ChatCompletionRequest, check_chat, check_messages, template_kwargs
from inferd.server.apis.openai_fields import openai_sampling, stop_list
from inferd.server.generation import PromptText, Rendered, limits
from inferd.server.protocol import ProtocolError
from inferd.server.state import ServerState
from inferd.server.structured import ChatPrep, prepare_chat, request_grammar, tool_request, with_reasoning


def render_chat(
    state: ServerState,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
    param: str = "messages",
    extra: dict[str, Any] | None = None,
) -> str:
    """The chat template's text; `param` names the request field the messages came from."""
    variables = {**state.settings.template_defaults(), **(extra or {})}  # the request's own win key by key
    try:
        template = state.ready_template
        return template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools, **variables)
    except ValueError as e:  # ChatTemplateError: the template refused these messages
        raise ProtocolError(str(e), param) from None


async def render(state: ServerState, req: ChatCompletionRequest) -> Rendered[ChatPrep]:
    lim = limits(state)
    check_chat(req, lim)
    messages = check_messages(req.messages, lim)
    stops = stop_list(req.stop, lim)
    tools = tool_request(req.tools, req.tool_choice, req.parallel_tool_calls)
    prep = await prepare_chat(state, messages, tools, request_grammar(req))
    text = render_chat(state, prep.messages, req.add_generation_prompt, prep.tools, extra=template_kwargs(req))
    if req.add_generation_prompt:  # an answer follows the prompt
        prep = with_reasoning(state, prep, text, req.max_thinking_tokens, "max_thinking_tokens")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    given = req.max_completion_tokens is not None
    return Rendered(
        [PromptText(text, add_special=False)],  # the template wrote BOS itself if it wants one
        lambda j: openai_sampling(req, lim, state.sampling_defaults, logprobs, j),
        prep,
        "messages",
        n=req.n,
        max_tokens=req.max_completion_tokens if given else req.max_tokens,
        max_tokens_param="max_completion_tokens" if given else "max_tokens",
        stop=stops,
        ignore_eos=req.ignore_eos,
        speculative=req.speculative,
        constraint=prep.constraint,
        shown_special=prep.shown_special,
    )
