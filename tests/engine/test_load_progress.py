"""LoadProgress: a bar on a terminal, one summary line in a log, nothing for loads shorter than `after`; and the
real callback path: building an engine reports every weight's bytes up to the total."""
from __future__ import annotations

import io

from inferd.engine.engine import Engine
from inferd.engine.load_progress import LoadProgress
from tests.reference import random_model


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_gets_a_bar_and_a_summary():
    out = Terminal()
    p = LoadProgress("weights", out, after=0.0)
    p(500_000_000, 1_000_000_000)
    p(1_000_000_000, 1_000_000_000)
    p.finish()
    text = out.getvalue()
    assert "\rloading weights [" + "#" * 15 + "." * 15 + "] 0.50/1.00 GB" in text
    assert "[" + "#" * 30 + "] 1.00/1.00 GB\n" in text
    assert text.endswith("loaded weights: 1.00 GB in 0.0 s\n")


def test_log_gets_only_the_summary_and_quick_loads_nothing():
    log = io.StringIO()
    p = LoadProgress("weights", log, after=0.0)
    p(1, 2)
    p.finish()
    assert log.getvalue().startswith("loaded weights: ") and "\r" not in log.getvalue()
    quiet = Terminal()
    q = LoadProgress("weights", quiet, after=3600.0)
    q(1, 2)
    q.finish()
    assert quiet.getvalue() == ""


def test_engine_reports_its_progress_up_to_the_whole():
    """The weights fill in calls without the GIL of about a quarter second each, each followed by a report: a small
    model's fill is one call, so one report, of the whole."""
    calls = []
    engine = Engine(random_model(weight_type="Q4_0"), num_kv_blocks=2, max_seqs=1, threads=2,
                    progress=lambda done, total: calls.append((done, total)))
    dones = [d for d, _ in calls]
    assert calls and dones == sorted(dones) and all(total == calls[0][1] for _, total in calls)
    assert calls[-1][0] == calls[-1][1] >= engine.weight_bytes > 0
