"""The parser for a detected format: ToolCallParser picks the format's own parser from the registry, and
parse_tool_calls runs it over a whole output. Streaming and whole-text parsing are this same parser, so they
always agree."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from inferd.text.parsing import ContentDelta, Delta
from inferd.text.tools.base import CallParser, ToolCall
from inferd.text.tools.registry import ToolFormat, syntax_of


class ToolCallParser:
    """Feed the model's output text piece by piece; get back content deltas and OpenAI tool-call deltas (a call's
    index, id and name first, then fragments of its arguments). An OutputParser (inferd.text.parsing)."""

    def __init__(
        self,
        fmt: ToolFormat | str,
        new_id: Callable[[], str] | None = None,
        tool_names: Iterable[str] = (),
        param_schemas: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        """tool_names: the request's tools. With them, hermes-style models may also answer with a fenced
        ```json {"name": <a tool>, "arguments": {...}}``` block (Qwen2.5-Coder does), which counts as a call.
        new_id: makes call ids (default: the format's, "call_..." or Mistral's 9-character ones).
        param_schemas: tool name -> parameters schema, which types the bare-text values of the XML formats."""
        syntax = syntax_of(fmt)
        self.fmt = fmt.name if isinstance(fmt, ToolFormat) else fmt
        self._parser = syntax.parser(new_id or syntax.new_id, tool_names)
        if param_schemas and isinstance(self._parser, CallParser):  # (harmony's calls are JSON: it needs none)
            self._parser.param_schemas = dict(param_schemas)

    @property
    def calls(self) -> list[ToolCall]:
        return self._parser.calls

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Delta]:
        return list(self._parser.feed(text, token_ids))

    def finish(self) -> list[Delta]:
        return list(self._parser.finish())


def parse_tool_calls(
    text: str,
    fmt: ToolFormat | str,
    new_id: Callable[[], str] | None = None,
    tool_names: Iterable[str] = (),
    param_schemas: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[str | None, list[ToolCall]]:
    """The whole output -> (content or None, tool calls). Content that is only whitespace around calls is None."""
    parser = ToolCallParser(fmt, new_id, tool_names, param_schemas)
    events = parser.feed(text) + parser.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return (None if parser.calls and not content else content), parser.calls
