"""Progress lines for long serial work (verify, convert), shown only on a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressLine:
    """Rewrites one stderr line with ``label: 42% (1.2 of 2.9 GiB)`` at most 5 times a second.

    Silent when ``stream`` is not a terminal, so logs and pipes stay clean.
    """

    def __init__(self, label: str, total_bytes: int, stream: TextIO | None = None) -> None:
        self.label, self.total, self.done = label, max(total_bytes, 1), 0
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self._shown = 0.0

    def __call__(self, nbytes: int) -> None:
        """Count ``nbytes`` more as done."""
        self.done += nbytes
        now = time.monotonic()
        if self.enabled and (now - self._shown > 0.2 or self.done >= self.total):
            self._shown = now
            percent = 100 * self.done // self.total
            self.stream.write(f"\r{self.label}: {percent}% "
                              f"({human_bytes(self.done)} of {human_bytes(self.total)})")
            self.stream.flush()

    def close(self) -> None:
        """End the line."""
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def human_bytes(nbytes: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            break
        nbytes /= 1024
    return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
