"""Lark pieces the formats' call grammars share: a call object with one of the tools' names and arguments valid
against that tool's parameters schema, repetition for parallel calls, and "this JSON answer, or the calls"."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from inferd.text.grammar import JSON_WHITESPACE
from inferd.text.tools.validation import Tool


def args_schema(tool: Tool) -> dict[str, Any]:
    """The tool's parameters schema under the server's bounded JSON whitespace."""
    return {**dict(tool.parameters), "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}


def call_object(tools: Iterable[Tool], args_key: str) -> str:
    """A Lark `%json` item: {"name": <one of the tools>, <args_key>: <its arguments>}."""
    options = [
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", args_key],
            "properties": {"name": {"const": t.name}, args_key: dict(t.parameters)},
        }
        for t in tools
    ]
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    return "%json " + json.dumps({**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}})


def repeated(item: str, sep: str, parallel: bool) -> str:
    """`item`, or (parallel) one or more of it separated by the literal `sep`."""
    return item + " (" + json.dumps(sep) + " " + item + ")*" if parallel else item


def or_json(lark: str, schema: Mapping[str, Any] | None) -> str:
    """The calls grammar, or (given a schema) that JSON answer instead."""
    if schema is None:
        return lark
    lark = lark.replace("start: ", "calls: ", 1)
    return "start: answer | calls\nanswer: %json " + json.dumps(dict(schema)) + "\n" + lark
