"""The conversation and the tools as the chat template expects them.

A template that renders tools (it has a `tools` variable) gets them as OpenAI's function objects, assistant
tool_calls with `arguments` as an object (templates `tojson` it) and tool messages with their function's `name`
filled in from the call they answer; call ids as the format's templates accept them. A generic template (one that
knows nothing of tools) gets the tools in a system block (GENERIC_TOOLS_BLOCK) that asks for the Hermes syntax,
and past calls and results written into the conversation as that syntax (results as user turns).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from inferd.text.tools.base import ToolCall
from inferd.text.tools.hermes import write_calls as write_hermes_calls
from inferd.text.tools.registry import ToolFormat, syntax_of
from inferd.text.tools.validation import Tool, ToolError

GENERIC_TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query. The functions, as JSON "
    "signatures, are within <tools></tools>:\n<tools>\n{tools}\n</tools>\n\nTo call a function, answer with one "
    "<tool_call></tool_call> block per call, each holding a JSON object with the function's name and arguments:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def prepare_messages(
    messages: Sequence[Mapping[str, Any]], fmt: ToolFormat, tools: Sequence[Tool] = ()
) -> list[dict[str, Any]]:
    """The conversation as the template expects it.

    Templates that render tools get assistant tool_calls with `arguments` as an object (they `tojson` it) and tool
    messages with their function's `name` filled in from the call they answer. A generic template gets the tools
    in a system block and the calls/results written as hermes-syntax text (tool results as user turns)."""
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    fix_id = syntax_of(fmt).template_call_id  # Mistral's templates accept only 9-character ids
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ToolError(f"messages[{i}] must be an object", f"messages[{i}]")
        msg = dict(m)
        role = msg.get("role")
        if role == "assistant" and msg.get("tool_calls"):
            calls = []
            for j, tc in enumerate(msg["tool_calls"]):
                fn = tc.get("function") if isinstance(tc, Mapping) else None
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                    raise ToolError(
                        f"messages[{i}].tool_calls[{j}] must have function.name", f"messages[{i}].tool_calls[{j}]"
                    )
                args = fn.get("arguments", "{}")
                try:
                    args_obj = json.loads(args) if isinstance(args, str) else args
                except json.JSONDecodeError:
                    args_obj = args
                call_id = fix_id(str(tc["id"])) if tc.get("id") else None
                if call_id:
                    names[call_id] = fn["name"]
                calls.append(
                    {"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": args_obj}}
                )
            msg["tool_calls"] = calls
        elif role == "tool":
            msg["content"] = _text(msg.get("content"), i)
            if msg.get("tool_call_id"):
                msg["tool_call_id"] = fix_id(str(msg["tool_call_id"]))
            if "name" not in msg and msg.get("tool_call_id") in names:
                msg["name"] = names[msg["tool_call_id"]]
        out.append(msg)
    if fmt.template_renders_tools:
        return out
    if fmt.name in WRITES_ITS_OWN_CALLS:
        return _with_tools_block(out, tools, fmt)
    return _generic_conversation(out, tools)


# formats whose templates write past calls and results themselves even where they take no `tools` (DeepSeek's
# published templates): only the tools go in a system block, with a call in the format's own syntax as the example
WRITES_ITS_OWN_CALLS = ("deepseek_v3", "deepseek_v31", "qwen3_coder", "glm45")
OWN_TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query. The functions, as JSON "
    "signatures, are within <tools></tools>:\n<tools>\n{tools}\n</tools>\n\nTo call a function, answer with:\n"
    "{example}"
)


def _with_tools_block(messages: list[dict[str, Any]], tools: Sequence[Tool], fmt: ToolFormat) -> list[dict[str, Any]]:
    if not tools:
        return messages
    example = syntax_of(fmt).write_calls([ToolCall("", "<function-name>", "<args-json-object>")], False)
    block = OWN_TOOLS_BLOCK.format(
        tools="\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools), example=example
    )
    out = list(messages)
    if out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": f"{_text(out[0].get('content'), 0)}\n\n{block}"}
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


def template_tools(tools: Sequence[Tool], fmt: ToolFormat) -> list[dict[str, Any]] | None:
    """What to pass as the template's `tools` variable (None for a generic template: the block carries them)."""
    return [t.as_openai() for t in tools] if fmt.template_renders_tools and tools else None


def _text(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise ToolError(f"messages[{index}].content must be a string or a list of text parts", f"messages[{index}].content")


def _generic_conversation(messages: list[dict[str, Any]], tools: Sequence[Tool]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [
                ToolCall(
                    c["id"] or "", c["function"]["name"], json.dumps(c["function"]["arguments"], ensure_ascii=False)
                )
                for c in m["tool_calls"]
            ]
            content = m.get("content") or ""
            out.append({"role": "assistant", "content": (content + "\n" + write_hermes_calls(calls)).strip("\n")})
        elif m.get("role") == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("role") == "user" and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append(m)
    for m in out:
        m.pop("_tool_results", None)
    if tools:
        block = GENERIC_TOOLS_BLOCK.format(
            tools="\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
        )
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{_text(out[0].get('content'), 0)}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out
