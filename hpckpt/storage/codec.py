"""Lossless compression of stored blocks (the posix backend's ``compression`` option).

``"blosc2"``: Blosc2 with zstd level 1 and byte shuffling by the element size, which
groups the exponent bytes of floating-point data. A block is compressed in pieces of
256 MiB (Blosc2 takes at most 2 GiB at once); the stored bytes are a little-endian
uint64 count of pieces, their compressed sizes, then the pieces. Checksums are taken
on the uncompressed data, so a restored block is verified after decompression.
"""

from __future__ import annotations

from typing import Any

import numpy as np

CODECS = ("blosc2",)
_PIECE = 256 << 20


def check_codec(name: str | None) -> str | None:
    """``name`` if hpckpt knows the codec (None: no compression), else ValueError."""
    if name is not None and name not in CODECS:
        raise ValueError(f"unknown compression {name!r}; expected one of {', '.join(CODECS)} or None")
    if name == "blosc2":
        _blosc2()
    return name


def _blosc2() -> Any:
    try:
        import blosc2
    except ImportError as exc:
        raise ImportError("compression='blosc2' needs the blosc2 package: pip install blosc2") from exc
    return blosc2


def encode(array: np.ndarray) -> np.ndarray:
    """The stored bytes of a C-contiguous ``array``, compressed (blosc2)."""
    blosc2 = _blosc2()
    raw = array.reshape(-1).view(np.uint8)
    pieces = [
        blosc2.compress2(
            raw[start : start + _PIECE],
            typesize=max(array.itemsize, 1),
            clevel=1,
            codec=blosc2.Codec.ZSTD,
            filters=[blosc2.Filter.SHUFFLE],
        )
        for start in range(0, raw.size, _PIECE)
    ]
    header = np.array([len(pieces), *(len(piece) for piece in pieces)], dtype="<u8").view(np.uint8)
    return np.concatenate([header, *(np.frombuffer(piece, dtype=np.uint8) for piece in pieces)])


def decode(stored: np.ndarray, into: np.ndarray) -> None:
    """Decompress ``stored`` (from :func:`encode`) into the C-contiguous ``into``.

    Raises ValueError, saying what is wrong, when the bytes do not decompress to
    exactly ``into.nbytes`` bytes.
    """
    blosc2 = _blosc2()
    raw = into.reshape(-1).view(np.uint8)
    if stored.size < 8:
        raise ValueError(f"compressed block of {stored.size} bytes has no header")
    count = int(stored[:8].view("<u8")[0])
    expected = -(-raw.size // _PIECE)
    if count != expected or stored.size < 8 * (count + 1):
        raise ValueError(f"compressed block header says {count} pieces; {expected} expected")
    sizes = stored[8 : 8 * (count + 1)].view("<u8").astype(np.int64)
    if int(sizes.sum()) != stored.size - 8 * (count + 1):
        raise ValueError("compressed block sizes do not add up to its stored bytes")
    position = 8 * (count + 1)
    for index, size in enumerate(sizes):
        target = raw[index * _PIECE : (index + 1) * _PIECE]
        piece = stored[position : position + size]
        if blosc2.get_cbuffer_sizes(piece.tobytes())[0] != target.size:
            raise ValueError(f"compressed piece {index} does not hold {target.size} bytes")
        blosc2.decompress2(piece.tobytes(), dst=target)
        position += int(size)
