"""The grammar compiler, one per model: the llguidance vocabulary built in the background, a small thread pool
that compiles grammars under limits and a timeout, and a cache of compiled grammars."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import llguidance as llg

from inferd.text.grammar.matcher import CompiledGrammar
from inferd.text.grammar.spec import GrammarError, GrammarSpec
from inferd.text.grammar.vocabulary import build_lltokenizer, mask_words
from inferd.text.tokenizer import Tokenizer

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
