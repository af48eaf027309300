"""Tool-calling request fields: OpenAI's `tools` (functions only) and `tool_choice`, checked, each problem a
ToolError naming the field."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferd.text.grammar import GrammarError

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")


class ToolError(GrammarError):
    """A bad `tools`/`tool_choice`/tool message; `param` names the field."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: Mapping[str, Any]
    strict: bool = False

    def as_openai(self) -> dict[str, Any]:
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = dict(self.parameters)
        return {"type": "function", "function": fn}


def parse_tools(tools: Any, param: str = "tools") -> list[Tool]:
    """OpenAI's `tools` (type "function" only) -> Tools; ToolError naming the bad entry."""
    if tools is None:
        return []
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise ToolError(f"{param} must be a list of tools", param)
    out: list[Tool] = []
    for i, t in enumerate(tools):
        where = f"{param}[{i}]"
        if not isinstance(t, Mapping) or t.get("type") != "function":
            raise ToolError(f'{where} must be {{"type": "function", "function": {{...}}}}', f"{where}.type")
        fn = t.get("function")
        if not isinstance(fn, Mapping):
            raise ToolError(f"{where}.function must be an object with a name", f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise ToolError(
                f"{where}.function.name must be 1-64 letters, digits, '_', '.' or '-', got {name!r}",
                f"{where}.function.name",
            )
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise ToolError(f"{where}.function.parameters must be a JSON schema object", f"{where}.function.parameters")
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ToolError(f"{where}.function.description must be a string", f"{where}.function.description")
        if any(o.name == name for o in out):
            raise ToolError(f"{where}.function.name {name!r} is given twice", f"{where}.function.name")
        out.append(Tool(name, desc, params, bool(fn.get("strict", False))))
    return out


def parse_tool_choice(choice: Any, tools: Sequence[Tool], param: str = "tool_choice") -> tuple[str, str | None]:
    """("none" | "auto" | "required", the forced function's name or None). Without tools: ("none", None)."""
    if choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ToolError(f"{param} must be none, auto, required or a named function, got {choice!r}", param)
        if choice != "none" and not tools:
            raise ToolError(f"{param} {choice!r} needs tools", param)
        return choice, None
    fn = choice.get("function") if isinstance(choice, Mapping) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise ToolError(
            f'{param} must be none, auto, required or {{"type": "function", "function": {{"name": ...}}}}', param
        )
    if not any(t.name == name for t in tools):
        raise ToolError(f"{param} names function {name!r}, which is not among the tools", f"{param}.function.name")
    return "required", name
