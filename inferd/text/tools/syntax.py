"""The record a tool-call format module registers (registry.FORMATS): how the model writes calls in it, and
everything the rest of inferd needs to know about that writing."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from inferd.text.parsing import Delta
from inferd.text.tools.base import ToolCall, new_call_id
from inferd.text.tools.validation import Tool


class FormatParser(Protocol):
    """A format's parser: an OutputParser (inferd.text.parsing) that keeps the calls it has parsed. Its deltas are
    tool deltas, and the thinking too for a format that carries both (harmony)."""

    @property
    def calls(self) -> list[ToolCall]: ...

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> Sequence[Delta]: ...

    def finish(self) -> Sequence[Delta]: ...


class CallGrammar(Protocol):
    def __call__(
        self,
        tools: Sequence[Tool],
        *,
        parallel: bool,
        trigger_token_id: int | None,
        markers: Mapping[str, int],
        call_ids: bool,
    ) -> str:
        """Lark for the calls of `tools` (several with `parallel`), arguments valid against each one's schema.
        trigger_token_id / markers: the ids of the format's control tokens; call_ids: the template wants ids."""
        ...


@dataclass(frozen=True)
class CallSyntax:
    name: str
    parser: Callable[[Callable[[], str], Iterable[str]], FormatParser]  # (new_id, tool_names) -> a fresh parser
    grammar: CallGrammar
    # the calls written as the grammar has the model write them (with_ids: the ids too, where the format has them)
    write_calls: Callable[[Sequence[ToolCall], bool], str]
    trigger: str | None = None  # the single token that opens a call: a lazy grammar starts there
    shown_markers: tuple[str, ...] = ()  # control tokens the output text must keep for the parser to see calls
    new_id: Callable[[], str] = new_call_id  # the id of a call the model wrote without one
    template_call_id: Callable[[str], str] = str  # a past call's id as the chat template accepts it
    # False where a JSON answer cannot be told from a call (Llama 3's calls are bare JSON objects)
    json_answer_is_distinct: bool = True
