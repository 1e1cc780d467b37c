"""Determinants: which message each wildcard receive matched, kept where a crash can't reach.

A receive from ``ANY_SOURCE`` or with ``ANY_TAG`` may match a different message when
re-executed. The k-th such receive since the rank's newest checkpoint appends
``(k, source, tag, seq)`` to ``determinants-<step>.bin`` in the rank's directory with
one ``write`` (the kernel keeps it if the process is killed; ``durable=True`` also
fsyncs it, to survive the node). After a restore from ``step`` the rank reads the file
back and forces its k-th wildcard receive to match the recorded source and tag; past
the recorded ones, receives are free again and appended as before.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

_ENTRY = np.dtype("<i8")
_FIELDS = 4  # k, source, tag, seq


class DeterminantFile:
    """The determinants of one epoch (the span since checkpoint ``step``)."""

    def __init__(self, directory: Path, step: int | None, *, durable: bool = False) -> None:
        self.path = directory / f"determinants-{-1 if step is None else step}.bin"
        self.durable = durable
        self._descriptor: int | None = None

    def load(self) -> dict[int, tuple[int, int, int]]:
        """Recorded ``k -> (source, tag, seq)``; a torn last entry (killed mid-write) is dropped."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        whole = len(raw) - len(raw) % (_FIELDS * _ENTRY.itemsize)
        rows = np.frombuffer(raw[:whole], dtype=_ENTRY).reshape(-1, _FIELDS)
        return {int(k): (int(source), int(tag), int(seq)) for k, source, tag, seq in rows}

    def append(self, k: int, source: int, tag: int, seq: int) -> None:
        """Record that wildcard receive ``k`` matched (source, tag, seq)."""
        if self._descriptor is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            whole = os.fstat(self._descriptor).st_size
            os.ftruncate(self._descriptor, whole - whole % (_FIELDS * _ENTRY.itemsize))
        os.write(self._descriptor, np.array([k, source, tag, seq], dtype=_ENTRY).tobytes())
        if self.durable:
            os.fsync(self._descriptor)

    def close(self) -> None:
        """Close the file (it stays on disk until its epoch is older than every kept step)."""
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None
