"""What of a file is in the page cache (``mincore`` over a mapping of it), and evicting it."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


def cached_pages(path: Path) -> int:
    """How many pages of ``path`` are in the page cache now."""
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    if not pages:
        return 0
    descriptor = os.open(path, os.O_RDONLY)
    try:
        address = _LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, descriptor, 0)
        if address == _MAP_FAILED:
            raise OSError(ctypes.get_errno(), f"mmap of {path}")
        try:
            resident = (ctypes.c_ubyte * pages)()
            if _LIBC.mincore(address, size, resident) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path}")
            return sum(page & 1 for page in resident)
        finally:
            _LIBC.munmap(address, size)
    finally:
        os.close(descriptor)


def evict(path: Path) -> None:
    """Write ``path``'s dirty pages and drop all its pages from the page cache."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)
