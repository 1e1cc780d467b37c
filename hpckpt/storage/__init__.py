"""Storage backends, looked up by name; each imports its I/O library only when used."""

from __future__ import annotations

from .base import Backend

BACKENDS = ("hdf5",)
PLANNED_BACKENDS = ("adios2", "posix")


def open_backend(name: str) -> Backend:
    """Return the backend called ``name``.

    Raises
    ------
    ValueError
        For a name that is not a backend, listing the ones there are.
    ImportError
        When the backend's library is missing or built without MPI.
    """
    if name == "hdf5":
        from .hdf5 import HDF5Backend

        return HDF5Backend()
    if name in PLANNED_BACKENDS:
        raise ValueError(f"backend {name!r} is not implemented yet; available: {', '.join(BACKENDS)}")
    raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
