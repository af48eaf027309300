"""`inferd perplexity` on SmolLM2 agrees with llama.cpp's llama-perplexity on the same file and text.

Recorded with llama.cpp 0.3.36: `llama-perplexity -m SmolLM2-135M-Instruct.Q4_1.gguf -f bench/data/gpl-3.txt -c 512
-t 2` -> "Final estimate: PPL = 18.3914 +/- 0.86455" (14 chunks); with `--chunks 4` "PPL = 18.3363 +/- 1.55488"
(the fast suite's check; the whole text runs under -m slow). The bar is 0.5%.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferd.cli import main

TEXT = Path(__file__).resolve().parents[2] / "bench" / "data" / "gpl-3.txt"


def check_against_llama_cpp(path, capsys, chunks: int | None, ppl_ref: float, stderr_ref: float):
    assert main(["perplexity", "-m", str(path), "-f", str(TEXT), "-c", "512",
                 *(["--chunks", str(chunks)] if chunks else [])]) == 0
    out = capsys.readouterr().out
    m = re.search(r"PPL = ([\d.]+) \+/- ([\d.]+) \((\d+) chunks of 512, (\d+) tokens scored", out)
    assert m, out
    ppl, err, n = float(m.group(1)), float(m.group(2)), int(m.group(3))
    assert n == (chunks or 14) and int(m.group(4)) == n * 255   # positions 256..510 of each chunk predict the next
    assert abs(ppl - ppl_ref) / ppl_ref < 0.005
    assert abs(err - stderr_ref) / stderr_ref < 0.02


def test_perplexity_of_four_chunks_matches_llama_cpp(smollm2_path, capsys):
    check_against_llama_cpp(smollm2_path, capsys, 4, 18.3363, 1.55488)


@pytest.mark.slow  # 12 s: the whole text
def test_perplexity_matches_llama_cpp(smollm2_path, capsys):
    check_against_llama_cpp(smollm2_path, capsys, None, 18.3914, 0.86455)


def test_perplexity_rejects_a_text_shorter_than_one_chunk(smollm2_path, tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("Too short to score.")
    assert main(["perplexity", "-m", str(smollm2_path), "-f", str(short), "-c", "512"]) == 1
    assert "make no chunk of 512" in capsys.readouterr().err



def test_chunks_must_be_positive(smollm2_path, capsys):
    assert main(["perplexity", "-m", str(smollm2_path), "-f", str(TEXT), "-c", "512", "--chunks", "0"]) == 1
    assert "--chunks 0" in capsys.readouterr().err


def test_an_engine_with_few_logits_rows_scores_in_more_steps_to_the_same_result(smollm2_model):
    from inferd.engine.engine import Engine
    from inferd.engine.runner import blocks_needed, perplexity

    tokens = smollm2_model.tokenizer.encode(TEXT.read_text(encoding="utf-8"), add_special=False)[:256]
    results = []
    for rows in (64, 24):   # 64: each chunk's scored half in one step; 24: in three
        engine = Engine(smollm2_model, num_kv_blocks=blocks_needed(128), max_batch_tokens=128, max_seqs=1,
                        threads=1, max_logits_rows=rows)
        results.append(perplexity(engine, tokens, 128))
    assert results[0].chunks == results[1].chunks == 2 and results[0].scored_tokens == results[1].scored_tokens == 126
    assert results[1].ppl == pytest.approx(results[0].ppl, rel=1e-9)
    assert results[1].stderr == pytest.approx(results[0].stderr, rel=1e-6)
