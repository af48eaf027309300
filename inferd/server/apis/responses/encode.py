"""The Responses API's encoder: the text deltas and tool-call deltas of the answer -> output items `message`
(output_text) and `function_call`, the response object, and for `stream: true` OpenAI's typed events, each with a
sequence_number. A finished response is stored (unless `store` is false) for previous_response_id and GET."""

from __future__ import annotations

import secrets
import string
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from inferd.server.apis.responses.items import encrypt_reasoning
from inferd.server.apis.responses.render import ChatPlan, ResponsesContext
from inferd.server.apis.responses.request import ResponsesRequest
from inferd.server.apis.responses.tools import exposed_name
from inferd.server.choices import Generation
from inferd.server.generation import Rendered
from inferd.server.protocol import ProtocolError
from inferd.server.sse import PING, SSE, sse_event
from inferd.server.apis.openai_fields import count_tokens
from inferd.server.structured import answer_parser
from inferd.text.parsing import Delta, ReasoningDelta
from inferd.text.tools import ContentDelta, ToolCallStart


def new_id(prefix: str) -> str:
    alphabet = string.ascii_lowercase + string.digits
    return f"{prefix}_" + "".join(secrets.choice(alphabet) for _ in range(32))


class ResponseBuilder:
    """Turns the answer's deltas (text, tool-call starts, argument fragments) into output items, collecting the
    typed stream events they make (take them with drain()). The final object is response()."""

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
        self._reasoning: dict[str, Any] | None = None  # the open reasoning item
        self._emit("response.created", response=self.response())
        self._emit("response.in_progress", response=self.response())

    def _emit(self, kind: str, **fields: Any) -> None:
        self._events.append({"type": kind, "sequence_number": self._seq, **fields})
        self._seq += 1

    def drain(self) -> list[dict[str, Any]]:
        events, self._events = self._events, []
        return events

    def add(self, event: Delta) -> None:
        if isinstance(event, ReasoningDelta):
            self._add_reasoning(event.text)
            return
        self._close_reasoning()
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
            namespace, name = self.plan.names.client_name(event.name)
            item = {
                "type": "function_call",
                "id": new_id("fc"),
                "call_id": event.id,
                "name": name,
                **({"namespace": namespace} if namespace else {}),
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

    def _add_reasoning(self, text: str) -> None:
        """The thinking, as a reasoning item with one reasoning_text part (before the answer's items)."""
        if self._reasoning is None:
            self._reasoning = {
                "type": "reasoning",
                "id": new_id("rs"),
                "summary": [],
                "status": "in_progress",
                "content": [{"type": "reasoning_text", "text": ""}],
            }
            self.output.append(self._reasoning)
            self._emit(
                "response.output_item.added", output_index=len(self.output) - 1, item={**self._reasoning, "content": []}
            )
        item = self._reasoning
        item["content"][0]["text"] += text
        self._emit(
            "response.reasoning_text.delta",
            item_id=item["id"],
            output_index=self.output.index(item),
            content_index=0,
            delta=text,
        )

    def _close_reasoning(self) -> None:
        item, self._reasoning = self._reasoning, None
        if item is None:
            return
        index = self.output.index(item)
        self._emit(
            "response.reasoning_text.done",
            item_id=item["id"],
            output_index=index,
            content_index=0,
            text=item["content"][0]["text"],
        )
        item["status"] = "completed"
        if self.plan.reasoning_content:  # the thinking, for a client that replays it (include)
            item["encrypted_content"] = encrypt_reasoning(item["content"][0]["text"])
        self._emit("response.output_item.done", output_index=index, item=dict(item))

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
        self._close_reasoning()
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
            "output_tokens_details": {"reasoning_tokens": usage.get("reasoning_tokens", 0)},
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
            "reasoning": {
                "effort": None,
                "summary": None,
                **{k: v for k, v in (e.get("reasoning") or {}).items() if k in ("effort", "summary")},
            },
            "service_tier": "default",
            "truncation": e.get("truncation") or "disabled",
            "user": e.get("user"),
            "safety_identifier": e.get("safety_identifier"),
            "prompt_cache_key": e.get("prompt_cache_key"),
            "max_tool_calls": e.get("max_tool_calls"),
            "top_logprobs": e.get("top_logprobs"),
            "background": False,
            "usage": self.usage,
        }

    def thinking(self) -> str:
        return "".join(p["text"] for i in self.output if i["type"] == "reasoning" for p in i["content"])

    def output_messages(self) -> list[dict[str, Any]]:
        """The output as chat messages (kept in the store for previous_response_id)."""
        text = "".join(p["text"] for i in self.output if i["type"] == "message" for p in i["content"])
        calls = [
            {"id": i["call_id"], "type": "function", "function": {"name": chat_name(i), "arguments": i["arguments"]}}
            for i in self.output
            if i["type"] == "function_call"
        ]
        msg: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            msg["tool_calls"] = calls
        thinking = self.thinking()
        if thinking:
            msg["reasoning_content"] = thinking
        return [msg]


def chat_name(item: Mapping[str, Any]) -> str:
    """A function_call item's function as the model saw it (a namespaced one under its joined name)."""
    return exposed_name(item["namespace"], item["name"]) if item.get("namespace") else item["name"]


class ResponsesEncoder:
    content_type = SSE

    def __init__(self, gen: Generation, req: ResponsesRequest, rendered: Rendered[ResponsesContext]):
        self.gen, self.context = gen, rendered.context
        self.headers = self.context.plan.headers  # what was left out (hosted tools and their items)
        self.builder = ResponseBuilder(gen.model, self.context.plan)
        self.parser, _ = answer_parser(self.context.prep)

    def feed(self, text: str, final: bool) -> None:
        if self.parser is None:
            self.builder.add(ContentDelta(text))
            return
        for e in [*self.parser.feed(text), *(self.parser.finish() if final else [])]:
            self.builder.add(e)

    def finish(self) -> dict[str, Any]:
        """The response, completed (or incomplete at its length), stored if asked."""
        u = self.gen.usage()
        usage = {
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "cached_tokens": u.cached_tokens,
            "reasoning_tokens": count_tokens(self.gen.state.tokenizer, self.builder.thinking()),
        }
        response = self.builder.finish(self.gen.choices[0].finish_reason or "stop", usage)
        p = self.context.plan
        if p.store:
            self.context.store.put(response, p.messages + self.builder.output_messages())
        return response

    def events(self) -> bytes:
        return b"".join(f"event: {ev['type']}\n".encode() + sse_event(ev) for ev in self.builder.drain())

    def full(self) -> dict[str, Any]:
        self.feed(self.gen.choices[0].text, final=True)
        return self.finish()

    async def stream(self) -> AsyncIterator[bytes]:
        yield self.events()  # response.created, response.in_progress
        async for item in self.gen.outputs(self.gen.state.settings.sse_keepalive_s):
            if item is None:
                yield PING
                continue
            self.feed(item[1].text, item[1].finish_reason is not None)
            events = self.events()
            if events:
                yield events
        self.finish()
        yield self.events()

    def stream_error(self, err: ProtocolError) -> bytes:
        self.builder.fail(err.message)
        return self.events()

    def stream_end(self) -> bytes:
        return b""  # the last event (response.completed or .incomplete) ends the stream
