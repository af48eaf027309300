"""The Responses API's `tools` and `tool_choice` as coding agents send them, in chat completions' shape.

- `function` tools are flat ({"type", "name", "parameters", ...}); chat nests them under `function`.
- `namespace` tools group function tools under a name; the model sees each as a function named
  `<namespace>.<name>` (with the namespace's description before its own), and a call to one goes back to the
  client as its own name with the `namespace` beside it (ToolNames).
- Hosted tools (web search, file search, code interpreter, computer use, image generation, MCP, shells, custom
  grammar tools...) run on OpenAI's side; a local server cannot run them, so they are left out of the prompt and
  named (`ignored`) for the response header and the log; a tool_choice that forces one is a 400.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferd.server.protocol import ProtocolError
from inferd.text.tools.validation import TOOL_NAME

# tool types the server leaves out: they run on the provider's side (or take free-form grammar input)
HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "computer",
        "computer_use_preview",
        "image_generation",
        "mcp",
        "local_shell",
        "shell",
        "apply_patch",
        "custom",
        "tool_search",
        "programmatic_tool_calling",
    }
)


@dataclass
class ToolNames:
    """The chat-side function name of each namespaced tool -> (its namespace, its own name)."""

    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)

    def client_name(self, exposed: str) -> tuple[str | None, str]:
        """(namespace or None, the name the client gave) of the function the model called."""
        ns, name = self.namespaced.get(exposed, (None, exposed))
        return ns, name


@dataclass
class ResponseTools:
    tools: list[dict[str, Any]] | None  # chat completions' form (None: the request had none)
    names: ToolNames
    ignored: list[str]  # the hosted tools left out, as "type" or "type:name"


def exposed_name(namespace: str, name: str) -> str:
    return f"{namespace}.{name}"


def _function(t: Mapping[str, Any], where: str, name: str, prefix: str | None = None) -> dict[str, Any]:
    if not TOOL_NAME.match(name):
        raise ProtocolError(
            f"{where}.name must make a function name of 1-64 letters, digits, '_', '.' or '-', got {name!r}",
            f"{where}.name",
        )
    fn: dict[str, Any] = {k: t[k] for k in ("parameters", "strict") if t.get(k) is not None}
    description = t.get("description")
    if description is not None and not isinstance(description, str):
        raise ProtocolError(f"{where}.description must be a string", f"{where}.description")
    if prefix and description:
        description = f"{prefix}\n{description}"
    elif prefix:
        description = prefix
    if description is not None:
        fn["description"] = description
    return {"type": "function", "function": {"name": name, **fn}}


def _ignored_name(t: Mapping[str, Any]) -> str:
    kind = str(t.get("type"))
    label = t.get("server_label") if kind == "mcp" else t.get("name")
    return f"{kind}:{label}" if isinstance(label, str) and label else kind


def chat_tools(tools: Any) -> ResponseTools:
    """`tools` -> the functions the model sees (namespaces flattened), their names back, the hosted ones left out."""
    names, ignored = ToolNames(), list[str]()
    if tools is None:
        return ResponseTools(None, names, ignored)
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise ProtocolError("tools must be a list", "tools")
    out: list[dict[str, Any]] = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        kind = t.get("type") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or not isinstance(kind, str):
            raise ProtocolError(f"{where} must be an object with a type", f"{where}.type")
        if kind == "function":
            name = t.get("name")
            if not isinstance(name, str):
                raise ProtocolError(f"{where}.name must be a string", f"{where}.name")
            out.append(_function(t, where, name))
        elif kind == "namespace":
            out += _namespace(t, where, names, ignored)
        elif kind in HOSTED_TOOLS:
            ignored.append(_ignored_name(t))
        else:
            raise ProtocolError(
                f"{where}: tool type {kind!r} is not supported (function, namespace, or a hosted tool, which is "
                "left out)",
                f"{where}.type",
            )
    return ResponseTools(out, names, ignored)


def _namespace(t: Mapping[str, Any], where: str, names: ToolNames, ignored: list[str]) -> list[dict[str, Any]]:
    ns, members = t.get("name"), t.get("tools")
    if not isinstance(ns, str) or not ns:
        raise ProtocolError(f"{where}.name must be the namespace's name", f"{where}.name")
    if not isinstance(members, Sequence) or isinstance(members, (str, bytes)):
        raise ProtocolError(f"{where}.tools must be a list of function tools", f"{where}.tools")
    desc = t.get("description")
    prefix = f"({ns}: {desc})" if isinstance(desc, str) and desc else None
    out = []
    for j, m in enumerate(members):
        inner = f"{where}.tools[{j}]"
        kind = m.get("type") if isinstance(m, Mapping) else None
        if not isinstance(m, Mapping) or not isinstance(m.get("name"), str):
            raise ProtocolError(f"{inner} must be a function tool with a name", inner)
        if kind == "custom":
            ignored.append(f"custom:{ns}.{m['name']}")
            continue
        if kind != "function":
            raise ProtocolError(f"{inner}: a namespace holds function tools, got type {kind!r}", f"{inner}.type")
        exposed = exposed_name(ns, m["name"])
        names.namespaced[exposed] = (ns, m["name"])
        out.append(_function(m, inner, exposed, prefix))
    return out


def chat_tool_choice(choice: Any, tools: ResponseTools) -> tuple[Any, list[dict[str, Any]] | None]:
    """tool_choice -> (chat completions' tool_choice, the tools it allows: `allowed_tools` narrows them).

    A choice forcing a hosted tool is a 400: the server cannot run it, and quietly calling something else would be
    a wrong answer."""
    if not isinstance(choice, Mapping):
        return choice, tools.tools
    kind = choice.get("type")
    if kind == "function":
        name = choice.get("name")
        ns = choice.get("namespace")
        if isinstance(ns, str) and isinstance(name, str):
            name = exposed_name(ns, name)
        return {"type": "function", "function": {"name": name}}, tools.tools
    if kind == "allowed_tools":
        mode, allowed = choice.get("mode", "auto"), choice.get("tools")
        if mode not in ("auto", "required") or not isinstance(allowed, Sequence):
            raise ProtocolError(
                'tool_choice.allowed_tools needs mode "auto" or "required" and a list of tools', "tool_choice"
            )
        wanted = {
            exposed_name(a["namespace"], a["name"]) if a.get("namespace") else a.get("name")
            for a in allowed
            if isinstance(a, Mapping) and a.get("type") in ("function", None)
        }
        kept = [t for t in tools.tools or () if t["function"]["name"] in wanted]
        return mode, kept
    if isinstance(kind, str) and (kind in HOSTED_TOOLS or kind.startswith(("web_search", "computer"))):
        raise ProtocolError(
            f"tool_choice forces the hosted tool {kind!r}, which this server cannot run (it runs functions only)",
            "tool_choice",
        )
    raise ProtocolError(f"tool_choice type {kind!r} is not supported", "tool_choice")
