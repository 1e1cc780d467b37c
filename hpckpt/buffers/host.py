"""Host views of array leaves: contiguous NumPy arrays to write from and read into.

NumPy arrays, CPU torch tensors (viewed through ``detach().numpy()``, no copy), and
anything exposing ``__array__``, DLPack or the buffer protocol on the host are handled
here; device arrays are copied to pinned host buffers by :mod:`hpckpt.buffers.device`.
bfloat16 arrays are viewed as their uint16 bits (:mod:`hpckpt.buffers.bfloat16`).
"""

from __future__ import annotations

import mmap
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
    (:mod:`hpckpt.storage.direct`) writes it with no copy; a smaller one from NumPy."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < ALIGNED_FROM:
        return np.empty(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).reshape(shape)


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


def as_host_array(array: Any, path: str) -> np.ndarray:
    """Return host ``array`` as a C-contiguous NumPy array (a copy only when it is not one).

    Device arrays are staged by :class:`hpckpt.buffers.device.DeviceStager` instead.

    Raises
    ------
    InvalidStateError
        When the array cannot be viewed on the host or its dtype cannot be stored
        (only booleans, integers, floats and complex numbers can).
    """
    if type(array) is np.ndarray and array.dtype.kind in STORABLE_KINDS:  # the common case, checked fast
        return array if array.flags.c_contiguous else array.copy(order="C")
    try:
        host = _numpy_view(array)
    except Exception as exc:
        raise InvalidStateError(f"leaf {path!r}: cannot view {type(array).__name__} as a host array: {exc}") from exc
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
