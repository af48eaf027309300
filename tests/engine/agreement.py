"""Greedy agreement with llama.cpp's recorded tokens, shared by the per-model agreement tests."""
from __future__ import annotations

import numpy as np

from inferd.engine.types import SeqInput


def assert_greedy_agrees(engine, prompt_ids: list[int], expected: list[int], near_tie: float, min_agree: int,
                         table: list[int]) -> None:
    """Teacher forcing: at every position our greedy choice is llama.cpp's token, or llama.cpp's token is within
    `near_tie` logits of ours; the first such near tie comes at `min_agree` or later; and free-running greedy
    decoding gives llama.cpp's tokens up to that tie."""
    forced = engine.step([SeqInput(prompt_ids + expected, 0, table, 0, want_logits=True)])[0]
    logits = forced.logits[len(prompt_ids) - 1:len(prompt_ids) - 1 + len(expected)]
    first_tie = len(expected)
    for i, want in enumerate(expected):
        ours = int(np.argmax(logits[i]))
        if ours != want:
            gap = float(logits[i][ours] - logits[i][want])
            assert gap < near_tie, f"token {i}: we pick {ours}, llama.cpp {want}, {gap:.3f} logits apart"
            first_tie = min(first_tie, i)
    assert first_tie >= min_agree, "the two engines should agree well past the start of the answer"
    assert_free_run_matches(engine, prompt_ids, expected, first_tie, table)


def assert_free_run_matches(engine, prompt_ids: list[int], expected: list[int], first_tie: int,
                            table: list[int]) -> None:
    """Free-running greedy decoding gives llama.cpp's tokens up to the first near tie."""
    out = engine.step([SeqInput(prompt_ids, 0, table, 1)])[0]
    generated, pos = [out.tokens[0]], len(prompt_ids)
    while len(generated) < first_tie + 1:
        out = engine.step([SeqInput([generated[-1]], pos, table, 1)])[0]
        generated.append(out.tokens[0])
        pos += 1
    assert generated[:first_tie] == expected[:first_tie]
