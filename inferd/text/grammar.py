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
has exactly mask_words(vocab) words and lines up with the logits. It is built once per model (~2 s for 150k
tokens), in a background thread.

Bounds: a grammar's text is capped (`max_grammar_bytes`: llguidance's Lark front end is quadratic in the length of a
rule, 300k terminals take minutes), LLParserLimits caps the lexer states, the grammar size and the work per step, so
that a hostile schema ends in an error rather than in minutes of CPU or gigabytes of lexer; compilation runs in a
small thread pool (llguidance releases the GIL while it validates and builds) and a request waits at most
`compile_timeout` for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llguidance as llg
import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from inferd.text.tokenizer import Tokenizer

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

# Parser limits for a server: well below llguidance's defaults for memory (250k lexer states ~ 0.5 GB), and
# enough for every real schema we tried (tests/text/test_grammar.py compiles a 60-property nested one).
DEFAULT_LIMITS = {
    "max_items_in_row": 2000,
    "initial_lexer_fuel": 1_000_000,
    "step_lexer_fuel": 200_000,
    "step_max_items": 50_000,
    "max_lexer_states": 20_000,
    "max_grammar_size": 200_000,
    "verbose_errors": False,
}


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


def mask_words(vocab_size: int) -> int:
    """uint32 words in one packed allowed-token bitmask row (the C sampler's and llguidance's layout)."""
    return (vocab_size + 31) // 32


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


# ---- the model's vocabulary for llguidance ------------------------------------------------------------------------
class _VocabForLLG:
    """What llguidance.TokenizerWrapper reads: token bytes (special tokens as their text), their ids, the EOS id,
    and a tokenize callback (llguidance tokenizes forced text with it, so its tokens must spell the text exactly)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        n = tokenizer.vocab_size
        self.tokens = [tokenizer.token_bytes(i, skip_special=False) for i in range(n)] + [b""] * (vocab_size - n)
        self.special_token_ids = sorted(i for i in tokenizer.special_ids if i < vocab_size)
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eos_ids, default=0)
        self.bos_token_id = tokenizer.bos_id
        self._hf = _without_prefix_space(tokenizer.hf) if tokenizer.strip_first_space else tokenizer.hf

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self._hf.encode(text, add_special_tokens=False).ids)


def _without_prefix_space(hf: HFTokenizer) -> HFTokenizer:
    """A copy of a SentencePiece-style tokenizer that does not put "▁" in front of the text: "s-" must become
    "s" "-" for llguidance, not "▁s" "-" (which spells " s-")."""
    spec = json.loads(hf.to_str())

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            if node.get("type") == "Prepend":
                return None
            if node.get("type") == "Metaspace":
                node = {**node, "prepend_scheme": "never", "add_prefix_space": False}
            return {k: (strip(v) if k in ("normalizers", "pretokenizers") else v) for k, v in node.items()}
        if isinstance(node, list):
            return [x for x in (strip(v) for v in node) if x is not None]
        return node

    for key in ("normalizer", "pre_tokenizer"):
        if spec.get(key) is not None:
            spec[key] = strip(spec[key])
    return HFTokenizer.from_str(json.dumps(spec))


def build_lltokenizer(tokenizer: Tokenizer, vocab_size: int | None = None) -> llg.LLTokenizer:
    """llguidance's view of the model's vocabulary; vocab_size: the model's (>= the tokenizer's) logits width."""
    vocab_size = vocab_size or tokenizer.vocab_size
    if vocab_size < tokenizer.vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {tokenizer.vocab_size}")
    eos = sorted(i for i in tokenizer.eos_ids if i < vocab_size)
    wrapper = llg.TokenizerWrapper(_VocabForLLG(tokenizer, vocab_size))
    return llg.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=eos or None)


# ---- matchers -----------------------------------------------------------------------------------------------------
class SequenceMatcher:
    """One sequence's grammar state: the allowed-token mask for its next token, advanced by what it samples.

    State: running (more tokens needed or allowed), done (the grammar is complete: nothing but EOS may follow, or
    EOS was taken while accepting), error (a token the grammar forbids, or a limit hit; `error` says which).
    """

    __slots__ = ("_eos", "_m")

    def __init__(self, matcher: llg.LLMatcher, eos_ids: frozenset[int]):
        self._m = matcher
        self._eos = eos_ids

    @property
    def llmatcher(self) -> llg.LLMatcher:
        return self._m

    def fill_mask(self, row: np.ndarray) -> bool:
        """Writes the allowed-token bitmask for the next token into `row` (contiguous int32/uint32 words); True
        (a LazyMatcher that has not started says False and leaves the row alone)."""
        if row.dtype.itemsize != 4 or not row.flags.c_contiguous or row.ndim != 1:
            raise ValueError("a mask row must be a contiguous 1-D array of 32-bit words")
        self._m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        return True

    def advance(self, token: int) -> bool:
        """Takes the sampled token; False when the grammar does not allow it (the matcher is in error then)."""
        return bool(self._m.consume_token(int(token)))

    def accepts_eos(self) -> bool:
        """The output so far is complete under the grammar (ending here would be valid)."""
        return bool(self._m.is_accepting())

    @property
    def is_done(self) -> bool:
        return bool(self._m.is_stopped()) and not self._m.is_error()

    @property
    def is_error(self) -> bool:
        return bool(self._m.is_error())

    @property
    def error(self) -> str:
        return str(self._m.get_error())

    def rollback(self, num_tokens: int) -> bool:
        return bool(self._m.rollback(num_tokens))


class CompiledGrammar:
    """A grammar compiled against one model's vocabulary; new_matcher() is cheap (a copy of a pristine one)."""

    def __init__(self, spec: GrammarSpec, matcher: llg.LLMatcher, eos_ids: frozenset[int], vocab_size: int):
        self.spec = spec
        self._pristine = matcher
        self._eos = eos_ids
        self.vocab_size = vocab_size  # the mask rows' width in tokens (the model's logits)
        self.warnings: list[str] = list(matcher.get_grammar_warnings())

    def new_matcher(self) -> SequenceMatcher:
        return SequenceMatcher(self._pristine.deep_copy(), self._eos)


