"""Positioned reads of whole byte ranges into NumPy arrays, in pieces that a reader can
checksum while the next piece is read. Used by the backends whose bytes lie at known file
offsets (posix's segments, hdf5's contiguous datasets). Not collective.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

READ_PIECE = 128 << 20  # bytes per read, each checksummed while the next is read (smaller pieces read slower)


def read_into(
    descriptor: int, array: np.ndarray, offset: int, path: Path, progress: Callable[[int], None] | None = None
) -> None:
    """Fill C-contiguous ``array`` from byte ``offset`` of open file ``path``, in pieces of
    :data:`READ_PIECE` bytes (``preadv``, no GIL held), calling ``progress(bytes in
    place)`` after each. A file that ends early raises ``OSError`` saying where.
    """
    if not array.flags.c_contiguous:
        raise ValueError("positioned reads fill only C-contiguous arrays")
    view = array.reshape(-1).view(np.uint8).data
    done = 0
    while done < len(view):
        count = os.preadv(descriptor, [view[done : done + READ_PIECE]], offset + done)
        if count == 0:
            raise OSError(
                f"{path} ends at byte {offset + done}, expected {len(view) - done} more bytes there"
            )
        done += count
        if progress is not None:
            progress(done)
