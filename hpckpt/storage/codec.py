"""Compression of stored blocks (the posix backend's ``compression`` and ``lossy`` options).

``"blosc2"`` (lossless): Blosc2 with zstd level 1 and byte shuffling by the element
size, which groups the exponent bytes of floating-point data. A block is compressed in
pieces of 256 MiB (Blosc2 takes at most 2 GiB at once); the stored bytes are a
little-endian uint64 count of pieces, their compressed sizes, then the pieces.

``"zfp"`` (lossy, error-bounded): ZFP in fixed-accuracy mode through ``zfpy``: every
restored value is within the given absolute tolerance of the saved one. The save
decodes each block and compares it with the original (:func:`within_tolerance`): a
block ZFP cannot bound (NaN, infinities, values too large for the tolerance) is stored
losslessly instead. For float32
and float64 blocks of 1 to 4 dimensions; the stored bytes are the xxh3_64 of the ZFP
stream (8 bytes, little-endian) and the stream, checked before ZFP parses it.

Checksums in the manifest are of what a restore gives back (the data, or its lossy
reconstruction), so a restored block is verified after decompression.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..checksum import block_checksum

CODECS = ("blosc2",)
LOSSY_CODEC = "zfp"
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


# A Blosc2 chunk's 32-byte header ends with its flags byte, whose bits 4-6 name a chunk of
# special values; "uninitialized" (4) decompresses to nothing at all, which would leave
# the reader's buffer as it was (found by tests/fault/test_corruption.py: one flipped bit).
_HEADER, _SPECIAL_FLAGS, _UNINITIALIZED = 32, 31, 4


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
        if piece.size >= _HEADER and (int(piece[_SPECIAL_FLAGS]) >> 4) & 7 == _UNINITIALIZED:
            raise ValueError(f"compressed piece {index} is marked uninitialized: it would write no bytes")
        blosc2.decompress2(piece.tobytes(), dst=target)
        position += int(size)


def _zfpy() -> Any:
    try:
        import zfpy
    except ImportError as exc:
        raise ImportError("lossy compression needs the zfpy package: pip install zfpy") from exc
    return zfpy


def check_lossy(tolerances: Mapping[str, float] | None) -> dict[str, float]:
    """Leaf-path patterns and their absolute error bounds, checked; ValueError if not positive."""
    checked = {}
    for pattern, tolerance in (tolerances or {}).items():
        if (
            isinstance(tolerance, bool)
            or not isinstance(tolerance, (int, float))
            or not 0 < tolerance < math.inf
        ):
            raise ValueError(f"lossy tolerance of {pattern!r} must be a positive number, got {tolerance!r}")
        checked[str(pattern)] = float(tolerance)
    if checked:
        _zfpy()
    return checked


def lossy_applies(array: np.ndarray) -> bool:
    """Whether ZFP can store ``array``: float32 or float64, 1 to 4 dimensions, not empty."""
    return (
        array.dtype in (np.float32, np.float64)
        and array.dtype.isnative
        and 1 <= array.ndim <= 4
        and array.size > 0
    )


def within_tolerance(restored: np.ndarray, array: np.ndarray, tolerance: float) -> bool:
    """Whether every value of ``restored`` is within ``tolerance`` of ``array``'s.

    False where either holds a NaN or an infinity. Compared in float64, in pieces, so the
    check needs little memory beyond the two arrays.
    """
    flat_restored, flat_array = restored.reshape(-1), array.reshape(-1)
    step = _PIECE // 8
    for start in range(0, flat_array.size, step):
        piece = slice(start, start + step)
        error = np.abs(np.subtract(flat_restored[piece], flat_array[piece], dtype=np.float64))
        if not (error <= tolerance).all():  # a NaN compares False
            return False
    return True


def encode_lossy(array: np.ndarray, tolerance: float) -> np.ndarray:
    """The stored bytes of ``array`` compressed by ZFP to within ``tolerance`` (absolute)."""
    stream = np.frombuffer(_zfpy().compress_numpy(array, tolerance=tolerance), dtype=np.uint8)
    digest = np.array([int(block_checksum(stream), 16)], dtype="<u8").view(np.uint8)
    return np.concatenate([digest, stream])


def decode_lossy(stored: np.ndarray, into: np.ndarray) -> None:
    """Decompress ``stored`` (from :func:`encode_lossy`) into ``into``; ValueError if it does
    not verify or does not hold an array of ``into``'s shape and dtype.
    """
    if stored.size < 8 or int(stored[:8].view("<u8")[0]) != int(block_checksum(stored[8:]), 16):
        raise ValueError("ZFP stream does not match its stored checksum")
    restored = _zfpy().decompress_numpy(stored[8:].tobytes())
    if restored.shape != into.shape or restored.dtype != into.dtype:
        raise ValueError(
            f"ZFP stream holds {restored.dtype} {restored.shape}, expected {into.dtype} {into.shape}"
        )
    into[...] = restored


def decode_as(name: str, stored: np.ndarray, into: np.ndarray) -> None:
    """Decode ``stored`` made by codec ``name`` into ``into``; ValueError for unknown codecs."""
    if name == LOSSY_CODEC:
        decode_lossy(stored, into)
    elif name in CODECS:
        decode(stored, into)
    else:
        raise ValueError(f"unknown codec {name!r}")
