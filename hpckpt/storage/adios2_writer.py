"""Writing one BP5 step through ADIOS2's C API, with the GIL released in every call.

The ADIOS2 Python bindings hold the GIL inside ``EndStep`` and ``Close``, where BP5
waits on the other ranks (MPI gathers). A save running in a background thread there
could then deadlock with an application thread that waits in MPI for this rank while
it holds the GIL itself (mpi4py does, while it duplicates a communicator for a pickled
collective): rank 0's worker waits for rank 1's, which waits for the GIL. Called
through :mod:`ctypes`, every ADIOS2 call releases the GIL, so the worker never blocks
the application's thread, whatever the application does.

Reading stays with the Python bindings (serial, random access, never collective).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from mpi4py import MPI

# adios2_c_types.h
_TYPE_CODES = {
    np.dtype(name): code
    for code, name in enumerate(
        ("float32", "float64", "complex64", "complex128", "int8", "int16", "int32", "int64")
        + ("uint8", "uint16", "uint32", "uint64"),
        start=1,
    )
}
_STRING = 0
_MODE_WRITE = 1
# Puts are deferred: BP5 then writes large arrays straight from them at the end of the
# step instead of copying them into its buffer first (a new 512 MiB buffer per save:
# in-place saves of 2 x 512 MiB took 1.0 s deferred against 1.35-4.9 s synchronous here).
_MODE_DEFERRED = 4
_STEP_APPEND = 0
_SIZES = ctypes.POINTER(ctypes.c_size_t)
_library: Any = None


def _load() -> Any:
    """The ADIOS2 C library built with MPI, with the signatures this module calls."""
    global _library
    if _library is not None:
        return _library
    import adios2
    from mpi4py import MPI

    libraries = [_open_library(adios2, name) for name in ("adios2_c_mpi", "adios2_c")]
    pointer, status = ctypes.c_void_p, ctypes.c_int
    comm_type = ctypes.c_int if MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_int) else ctypes.c_void_p
    signatures = {
        "adios2_init_mpi": (pointer, [comm_type]),
        "adios2_declare_io": (pointer, [pointer, ctypes.c_char_p]),
        "adios2_set_engine": (status, [pointer, ctypes.c_char_p]),
        "adios2_set_parameter": (status, [pointer, ctypes.c_char_p, ctypes.c_char_p]),
        "adios2_define_variable": (pointer, [pointer, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t, _SIZES, _SIZES,
                                             _SIZES, ctypes.c_int]),
        "adios2_set_selection": (status, [pointer, ctypes.c_size_t, _SIZES, _SIZES]),
        "adios2_define_variable_attribute": (pointer, [pointer, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p,
                                                       ctypes.c_char_p, ctypes.c_char_p]),
        "adios2_open": (pointer, [pointer, ctypes.c_char_p, ctypes.c_int]),
        "adios2_begin_step": (status, [pointer, ctypes.c_int, ctypes.c_float, ctypes.POINTER(ctypes.c_int)]),
        "adios2_put": (status, [pointer, pointer, ctypes.c_void_p, ctypes.c_int]),
        "adios2_end_step": (status, [pointer]),
        "adios2_close": (status, [pointer]),
        "adios2_finalize": (status, [pointer]),
    }  # fmt: skip
    library = types.SimpleNamespace()
    for name, (restype, argtypes) in signatures.items():
        function = next(getattr(lib, name) for lib in libraries if hasattr(lib, name))
        function.restype, function.argtypes = restype, argtypes
        setattr(library, name, function)
    _library = library
    return library


def _open_library(package: Any, name: str) -> ctypes.CDLL:
    """ADIOS2's C library ``lib<name>.so``: next to the Python package, or on the library path."""
    beside = Path(package.__file__).parent / f"lib{name}.so"
    found = str(beside) if beside.exists() else ctypes.util.find_library(name)
    if found is None:
        raise ImportError(f"the adios2 backend writes through ADIOS2's C library lib{name}.so, which is neither next "
                          "to the adios2 package nor on the library path (see docs/install.md)")
    return ctypes.CDLL(found)


def _sizes(values: Sequence[int]) -> Any:
    return (ctypes.c_size_t * len(values))(*values) if values else None


class BP5Step:
    """One step written by every rank of ``comm`` together. Collective: construct and
    :meth:`close` on every rank (a rank that fails between them makes the protocol abort
    the job, as the others wait inside ADIOS2)."""

    def __init__(self, comm: MPI.Comm, path: Path, engine: str, parameters: Mapping[str, str]) -> None:
        from mpi4py import MPI

        self._c = _load()
        self._adios = self._c.adios2_init_mpi(MPI._handleof(comm))
        self._check(self._adios, "adios2_init_mpi")
        self._io = self._check(self._c.adios2_declare_io(self._adios, b"hpckpt-write"), "adios2_declare_io")
        self._call("adios2_set_engine", self._io, engine.encode())
        for key, value in parameters.items():
            self._call("adios2_set_parameter", self._io, key.encode(), value.encode())
        self._engine = self._check(self._c.adios2_open(self._io, str(path).encode(), _MODE_WRITE), "adios2_open")
        step_status = ctypes.c_int()
        self._call("adios2_begin_step", self._engine, _STEP_APPEND, ctypes.c_float(-1.0), ctypes.byref(step_status))
        self._variables: dict[str, Any] = {}
        self._deferred: list[np.ndarray] = []  # read by ADIOS2 at the end of the step: kept alive until then

    def put(self, name: str, kind: str, array: np.ndarray, shape: list[int], start: list[int], count: list[int]) -> None:
        """Put the C-contiguous ``array`` (a native ADIOS2 type) as the box ``start``,
        ``count`` of variable ``name`` (``shape`` empty: a local array); ADIOS2 reads it
        when the step ends (:meth:`close`), so it must not change before."""
        variable = self._variables.get(name)
        if variable is None:
            variable = self._c.adios2_define_variable(
                self._io, name.encode(), _TYPE_CODES[array.dtype], len(count), _sizes(shape), _sizes(start),
                _sizes(count), 0,
            )  # fmt: skip
            self._check(variable, f"adios2_define_variable({name!r})")
            kind_text = ctypes.c_char_p(kind.encode())
            attribute = self._c.adios2_define_variable_attribute(
                self._io, b"hpckpt_kind", _STRING, ctypes.cast(kind_text, ctypes.c_void_p), name.encode(), b"/"
            )
            self._check(attribute, f"adios2_define_variable_attribute({name!r})")
            self._variables[name] = variable
        elif shape:
            self._call("adios2_set_selection", variable, len(count), _sizes(start), _sizes(count))
        else:
            self._call("adios2_set_selection", variable, len(count), None, _sizes(count))
        self._deferred.append(array)
        self._call("adios2_put", self._engine, variable, ctypes.c_void_p(array.ctypes.data), _MODE_DEFERRED)

    def close(self) -> None:
        """End the step, close the engine and free ADIOS2 (the files are complete)."""
        try:
            self._call("adios2_end_step", self._engine)
            self._call("adios2_close", self._engine)
        finally:
            self._deferred.clear()
            self._call("adios2_finalize", self._adios)

    def _call(self, name: str, *args: Any) -> None:
        code = getattr(self._c, name)(*args)
        if code != 0:
            raise RuntimeError(f"ADIOS2 {name} failed with error {code} (its message is on stderr)")

    @staticmethod
    def _check(handle: Any, what: str) -> Any:
        if not handle:
            raise RuntimeError(f"ADIOS2 {what} failed (its message is on stderr)")
        return handle
