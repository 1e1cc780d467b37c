"""The storage interface: where and how the bytes of a step go.

A backend knows nothing of protocols. The protocol calls, per saved step:

1. ``location(record)`` on every rank, for every leaf (pure, no I/O);
2. ``write(comm, directory, records, arrays)`` on every rank together (collective),
   into the step's temporary directory, which exists when it is called; returns the
   file names it created (relative to ``directory``).

and per restored step:

3. ``read(directory, requests)`` on each rank independently; a missing file or
   dataset raises ``KeyError`` or ``OSError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..model.manifest import LeafRecord

if TYPE_CHECKING:
    from mpi4py import MPI


@dataclass(frozen=True)
class ReadRequest:
    """Read ``record``'s block of ``rank`` (local) or box ``offset`` (others) into ``out``."""

    record: LeafRecord
    rank: int
    offset: tuple[int, ...]
    out: np.ndarray


class Backend(Protocol):
    """What every storage backend provides (see the module docstring for call order)."""

    name: str

    def location(self, record: LeafRecord) -> dict[str, str]:
        """Where ``record`` lives inside a step directory (file, dataset)."""

    def write(
        self, comm: MPI.Comm, directory: Path, records: Sequence[LeafRecord], arrays: Mapping[str, np.ndarray]
    ) -> list[str]:
        """Write this rank's arrays. Collective over ``comm``."""

    def read(self, directory: Path, requests: Sequence[ReadRequest]) -> None:
        """Fill each request's ``out``. Independent: each rank calls on its own."""
