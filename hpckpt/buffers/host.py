"""Host views of array leaves: contiguous NumPy arrays to write from and read into.

NumPy arrays, CPU torch tensors (viewed through ``detach().numpy()``, no copy), and
anything exposing ``__array__``, DLPack or the buffer protocol on the host are handled
here; device arrays are copied to pinned host buffers by :mod:`hpckpt.buffers.device`.
bfloat16 arrays are viewed as their uint16 bits (:mod:`hpckpt.buffers.bfloat16`).
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..errors import InvalidStateError
from .bfloat16 import is_bfloat16, numpy_bits
from .device import device_layout, is_device_array

STORABLE_KINDS = "biufc"
PAGE = 4096
ALIGNED_FROM = 1 << 20  # smaller arrays come from NumPy's allocator


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised array of at least 1 MiB whose data starts on a page boundary
    (anonymous memory mapped for it, unmapped with the array), so that direct I/O
    (:mod:`hpckpt.storage.direct`) writes it with no copy; a smaller one from NumPy.
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < ALIGNED_FROM:
        return np.empty(shape, dtype)
    # Private, not mmap's default shared mapping: shared anonymous memory lives in shmem,
    # whose first touch of 160 MiB took 0.14-0.22 s here against 0.02-0.04 s private with
    # transparent huge pages (as NumPy's own large allocations ask for).
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        memory.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(memory, dtype=dtype).reshape(shape)


class AlignedPool:
    """Page-aligned byte buffers (:func:`aligned_empty`) kept for reuse, at most ``keep``
    free ones. Memory touched for the first time costs a page fault per page (0.1-0.2 s
    per 160 MiB on the test machine); a reused buffer costs none. Thread-safe.
    """

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A ``uint8`` buffer of at least ``nbytes`` (at most twice that, when reused):
        the smallest free one that fits, else a new one of exactly ``nbytes``.
        """
        with self._lock:
            fitting = [index for index, buffer in enumerate(self._free)
                       if nbytes <= len(buffer) <= 2 * nbytes]
            if fitting:
                return self._free.pop(min(fitting, key=lambda index: len(self._free[index])))
        return aligned_empty((nbytes,), np.uint8)

    def give_back(self, buffers: Iterable[np.ndarray]) -> None:
        """Keep ``buffers`` (from :meth:`take`, no longer used) for later calls; the oldest
        free ones beyond ``keep`` are released.
        """
        with self._lock:
            self._free.extend(buffers)
            del self._free[: max(0, len(self._free) - self._keep)]


PACK_BUFFERS = AlignedPool(keep=2)
"""The buffers of pack blocks (a rank's small Local leaves in one block), kept from save
to save, and from a restore's read of its packs to the next save: a relaunched job's
first save then packs into memory already touched (a new 160 MiB buffer's first touch
cost more than the copy into it)."""


def _numpy_view(array: Any) -> np.ndarray:
    """A NumPy array sharing ``array``'s memory where possible (bfloat16: its uint16 bits)."""
    if is_bfloat16(array):
        return numpy_bits(array)
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "detach") and hasattr(array, "numpy"):  # a torch tensor
        return array.detach().numpy()
    return np.asarray(array)


def host_dtype(array: Any, path: str) -> np.dtype:
    """The NumPy dtype ``array`` is stored as."""
    if is_device_array(array):
        return device_layout(array, path)[1]
    return _numpy_view(array).dtype


def stored_as_is(array: Any) -> str | None:
    """The stored dtype's name (:func:`stored_dtype`) of what most host arrays are, told
    at a few attribute reads: a C-contiguous NumPy array (not a subclass) of a storable
    dtype, which :func:`as_host_array` returns as it is. None for any other array.
    """
    if type(array) is not np.ndarray or not array.flags.c_contiguous:
        return None
    return stored_dtype(array.dtype)


_STORED_DTYPES: dict[np.dtype, str | None] = {}


def stored_dtype(dtype: np.dtype) -> str | None:
    """``dtype.str`` (e.g. ``'<f8'``) where hpckpt stores arrays of ``dtype`` as they are
    (:data:`STORABLE_KINDS`), else None. Remembered per dtype: ``dtype.str`` builds a new
    string each time (0.5 us, a tenth of what planning a small leaf costs).
    """
    try:
        return _STORED_DTYPES[dtype]
    except KeyError:
        known = _STORED_DTYPES[dtype] = dtype.str if dtype.kind in STORABLE_KINDS else None
        return known


def as_host_array(array: Any, path: str) -> np.ndarray:
    """Return host ``array`` as a C-contiguous NumPy array (a copy only when it is not one).

    Device arrays are staged by :class:`hpckpt.buffers.device.DeviceStager` instead.

    Raises
    ------
    InvalidStateError
        When the array cannot be viewed on the host or its dtype cannot be stored
        (only booleans, integers, floats and complex numbers can).
    """
    if stored_as_is(array) is not None:  # the common case, checked fast
        return array
    try:
        host = _numpy_view(array)
    except Exception as exc:
        raise InvalidStateError(
            f"leaf {path!r}: cannot view {type(array).__name__} as a host array: {exc}") from exc
    if host.dtype.kind not in STORABLE_KINDS:
        raise InvalidStateError(
            f"leaf {path!r}: dtype {host.dtype} cannot be stored; expected bool, integer, float or complex"
        )
    return host if host.flags.c_contiguous else host.copy(order="C")


def writable_target(array: Any, path: str) -> np.ndarray:
    """Return a NumPy view of ``array`` that restore may fill in place.

    Raises
    ------
    InvalidStateError
        When ``array`` is read-only or not a host array.
    """
    try:
        view = _numpy_view(array)
    except Exception as exc:
        raise InvalidStateError(f"leaf {path!r}: cannot restore into {type(array).__name__}: {exc}") from exc
    if not view.flags.writeable:
        raise InvalidStateError(f"leaf {path!r}: the array to restore into is read-only")
    return view
