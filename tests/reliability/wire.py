"""What a complete, well-formed answer looks like on the wire: SSE framing and the shapes of both endpoints.

`check_response` / `check_stream` return a problem description (str) or None, and the text of each choice,
so a soak can tally problems instead of stopping at the first one.
"""

from __future__ import annotations

import json
from typing import Any

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
FINISH_REASONS = ("stop", "length")


class WireError(AssertionError):
    pass


def parse_sse(raw: bytes) -> list[Any]:
    """The data payloads of an SSE body (dicts, or the string "[DONE]"); comments (pings) dropped.

    Two framings: chat/completions streams (one `data: ` line per event, ending with [DONE]) and the typed events
    of the Responses and Anthropic's Messages APIs (`event: NAME` then `data: ` whose "type" is NAME; no [DONE],
    the last event is response.completed, response.incomplete, response.failed, message_stop or error).
    Raises WireError for bad framing: a body that does not end in a blank line, an event of more lines than its
    framing has, a line that is neither `data: ` nor a `: ` comment, JSON that does not parse, anything after the end.
    """
    body = raw.decode("utf-8")
    if not body.endswith("\n\n"):
        raise WireError(f"stream does not end with a blank line: {body[-80:]!r}")
    if body.startswith("event: "):
        return _parse_typed_sse(body)
    out: list[Any] = []
    for block in body[:-2].split("\n\n"):
        if "\n" in block:
            raise WireError(f"one line per event expected: {block[:120]!r}")
        if block.startswith(":"):
            continue
        if not block.startswith("data: "):
            raise WireError(f"not a data line: {block[:120]!r}")
        if out and out[-1] == "[DONE]":
            raise WireError("an event after [DONE]")
        payload = block[len("data: "):]
        if payload == "[DONE]":
            out.append(payload)
            continue
        try:
            out.append(json.loads(payload))
        except ValueError:
            raise WireError(f"event is not JSON: {payload[:120]!r}") from None
    if not out or out[-1] != "[DONE]":
        raise WireError("stream ended without [DONE]")
    return out


TYPED_ENDS = ("response.completed", "response.incomplete", "response.failed", "message_stop", "error")


def _parse_typed_sse(body: str) -> list[Any]:
    out: list[Any] = []
    for block in body[:-2].split("\n\n"):
        if block.startswith(":"):
            continue
        lines = block.split("\n")
        if len(lines) != 2 or not lines[0].startswith("event: ") or not lines[1].startswith("data: "):
            raise WireError(f"an `event:` line and a `data:` line expected: {block[:120]!r}")
        if out and out[-1].get("type") in TYPED_ENDS:
            raise WireError("an event after the stream's last one")
        try:
            event = json.loads(lines[1][len("data: "):])
        except ValueError:
            raise WireError(f"event is not JSON: {lines[1][:120]!r}") from None
        if not isinstance(event, dict) or event.get("type") != lines[0][len("event: "):]:
            raise WireError(f"event's type differs from its name: {block[:120]!r}")
        out.append(event)
    if not out or out[-1]["type"] not in TYPED_ENDS:
        raise WireError(f"typed stream ended without one of {TYPED_ENDS}")
    return out


def num_choices(path: str, body: dict) -> int:
    n = body.get("n", 1)
    if path == CHAT:
        return n
    p = body["prompt"]
    if isinstance(p, str) or (p and isinstance(p[0], int)):
        return n
    return n * len(p)


def _check_usage(usage: Any, body: dict, choices: int) -> str | None:
    if not isinstance(usage, dict):
        return f"usage missing: {usage!r}"
    keys = {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}
    if set(usage) != keys:
        return f"usage keys {sorted(usage)}"
    if usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]:
        return f"usage does not add up: {usage}"
    if usage["prompt_tokens"] <= 0:
        return f"no prompt tokens: {usage}"
    if not 0 <= usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"]:
        return f"cached tokens out of range: {usage}"
    cap = body.get("max_tokens") or body.get("max_completion_tokens")
    if cap is not None and not 0 <= usage["completion_tokens"] <= cap * choices:
        return f"{usage['completion_tokens']} completion tokens for {choices} choices of at most {cap}"
    return None


def _forced_length(body: dict) -> bool:
    """A request that must run to max_tokens: EOS ignored and no stop strings."""
    return bool(body.get("ignore_eos")) and not body.get("stop")


