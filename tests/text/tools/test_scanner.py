"""inferd.text.tools.scanner: the JSON call object and JSON value scanners stop exactly at their value's end, and
say what they read (a call's name, its arguments' text as written)."""
from __future__ import annotations

from inferd.text.tools.scanner import CallObject, JsonValue, partial_suffix


def test_json_value_scanner():
    for text, value, rest in [('{"a": "}"} tail', '{"a": "}"}', " tail"), ("  [1, [2]]x", "[1, [2]]", "x"),
                              ('"s\\"q" z', '"s\\"q"', " z"), ("12[TOOL_CALLS]", "12", "[TOOL_CALLS]")]:
        v = JsonValue()
        taken = v.feed(text)
        assert (v.raw, text[taken:], v.done) == (value, rest, True)


def test_call_object_reads_the_name_and_the_arguments_as_written():
    obj = CallObject()
    text = '{"arguments": {"a": [1, "}"]},  "name": "f"}\n</tool_call>'
    taken = obj.feed(text[:20]) + obj.feed(text[20:])
    assert text[taken:] == "\n</tool_call>" and obj.done
    assert (obj.name, obj.arguments_so_far()) == ("f", '{"a": [1, "}"]}')


def test_call_object_gives_arguments_as_they_arrive_and_a_string_only_when_whole():
    obj = CallObject()
    obj.feed('{"name": "f", "parameters": {"city": "Pa')
    assert (obj.name, obj.arguments_so_far(), obj.done) == ("f", '{"city": "Pa', False)
    obj = CallObject()
    obj.feed('{"name": "f", "arguments": "{\\"a\\": ')
    assert obj.arguments_so_far() == ""                        # a JSON string holding JSON: the inner text, once whole
    obj.feed('1}"}')
    assert obj.arguments_so_far() == '{"a": 1}' and obj.done


def test_what_is_not_an_object_is_no_call():
    obj = CallObject()
    assert obj.feed("[1, 2]") == 1 and obj.done and obj.name is None


def test_partial_suffix_is_the_longest_end_that_begins_the_marker():
    assert partial_suffix("text <tool_ca", "<tool_call>") == len("<tool_ca")
    assert partial_suffix("text", "<tool_call>") == 0
    assert partial_suffix("[TOOL_CALLS]", "[TOOL_CALLS]") == 0     # a whole marker is found, not held back


def test_keys_an_unconstrained_model_wrote_badly_are_read_as_written_not_a_crash():
    for text, key in [('{"na\nme": 1, "name": "f", "arguments": {}}', "na\nme"),
                      ('{"na\\xme": 1, "name": "f", "arguments": {}}', "na\\xme")]:
        obj = CallObject()
        cut = text.index(":")
        obj.feed(text[:cut])
        assert obj.key == key
        obj.feed(text[cut:])
        assert (obj.done, obj.name, obj.arguments_so_far()) == (True, "f", "{}")
