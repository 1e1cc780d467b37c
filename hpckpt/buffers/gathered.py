"""A block gathered from many arrays into one page-aligned buffer, filled as it is written.

A rank's small Local leaves are stored as one block, a pack: their bytes one after the
other. Copying 160 MiB of them into the pack's buffer took 30-40 ms on the test machine,
before the write could start. A backend that writes blocks as (file offset, bytes)
pieces takes the pack unfilled instead (:meth:`~hpckpt.storage.base.Backend.writes_gathered`):
the direct writer fills it a chunk at a time and writes each filled chunk from the buffer
while it fills the next (``hpckpt.storage.direct``), so the copy overlaps the disk; the
ADIOS2 backend fills each piece it puts while BP5 writes the one before
(``hpckpt.storage.bp5_pieces``).
Each chunk is checksummed as it is filled, while its bytes are fresh in the cache, instead
of read again from the scattered parts by the checksum thread. Anything else that reads
the buffer fills it first (:meth:`Gathered.filled`).

Not collective. Fills are serialized (a writer fills; a checksum fills what is left).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..checksum import running_checksum
from ..model.plans import pack_parts


class Gathered:
    """``buffer`` (``uint8``, as long as the parts) to hold ``parts`` (1-D ``uint8`` views of
    C-contiguous arrays) one after the other, filled in order up to ``filled_to`` bytes.
    The arrays must not change until the block is written and checksummed. Filled bytes
    are checksummed as they are filled (:meth:`checksum`). Made by :meth:`of`.
    """

    def __init__(self, parts: tuple[np.ndarray, ...], buffer: np.ndarray, ends: np.ndarray) -> None:
        self.parts, self.buffer = parts, buffer
        self._ends = ends  # each part's end in the block, a running total
        self.filled_to = 0
        self._lock = threading.Lock()
        self._digest = running_checksum()

    @classmethod
    def of(cls, arrays: Sequence[np.ndarray], buffer: np.ndarray) -> Gathered:
        """The block of C-contiguous ``arrays``' bytes in order, to be filled into ``buffer``
        (``uint8``, exactly as long as their bytes). Nothing is copied yet.
        """
        parts = tuple(pack_parts(arrays))
        ends = np.cumsum([part.nbytes for part in parts], dtype=np.int64)
        nbytes = int(ends[-1]) if len(ends) else 0
        if buffer.nbytes != nbytes:
            raise ValueError(f"a buffer of {buffer.nbytes} bytes for parts of {nbytes} bytes")
        return cls(parts, buffer, ends)

    @property
    def nbytes(self) -> int:
        """The block's length in bytes."""
        return self.buffer.nbytes

    def fill_to(self, stop: int) -> None:
        """Fill the buffer up to byte ``stop`` (from where it is filled to; one
        concatenation of the parts in between, which holds no GIL for large ones).
        """
        if stop <= self.filled_to:  # a writer's check of a filled chunk waits for no fill
            return
        with self._lock:
            start, stop = self.filled_to, min(stop, self.nbytes)
            if stop <= start:
                return
            first = int(np.searchsorted(self._ends, start, side="right"))
            last = int(np.searchsorted(self._ends, stop, side="left"))
            parts = list(self.parts[first : last + 1])
            parts[-1] = parts[-1][: stop - (int(self._ends[last]) - parts[-1].nbytes)]
            parts[0] = parts[0][start - (int(self._ends[first]) - self.parts[first].nbytes) :]
            np.concatenate(parts, out=self.buffer[start:stop])
            self._digest.update(self.buffer[start:stop].data)
            self.filled_to = stop

    def filled(self) -> np.ndarray:
        """The buffer, filled whole."""
        self.fill_to(self.nbytes)
        return self.buffer

    def bytes(self) -> GatheredBytes:
        """All of the block's bytes, as a writer's piece."""
        return GatheredBytes(self, 0, self.nbytes)

    def checksum(self) -> str:
        """The block's checksum (``hpckpt.checksum.block_checksum`` of the filled buffer),
        taken as it was filled; what is not filled yet is filled first.
        """
        self.filled()
        return self._digest.hexdigest()


@dataclass(frozen=True)
class GatheredBytes:
    """Bytes ``[start, stop)`` of a :class:`Gathered` block: what a writer places in a file.
    Sliced like a ``memoryview``; :meth:`view` fills the block up to ``stop`` first.
    """

    source: Gathered
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index: slice) -> GatheredBytes:
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise ValueError("gathered bytes are sliced without a step")
        return GatheredBytes(self.source, self.start + start, self.start + max(start, stop))

    @property
    def address(self) -> int:
        """Where the bytes lie in memory (in the block's buffer)."""
        return int(self.source.buffer.ctypes.data) + self.start

    def fill(self) -> None:
        """Fill the block up to these bytes' end."""
        self.source.fill_to(self.stop)

    def view(self) -> memoryview:
        """The bytes, filled, as a ``memoryview`` of the buffer."""
        self.fill()
        return self.source.buffer[self.start : self.stop].data


PieceBytes = memoryview | GatheredBytes
"""The bytes of a piece a writer places in a file: a buffer's, or a gathered block's."""
