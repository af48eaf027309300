"""Keep a long-running server's resident memory flat.

glibc's malloc serves large blocks with mmap and returns them on free, but every such free raises the mmap
threshold (up to 32 MiB) so that later blocks of that size come from the heap instead; freed heap memory
mostly stays with the process. A server that now and then builds a big temporary (prompt logprobs: a row of
vocabulary-sized logits per prompt token, tens of MiB) therefore grows its RSS in steps of that size, on
several threads' arenas, and never gives it back: the soak test saw +100 MiB over 80 requests, all of it
free memory (malloc_trim returned it). A fixed threshold turns the adaptation off: blocks of 4 MiB and more
are always mmapped and handed back to the kernel when freed.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("inferd.server")

MMAP_THRESHOLD_BYTES = 4 << 20
_pinned = False


def pin_mmap_threshold(nbytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold (once per process); False where that is not glibc or the user set it."""
    global _pinned
    if _pinned:
        return True
    if (
        not sys.platform.startswith("linux")
        or "MALLOC_MMAP_THRESHOLD_" in os.environ
        or "glibc.malloc.mmap_threshold" in os.environ.get("GLIBC_TUNABLES", "")
    ):
        return False
    from inferd import _cpu

    _pinned = _cpu.set_mmap_threshold(nbytes)  # musl and others: their malloc works differently (False)
    if _pinned:
        log.debug("malloc: blocks of %d bytes and more are mmapped and returned on free", nbytes)
    return _pinned
