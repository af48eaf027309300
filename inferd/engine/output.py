"""The output processor: token-level outputs of the scheduler -> what a request is told.

The scheduler speaks in token ids (new ids, finished and why). This turns them into text: incremental
detokenization, stop strings (text that could start one is held back, never lost), and the finish of a sequence
that hit one, which it asks of the scheduler before the next step is scheduled. It runs on the scheduler thread,
between a step's postprocess and the delivery of its outputs, so a stop string ends a sequence exactly where the
token-level stops would, and the HTTP side receives text deltas ready to write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from inferd.engine.request import FinishReason, RequestOutput, RequestState, Usage
from inferd.text.chat import StopChecker
from inferd.text.tokenizer import IncrementalDetokenizer


class StopsSequences(Protocol):
    """What the processor asks of the scheduler: end a sequence after its first `num_output_tokens` tokens."""

    def finish_at_stop_string(self, st: RequestState, num_output_tokens: int) -> None: ...


class TextState:
    """Incremental detokenization plus stop-string matching for one request's generated tokens."""

    def __init__(self, tokenizer, prompt_ids: Sequence[int], stop: Sequence[str], shown: frozenset[int] = frozenset()):
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids, shown=shown)
        self.stops = StopChecker(list(stop)) if stop else None
        self.num_tokens = 0  # generated tokens delivered so far (a stop string may cut a step's tokens)

    def add(self, token_id: int) -> tuple[str, str | None]:
        """Text that is now safe to show, and the stop string it hit, if any (text then ends before it)."""
        text = self.detok.add(token_id)
        if self.stops is None:
            return text, None
        return self.stops.feed(text)

    def flush(self) -> str:
        # the detokenizer's incomplete UTF-8 tail goes through the stop checker like any other text
        tail = self.detok.flush()
        if self.stops is None:
            return tail
        text, matched = self.stops.feed(tail) if tail else ("", None)
        return text + (self.stops.flush() if matched is None else "")


class OutputProcessor:
    def __init__(self, tokenizer, scheduler: StopsSequences):
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self._texts: dict[str, TextState] = {}

    def process(self, outputs: list[tuple[RequestState, RequestOutput]]) -> list[tuple[RequestState, RequestOutput]]:
        """Add text to each output (in place); a stop string cuts the output there and finishes its sequence
        (whatever else the step said of that request is dropped)."""
        kept: list[tuple[RequestState, RequestOutput]] = []
        ended: set[str] = set()
        for st, out in outputs:
            rid = st.request.request_id
            if rid in ended:
                continue
            text = self._text_state(st, out)
            if text is not None:
                self._add_text(st, out, text)
            if out.finish_reason is not None:
                self._texts.pop(rid, None)
                ended.add(rid)
            kept.append((st, out))
        return kept

    def _text_state(self, st: RequestState, out: RequestOutput) -> TextState | None:
        req = st.request
        if self.tokenizer is None or not req.detokenize or req.warm:
            return None
        text = self._texts.get(req.request_id)
        if text is None and out.token_ids:  # the first output with tokens: from here on its text is followed
            text = self._texts[req.request_id] = TextState(self.tokenizer, req.prompt_ids, req.stop, req.shown_special)
        return text

    def _add_text(self, st: RequestState, out: RequestOutput, text: TextState) -> None:
        stop_ids = st.request.stop_token_ids
        pieces: list[str] = []
        for i, tok in enumerate(out.token_ids):
            if tok in stop_ids:  # a stop token ends the output and shows no text
                break
            piece, hit_stop = text.add(tok)
            pieces.append(piece)
            if hit_stop is not None:
                out.stop_string = hit_stop
                self._cut(st, out, text, i + 1)
                out.text = "".join(pieces)
                return
        text.num_tokens += len(out.token_ids)
        if out.finish_reason not in (None, FinishReason.ABORT):
            pieces.append(text.flush())  # text held back for a stop string that never came is real output
        out.text = "".join(pieces)

    def _cut(self, st: RequestState, out: RequestOutput, text: TextState, kept: int) -> None:
        """The stop string ended within this output's `kept`-th token: nothing after it is output or counted."""
        out.token_ids = out.token_ids[:kept]
        if out.logprobs is not None:
            out.logprobs = out.logprobs[:kept]
        if out.top_logprobs is not None:
            out.top_logprobs = out.top_logprobs[:kept]
        out.finish_reason = FinishReason.STOP
        out.error_message = out.error_status = None
        text.num_tokens += kept
        self.scheduler.finish_at_stop_string(st, text.num_tokens)
        if out.usage is not None:
            out.usage = Usage(out.usage.prompt_tokens, text.num_tokens, out.usage.cached_tokens)
