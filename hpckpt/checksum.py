"""Block checksums: fast enough to run at the disk's bandwidth on the save path."""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np
import xxhash

ALGORITHM = "xxh3_64"


def file_checksum(path: str | os.PathLike[str]) -> str:
    """Return the hex ``xxh3_64`` digest of a whole file's bytes (read in 4 MiB pieces)."""
    digest = xxhash.xxh3_64()
    with open(path, "rb") as handle:
        for piece in iter(lambda: handle.read(4 << 20), b""):
            digest.update(piece)
    return digest.hexdigest()


def text_checksum(text: str) -> str:
    """Return the hex ``xxh3_64`` digest (16 digits) of ``text`` encoded as UTF-8."""
    return bytes_checksum(text.encode())


def bytes_checksum(data: bytes) -> str:
    """Return the hex ``xxh3_64`` digest (16 digits) of ``data``."""
    return xxhash.xxh3_64_hexdigest(data)


def block_checksum(array: np.ndarray) -> str:
    """Return the hex ``xxh3_64`` digest of a C-contiguous array's bytes."""
    return xxhash.xxh3_64_hexdigest(array.reshape(-1).view(np.uint8).data)


def running_checksum() -> xxhash.xxh3_64:
    """A digest fed piece by piece (``update``); its ``hexdigest()`` is the same as
    :func:`block_checksum` of the pieces joined.
    """
    return xxhash.xxh3_64()


def pieces_checksum(pieces: Iterable[np.ndarray]) -> str:
    """Return the hex ``xxh3_64`` digest of the bytes of ``pieces`` (uint8 arrays) in order:
    the same digest as :func:`block_checksum` of their concatenation.
    """
    digest = running_checksum()
    for piece in pieces:
        digest.update(piece.data)
    return digest.hexdigest()
