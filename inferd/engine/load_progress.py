"""Load progress for `inferd serve` and `generate`: a bar on stderr while the weights are repacked, and one line
with the time it took.

LoadProgress is the `progress(done_bytes, total_bytes)` callback of weights.build_cpu_model (Engine's `progress`).
On a terminal it draws a bar once the load has run for more than `after` seconds (a small model loads before the
bar would be seen); in a log it writes nothing while loading. Either way, finish() writes one line with the
weights' size and the time, for loads that took longer than `after`."""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 30


class LoadProgress:
    def __init__(self, what: str = "weights", stream: TextIO | None = None, after: float = 1.0):
        self.what = what
        self.stream = stream if stream is not None else sys.stderr
        self.after = after
        self.start = time.monotonic()
        self.total = 0
        self.drawn = False
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, done: int, total: int) -> None:
        self.total = total
        if not self.tty or time.monotonic() - self.start < self.after:
            return
        filled = BAR_WIDTH * done // max(total, 1)
        self.stream.write(
            f"\rloading {self.what} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done / 1e9:.2f}/{total / 1e9:.2f} GB"
        )
        self.stream.flush()
        self.drawn = True

    def finish(self) -> float:
        """Ends the bar; writes the summary line when the load took more than `after`. Returns the seconds."""
        seconds = time.monotonic() - self.start
        if self.drawn:
            self.stream.write("\n")
        if seconds >= self.after:
            self.stream.write(f"loaded {self.what}: {self.total / 1e9:.2f} GB in {seconds:.1f} s\n")
            self.stream.flush()
        return seconds
