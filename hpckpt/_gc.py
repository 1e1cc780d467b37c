"""The cyclic garbage collector paused while a save or a restore does its bookkeeping.

A save of 10,000 leaves makes some 100,000 short-lived objects without cycles; the
collections they trigger include full ones, each of which walks every object of the
application (0.1-0.4 s per save in the benchmark suite's small-arrays case, where a
save otherwise takes 0.2 s). Collection resumes when the last paused section ends.
Thread-safe: a background save and a call on the main thread may overlap.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def collection_paused() -> Iterator[None]:
    """Pause the cyclic collector for the ``with`` block (nested and concurrent blocks
    share one pause); it is enabled again after the last one if it was enabled before.
    """
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
