"""A submitted request's choices and their outputs as they arrive (the pipeline's collect step): what each choice
has produced so far, the request's usage and its log line. Outputs of one choice that arrived together come merged
into one, so a stream writes one event for them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from inferd.engine.mailbox import RequestHandle
from inferd.engine.request import FinishReason, RequestOutput, Usage
from inferd.server.protocol import ProtocolError
from inferd.server.state import ServerState

log = logging.getLogger("inferd.server")


@dataclass
class Choice:
    """One choice's accumulated output."""

    handle: RequestHandle | None  # None: answered without the engine (nothing to compute)
    index: int
    prompt_index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_string: str | None = None  # the stop string that ended the choice, if one did
    usage: Usage | None = None

    def add(self, out: RequestOutput) -> None:
        self.text += out.text
        self.token_ids += out.token_ids
        if out.logprobs is not None:
            self.logprobs += out.logprobs
            self.top_logprobs += out.top_logprobs or [[] for _ in out.logprobs]
        if out.prompt_logprobs:
            self.prompt_logprobs += out.prompt_logprobs
        if out.usage is not None:
            self.usage = out.usage
        if out.finish_reason is not None:
            self.finish_reason = out.finish_reason.value
            self.stop_string = out.stop_string


@dataclass
class Generation:
    """One API request's choices (one scheduler request each, in choice order), and the response's envelope."""

    state: ServerState
    rid: str
    prompt_ids: list[list[int]]  # each prompt's tokens; a choice's prompt is prompt_ids[choice.prompt_index]
    stop_token_ids: frozenset[int]  # the ids that end every choice (EOS unless ignore_eos)
    choices: list[Choice]
    created: int = field(default_factory=lambda: int(time.time()))
    handles: list[RequestHandle] = field(init=False)  # the submitted choices' (none if answered without the engine)

    def __post_init__(self) -> None:
        self.handles = [c.handle for c in self.choices if c.handle is not None]

    @property
    def model(self) -> str:
        return self.state.served_model_name

    @property
    def fingerprint(self) -> str:
        return self.state.system_fingerprint

    def usage(self) -> Usage:
        """Prompt tokens count once per prompt (not once per choice); completion tokens for every choice."""
        per_prompt: dict[int, Usage] = {}
        completion = 0
        for c in self.choices:
            if c.usage is not None:
                per_prompt[c.prompt_index] = c.usage
                completion += c.usage.completion_tokens
        prompt = sum(u.prompt_tokens for u in per_prompt.values())
        cached = sum(u.cached_tokens for u in per_prompt.values())
        return Usage(prompt, completion, cached)

    @property
    def finished(self) -> bool:
        """Every choice has had its last output: the rest of a stream needs no more waiting."""
        return all(h.done for h in self.handles)

    async def outputs(self, keepalive_s: float) -> AsyncIterator[tuple[Choice, RequestOutput] | None]:
        """Outputs as they arrive, already added to their choice (a choice's outputs that arrived together come
        merged into one); None when `keepalive_s` passed without any. A failed choice raises its ProtocolError,
        after what it produced before failing."""
        if not self.handles:  # answered without the engine: each choice ends at once, empty, at its length
            for c in self.choices:
                usage = Usage(len(self.prompt_ids[c.prompt_index]), 0, 0)
                done = RequestOutput("", finish_reason=FinishReason.LENGTH, usage=usage)
                c.add(done)
                yield c, done
            return
        async for item in merged_outputs(self.handles, keepalive_s):
            if item is None:
                yield None
                continue
            i, outs = item
            choice = self.choices[i]
            err = output_error(outs[-1])  # only a choice's last output can end it
            if err is not None:
                if len(outs) > 1:
                    out = merge_outputs(outs[:-1])
                    choice.add(out)
                    yield choice, out
                raise err
            out = merge_outputs(outs)
            choice.add(out)
            yield choice, out

    def log(self, status: str) -> None:
        if not self.state.settings.log_requests:
            return
        usage = self.usage()
        firsts = [h.first_token_time for h in self.handles if h.first_token_time]
        ttft = (min(firsts) - min(h.arrival_time for h in self.handles)) if firsts else None
        end = max((h.finish_time or time.monotonic()) for h in self.handles) if self.handles else 0.0
        gen_time = end - min(firsts) if firsts else 0.0
        tps = usage.completion_tokens / gen_time if gen_time > 0 else 0.0
        log.info(
            "%s %s prompt=%d cached=%d completion=%d ttft=%s tok/s=%.1f",
            self.rid,
            status,
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.completion_tokens,
            f"{ttft:.3f}s" if ttft is not None else "-",
            tps,
        )


def output_error(out: RequestOutput) -> ProtocolError | None:
    if out.finish_reason == FinishReason.ERROR:
        return ProtocolError(out.error_message or "internal error", status=out.error_status or 500)
    if out.finish_reason == FinishReason.ABORT:
        return ProtocolError(out.error_message or "the request was aborted", status=503, headers={"Retry-After": "5"})
    return None


def merge_outputs(outs: list[RequestOutput]) -> RequestOutput:
    """Outputs of one request that arrived together, as one: text, tokens and logprobs in order, the latest usage,
    the last one's finish and error."""
    if len(outs) == 1:
        return outs[0]
    last = outs[-1]
    logprobs = top = None
    if any(o.logprobs is not None for o in outs):
        logprobs = [x for o in outs for x in o.logprobs or ()]
        if any(o.top_logprobs for o in outs):
            top = [t for o in outs for t in o.top_logprobs or [[] for _ in o.logprobs or ()]]
    prompt = [x for o in outs for x in o.prompt_logprobs or ()] if any(o.prompt_logprobs for o in outs) else None
    return RequestOutput(
        last.request_id,
        token_ids=[t for o in outs for t in o.token_ids],
        text="".join(o.text for o in outs),
        logprobs=logprobs,
        top_logprobs=top,
        prompt_logprobs=prompt,
        finish_reason=last.finish_reason,
        error_status=last.error_status,
        error_message=last.error_message,
        usage=next((o.usage for o in reversed(outs) if o.usage is not None), None),
        stop_string=last.stop_string,
    )


async def merged_outputs(
    handles: list[RequestHandle], keepalive_s: float
) -> AsyncIterator[tuple[int, list[RequestOutput]] | None]:
    """Outputs of several requests as they arrive, each request's that arrived together in one list; None when
    `keepalive_s` passed without any."""
    if len(handles) == 1:  # the common case (one prompt, n = 1): no tasks
        handle = handles[0]
        while not handle.done:
            outs = await handle.get_all(keepalive_s)
            yield (0, outs) if outs else None
        return
    tasks = {asyncio.ensure_future(h.get_all()): i for i, h in enumerate(handles) if not h.done}
    try:
        while tasks:
            done, _ = await asyncio.wait(tasks, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                yield None
                continue
            for t in sorted(done, key=tasks.__getitem__):
                i = tasks.pop(t)
                outs = t.result()
                if not handles[i].done:
                    tasks[asyncio.ensure_future(handles[i].get_all())] = i
                yield i, outs
    finally:
        for t in tasks:
            t.cancel()
