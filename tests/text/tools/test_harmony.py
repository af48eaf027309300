"""inferd/text/tools/harmony.py: gpt-oss's channels into thinking, answer and tool calls, the markup never
out, the same whatever the stream's pieces; and the same messages as OpenAI's own parser (openai-harmony) on
random completions."""

import json
import random

import pytest

from inferd.text.parsing import ContentDelta, ReasoningDelta, ToolArgsDelta, ToolCallStart
from inferd.text.tools import HARMONY, detect_format
from inferd.text.tools.harmony import SHOWN_TOKENS, HarmonyParser, is_harmony_template
from tests.text.harmony import GPT_OSS
from tests.text.tools.harmony_oracle import harmony_encoding
from tests.text.reasoning.test_think import splits


def parse(pieces):
    ids = iter(range(100))
    p = HarmonyParser(new_id=lambda: f"call_{next(ids)}")
    deltas = [d for piece in pieces for d in p.feed(piece)] + p.finish()
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    return reasoning, content, [(c.id, c.name, c.arguments) for c in p.calls], deltas


THINK_THEN_ANSWER = (
    "<|channel|>analysis<|message|>User wants colors. Give three.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Red, blue and green.<|return|>"
)
CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Oslo"}<|call|>'
)


@pytest.mark.parametrize("pieces", list(splits(THINK_THEN_ANSWER)))
def test_analysis_is_thinking_final_is_the_answer_whatever_the_pieces(pieces):
    reasoning, content, calls, _ = parse(pieces)
    assert (reasoning, content, calls) == ("User wants colors. Give three.", "Red, blue and green.", [])


@pytest.mark.parametrize("pieces", list(splits(CALL)))
def test_a_commentary_message_to_a_function_is_a_tool_call(pieces):
    reasoning, content, calls, deltas = parse(pieces)
    assert (reasoning, content) == ("Need the weather.", "")
    assert calls == [("call_0", "get_weather", '{"city": "Oslo"}')]
    starts = [d for d in deltas if isinstance(d, ToolCallStart)]
    assert [(s.index, s.name) for s in starts] == [(0, "get_weather")]
    assert "".join(d.text for d in deltas if isinstance(d, ToolArgsDelta)) == '{"city": "Oslo"}'


def test_the_recipient_may_come_before_the_channel_and_calls_count_up():
    text = (
        '<|channel|>commentary to=functions.a json<|message|>{"x": 1}<|call|>'
        '<|start|>assistant to=functions.b<|channel|>commentary json<|message|>{}<|call|>'
    )
    assert parse([text])[2] == [("call_0", "a", '{"x": 1}'), ("call_1", "b", "{}")]


def test_a_preamble_on_commentary_is_answer_and_an_empty_call_gets_empty_arguments():
    text = (
        "<|channel|>commentary<|message|>Let me check.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.now <|constrain|>json<|message|><|call|>"
    )
    _, content, calls, _ = parse(list(text))
    assert content == "Let me check." and calls == [("call_0", "now", "{}")]


@pytest.mark.parametrize("text", ["Plain words, no channels.", "<b>bold</b> text", "  spaced"])
def test_an_output_that_ignores_the_format_is_all_answer(text):
    for pieces in splits(text):
        reasoning, content, calls, _ = parse(pieces)
        assert (reasoning, content.strip(), calls) == ("", text.strip(), [])


def test_markup_never_reaches_the_answer_and_an_unfinished_body_is_kept():
    reasoning, content, _, deltas = parse(["<|channel|>analysis<|message|>Thinking", " still"])
    assert (reasoning, content) == ("Thinking still", "")
    for d in deltas:
        assert not any(m in d.text for m in SHOWN_TOKENS)


def test_the_format_is_told_by_its_template():
    assert is_harmony_template("{{- '<|start|>assistant<|channel|>final<|message|>' }}")
    assert not is_harmony_template("<|im_start|>assistant") and not is_harmony_template(None)


