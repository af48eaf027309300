"""Request fields -> a GrammarSpec: which field constrains the output (one at most), checked and turned into
llguidance's grammar text. Every problem is a GrammarError naming the field it came from."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llguidance as llg

# Fields that carry a constraint, in the order they are looked at.
CONSTRAINT_FIELDS = (
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "grammar",
    "json_schema",
)

# Whitespace JSON may hold between tokens, bounded as llama.cpp's json-schema-to-grammar bounds it: a small model
# under an unbounded pattern can emit newlines forever. Indentation up to 40 columns; a schema's own
# "x-guidance" options or a request's guided_whitespace_pattern take precedence.
JSON_WHITESPACE = r"(?:[ \t]{0,20}|\n{1,2}[ \t]{0,40})"


class GrammarError(ValueError):
    """A constraint that cannot be used; `param` names the request field (OpenAI's error.param)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class GrammarSpec:
    """A constraint from a request: the llguidance grammar (a JSON string) and where it came from."""

    grammar: str
    param: str
    kind: str  # json_schema | json_object | regex | choice | grammar | tools


# ---- request fields -> GrammarSpec ------------------------------------------------------------------------------
def grammar_from_request(fields: Mapping[str, Any]) -> GrammarSpec | None:
    """The one constraint among `fields` (a request body, or the constraint fields of one), or None."""
    found: list[tuple[str, Any]] = [(k, fields[k]) for k in CONSTRAINT_FIELDS if fields.get(k) is not None]
    found = [(k, v) for k, v in found if not (k == "response_format" and _is_text_format(v))]
    if not found:
        return None
    if len(found) > 1:
        raise GrammarError(f"{found[0][0]} and {found[1][0]} both constrain the output; send only one", found[1][0])
    name, value = found[0]
    whitespace = fields.get("guided_whitespace_pattern")
    if name == "response_format":
        return response_format_grammar(value)
    if name in ("guided_json", "json_schema"):
        return json_schema_grammar(value, name, whitespace_pattern=whitespace)
    if name == "guided_regex":
        return regex_grammar(value, name)
    if name == "guided_choice":
        return choice_grammar(value, name)
    if name in ("guided_grammar", "grammar"):
        return lark_or_gbnf_grammar(value, name)
    return structured_outputs_grammar(value)


def _is_text_format(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type") == "text"


def response_format_grammar(rf: Any, param: str = "response_format") -> GrammarSpec | None:
    """OpenAI's response_format (chat and the Responses API's text.format share this shape, minus nesting)."""
    if not isinstance(rf, Mapping) or not isinstance(rf.get("type"), str):
        raise GrammarError(f"{param} must be an object with a type (text, json_object or json_schema)", param)
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return json_schema_grammar({"type": "object"}, param, kind="json_object")
    if kind != "json_schema":
        raise GrammarError(
            f"{param}.type {kind!r} is not supported (text, json_object or json_schema)", f"{param}.type"
        )
    # chat completions nest the schema under "json_schema"; the Responses API's text.format has it flat
    spec = rf.get("json_schema", rf if "schema" in rf or "name" in rf else None)
    where = f"{param}.json_schema" if "json_schema" in rf else param
    if not isinstance(spec, Mapping):
        raise GrammarError(f"{where} must be an object with a name and a schema", where)
    name = spec.get("name")
    if not isinstance(name, str) or not name or len(name) > 64 or not all(c.isalnum() or c in "_-" for c in name):
        raise GrammarError(f"{where}.name must be 1-64 letters, digits, '_' or '-', got {name!r}", f"{where}.name")
    schema = spec.get("schema", {})
    return json_schema_grammar(schema, f"{where}.schema")


def json_schema_grammar(
    schema: Any, param: str, *, kind: str = "json_schema", whitespace_pattern: str | None = None, compact: bool = False
) -> GrammarSpec:
    """compact: no whitespace at all between JSON tokens (vLLM's disable_any_whitespace)."""
    if isinstance(schema, str):  # vLLM accepts the schema as a JSON string too
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"{param} is not valid JSON: {e}", param) from e
    if not isinstance(schema, (Mapping, bool)):
        raise GrammarError(f"{param} must be a JSON schema (an object), got {type(schema).__name__}", param)
    overrides: dict[str, Any] = {}
    if whitespace_pattern is not None:
        if not isinstance(whitespace_pattern, str):
            raise GrammarError("guided_whitespace_pattern must be a string", "guided_whitespace_pattern")
        overrides["whitespace_pattern"] = whitespace_pattern
    if compact:
        overrides.update(whitespace_flexible=False, whitespace_pattern=None)
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(
            json.dumps(schema),
            defaults={"whitespace_pattern": JSON_WHITESPACE},
            overrides=overrides or None,  # type: ignore[arg-type]
        )
    except (ValueError, TypeError) as e:
        what = "nested past the limits" if "recursion limit" in str(e) else "invalid JSON schema"
        raise GrammarError(f"{param}: {what}: {e}", param) from e
    return GrammarSpec(grammar, param, kind)


def regex_grammar(regex: Any, param: str) -> GrammarSpec:
    if not isinstance(regex, str) or not regex:
        raise GrammarError(f"{param} must be a non-empty string (a regular expression)", param)
    return GrammarSpec(llg.LLMatcher.grammar_from_regex(regex), param, "regex")


def choice_grammar(choices: Any, param: str) -> GrammarSpec:
    if (
        not isinstance(choices, Sequence)
        or isinstance(choices, str)
        or not choices
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise GrammarError(f"{param} must be a non-empty list of non-empty strings", param)
    lark = "start: " + " | ".join(json.dumps(c) for c in choices)
    return GrammarSpec(llg.LLMatcher.grammar_from_lark(lark), param, "choice")


def lark_or_gbnf_grammar(text: Any, param: str) -> GrammarSpec:
    """A Lark grammar (llguidance's syntax) or a GBNF one (llama.cpp's; converted to Lark)."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError(f"{param} must be a non-empty grammar (Lark or GBNF)", param)
    try:
        grammar = llg.grammar_from("grammar", text)
    except ValueError as e:
        raise GrammarError(f"{param}: invalid grammar: {e}", param) from e
    return GrammarSpec(grammar, param, "grammar")


def structured_outputs_grammar(so: Any, param: str = "structured_outputs") -> GrammarSpec | None:
    if not isinstance(so, Mapping):
        raise GrammarError(f"{param} must be an object with one of json, regex, choice, grammar, json_object", param)
    keys = [k for k in ("json", "regex", "choice", "grammar", "json_object") if so.get(k) not in (None, False)]
    unknown = sorted(
        k
        for k, v in so.items()
        if v is not None
        and k
        not in (
            "json",
            "regex",
            "choice",
            "grammar",
            "json_object",
            "whitespace_pattern",
            "disable_additional_properties",
            "disable_any_whitespace",
            "disable_fallback",
        )
    )
    if unknown:
        raise GrammarError(
            f"{param}.{unknown[0]} is not supported (json, regex, choice, grammar, json_object)",
            f"{param}.{unknown[0]}",
        )
    if len(keys) != 1:
        raise GrammarError(
            f"{param} needs exactly one of json, regex, choice, grammar, json_object (got {', '.join(keys) or 'none'})",
            param,
        )
    key = keys[0]
    where = f"{param}.{key}"
    if key == "json":
        return json_schema_grammar(
            so[key],
            where,
            whitespace_pattern=so.get("whitespace_pattern"),
            compact=bool(so.get("disable_any_whitespace")),
        )
    if key == "json_object":
        return json_schema_grammar({"type": "object"}, where, kind="json_object")
    if key == "regex":
        return regex_grammar(so[key], where)
    if key == "choice":
        return choice_grammar(so[key], where)
    return lark_or_gbnf_grammar(so[key], where)