def check_response(path: str, body: dict, status: int, payload: Any) -> tuple[str | None, dict[int, str]]:
    """A non-streaming answer to a valid request."""
    if status != 200:
        return f"status {status}: {str(payload)[:200]}", {}
    if not isinstance(payload, dict):
        return f"not a JSON object: {str(payload)[:200]}", {}
    chat = path == CHAT
    prefix, obj = ("chatcmpl-", "chat.completion") if chat else ("cmpl-", "text_completion")
    if not str(payload.get("id", "")).startswith(prefix) or payload.get("object") != obj:
        return f"id/object {payload.get('id')!r} {payload.get('object')!r}", {}
    n = num_choices(path, body)
    choices = payload.get("choices") or []
    if sorted(c["index"] for c in choices) != list(range(n)):
        return f"choice indexes {[c['index'] for c in choices]} for {n} choices", {}
    texts: dict[int, str] = {}
    for c in choices:
        if c["finish_reason"] not in FINISH_REASONS:
            return f"finish_reason {c['finish_reason']!r}", {}
        if _forced_length(body) and c["finish_reason"] != "length":
            return f"finish_reason {c['finish_reason']!r} for an ignore_eos request", {}
        text = c["message"]["content"] if chat else c["text"]
        if chat and c["message"]["role"] != "assistant":
            return f"role {c['message']['role']!r}", {}
        if not isinstance(text, str):
            return f"text is {type(text).__name__}", {}
        if chat and body.get("logprobs"):
            lp = c.get("logprobs")
            if not lp or any(len(t["top_logprobs"]) != (body.get("top_logprobs") or 0) for t in lp["content"]):
                return f"chat logprobs malformed: {str(lp)[:200]}", {}
        if not chat and body.get("logprobs") is not None:
            lp = c.get("logprobs")
            if not lp or not (len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"])):
                return f"completion logprobs malformed: {str(lp)[:200]}", {}
        texts[c["index"]] = text
    problem = _check_usage(payload.get("usage"), body, n)
    if problem is None and _forced_length(body):
        cap = body.get("max_tokens") or body.get("max_completion_tokens")
        if payload["usage"]["completion_tokens"] != cap * n:
            problem = f"{payload['usage']['completion_tokens']} completion tokens, expected {cap * n}"
    return problem, texts


def check_stream(path: str, body: dict, status: int, raw: bytes) -> tuple[str | None, dict[int, str]]:
    """A streamed answer to a valid request: framing, chunk order per choice, one finish each, usage last."""
    if status != 200:
        return f"status {status}: {raw[:200]!r}", {}
    try:
        events = parse_sse(raw)
    except WireError as e:
        return str(e), {}
    chunks = events[:-1]
    chat = path == CHAT
    prefix, obj = ("chatcmpl-", "chat.completion.chunk") if chat else ("cmpl-", "text_completion")
    n = num_choices(path, body)
    texts: dict[int, str] = {i: "" for i in range(n)}
    started: set[int] = set()
    finished: dict[int, str] = {}
    want_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    if not chunks:
        return "no chunks", {}
    for k, c in enumerate(chunks):
        if "error" in c:
            return f"error event: {c['error']}", {}
        if not str(c.get("id", "")).startswith(prefix) or c.get("object") != obj or c["id"] != chunks[0]["id"]:
            return f"chunk id/object {c.get('id')!r} {c.get('object')!r}", {}
        if not c["choices"]:
            if not want_usage or k != len(chunks) - 1:
                return "a chunk without choices that is not the final usage chunk", {}
            if len(finished) != n:
                return "usage chunk before every choice finished", {}
            problem = _check_usage(c.get("usage"), body, n)
            if problem:
                return problem, {}
            continue
        if c.get("usage") is not None:
            return "usage on a content chunk", {}
        for ch in c["choices"]:
            i = ch["index"]
            if i not in texts:
                return f"choice index {i} of {n}", {}
            if i in finished:
                return f"choice {i} sent more after finishing", {}
            if chat:
                delta = ch["delta"]
                if i not in started:
                    if delta != {"role": "assistant", "content": ""}:
                        return f"first chunk of choice {i} is {delta}", {}
                    started.add(i)
                    continue
                if "role" in delta:
                    return f"role repeated for choice {i}", {}
                texts[i] += delta.get("content") or ""
            else:
                texts[i] += ch["text"]
            if ch["finish_reason"] is not None:
                if ch["finish_reason"] not in FINISH_REASONS:
                    return f"finish_reason {ch['finish_reason']!r}", {}
                if _forced_length(body) and ch["finish_reason"] != "length":
                    return f"finish_reason {ch['finish_reason']!r} for an ignore_eos request", {}
                finished[i] = ch["finish_reason"]
    if len(finished) != n:
        return f"{len(finished)} of {n} choices finished", {}
    if want_usage and chunks[-1]["choices"]:
        return "include_usage but no usage chunk", {}
    return None, texts
