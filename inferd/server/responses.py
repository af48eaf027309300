"""The Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}) on top of chat completions.

A request becomes a chat conversation: `instructions` as the system message, the stored conversation of
`previous_response_id` (its input and output), then `input` (a string, or message / function_call /
function_call_output items). `text.format`, `tools` (flat function tools) and `tool_choice` map onto the chat
fields. The answer is built from the same deltas a chat stream has (content, tool-call starts, argument
fragments): output items `message` (output_text) and `function_call`, and for `stream: true` OpenAI's typed
events, each with a sequence_number.

Stored responses live in a bounded in-memory store (most recent `size`, each for `ttl_s`); a miss is a 404.
"""

from __future__ import annotations

import asyncio
import secrets
import string
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from inferd.engine.request import Request
from inferd.server import protocol as P
from inferd.server.chat import render_chat
from inferd.server.generation import (
    Generation,
    check_model,
    check_prompt_len,
    encode,
    json_response,
    limits,
    resolve_max_tokens,
    sampling_params,
    sse_event,
    stop_token_ids,
)
from inferd.server.protocol import ProtocolError
from inferd.server.state import STATE
from inferd.server.structured import prepare_chat
from inferd.text.tools import ContentDelta, ToolArgsDelta, ToolCallParser, ToolCallStart


class ResponsesError(ValueError):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param = param
        self.status = status


def new_id(prefix: str) -> str:
    alphabet = string.ascii_lowercase + string.digits
    return f"{prefix}_" + "".join(secrets.choice(alphabet) for _ in range(32))


# ---- the store ------------------------------------------------------------------------------------------------
@dataclass
class Stored:
    response: dict[str, Any]  # the response object as returned
    messages: list[dict[str, Any]]  # the whole conversation through this response, as chat messages
    expires: float


class ResponseStore:
    """Bounded (least recently stored go first) and time-limited; safe to use from several threads."""

    def __init__(self, size: int = 1000, ttl_s: float = 3600.0, clock=time.monotonic):
        self.size, self.ttl_s, self._clock = size, ttl_s, clock
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._items[response["id"]] = Stored(response, messages, self._clock() + self.ttl_s)
            self._items.move_to_end(response["id"])
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> Stored | None:
        with self._lock:
            item = self._items.get(response_id)
            if item is not None and item.expires <= self._clock():
                del self._items[response_id]
                return None
            return item

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._items)


def not_found(response_id: str) -> ResponsesError:
    return ResponsesError(f"Response with id '{response_id}' not found.", "response_id", status=404)


# ---- request -> chat ----------------------------------------------------------------------------------------------
@dataclass
class ChatPlan:
    messages: list[dict[str, Any]]  # the whole conversation to render
    new_messages: list[dict[str, Any]]  # what this request added (stored with the output)
    tools: list[dict[str, Any]] | None = None  # chat-completions form
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    instructions: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    echo: dict[str, Any] = field(default_factory=dict)  # request fields the response repeats


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for j, p in enumerate(content):
            if not isinstance(p, Mapping) or p.get("type") not in ("input_text", "output_text", "text"):
                kind = p.get("type") if isinstance(p, Mapping) else type(p).__name__
                raise ResponsesError(
                    f"{where}[{j}]: content type {kind!r} is not supported (text only)", f"{where}[{j}]"
                )
            parts.append(str(p.get("text", "")))
        return "".join(parts)
    raise ResponsesError(f"{where} must be a string or a list of text parts", where)


