"""Host views of array leaves: contiguous NumPy arrays to write from and read into.

NumPy arrays (and anything exposing ``__array__``, DLPack or the buffer protocol on
the host) are handled here; device arrays get their own staging module later, behind
the same two functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidStateError

STORABLE_KINDS = "biufc"


def as_host_array(array: Any, path: str) -> np.ndarray:
    """Return ``array`` as a C-contiguous NumPy array (a copy only when it is not one).

    Raises
    ------
    InvalidStateError
        When the array cannot be viewed on the host or its dtype cannot be stored
        (only booleans, integers, floats and complex numbers can).
    """
    try:
        host = np.asarray(array)
    except Exception as exc:  # noqa: BLE001 - any conversion failure is the user's input
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
    if not isinstance(array, np.ndarray):
        try:
            array = np.asarray(array)
        except Exception as exc:  # noqa: BLE001
            raise InvalidStateError(f"leaf {path!r}: cannot restore into {type(array).__name__}: {exc}") from exc
    if not array.flags.writeable:
        raise InvalidStateError(f"leaf {path!r}: the array to restore into is read-only")
    return array
