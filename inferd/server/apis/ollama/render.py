"""Ollama's chat and generate renderers: messages (or generate's prompt, system, raw text, fill-in-the-middle
suffix and earlier `context`) -> the prompt's token ids, `options` -> sampling and bounds, `format` -> the
constraint, `think` -> the template's switches. An empty request is Ollama's way to load a model: it is answered
at once, with nothing generated."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from inferd.engine.types import SamplingParams
from inferd.server.apis.chat.render import render_chat
from inferd.server.apis.ollama.request import (
    ROLES,
    ChatRequest,
    GenerateRequest,
    Message,
    OllamaRequest,
    Options,
    check_request,
    check_think,
    format_grammar,
    keep_alive_seconds,
    refuse_images,
    think_kwargs,
)
from inferd.server.apis.openai_fields import stop_list
from inferd.server.apis.sampling import sampling_params
from inferd.server.generation import Rendered, encode, limits
from inferd.server.protocol import Limits, ProtocolError
from inferd.server.state import ServerState
from inferd.server.structured import ChatPrep, compile_spec, prepare_chat, tool_request, with_reasoning
from inferd.text.fim import FimUnsupported, fim_prompt_ids
from inferd.text.reasoning import detect_reasoning


@dataclass
class Turn:
    """What the encoder needs beside the outputs."""

    prep: ChatPrep  # how the answer is parsed (thinking, tool calls); parses nothing for raw text
    started: float  # time.monotonic() when the request was rendered: total_duration counts from here
    show_thinking: bool  # think: false drops whatever thinking the model still writes
    load: str | None = None  # "load" / "unload": an empty request, answered without generating


# Ollama's option -> the sampler's parameter of the same meaning
SAMPLING_OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


def options_sampling(state: ServerState, opts: Options, logprobs: int | None) -> SamplingParams:
    seed = opts.seed if opts.seed is not None and opts.seed >= 0 else None
    given: dict[str, Any] = {param: getattr(opts, option) for option, param in SAMPLING_OPTIONS.items()}
    return sampling_params(state.sampling_defaults, logprobs=logprobs, seed=seed, **given)


def rendered(
    state: ServerState, req: OllamaRequest, ids: list[int], prep: ChatPrep, param: str, started: float
) -> Rendered[Turn]:
    """The prompt's ids with the request's options. num_predict caps the answer (as Ollama's, it is not a demand:
    past the context's end the answer stops at the end); unset, zero or negative, the answer runs until the
    context is full."""
    opts = req.options or Options()
    lim = limits(state)
    sampling = options_sampling(state, opts, (req.top_logprobs or 0) if req.logprobs else None)
    room = state.max_model_len - len(ids)
    n = opts.num_predict
    max_tokens = None if n is None or n <= 0 else min(n, room) if room > 0 else n
    return Rendered(
        [ids],
        lambda j: sampling,
        Turn(prep, started, req.think is not False),
        param,
        max_tokens=max_tokens,
        max_tokens_param="options.num_predict",
        stop=stop_list(opts.stop, lim),
        constraint=prep.constraint,
        shown_special=prep.shown_special,
    )


def load_only(req: OllamaRequest, param: str, started: float) -> Rendered[Turn]:
    """An empty request: Ollama loads the model (or, with keep_alive 0, unloads it) and answers done. Nothing is
    computed: the pipeline answers a request for 0 tokens without the engine (the one-token prompt is never run)."""
    keep = keep_alive_seconds(req.keep_alive)
    turn = Turn(ChatPrep([], None, None, None), started, False, "unload" if keep == 0 else "load")
    return Rendered([[0]], lambda j: SamplingParams(), turn, param, max_tokens=0)


def chat_messages(messages: list[Message], lim: Limits) -> list[dict[str, Any]]:
    """Ollama's messages as the chat template's: tool calls in OpenAI's shape with ids, and each tool result tied
    to the call it answers (Ollama names only the function, by tool_name: results answer the calls in order)."""
    if len(messages) > lim.max_messages:
        raise ProtocolError(f"too many messages: {len(messages)} > {lim.max_messages}", "messages")
    out: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (id, name) of the last assistant turn's calls
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise ProtocolError(f"unsupported role {m.role!r}; use one of {', '.join(ROLES)}", f"messages[{i}].role")
        refuse_images(m.images, f"messages[{i}].images")
        msg: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.tool_calls:
            if m.role != "assistant":
                raise ProtocolError("only assistant messages have tool_calls", f"messages[{i}].tool_calls")
            msg["tool_calls"] = [
                {
                    "id": tc.id or f"call_{i}_{j}",
                    "type": "function",
                    "function": {"name": tc.function.name, "arguments": tc.function.arguments},
                }
                for j, tc in enumerate(m.tool_calls)
            ]
            unanswered = [(c["id"], c["function"]["name"]) for c in msg["tool_calls"]]
        if m.role == "tool":
            k = next((k for k, (_, name) in enumerate(unanswered) if m.tool_name in (None, name)), None)
            if k is not None:
                call_id, name = unanswered.pop(k)
                msg["tool_call_id"], msg["name"] = call_id, name
            elif m.tool_name:
                msg["name"] = m.tool_name
        if m.thinking and m.role == "assistant":
            msg["reasoning_content"] = m.thinking
        out.append(msg)
    return out


def model_thinks(state: ServerState) -> bool:
    return detect_reasoning(state.ready_template.source) is not None


async def render_chat_request(state: ServerState, req: ChatRequest) -> Rendered[Turn]:
    started = time.monotonic()
    check_request(state, req)
    lim = limits(state)
    check_think(req.think, model_thinks(state))
    if not req.messages:
        return load_only(req, "messages", started)
    messages = chat_messages(req.messages, lim)
    tools = tool_request(req.tools, None, None)  # Ollama has no tool_choice: the model decides
    prep = await prepare_chat(state, messages, tools, format_grammar(req.format))
    text = render_chat(state, prep.messages, True, prep.tools, extra=think_kwargs(req.think))
    prep = with_reasoning(state, prep, text)
    ids = await encode(state, text, add_special=False)  # the template wrote BOS itself if it wants one
    return rendered(state, req, ids, prep, "messages", started)


def check_generate(req: GenerateRequest) -> None:
    refuse_images(req.images, "images")
    if req.template:
        raise ProtocolError(
            "template is not supported: the model's own chat template is used (send raw: true to give the "
            "prompt exactly as the model should read it)",
            "template",
        )
    if req.raw and req.system is not None:
        raise ProtocolError("system cannot be used with raw: a raw prompt is not templated", "system")
    if (req.raw or req.suffix) and req.think not in (None, False):
        raise ProtocolError("think needs the chat template, which raw and suffix prompts skip", "think")
    if req.suffix:
        for name in ("system", "context"):
            if getattr(req, name):
                raise ProtocolError(f"{name} cannot be used with suffix (a fill-in-the-middle prompt)", name)


def context_ids(req: GenerateRequest, vocab: int) -> list[int]:
    """`context`, an earlier answer's token ids, continues as the new prompt's prefix."""
    ids = req.context or []
    bad = next((t for t in ids if t >= vocab), None)
    if bad is not None:
        raise ProtocolError(f"context holds token id {bad}, outside the vocabulary [0, {vocab})", "context")
    return list(ids)


async def render_generate(state: ServerState, req: GenerateRequest) -> Rendered[Turn]:
    started = time.monotonic()
    check_request(state, req)
    check_generate(req)
    lim = limits(state)
    check_think(req.think, model_thinks(state))
    prompt = req.prompt or ""
    if not prompt and not req.suffix:
        return load_only(req, "prompt", started)
    spec = format_grammar(req.format)
    prefix = context_ids(req, lim.vocab_size)
    if req.suffix:  # fill in the middle: the code before the cursor, then after it
        try:
            ids = fim_prompt_ids(state.tokenizer, prompt, req.suffix)
        except FimUnsupported as e:
            raise ProtocolError(str(e), "suffix") from None
        prep = ChatPrep([], None, await compile_spec(state, spec), None)
    elif req.raw:
        ids = prefix + await encode(state, prompt, add_special=not prefix)
        prep = ChatPrep([], None, await compile_spec(state, spec), None)
    else:  # the prompt is the user's turn of the model's chat template
        messages = ([{"role": "system", "content": req.system}] if req.system else []) + [
            {"role": "user", "content": prompt}
        ]
        prep = await prepare_chat(state, messages, tool_request(None, None, None), spec)
        text = render_chat(state, prep.messages, True, extra=think_kwargs(req.think), param="prompt")
        prep = with_reasoning(state, prep, text)
        ids = prefix + await encode(state, text, add_special=False)
    return rendered(state, req, ids, prep, "prompt", started)