def input_messages(items: Any) -> list[dict[str, Any]]:
    """`input` -> chat messages; consecutive function_call items become one assistant message with tool_calls."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, Sequence):
        raise ResponsesError("input must be a string or a list of items", "input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise ResponsesError(f"{where} must be an object", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ResponsesError(f"{where}.role must be user, assistant, system or developer", f"{where}.role")
            out.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": _content_text(item.get("content"), f"{where}.content"),
                }
            )
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise ResponsesError(f"{where} needs name and call_id", where)
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": item.get("arguments") or "{}"},
            }
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise ResponsesError(f"{where} needs call_id", f"{where}.call_id")
            output = item.get("output")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": output if isinstance(output, str) else _content_text(output, f"{where}.output"),
                }
            )
        else:
            raise ResponsesError(
                f"{where}: item type {kind!r} is not supported (message, function_call, function_call_output)",
                f"{where}.type",
            )
    return out


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses function tools are flat ({"type", "name", "parameters", ...}); chat nests them under function."""
    if tools is None:
        return None
    if not isinstance(tools, Sequence):
        raise ResponsesError("tools must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, Mapping) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, Mapping) else None
            raise ResponsesError(f"tools[{i}]: tool type {kind!r} is not supported (function)", f"tools[{i}].type")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, Mapping) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def plan(body: Mapping[str, Any], store: ResponseStore) -> ChatPlan:
    """A Responses request body -> what the chat pipeline needs."""
    if body.get("input") is None:
        raise ResponsesError("input is required", "input")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ResponsesError("instructions must be a string", "instructions")
    history: list[dict[str, Any]] = []
    prev = body.get("previous_response_id")
    if prev is not None:
        stored = store.get(prev)
        if stored is None:
            raise not_found(prev)
        history = [m for m in stored.messages if m.get("role") != "system"]  # instructions are not carried over
    new = input_messages(body["input"])
    system = [{"role": "system", "content": instructions}] if instructions else []
    text = body.get("text") or {}
    fmt = text.get("format") if isinstance(text, Mapping) else None
    max_out = body.get("max_output_tokens")
    if max_out is not None and (not isinstance(max_out, int) or max_out < 1):
        raise ResponsesError("max_output_tokens must be a positive integer", "max_output_tokens")
    echo_keys = (
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "previous_response_id",
        "metadata",
        "store",
    )
    return ChatPlan(
        messages=system + history + new,
        new_messages=new,
        tools=chat_tools(body.get("tools")),
        tool_choice=chat_tool_choice(body.get("tool_choice")),
        response_format=dict(fmt) if isinstance(fmt, Mapping) else None,
        parallel_tool_calls=bool(body.get("parallel_tool_calls", True)),
        max_tokens=max_out,
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        stream=bool(body.get("stream", False)),
        store=bool(body.get("store", True)),
        previous_response_id=prev,
        instructions=instructions,
        metadata=dict(body.get("metadata") or {}),
        echo={k: body.get(k) for k in echo_keys},
    )


