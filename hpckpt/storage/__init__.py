"""Storage backends, registered by name; each imports its I/O library only when opened.

A backend is a subclass of :class:`~hpckpt.storage.base.Backend` (the contract is in
:mod:`hpckpt.storage.base`, the tests it passes in :mod:`hpckpt.testing.conformance`);
:func:`register_backend` makes it available by name to ``Checkpointer(backend=...)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .base import Annotations, Backend, BlockData, Capabilities, Encoded, GroupLayout

if TYPE_CHECKING:
    from .lustre import Striping

BackendLoader = Callable[[], type[Backend]]
_REGISTRY: dict[str, BackendLoader] = {}


def register_backend(name: str, loader: BackendLoader) -> None:
    """Make ``open_backend(name, options)`` call ``loader()(**options)``.

    ``loader`` imports and returns the backend class, so a backend's module (and its
    I/O library) is imported only when the backend is used. The class should raise
    ImportError, saying how to install what is missing, when its I/O library is
    absent or unusable (for example built without MPI).
    """
    if name in _REGISTRY:
        raise ValueError(f"a storage backend named {name!r} is already registered")
    _REGISTRY[name] = loader


def backend_names() -> tuple[str, ...]:
    """The registered backend names, in registration order."""
    return tuple(_REGISTRY)


def backend_class(name: str) -> type[Backend]:
    """The class of the backend registered as ``name`` (its module imported, not its library).

    Raises
    ------
    ValueError
        For a name that is not registered (listing the ones that are).
    """
    loader = _REGISTRY.get(name)
    if loader is None:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(_REGISTRY)}")
    return loader()


def open_backend(
    name: str | Backend, options: dict[str, Any] | None = None, striping: Striping | None = None
) -> Backend:
    """Return the backend called ``name`` made with ``options`` (or ``name`` if a Backend).

    With ``striping``, the options not given take the backend's defaults for it
    (:meth:`~hpckpt.storage.base.Backend.striped_options`).

    Raises
    ------
    ValueError
        For a name that is not registered (listing the ones that are), or options the
        backend does not take.
    ImportError
        When the backend's library is missing or built without MPI; the message says
        how to fix it.
    TypeError
        For an object that is not a :class:`~hpckpt.storage.base.Backend`.
    """
    if not isinstance(name, str):
        if options:
            raise ValueError("backend_options apply to a backend given by name, not to a backend object")
        if not isinstance(name, Backend):
            raise TypeError(
                f"backend {name!r} is neither a registered name nor an hpckpt.storage.base.Backend"
            )
        return name
    made = backend_class(name)
    options = dict(options or {})
    try:
        inspect.signature(made).bind(**options)
    except TypeError as exc:
        raise ValueError(f"backend {name!r} does not take backend_options {options!r}: {exc}") from exc
    if striping is not None:
        options = made.striped_options(striping, options)
    return made(**options)


def _hdf5() -> type[Backend]:
    from .hdf5 import HDF5Backend

    return HDF5Backend


def _adios2() -> type[Backend]:
    from .bp5 import ADIOS2Backend

    return ADIOS2Backend


def _posix() -> type[Backend]:
    from .posix import PosixBackend

    return PosixBackend


register_backend("hdf5", _hdf5)
register_backend("adios2", _adios2)
register_backend("posix", _posix)

__all__ = [
    "Annotations",
    "Backend",
    "BlockData",
    "Capabilities",
    "Encoded",
    "GroupLayout",
    "backend_class",
    "backend_names",
    "open_backend",
    "register_backend",
]
