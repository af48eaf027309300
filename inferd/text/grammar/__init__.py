"""Constrained decoding with llguidance: request fields -> a grammar, compiled off the event loop, and one matcher
per sequence that gives the C sampler its allowed-token bitmask each step.

What a request may send (exactly one of them; response_format {"type": "text"} counts as none):
- OpenAI: response_format {"type": "json_object"} (any JSON object) or {"type": "json_schema", "json_schema":
  {"name", "schema", "strict", "description"}};
- vLLM: guided_json (schema), guided_regex, guided_choice (list of strings), guided_grammar (Lark or GBNF), and
  the newer structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object"};
- llama-server: grammar (GBNF) and json_schema (a schema at the top level).
Every problem is a GrammarError carrying the request field it came from (`param`), for a 400 in OpenAI's envelope.

The vocabulary llguidance sees is the model's own (inferd's Tokenizer: token bytes, special tokens, EOS ids),
padded with empty tokens up to the model's vocabulary size (embedding rows beyond the tokenizer's), so a mask row
has exactly mask_words(vocab) words and lines up with the logits. It is built once per model, in a background
thread (seconds for a large vocabulary).

Bounds: a grammar's text is capped (`max_grammar_bytes`: llguidance's Lark front end is quadratic in the length of a
rule), LLParserLimits caps the lexer states, the grammar size and the work per step, so that a hostile schema ends
in an error rather than in minutes of CPU or gigabytes of lexer; compilation runs in a small thread pool (llguidance
releases the GIL while it validates and builds) and a request waits at most `compile_timeout` for it.

Modules: spec (request fields -> GrammarSpec), vocabulary (the model's vocabulary for llguidance), matcher (one
sequence's matcher, the lazy one that starts at a trigger token, masks in parallel), compiler (GrammarCompiler).
"""

from inferd.text.grammar.compiler import DEFAULT_LIMITS, GrammarCompiler
from inferd.text.grammar.matcher import CompiledGrammar, LazyMatcher, SequenceMatcher, fill_masks
from inferd.text.grammar.spec import (
    CONSTRAINT_FIELDS,
    JSON_WHITESPACE,
    GrammarError,
    GrammarSpec,
    choice_grammar,
    grammar_from_request,
    json_schema_grammar,
    lark_or_gbnf_grammar,
    regex_grammar,
    response_format_grammar,
    structured_outputs_grammar,
)
from inferd.text.grammar.vocabulary import build_lltokenizer, mask_words

__all__ = [
    "CONSTRAINT_FIELDS",
    "DEFAULT_LIMITS",
    "JSON_WHITESPACE",
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarSpec",
    "LazyMatcher",
    "SequenceMatcher",
    "build_lltokenizer",
    "choice_grammar",
    "fill_masks",
    "grammar_from_request",
    "json_schema_grammar",
    "lark_or_gbnf_grammar",
    "mask_words",
    "regex_grammar",
    "response_format_grammar",
    "structured_outputs_grammar",
]