# ---- chat deltas -> output items and events ------------------------------------------------------------------------
class ResponseBuilder:
    """Turns the chat pipeline's deltas into Responses output items; `events` collects the typed stream events
    (take them with drain()). The final object is response()."""

    def __init__(self, model: str, p: ChatPlan, response_id: str | None = None):
        self.id = response_id or new_id("resp")
        self.model = model
        self.plan = p
        self.created_at = int(time.time())
        self.output: list[dict[str, Any]] = []
        self.status = "in_progress"
        self.incomplete_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self._events: list[dict[str, Any]] = []
        self._seq = 0
        self._message: dict[str, Any] | None = None  # the open message item
        self._calls: dict[int, dict[str, Any]] = {}  # tool-call index -> its function_call item
        self._emit("response.created", response=self.response())
        self._emit("response.in_progress", response=self.response())

    def _emit(self, kind: str, **fields: Any) -> None:
        self._events.append({"type": kind, "sequence_number": self._seq, **fields})
        self._seq += 1

    def drain(self) -> list[dict[str, Any]]:
        events, self._events = self._events, []
        return events

    def add(self, event: ContentDelta | ToolCallStart | ToolArgsDelta) -> None:
        if isinstance(event, ContentDelta):
            if not event.text:
                return
            msg = self._open_message()
            part = msg["content"][0]
            part["text"] += event.text
            self._emit(
                "response.output_text.delta",
                item_id=msg["id"],
                output_index=self.output.index(msg),
                content_index=0,
                delta=event.text,
                logprobs=[],
            )
        elif isinstance(event, ToolCallStart):
            self._close_message()
            item = {
                "type": "function_call",
                "id": new_id("fc"),
                "call_id": event.id,
                "name": event.name,
                "arguments": "",
                "status": "in_progress",
            }
            self.output.append(item)
            self._calls[event.index] = item
            self._emit("response.output_item.added", output_index=len(self.output) - 1, item=dict(item))
        else:
            item = self._calls[event.index]
            item["arguments"] += event.text
            self._emit(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=self.output.index(item),
                delta=event.text,
            )

    def _open_message(self) -> dict[str, Any]:
        if self._message is None:
            self._message = {
                "type": "message",
                "id": new_id("msg"),
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            self.output.append(self._message)
            index = len(self.output) - 1
            self._emit("response.output_item.added", output_index=index, item={**self._message, "content": []})
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self._message["content"].append(part)
            self._emit(
                "response.content_part.added",
                item_id=self._message["id"],
                output_index=index,
                content_index=0,
                part={**part},
            )
        return self._message

    def _close_message(self) -> None:
        msg, self._message = self._message, None
        if msg is None:
            return
        index = self.output.index(msg)
        part = msg["content"][0]
        self._emit(
            "response.output_text.done",
            item_id=msg["id"],
            output_index=index,
            content_index=0,
            text=part["text"],
            logprobs=[],
        )
        self._emit(
            "response.content_part.done", item_id=msg["id"], output_index=index, content_index=0, part=dict(part)
        )
        msg["status"] = "completed"
        self._emit("response.output_item.done", output_index=index, item=dict(msg))

    def finish(self, finish_reason: str, usage: Mapping[str, int]) -> dict[str, Any]:
        """Closes the items, sets status (completed, or incomplete after max_output_tokens) and usage; emits
        response.completed (or .incomplete); returns the response object."""
        self._close_message()
        for item in self._calls.values():
            if item["status"] != "completed":
                index = self.output.index(item)
                self._emit(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                )
                item["status"] = "completed"
                self._emit("response.output_item.done", output_index=index, item=dict(item))
        if finish_reason == "length":
            self.status, self.incomplete_reason = "incomplete", "max_output_tokens"
        else:
            self.status = "completed"
        cached = usage.get("cached_tokens", 0)
        self.usage = {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
        }
        response = self.response()
        self._emit("response.completed" if self.status == "completed" else "response.incomplete", response=response)
        return response

    def fail(self, message: str, code: str = "server_error") -> dict[str, Any]:
        self.status = "failed"
        response = {**self.response(), "error": {"code": code, "message": message}}
        self._emit("response.failed", response=response)
        return response

    def response(self) -> dict[str, Any]:
        e = self.plan.echo
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "model": self.model,
            "output": [dict(i) for i in self.output],
            "error": None,
            "incomplete_details": {"reason": self.incomplete_reason} if self.incomplete_reason else None,
            "instructions": e.get("instructions"),
            "max_output_tokens": e.get("max_output_tokens"),
            "temperature": 1.0 if e.get("temperature") is None else e["temperature"],
            "top_p": 1.0 if e.get("top_p") is None else e["top_p"],
            "tools": e.get("tools") or [],
            "tool_choice": e.get("tool_choice") or "auto",
            "parallel_tool_calls": True if e.get("parallel_tool_calls") is None else e["parallel_tool_calls"],
            "text": e.get("text") or {"format": {"type": "text"}},
            "previous_response_id": e.get("previous_response_id"),
            "metadata": e.get("metadata") or {},
            "store": True if e.get("store") is None else e["store"],
            "usage": self.usage,
        }

    def output_messages(self) -> list[dict[str, Any]]:
        """The output as chat messages (kept in the store for previous_response_id)."""
        text = "".join(p["text"] for i in self.output if i["type"] == "message" for p in i["content"])
        calls = [
            {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
            for i in self.output
            if i["type"] == "function_call"
        ]
        msg: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            msg["tool_calls"] = calls
        return [msg]


# ---- the endpoints ------------------------------------------------------------------------------------------------
def _chat_request(p: ChatPlan, body: Mapping[str, Any]) -> P.ChatCompletionRequest:
    """The chat-completions request the plan amounts to (checked by the same code as /v1/chat/completions)."""

    fmt = p.response_format
    if fmt is not None and fmt.get("type") == "json_schema" and "json_schema" not in fmt:
        # text.format is flat ({"type", "name", "schema", "strict"}); chat nests it under json_schema
        fmt = {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    chat = {
        "messages": p.messages,
        "tools": p.tools,
        "tool_choice": p.tool_choice,
        "response_format": fmt,
        "parallel_tool_calls": p.parallel_tool_calls,
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "model": body.get("model"),
        "seed": body.get("seed"),
    }
    try:
        return msgspec.convert({k: v for k, v in chat.items() if v is not None}, P.ChatCompletionRequest)
    except msgspec.ValidationError as e:
        raise ResponsesError(f"invalid request: {e}") from None


async def create_response(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses"""

    state = request.app[STATE]
    store = response_store(state)
    try:
        body = msgspec.json.decode(await request.read())
    except msgspec.DecodeError as e:
        raise ProtocolError(f"could not parse the request body as JSON: {e}") from None
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object")
    try:
        p = plan(body, store)
        req = _chat_request(p, body)
    except ResponsesError as e:
        raise ProtocolError(str(e), e.param, status=e.status) from None
    lim = limits(state)
    check_model(state, req.model)
    try:
        P.check_chat(req, lim)
        messages = P.check_messages(req.messages, lim)
        prep = await prepare_chat(state, req, messages, state.chat_template.source)
    except ProtocolError as e:  # name the Responses API's own fields
        if e.param is not None and e.message.startswith(e.param):
            e.message = str(responses_param(e.param)) + e.message[len(e.param) :]
        e.param = responses_param(e.param)
        raise
    prompt = await encode(state, render_chat(state, prep.messages, True, prep.tools), add_special=False)
    check_prompt_len(state, len(prompt), "input")
    max_tokens = resolve_max_tokens(state, req.max_tokens, len(prompt), None, "max_output_tokens")
    gen = Generation.submit(
        state,
        "resp",
        lambda rid: [
            (
                0,
                Request(
                    f"{rid}-0",
                    prompt,
                    sampling_params(req, state, None, 0),
                    max_tokens,
                    (),
                    stop_token_ids(state, False),
                    timeout_s=state.settings.request_timeout_s or None,
                    constraint=prep.constraint,
                    shown_special=prep.shown_special,
                ),
            )
        ],
    )
    builder = ResponseBuilder(state.served_model_name, p)
    parser = ToolCallParser(prep.tool_format, tool_names=prep.tool_names) if prep.tool_format is not None else None

    def feed(text: str, final: bool) -> None:
        if parser is None:
            builder.add(ContentDelta(text))
            return
        for e in parser.feed(text) + (parser.finish() if final else []):
            builder.add(e)

    def finish() -> dict[str, Any]:
        c = gen.choices[0]
        u = gen.usage()
        reason = c.finish_reason or "stop"
        response = builder.finish(
            reason,
            {
                "prompt_tokens": u.prompt_tokens,
                "completion_tokens": u.completion_tokens,
                "cached_tokens": u.prompt_tokens_details.cached_tokens,
            },
        )
        if p.store:
            store.put(response, p.messages + builder.output_messages())
        return response

    try:
        if not p.stream:
            async for item in gen.outputs(3600.0):
                if item is not None:
                    feed(item[1].text, item[1].finish_reason is not None)
            response = finish()
            gen.log("ok")
            return json_response(response)
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        await resp.prepare(request)

        async def send(events: list[dict[str, Any]]) -> None:
            for ev in events:
                await resp.write(f"event: {ev['type']}\n".encode() + sse_event(ev))

        await send(builder.drain())
        try:
            async for item in gen.outputs(state.settings.sse_keepalive_s):
                if item is None:
                    await resp.write(b": ping\n\n")
                    continue
                feed(item[1].text, item[1].finish_reason is not None)
                await send(builder.drain())
            finish()
        except ProtocolError as err:
            builder.fail(err.message)
            gen.log(f"error {err.status} (streamed)")
        await send(builder.drain())
        gen.log("ok")
        return resp
    except (asyncio.CancelledError, ConnectionResetError):
        gen.state.metrics.on_client_disconnected()
        gen.log("client disconnected")
        raise
    finally:
        for c in gen.choices:
            c.handle.abort()


def responses_param(param: str | None) -> str | None:
    """A chat-completions field name as the Responses API calls it."""
    if param is None:
        return None
    for chat, ours in (
        ("response_format.json_schema", "text.format"),
        ("response_format", "text.format"),
        ("max_tokens", "max_output_tokens"),
        ("messages", "input"),
    ):
        if param == chat or param.startswith(chat + ".") or param.startswith(chat + "["):
            return ours + param[len(chat) :]
    return param


def response_store(state: Any) -> ResponseStore:
    if state.responses is None:
        state.responses = ResponseStore(state.settings.responses_store_size, state.settings.responses_ttl_s)
    return state.responses


async def get_response(request: web.Request) -> web.Response:
    """GET /v1/responses/{response_id}"""
    rid = request.match_info["response_id"]
    stored = response_store(request.app[STATE]).get(rid)
    if stored is None:
        e = not_found(rid)
        raise ProtocolError(str(e), e.param, status=404)
    return json_response(stored.response)


async def delete_response(request: web.Request) -> web.Response:
    """DELETE /v1/responses/{response_id}"""
    rid = request.match_info["response_id"]
    if not response_store(request.app[STATE]).delete(rid):
        e = not_found(rid)
        raise ProtocolError(str(e), e.param, status=404)
    return json_response({"id": rid, "object": "response.deleted", "deleted": True})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
