"""The peer-comparison benches' results files, built from made-up figures: each starts with its title and date, the
machine and the peer's build, says once how medians and ranges are computed, shows every round, computes its
ratios as ratios of medians with the per-round ratios as their range, says when a run was cut short, and carries
the same figures in its JSON (kind, date, machine, peer build, commands, per-round raw figures)."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import _common  # noqa: E402

HOST = {"cpu": "Test CPU", "simd": ["avx2", "avx512f"], "cores": 2, "memory_gib": 8.0}
MACHINE = "Machine: Test CPU (avx2, avx512f), 2 cores, 8.0 GiB."
STAMP = "2026-01-02 03:04"


def load(name: str):
    """A bench script as a module, by its path (bench/ is no package); sys.path as it was before (embeddings.py
    edits it on import)."""
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


def check_head(markdown: str, title_start: str, peer: str) -> list[str]:
    lines = markdown.splitlines()
    assert lines[0].startswith(f"# {title_start}") and lines[0].endswith(f"({STAMP})")
    assert lines[2] == f"{MACHINE} {peer}."
    assert lines[4] == _common.MEDIANS
    assert markdown.count(_common.MEDIANS) == 1
    return lines


def check_data(data: dict, kind: str, commands: list[str], peer_build: str | None = "llama.cpp-0.3.36") -> None:
    assert data["kind"] == kind
    assert data["date"] == STAMP
    assert data["machine"] == HOST
    assert data["peer_build"] == peer_build
    assert data["commands"] == commands
    json.dumps(data)   # all of it JSON


# ---- _common ---------------------------------------------------------------------------------------------------

def test_ratio_of_medians_pools_samples_and_divides_each_rounds_medians():
    ratio, per_round = _common.ratio_of_medians([[4.0, 6.0], [10.0, 12.0]], [[2.0, 2.0], [4.0, 4.0]])
    assert ratio == pytest.approx(8.0 / 3.0)           # median 8 over median 3
    assert per_round == pytest.approx([2.5, 2.75])     # a median outside its rounds' range: what MEDIANS warns of
    # a round one side did not finish is left out of both
    assert _common.ratio_of_medians([[3.0], [5.0], [9.0]], [[1.0], [1.0]]) == (4.0, [3.0, 5.0])
    with pytest.raises(ValueError):
        _common.ratio_of_medians([], [[1.0]])


def test_figures_are_formatted_as_median_and_range():
    assert _common.fmt_median([3.0, 1.0, 2.0]) == "2.0 (1.0-3.0)"
    assert _common.fmt_median([1234.0, 980.0], ".3g") == "1.11e+03 (980-1.23e+03)"
    assert _common.fmt_ratio(1.2345, [1.1, 1.3]) == "1.23x (1.10-1.30)"
    assert _common.fmt_ratio(0.5, [0.5]) == "0.50x (1 round)"
    assert _common.stats([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "samples": [3.0, 1.0, 2.0]}


def test_results_head_names_the_machine_the_peer_and_how_medians_are_taken():
    assert _common.results_head("T", STAMP, HOST, "llama.cpp: b1") == [
        f"# T ({STAMP})", "", f"{MACHINE} llama.cpp: b1.", "", _common.MEDIANS]


def test_stop_reasons_and_the_partial_note():
    assert _common.stop_reason(KeyboardInterrupt()) == "interrupted"
    assert _common.stop_reason(SystemExit(143)) == "stopped by SIGTERM (a timeout)"
    assert _common.stop_reason(SystemExit("llama-server was not ready\nafter 300 s")) == \
        "SystemExit: llama-server was not ready after 300 s"
    assert _common.stop_reason(RuntimeError()) == "RuntimeError"
    assert "SIGTERM" in _common.stop_reason(asyncio.CancelledError())
    assert _common.partial_note(1, 3, "rounds", "interrupted") == (
        "**Partial run**: 1 of 3 rounds finished before it stopped (interrupted); the figures are those of the "
        "finished rounds only.")


def test_vs_llamacpp_states_its_medians_with_the_shared_sentence():
    text = (BENCH / "vs_llamacpp.py").read_text()
    assert "MEDIANS = (" not in text and "MEDIANS," in text


# ---- neighbour.py ----------------------------------------------------------------------------------------------

def neighbour_run(neighbour, **kw):
    rounds = [
        {"llama.cpp": {"quiet": {"fa0 ub512": [100.0, 102.0], "fa1 ub512": [90.0, 91.0]},
                       "busy": {"fa0 ub512": [50.0, 52.0], "fa1 ub512": [60.0, 61.0]}},
         "inferd": {"quiet": [200.0, 210.0], "busy": [100.0, 104.0]}},
        {"llama.cpp": {"quiet": {"fa0 ub512": [104.0, 106.0], "fa1 ub512": [92.0, 93.0]},
                       "busy": {"fa0 ub512": [54.0, 56.0], "fa1 ub512": [66.0, 68.0]}},
         "inferd": {"quiet": [190.0, 200.0], "busy": [96.0, 100.0]}}]
    return neighbour.NeighbourRun(STAMP, HOST, "llama.cpp-0.3.36", ["python bench/neighbour.py", "env llama-bench"],
                                  "m.gguf", "tg128", 2, 2, kw.pop("rounds", 2), 2, measured=rounds, minutes=3.0, **kw)


def test_neighbour_keeps_llama_cpps_best_setting_per_condition_and_shows_every_round():
    neighbour = load("neighbour")
    markdown, data = neighbour.results(neighbour_run(neighbour))
    check_head(markdown, "Decode (tg128) next to a busy neighbour: m.gguf, 2 threads on 2 cores", "llama.cpp: "
               "llama.cpp-0.3.36")
    # quiet: fa0 (median 103) beats fa1; busy: fa1 (median 63.5) beats fa0; kept = 63.5 / 103, per round
    # 60.5 / 101 and 67 / 105
    assert "| llama.cpp | 103.0 (100.0-106.0) | 63.5 (60.0-68.0) | 0.62x (0.60-0.64) |" in markdown
    assert "| inferd | 200.0 (190.0-210.0) | 100.0 (96.0-104.0) | 0.50x (0.50-0.50) |" in markdown
    assert ("| 1 | quiet (llama.cpp then inferd), busy (inferd then llama.cpp) | inferd | 200.0, 210.0 | "
            "100.0, 104.0 | 0.50x |") in markdown
    assert "| 2 | busy (inferd then llama.cpp), quiet (llama.cpp then inferd) | llama.cpp | 104.0, 106.0 | " \
           "66.0, 68.0 | 0.64x |" in markdown
    assert "Partial" not in markdown
    assert "```\npython bench/neighbour.py\nenv llama-bench\n```" in markdown
    check_data(data, "neighbour", ["python bench/neighbour.py", "env llama-bench"])
    assert data["complete"] is True
    assert data["engines"]["llama.cpp"]["best_config"] == {"quiet": "fa0 ub512", "busy": "fa1 ub512"}
    assert data["engines"]["llama.cpp"]["kept"] == pytest.approx(63.5 / 103)
    assert data["engines"]["llama.cpp"]["kept_per_round"] == pytest.approx([60.5 / 101, 67 / 105])
    assert data["engines"]["inferd"]["quiet"] == {"median": 200.0, "min": 190.0, "max": 210.0,
                                                  "samples": [200.0, 210.0, 190.0, 200.0]}
    assert data["rounds"][1]["inferd"]["busy"] == [96.0, 100.0]


def test_neighbour_cut_short_says_so_and_counts_finished_rounds_only():
    neighbour = load("neighbour")
    run = neighbour_run(neighbour, rounds=3, stopped="interrupted")
    run.measured.append({"llama.cpp": {"quiet": {"fa0 ub512": [1.0]}}, "inferd": {}})   # round 3, unfinished
    markdown, data = neighbour.results(run)
    assert "**Partial run**: 2 of 3 rounds finished before it stopped (interrupted)" in markdown
    assert "| llama.cpp | 103.0 (100.0-106.0) | 63.5 (60.0-68.0) | 0.62x (0.60-0.64) |" in markdown
    assert "| 3 |" not in markdown
    assert data["complete"] is False and data["stopped"] == "interrupted"
    assert len(data["rounds"]) == 3   # the raw figures keep the unfinished round


def test_results_files_are_written_whole_with_their_json_beside(tmp_path):
    neighbour = load("neighbour")
    out = tmp_path / "neighbour.md"
    out.write_text("an older run\n## Notes\nhand-written\n")
    markdown, data = neighbour.results(neighbour_run(neighbour))
    _common.write_results(out, markdown, data)
    assert out.read_text() == markdown
    assert json.loads(out.with_suffix(".json").read_text())["engines"]["inferd"]["kept"] == 0.5


# ---- startup.py ------------------------------------------------------------------------------------------------

def test_startup_shows_each_round_and_the_ratio_of_medians_per_metric():
    startup = load("startup")
    rounds = [{"llama-server": {"ready": 2.0, "peak": 1.88, "rss": 1.80, "ttft": 0.12},
               "inferd": {"ready": 3.0, "peak": 1.27, "rss": 1.20, "ttft": 0.09}},
              {"inferd": {"ready": 2.6, "peak": 1.29, "rss": 1.22, "ttft": 0.08},
               "llama-server": {"ready": 2.2, "peak": 1.88, "rss": 1.80, "ttft": 0.14}}]
    commands = ["python bench/startup.py", "env llama-server --port PORT", "env python -m inferd.cli serve"]
    run = startup.StartupRun(STAMP, HOST, "llama.cpp-0.3.36", commands, "m.gguf", 4096, 2, 2, measured=rounds)
    markdown, data = startup.results(run)
    check_head(markdown, "Time to ready and memory: m.gguf, context 4096", "llama.cpp: llama.cpp-0.3.36")
    assert "| llama-server | 2.10 (2.00-2.20) s | 1.88 (1.88-1.88) GB | 1.80 (1.80-1.80) GB | 0.13 (0.12-0.14) s |" \
        in markdown
    # ready: 2.8 / 2.1, per round 3.0 / 2.0 and 2.6 / 2.2
    assert "| inferd / llama-server | 1.33x (1.18-1.50) |" in markdown
    assert "| 2 | inferd | 2.60 s | 1.29 GB | 1.22 GB | 0.08 s |" in markdown
    assert markdown.index("| 2 | inferd |") < markdown.index("| 2 | llama-server |")   # round 2: inferd first
    assert "## Notes" not in markdown
    check_data(data, "startup", commands)
    assert data["servers"]["inferd / llama-server"]["ready"]["ratio"] == pytest.approx(2.8 / 2.1)
    assert data["servers"]["inferd / llama-server"]["ready"]["per_round"] == pytest.approx([1.5, 2.6 / 2.2])
    assert data["rounds"] == rounds and data["complete"] is True


# ---- perplexity.py ---------------------------------------------------------------------------------------------

def test_perplexity_rows_and_a_model_left_unfinished():
    perplexity = load("perplexity")
    done = perplexity.ModelRounds("model-a", [
        {"llama.cpp": {"seconds": 10.0, "ppl": 9.0}, "inferd": {"seconds": 8.0, "ppl": 9.01}},
        {"inferd": {"seconds": 9.0, "ppl": 9.01}, "llama.cpp": {"seconds": 12.0, "ppl": 9.0}}])
    cut = perplexity.ModelRounds("model-b", [{"llama.cpp": {"seconds": 5.0, "ppl": 20.0}}])
    commands = ["python bench/perplexity.py", "env llama-perplexity", "python -m inferd.cli perplexity"]
    run = perplexity.PerplexityRun(STAMP, HOST, "llama.cpp-0.3.36", commands, ["model-a", "model-b"], 512, None, 2,
                                   2, stopped="SystemExit: llama-perplexity failed (1)", models=[done, cut])
    markdown, data = perplexity.results(run)
    check_head(markdown, "Perplexity: `inferd perplexity` vs `llama-perplexity`", "llama.cpp: llama.cpp-0.3.36")
    assert ("**Partial run**: 1 of 2 models finished before it stopped (SystemExit: llama-perplexity failed (1))"
            in markdown)
    assert "| model-a | 11.0 (10.0-12.0) | 8.5 (8.0-9.0) | 0.77x (0.75-0.80) | 9.0000 | 9.0100 | +0.11% |" in markdown
    assert "| model-a | 2 | inferd | 12.0 | 9.0 | 0.75x | 9.0000 | 9.0100 |" in markdown
    assert "model-b" not in markdown.split("Commands:")[0].split("\n", 1)[1]   # no figures for it, only the note
    check_data(data, "perplexity", commands)
    assert data["complete"] is False
    assert data["models"][0]["time_ratio"] == pytest.approx(8.5 / 11)
    assert data["models"][0]["round_ratios"] == pytest.approx([0.8, 0.75])
    assert data["rounds"]["model-b"] == cut.rounds


# ---- structured.py ---------------------------------------------------------------------------------------------

def test_structured_ratios_are_ratios_of_medians():
    structured = load("structured")

    def side(free, constrained):
        return {"free": {"tok_s": free, "tokens": 3072, "errors": 0},
                "json_schema": {"tok_s": constrained, "tokens": 3072, "errors": 0}}
    model = structured.ModelRounds("m", [{"inferd": side(100.0, 90.0), "llama-server": side(50.0, 20.0)},
                                         {"llama-server": side(60.0, 30.0), "inferd": side(110.0, 99.0)}],
                                   {"compile_ms": 12.3, "mask_p50_ms": 0.41, "mask_p90_ms": 0.52,
                                    "new_schema_ms": 35.0})
    commands = ["python bench/structured.py", "python -m inferd.cli serve --port PORT", "env llama-server"]
    run = structured.StructuredRun(STAMP, HOST, "llama.cpp-0.3.36", commands, ["m"], 8, 32, 2, 2, models=[model])
    markdown, data = structured.results(run)
    check_head(markdown, "Structured output: c=8, 32 requests per level", "llama.cpp: llama.cpp-0.3.36")
    assert "| m | inferd | 105.0 (100.0-110.0) | 94.5 (90.0-99.0) | 0.90x (0.90-0.90) |" in markdown
    assert "| m | llama-server | 55.0 (50.0-60.0) | 25.0 (20.0-30.0) | 0.45x (0.40-0.50) |" in markdown
    # 94.5 / 25; per round 90 / 20 and 99 / 30
    assert "| m | inferd / llama-server, json_schema |  | 3.78x (3.30-4.50) | |" in markdown
    assert "| m | inferd / llama-server, free | 1.91x (1.83-2.00) |  | |" in markdown
    assert "| m | 2 | llama-server | 110.0 | 99.0 | 60.0 | 30.0 |" in markdown
    assert "compiles in 12.3 ms" in markdown and "adds 35 ms" in markdown
    assert "Partial" not in markdown and "failed" not in markdown
    check_data(data, "structured", commands)
    entry = data["models"][0]
    assert entry["llama-server"]["json_schema_over_free"] == pytest.approx(25 / 55)
    assert entry["inferd_over_llama_server_json_schema"]["round_ratios"] == pytest.approx([4.5, 3.3])
    assert data["rounds"]["m"][1]["inferd"]["free"]["tok_s"] == 110.0 and data["complete"] is True


# ---- speculative.py --------------------------------------------------------------------------------------------

def test_speculative_compares_each_side_with_llama_server_round_by_round():
    speculative = load("speculative")

    def rate(tok_s, accepted=""):
        return {"tok_s": tok_s, "tokens": 256, "accepted": accepted}
    rounds = [{"llama-server": rate(20.0), "inferd": rate(18.0), "inferd --speculative": rate(30.0, "90 of 120")},
              {"inferd --speculative": rate(40.0, "100 of 120"), "inferd": rate(20.0), "llama-server": rate(22.0)}]
    commands = ["python bench/speculative.py", "env llama-server", "python -m inferd.cli generate PROMPT"]
    run = speculative.SpeculativeRun(STAMP, HOST, "llama.cpp-0.3.36", commands, "m.gguf", 2, 256, 2,
                                     measured=rounds)
    markdown, data = speculative.results(run)
    check_head(markdown, "Decode on a code-editing prompt: m.gguf", "llama.cpp: llama.cpp-0.3.36")
    assert "| llama-server | 21.0 (20.0-22.0) | 1.00x (1.00-1.00) |  |" in markdown
    assert "| inferd | 19.0 (18.0-20.0) | 0.90x (0.90-0.91) |  |" in markdown
    assert "| inferd --speculative | 35.0 (30.0-40.0) | 1.67x (1.50-1.82) | 100 of 120 |" in markdown
    assert ("| 2 | inferd --speculative, inferd, llama-server | 22.0 (256) | 20.0 (256) | 40.0 (256) |"
            in markdown)
    check_data(data, "speculative", commands)
    assert data["engines"]["inferd --speculative"]["round_ratios"] == pytest.approx([1.5, 40 / 22])
    assert data["rounds"] == rounds and data["prompt"] == speculative.PROMPT


# ---- embeddings.py ---------------------------------------------------------------------------------------------

def embeddings_run(embeddings, mode, peer, build, measured, **kw):
    return embeddings.EmbeddingsRun(mode, "Title", STAMP, HOST, peer, build, ["python bench/embeddings.py"], ["m"],
                                    2, 3, finished=["m"], measured=measured, **kw)


def test_embeddings_in_process_rates_per_repeat_and_their_ratios():
    embeddings = load("embeddings")
    entry = {"model": "m", "workload": "batch 32", "tokens_per_input": 16.2, "inputs": 32,
             "seconds": {"f32": [0.1, 0.2, 0.08], "q8_0": [0.05, 0.04, 0.05], "st": [0.2, 0.25, 0.2]}}
    latency = [{"model": "m", "ms": {"f32": [1.0, 2.0, 3.0], "q8_0": [0.5, 0.6, 0.7], "st": [10.0, 11.0, 12.0]}}]
    run = embeddings_run(embeddings, "in_process", "Peer: sentence-transformers 5.0, torch 2.9",
                         "sentence-transformers 5.0, torch 2.9", [entry], latency=latency)
    markdown, data = embeddings.in_process_results(run)
    check_head(markdown, "Title", "Peer: sentence-transformers 5.0, torch 2.9")
    # sent/s per repeat: f32 320, 160, 400; q8_0 640, 800, 640; st 160, 128, 160
    assert ("| m | batch 32 | 16 | 320 (160-400) | 640 (640-800) | 160 (128-160) | 2.00x (1.25-2.50) | "
            "4.00x (4.00-6.25) |") in markdown
    assert "| m | batch 32 | 2 | 160 | 800 | 128 |" in markdown
    assert "(median of 3 calls): inferd f32 2.00 ms, q8_0 0.60 ms, sentence-transformers 11.00 ms" in markdown
    check_data(data, "embeddings", ["python bench/embeddings.py"], "sentence-transformers 5.0, torch 2.9")
    assert data["mode"] == "in_process" and data["complete"] is True
    assert data["rows"][0]["f32_over_st"]["per_repeat"] == pytest.approx([2.0, 1.25, 2.5])
    assert data["measured"][0]["seconds"]["st"] == [0.2, 0.25, 0.2]


def test_embeddings_served_against_in_process():
    embeddings = load("embeddings")
    entry = {"model": "m", "clients": 32, "inputs": 512, "seconds": {"in_process": [1.0, 0.8, 1.0]},
             "served_sent_s": 450.0}
    run = embeddings_run(embeddings, "served", "Peer: none", None, [entry])
    markdown, data = embeddings.served_results(run)
    check_head(markdown, "Title", "Peer: none")
    assert "| m | 32 | 450 | 512 (512-640) | 88% |" in markdown
    check_data(data, "embeddings", ["python bench/embeddings.py"], None)
    assert data["rows"][0]["served_over_in_process"] == pytest.approx(450 / 512)


def test_embeddings_against_llama_server_and_a_partial_run():
    embeddings = load("embeddings")
    entry = {"model": "m", "weights": "q8_0", "workload": "batch 32", "inputs": 32, "min_cos": 0.99961,
             "seconds": {"inferd": [0.1, 0.1], "llama": [0.2, 0.4]}}
    run = embeddings_run(embeddings, "llama_server", "llama.cpp: b1", "b1", [entry], stopped="interrupted")
    run.planned = ["m", "other"]
    markdown, data = embeddings.llama_server_results(run)
    check_head(markdown, "Title", "llama.cpp: b1")
    assert "**Partial run**: 1 of 2 models finished before it stopped (interrupted)" in markdown
    # inferd 320, 320 sent/s; llama-server 160, 80 (median 120)
    assert "| m | q8_0 | batch 32 | 320 (320-320) | 120 (80-160) | 2.67x (2.00-4.00) | 0.9996 |" in markdown
    assert "| m | q8_0 | batch 32 | 2 | 320 | 80 |" in markdown
    assert data["complete"] is False and data["rows"][0]["per_repeat"] == pytest.approx([2.0, 4.0])