def random_completion(rng: random.Random) -> tuple[str, list[tuple[str, str | None, str]]]:
    """A completion of 1-4 messages as gpt-oss writes them, and its (channel, recipient, body) list."""
    words = ["red", "blue", "the", "city", "é", "ünïcode", "1.5", "<b>", "x<y", "{", "}", "\n", '"q"']
    messages, parts = [], []
    for i in range(rng.randint(1, 4)):
        channel = rng.choice(["analysis", "final", "commentary", "commentary_call"])
        body = " ".join(rng.choice(words) for _ in range(rng.randint(1, 8)))
        recipient = None
        if channel == "commentary_call":
            channel, recipient = "commentary", f"functions.tool_{rng.randint(0, 3)}"
            body = json.dumps({"arg": body})
            header = rng.choice([f"<|channel|>commentary to={recipient} <|constrain|>json",
                                 f" to={recipient}<|channel|>commentary json"])
        else:
            header = f"<|channel|>{channel}"
        lead = "" if i == 0 else "<|start|>assistant"
        parts.append(lead + header + "<|message|>" + body + ("<|call|>" if recipient else "<|end|>"))
        messages.append((channel, recipient, body))
        if recipient or channel == "final":
            break
    return "".join(parts), messages


def test_the_same_messages_as_openai_harmony_on_random_completions(tmp_path_factory):
    try:
        enc = harmony_encoding(tmp_path_factory.mktemp("harmony-vocab"))
    except (ImportError, FileNotFoundError) as e:
        pytest.skip(f"openai-harmony's vocabulary cannot be had here: {e}")
    from openai_harmony import Role

    rng = random.Random(7)
    for _ in range(200):
        text, expected = random_completion(rng)
        tokens = enc.encode(text, allowed_special="all")
        theirs = [
            (m.channel, m.recipient, "".join(c.text for c in m.content))
            for m in enc.parse_messages_from_completion_tokens(tokens, Role.ASSISTANT)
        ]
        assert theirs == expected, text
        pieces = [enc.decode([t]) for t in tokens]  # token by token, as the server streams it
        reasoning, content, calls, _ = parse(pieces)
        assert reasoning == "".join(b for c, r, b in expected if c == "analysis")
        assert content == "".join(b for c, r, b in expected if c != "analysis" and r is None)
        assert [(n, a) for _, n, a in calls] == [(r.removeprefix("functions."), b) for _, r, b in expected if r]


@pytest.fixture(scope="module")
def harmony_vocab(tmp_path_factory):
    from gguf import GGUFReader

    from inferd.text.grammar import GrammarCompiler
    from inferd.text.tokenizer import Tokenizer
    from tests.text.harmony import write_tiny_harmony

    path = write_tiny_harmony(tmp_path_factory.mktemp("harmony") / "tiny-harmony.gguf")
    tok = Tokenizer.from_gguf(GGUFReader(str(path)).fields)
    compiler = GrammarCompiler(tok, tok.vocab_size)
    yield tok, compiler
    compiler.close()


THOUGHT = "<|channel|>analysis<|message|>Need Oslo's weather.<|end|><|start|>assistant"


@pytest.mark.parametrize("thinking", ["", THOUGHT])
def test_a_call_the_grammar_accepts_parses_back_and_only_return_and_call_end_the_turn(harmony_vocab, thinking):
    from inferd.text.tools import ToolCall, ToolFormat, marker_token_ids, parse_tools, syntax_of, tool_call_grammar
    from tests.text.tools.calls import TIME, weather

    tok, compiler = harmony_vocab
    fmt = detect_format(GPT_OSS)
    assert fmt == ToolFormat(HARMONY, True) and fmt.parses_thinking
    call = ToolCall("call_0", "get_weather", '{"city": "Oslo", "unit": "celsius"}')
    text = thinking + syntax_of(fmt).write_calls([call])
    markers = marker_token_ids(fmt, tok.hf.token_to_id)
    spec = tool_call_grammar(parse_tools([TIME, weather(max_city=10)]), fmt, markers=markers)
    matcher = compiler.compile_sync(spec).new_matcher()
    tokens = tok.encode(text, add_special=False)
    assert tok.decode(tokens, skip_special=False) == text
    for t in tokens:
        assert matcher.advance(t), (text, matcher.error)
    assert matcher.accepts_eos()
    reasoning, content, calls, _ = parse([text])
    assert (reasoning, content, calls) == (thinking and "Need Oslo's weather.", "", [("call_0", *call_args(call))])
    eog = {tok.hf.token_to_id(t) for t in ("<|return|>", "<|call|>")}
    assert eog <= tok.eos_ids and tok.hf.token_to_id("<|end|>") not in tok.eos_ids


def call_args(call):
    return call.name, call.arguments
