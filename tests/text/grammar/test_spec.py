"""inferd.text.grammar.spec: every request form (OpenAI, vLLM, llama-server) gives its grammar, and every bad one
is an error naming the field."""
from __future__ import annotations

import json

import llguidance as llg
import pytest

from inferd.text.grammar import GrammarError, grammar_from_request
from tests.text.grammar.walks import SCHEMA


def test_no_constraint_and_text_format_give_none():
    assert grammar_from_request({}) is None
    assert grammar_from_request({"response_format": {"type": "text"}, "guided_json": None}) is None


@pytest.mark.parametrize("fields,kind,param", [
    ({"response_format": {"type": "json_object"}}, "json_object", "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     "json_schema", "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "name": "x", "schema": SCHEMA}}, "json_schema",
     "response_format.schema"),                                          # the Responses API's flat text.format
    ({"guided_json": SCHEMA}, "json_schema", "guided_json"),
    ({"guided_json": json.dumps(SCHEMA)}, "json_schema", "guided_json"),
    ({"guided_regex": "a+"}, "regex", "guided_regex"),
    ({"guided_choice": ["a", "b"]}, "choice", "guided_choice"),
    ({"guided_grammar": 'start: "a"+'}, "grammar", "guided_grammar"),
    ({"grammar": 'root ::= "a"+'}, "grammar", "grammar"),
    ({"json_schema": SCHEMA}, "json_schema", "json_schema"),
    ({"structured_outputs": {"json": SCHEMA}}, "json_schema", "structured_outputs.json"),
    ({"structured_outputs": {"regex": "a+"}}, "regex", "structured_outputs.regex"),
    ({"structured_outputs": {"choice": ["x"]}}, "choice", "structured_outputs.choice"),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "grammar", "structured_outputs.grammar"),
    ({"structured_outputs": {"json_object": True}}, "json_object", "structured_outputs.json_object"),
])
def test_every_request_form_gives_a_grammar(fields, kind, param):
    spec = grammar_from_request(fields)
    assert spec is not None and spec.kind == kind and spec.param == param
    assert llg.LLMatcher.validate_grammar(spec.grammar) == ""


@pytest.mark.parametrize("fields,param,message", [
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", "send only one"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "not supported"),
    ({"response_format": "json"}, "response_format", "must be an object"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "name and a schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     "response_format.json_schema.name", "name must be"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}},
     "response_format.json_schema.name", "name must be"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
     "response_format.json_schema.schema", "must be a JSON schema"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_regex": ""}, "guided_regex", "non-empty"),
    ({"guided_choice": []}, "guided_choice", "non-empty list"),
    ({"guided_choice": "ab"}, "guided_choice", "non-empty list"),
    ({"guided_grammar": 'root ::= "a" | b'}, "guided_grammar", "invalid grammar"),
    ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag", "not supported"),
    ({"guided_json": {}, "guided_whitespace_pattern": 5}, "guided_whitespace_pattern", "string"),
    ({"guided_json": json.loads('{"type":"array","items":' * 300 + "{}" + "}" * 300)}, "guided_json",
     "nested past the limits"),
])
def test_bad_request_forms_name_the_field(fields, param, message):
    with pytest.raises(GrammarError, match=message) as e:
        grammar_from_request(fields)
    assert e.value.param == param
