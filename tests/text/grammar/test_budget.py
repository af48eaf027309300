"""inferd/text/grammar/budget.py: past its budget the thinking's closing is forced token by token, only the tokens
inside the thinking count, a grammar around it keeps its say, and a sequence that closes in time is left alone."""
from __future__ import annotations

import numpy as np

from inferd.text.grammar.budget import ThinkingBudget

# a toy vocabulary: one token per piece
PIECES = ["<think>", "</think>", "\n", "hm", " ok", "Red", ".", "<eos>", "<|channel|>", "analysis", "<|message|>",
          "<|end|>", "<|start|>", "assistant", "final"]
ID = {p: i for i, p in enumerate(PIECES)}
EOS = ID["<eos>"]


def budget(limit, open_text="<think>", close_text="</think>", forced=("\n", "</think>", "\n"), start_inside=False):
    return ThinkingBudget(limit, open_text, close_text, tuple(ID[p] for p in forced), PIECES.__getitem__,
                          frozenset({EOS}), vocab_size=len(PIECES), start_inside=start_inside)


def allowed(matcher):
    """The tokens the mask allows, or None for a free step."""
    row = np.zeros(1, np.uint32)
    if not matcher.fill_mask(row):
        return None
    return [t for t in range(len(PIECES)) if row[t // 32] >> (t % 32) & 1]


def run(matcher, wanted):
    """Samples `wanted` where the step is free, the mask's one token where it forces; returns the text written."""
    out = []
    wanted = list(wanted)
    while wanted or matcher.forcing:
        mask = allowed(matcher)
        token = mask[0] if mask is not None else ID[wanted.pop(0)]
        assert mask is None or len(mask) == 1
        assert matcher.advance(token)
        out.append(PIECES[token])
    return out


def test_past_the_budget_the_closing_is_forced_then_the_answer_is_free():
    m = budget(3).new_matcher(None)
    written = run(m, ["<think>", "hm", " ok", "hm", "Red", "."])
    assert written == ["<think>", "hm", " ok", "hm", "\n", "</think>", "\n", "Red", "."]
    assert not m.inside and allowed(m) is None


def test_a_thinking_closed_in_time_is_left_alone_and_the_answer_never_counts():
    m = budget(3).new_matcher(None)
    assert run(m, ["<think>", "hm", "</think>", "Red", " ok", " ok", " ok", "."]) == [
        "<think>", "hm", "</think>", "Red", " ok", " ok", " ok", "."]
    assert m.spent == 2  # "hm" and the closing tag


def test_a_prompt_that_opened_the_thinking_counts_from_the_first_token():
    m = budget(2, start_inside=True).new_matcher(None)
    assert run(m, ["hm", "hm", "Red"]) == ["hm", "hm", "\n", "</think>", "\n", "Red"]


def test_harmony_forces_the_end_of_the_analysis_and_every_later_analysis_at_once():
    b = budget(1, "<|channel|>analysis<|message|>", "<|end|>",
               ("<|end|>", "<|start|>", "assistant", "<|channel|>", "final", "<|message|>"))
    m = b.new_matcher(None)
    written = run(m, ["<|channel|>", "analysis", "<|message|>", "hm", "hm", "Red"])
    assert written[:5] == ["<|channel|>", "analysis", "<|message|>", "hm", "<|end|>"]
    assert written[5:] == ["<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "hm", "Red"]


def test_an_end_of_sequence_ends_a_free_output():
    m = budget(5).new_matcher(None)
    assert m.advance(EOS) and m.is_done and m.accepts_eos()