def fill_masks(executor: llg.LLExecutor, rows: Sequence[tuple[SequenceMatcher, int]], masks: np.ndarray) -> None:
    """Computes the masks of several matchers in parallel (GIL released): row k of `masks` for each (matcher, k)."""
    if not rows:
        return
    if masks.dtype.itemsize != 4 or masks.ndim != 2 or not masks.flags.c_contiguous:
        raise ValueError("masks must be a contiguous 2-D array of 32-bit words")
    executor.unsafe_compute_mask_ptr(
        [(m.llmatcher, k) for m, k in rows], masks.ctypes.data, masks.shape[1] * 4, masks.shape[0]
    )


class GrammarCompiler:
    """One per model: the llguidance vocabulary (built in the background from start-up), a small pool that
    compiles grammars, and a cache of compiled grammars (agents send the same tools and schemas again and again).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int | None = None,
        *,
        compile_timeout: float = 10.0,
        limits: Mapping[str, Any] | None = None,
        threads: int = 2,
        cache_size: int = 64,
        max_grammar_bytes: int = 256 << 10,
        build_now: bool = True,
    ):
        """build_now=False: the vocabulary is built on start() or on the first compile, whichever comes first (the
        server's way: the build holds the GIL for most of a second, which must neither delay /health nor stall an
        idle server's event loop and watchdog)."""
        self.vocab_size = vocab_size or tokenizer.vocab_size
        self.max_grammar_bytes = max_grammar_bytes
        self.compile_timeout = compile_timeout
        self.limits = llg.LLParserLimits(**{**DEFAULT_LIMITS, **(limits or {})})
        self.eos_ids = frozenset(i for i in tokenizer.eos_ids if i < self.vocab_size)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grammar")
        self._tokenizer = tokenizer
        self._lltokenizer: concurrent.futures.Future[llg.LLTokenizer] | None = None
        self._cache: OrderedDict[str, concurrent.futures.Future[CompiledGrammar]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.executor = llg.LLExecutor(num_threads=threads)
        if build_now:
            self.start()

    @property
    def started(self) -> bool:
        """Whether the vocabulary's build has started (or is done)."""
        return self._lltokenizer is not None

    def start(self) -> concurrent.futures.Future[llg.LLTokenizer]:
        """Starts building the vocabulary in the background (once); its future."""
        with self._lock:
            if self._lltokenizer is None:
                self._lltokenizer = self._pool.submit(build_lltokenizer, self._tokenizer, self.vocab_size)
            return self._lltokenizer

    @property
    def lltokenizer(self) -> llg.LLTokenizer:
        """The model's vocabulary for llguidance (waits for the background build)."""
        return self.start().result()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Waits until the vocabulary is built (start-up may call this so the first request does not)."""
        self.start().result(timeout)

    def mask_words(self) -> int:
        return mask_words(self.vocab_size)

    def _compile_now(self, spec: GrammarSpec) -> CompiledGrammar:
        tok = self.start().result()
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(spec.grammar, tok, limits=self.limits)
        if is_error:
            raise GrammarError(f"{spec.param}: {_describe(spec, messages[0] if messages else 'invalid')}", spec.param)
        matcher = llg.LLMatcher(tok, spec.grammar, limits=self.limits, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"{spec.param}: {_describe(spec, matcher.get_error())}", spec.param)
        return CompiledGrammar(spec, matcher, self.eos_ids, self.vocab_size)

    def _future(self, spec: GrammarSpec) -> concurrent.futures.Future[CompiledGrammar]:
        if len(spec.grammar) > self.max_grammar_bytes:
            raise GrammarError(
                f"{spec.param}: the grammar is past the size limit ({len(spec.grammar)} bytes "
                f"compiled, at most {self.max_grammar_bytes})",
                spec.param,
            )
        self.start()  # queued ahead of the compile, which waits for it on the pool
        with self._lock:
            fut = self._cache.get(spec.grammar)
            if fut is not None and not (fut.done() and fut.exception() is not None):
                self._cache.move_to_end(spec.grammar)
                return fut
            fut = self._pool.submit(self._compile_now, spec)
            self._cache[spec.grammar] = fut
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return fut

    def compile_sync(self, spec: GrammarSpec, timeout: float | None = None) -> CompiledGrammar:
        """Compiles (or finds in the cache) on the pool and waits; GrammarError on a bad grammar or a timeout."""
        fut = self._future(spec)
        try:
            compiled = fut.result(timeout=self.compile_timeout if timeout is None else timeout)
        except concurrent.futures.TimeoutError:
            raise self._timeout_error(spec) from None
        return self._same_param(compiled, spec)

    async def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """compile_sync for the event loop: the loop keeps serving while the pool compiles."""
        fut = self._future(spec)
        try:
            compiled = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), self.compile_timeout)
        except TimeoutError:
            raise self._timeout_error(spec) from None
        return self._same_param(compiled, spec)

    def _timeout_error(self, spec: GrammarSpec) -> GrammarError:
        return GrammarError(
            f"{spec.param}: the grammar did not compile within {self.compile_timeout:g} s "
            "(too complex; simplify the schema or grammar)",
            spec.param,
        )

    @staticmethod
    def _same_param(compiled: CompiledGrammar, spec: GrammarSpec) -> CompiledGrammar:
        # the cache is keyed by grammar text: the same schema may come from another field name
        if compiled.spec == spec:
            return compiled
        return CompiledGrammar(spec, compiled._pristine, compiled._eos, compiled.vocab_size)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _describe(spec: GrammarSpec, message: str) -> str:
    what = {
        "json_schema": "invalid or unsupported JSON schema",
        "json_object": "invalid JSON grammar",
        "regex": "invalid regular expression",
        "choice": "invalid choice list",
        "grammar": "invalid grammar",
        "tools": "invalid tool parameters schema",
    }.get(spec.kind, "invalid grammar")
    message = message.strip()
    if "Unimplemented keys" in message:
        what = "a JSON schema feature that cannot be enforced"
    elif "limit" in message.lower() or "too complex" in message.lower() or "fuel" in message.lower():
        what = "the grammar is past the size or complexity limits"
    return f"{what}: {message}"
