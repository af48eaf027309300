"""inferd.text.tools.registry: every format is listed and round-trips (calls written in its syntax are what its own
grammar accepts, token by token, and what its parser gives back), and the format is detected from the chat
template (and, for Mistral, the vocabulary's control tokens)."""
from __future__ import annotations

import importlib

import pytest

from inferd.text.tools import (
    DEEPSEEK_V3,
    DEEPSEEK_V31,
    FORMATS,
    GENERIC,
    GLM45,
    HARMONY,
    HERMES,
    LLAMA3,
    MISTRAL,
    MISTRAL_V11,
    QWEN3_CODER,
    ToolCall,
    ToolFormat,
    detect_format,
    marker_ids,
    parse_tool_calls,
    parse_tools,
    shown_tokens,
    syntax_of,
    tool_call_grammar,
    trigger_token,
)
from tests.text.mistral_v11 import MISTRAL_SMALL_32, MISTRAL_V11_NO_IDS
from tests.text.tools.calls import TIME, ids, weather


def test_the_registry_lists_every_format_by_its_module():
    assert sorted(FORMATS) == sorted([HERMES, LLAMA3, MISTRAL, MISTRAL_V11, QWEN3_CODER, GLM45, DEEPSEEK_V3,
                                      DEEPSEEK_V31, HARMONY, GENERIC])
    assert (HERMES, LLAMA3, MISTRAL, MISTRAL_V11, GENERIC) == ("hermes", "llama3", "mistral", "mistral_v11", "generic")
    assert (QWEN3_CODER, GLM45, DEEPSEEK_V3, DEEPSEEK_V31) == ("qwen3_coder", "glm45", "deepseek_v3", "deepseek_v31")
    for name, syntax in FORMATS.items():
        module = importlib.import_module(f"inferd.text.tools.{syntax.name}")
        assert module.SYNTAX is syntax
        assert syntax.name == (HERMES if name == GENERIC else name)     # a generic template is taught Hermes
        assert syntax_of(name) is syntax is syntax_of(ToolFormat(name, True))
    assert [n for n, s in FORMATS.items() if s.trigger] == [HERMES, MISTRAL, MISTRAL_V11, QWEN3_CODER, GLM45,
                                                            DEEPSEEK_V3, DEEPSEEK_V31, GENERIC]


CALLS = [ToolCall("a1B2c3D4e", "get_time", '{"tz": "CET"}'),
         ToolCall("Z9y8X7w6v", "get_weather", '{"city": "Oslo", "unit": "celsius"}')]


@pytest.mark.parametrize("fmt", [ToolFormat(n, True) for n in FORMATS if n != HARMONY]  # test_harmony.py has its own
                         + [ToolFormat(MISTRAL_V11, True, True)],
                         ids=lambda f: f.name + ("+ids" if f.call_ids else ""))
@pytest.mark.parametrize("parallel", [False, True])
def test_each_format_round_trips_calls_its_grammar_accepts(mistral, fmt, parallel):
    tok, compiler = mistral
    calls = CALLS if parallel else CALLS[:1]
    text = syntax_of(fmt).write_calls(calls, fmt.call_ids)
    assert ("[CALL_ID]a1B2c3D4e" in text) == fmt.call_ids
    spec = tool_call_grammar(parse_tools([TIME, weather(max_city=10)]), fmt, parallel=parallel,
                             trigger_token_id=trigger_token(fmt, tok.hf.token_to_id),
                             markers=marker_ids(tok.hf.token_to_id))
    matcher = compiler.compile_sync(spec).new_matcher()
    tokens = tok.encode(text, add_special=False)
    assert tok.decode(tokens, skip_special=False) == text
    for t in tokens:
        assert matcher.advance(t), (text, matcher.error)
    assert matcher.accepts_eos()
    content, got = parse_tool_calls(text, fmt, ids())
    assert content is None
    assert [(c.name, c.arguments) for c in got] == [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("template,name", [
    ("{% for t in tools %}[AVAILABLE_TOOLS]{% endfor %}[TOOL_CALLS]", MISTRAL),
    ("{{ tools }}<|python_tag|>{{ '<|eom_id|>' }}", LLAMA3),
    ("{% if tools %}{{ tools | tojson }}{% endif %}", HERMES),
    ("{{ messages }}", GENERIC),
    ("{% if tools %}<tool_call>\n<function={{ name }}>\n<parameter={{ p }}>{% endif %}", QWEN3_CODER),
    ("{% if tools %}<tool_call>{{ name }}<arg_key>{{ k }}</arg_key>{% endif %}", GLM45),
    ("{{ '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + name + '<｜tool▁sep｜>' + args }}", DEEPSEEK_V31),
    ("{{ '<｜tool▁call▁begin｜>function<｜tool▁sep｜>' + name + '\n```json\n' + args }}", DEEPSEEK_V3),
])
def test_detect_format(template, name):
    assert detect_format(template).name == name


def test_detect_v11_from_the_template_and_the_vocabulary(mistral):
    tok, _ = mistral
    fmt = detect_format(MISTRAL_SMALL_32)
    assert fmt == ToolFormat(MISTRAL_V11, True, call_ids=True) and fmt.is_mistral
    assert detect_format(MISTRAL_V11_NO_IDS) == ToolFormat(MISTRAL_V11, True, call_ids=False)
    old = "{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS] [{{ calls | tojson }}]"
    assert detect_format(old).name == MISTRAL                                    # no [ARGS] anywhere: the list form
    bare = "{% for t in tools %}[AVAILABLE_TOOLS]{% endfor %}{{ '[TOOL_CALLS]' + name }}"
    assert detect_format(bare).name == MISTRAL
    assert detect_format(bare, tok.hf.token_to_id).name == MISTRAL_V11          # ... but the vocabulary has [ARGS]
    assert detect_format(old, tok.hf.token_to_id).name == MISTRAL               # a template writing the JSON list
    markers = marker_ids(tok.hf.token_to_id)
    assert set(markers) == {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"}
    assert shown_tokens(fmt, tok.hf.token_to_id) == frozenset(markers.values())
    assert all(t in tok.special_ids for t in markers.values())                  # control tokens, hidden by default


def test_only_mistral_formats_keep_control_tokens_in_the_text(mistral):
    tok, _ = mistral
    markers = frozenset(marker_ids(tok.hf.token_to_id).values())
    for name in FORMATS:
        assert shown_tokens(name, tok.hf.token_to_id) == (markers if name in (MISTRAL, MISTRAL_V11) else frozenset())
