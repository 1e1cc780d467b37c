"""ADIOS2's C API through :mod:`ctypes`: one BP5 step written collectively
(:class:`BP5Step`) and a BP5 directory read by one process (:class:`BP5File`), with the
GIL released in every call.

The ADIOS2 Python bindings hold the GIL inside ``EndStep`` and ``Close``, where BP5
waits on the other ranks (MPI gathers). A save running in a background thread there
could then deadlock with an application thread that waits in MPI for this rank while
it holds the GIL itself (mpi4py does, while it duplicates a communicator for a pickled
collective): rank 0's worker waits for rank 1's, which waits for the GIL. Called
through :mod:`ctypes`, every ADIOS2 call releases the GIL, so the worker never blocks
the application's thread, whatever the application does.

Reads release the GIL too, so a helper thread checksums each slab of a block while the
next slab is read (the Python bindings hold the GIL in ``Get``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
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
_TYPE_NAMES = {code: dtype.name for dtype, code in _TYPE_CODES.items()}
_STRING = 0
_MODE_WRITE = 1
_MODE_READ_RANDOM_ACCESS = 6
# Puts are deferred: BP5 then writes large arrays straight from them at the end of the
# step instead of copying them into its buffer first (a new 512 MiB buffer per save:
# in-place saves of 2 x 512 MiB took 1.0 s deferred against 1.35-4.9 s synchronous here).
# Gets too: BP5 reads a batch of them in its reader threads (hpckpt.storage.bp5_reads).
_MODE_DEFERRED = 4
_STEP_APPEND = 0
_SIZES = ctypes.POINTER(ctypes.c_size_t)
# the features that hpckpt's patches (tools/adios2-patches) add to adios2_available_features
CONTIGUOUS_READ, ZERO_COPY = "BP5_CONTIGUOUS_READ", "BP5_DIRECTIO_ZERO_COPY"
IN_PLACE_WRITE, DIRECT_READ = "BP5_IN_PLACE_WRITE", "BP5_DIRECT_READ"
QUIET_WAIT = "BP5_QUIET_WAIT"
BP5_PATCHES = frozenset({CONTIGUOUS_READ, ZERO_COPY, IN_PLACE_WRITE, DIRECT_READ, QUIET_WAIT})
_OPTIONAL = frozenset({"adios2_perform_data_write"})  # without it, no blocks in pieces (bp5_pieces)
_library: Any = None


def _load() -> Any:
    """The ADIOS2 C library built with MPI, with the signatures this module calls."""
    global _library
    if _library is not None:
        return _library
    from mpi4py import MPI

    directory = package_directory()
    libraries = [_open_library(directory, name) for name in ("adios2_c_mpi", "adios2_c")]
    pointer, status = ctypes.c_void_p, ctypes.c_int
    comm_type = ctypes.c_int if MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_int) else ctypes.c_void_p
    signatures = {
        "adios2_init_mpi": (pointer, [comm_type]),
        "adios2_init_serial": (pointer, []),
        "adios2_declare_io": (pointer, [pointer, ctypes.c_char_p]),
        "adios2_set_engine": (status, [pointer, ctypes.c_char_p]),
        "adios2_set_parameter": (status, [pointer, ctypes.c_char_p, ctypes.c_char_p]),
        "adios2_define_variable": (
            pointer,
            [pointer, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t, _SIZES, _SIZES, _SIZES, ctypes.c_int],
        ),
        "adios2_set_selection": (status, [pointer, ctypes.c_size_t, _SIZES, _SIZES]),
        "adios2_define_variable_attribute": (
            pointer,
            [pointer, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p],
        ),
        "adios2_open": (pointer, [pointer, ctypes.c_char_p, ctypes.c_int]),
        "adios2_begin_step": (status, [pointer, ctypes.c_int, ctypes.c_float, ctypes.POINTER(ctypes.c_int)]),
        "adios2_put": (status, [pointer, pointer, ctypes.c_void_p, ctypes.c_int]),
        "adios2_perform_data_write": (status, [pointer]),
        "adios2_end_step": (status, [pointer]),
        "adios2_close": (status, [pointer]),
        "adios2_finalize": (status, [pointer]),
        "adios2_inquire_variable": (pointer, [pointer, ctypes.c_char_p]),
        "adios2_variable_type": (status, [ctypes.POINTER(ctypes.c_int), pointer]),
        "adios2_variable_ndims": (status, [_SIZES, pointer]),
        "adios2_variable_shape": (status, [_SIZES, pointer]),
        "adios2_variable_count": (status, [_SIZES, pointer]),
        "adios2_set_block_selection": (status, [pointer, ctypes.c_size_t]),
        "adios2_get": (status, [pointer, pointer, ctypes.c_void_p, ctypes.c_int]),
        "adios2_perform_gets": (status, [pointer]),
    }
    library = types.SimpleNamespace()
    for name, (restype, argtypes) in signatures.items():
        function = next((getattr(lib, name) for lib in libraries if hasattr(lib, name)), None)
        if function is None and name not in _OPTIONAL:
            raise ImportError(f"ADIOS2's C library has no {name}, which the adios2 backend calls")
        if function is not None:
            function.restype, function.argtypes = restype, argtypes
        setattr(library, name, function)
    # in ADIOS2's core library, reached through the C one's dependencies; older ADIOS2 lack it
    listing = next((lib.adios2_available_features for lib in libraries
                    if hasattr(lib, "adios2_available_features")), None)
    if listing is not None:
        listing.restype, listing.argtypes = None, [_SIZES, ctypes.POINTER(ctypes.POINTER(ctypes.c_char_p))]
    library.adios2_available_features = listing
    _library = library
    return library


def features() -> frozenset[str]:
    """The names the loaded ADIOS2 lists in ``adios2_available_features``: its optional
    parts and, in a build with hpckpt's BP5 patches
    (``tools/adios2-patches``, which ``make install`` applies), ``"BP5_CONTIGUOUS_READ"``,
    ``"BP5_DIRECTIO_ZERO_COPY"``, ``"BP5_IN_PLACE_WRITE"``, ``"BP5_DIRECT_READ"`` and
    ``"BP5_QUIET_WAIT"``.
    Empty for an ADIOS2 without the list.
    """
    listing = _load().adios2_available_features
    if listing is None:
        return frozenset()
    count, names = ctypes.c_size_t(), ctypes.POINTER(ctypes.c_char_p)()
    listing(ctypes.byref(count), ctypes.byref(names))
    return frozenset(names[index].decode() for index in range(count.value) if names[index])


def writes_now() -> bool:
    """Whether the loaded ADIOS2 has ``adios2_perform_data_write`` (:meth:`BP5Step.write_now`)."""
    return _load().adios2_perform_data_write is not None


def package_directory() -> Path:
    """The directory of the adios2 Python package, found without importing it: its
    high-level API imports torch where torch is installed (1.5 s of a process's start),
    and the adios2 backend needs only the C library beside it.

    Raises ImportError when there is no adios2 package.
    """
    spec = importlib.util.find_spec("adios2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("no adios2 Python package on sys.path")
    return Path(next(iter(spec.submodule_search_locations)))


def built_with_mpi(directory: Path) -> bool:
    """Whether the ADIOS2 of the adios2 package in ``directory`` has its MPI C library
    (``libadios2_c_mpi``; PyPI's adios2 wheel, built without MPI, has none), beside the
    package or on the library path.
    """
    return _library_path(directory, "adios2_c_mpi") is not None


def _library_path(directory: Path, name: str) -> str | None:
    """Where ADIOS2's C library ``lib<name>.so`` is: in the adios2 package's
    ``directory``, or on the library path; None if in neither.
    """
    beside = directory / f"lib{name}.so"
    return str(beside) if beside.exists() else ctypes.util.find_library(name)


def _open_library(directory: Path, name: str) -> ctypes.CDLL:
    """ADIOS2's C library ``lib<name>.so``, found by :func:`_library_path`."""
    found = _library_path(directory, name)
    if found is None:
        raise ImportError(
            f"the adios2 backend writes through ADIOS2's C library lib{name}.so, which is neither next "
            "to the adios2 package nor on the library path (see docs/install.md)"
        )
    return ctypes.CDLL(found)


def _sizes(values: Sequence[int]) -> Any:
    return (ctypes.c_size_t * len(values))(*values) if values else None


def _call(name: str, *args: Any) -> None:
    """Call ADIOS2's C function ``name``; an error code raises ``RuntimeError``."""
    code = getattr(_load(), name)(*args)
    if code != 0:
        raise RuntimeError(f"ADIOS2 {name} failed with error {code} (its message is on stderr)")


def _handle(handle: Any, what: str) -> Any:
    """``handle``, returned by ADIOS2's C function ``what``; a null one raises ``RuntimeError``."""
    if not handle:
        raise RuntimeError(f"ADIOS2 {what} failed (its message is on stderr)")
    return handle


class BP5Step:
    """One step written by every rank of ``comm`` together. Collective: construct and
    :meth:`close` on every rank (a rank that fails between them makes the protocol abort
    the job, as the others wait inside ADIOS2).
    """

    def __init__(self, comm: MPI.Comm, path: Path, engine: str, parameters: Mapping[str, str]) -> None:
        from mpi4py import MPI

        c = _load()
        self._adios = _handle(c.adios2_init_mpi(MPI._handleof(comm)), "adios2_init_mpi")
        self._io = _handle(c.adios2_declare_io(self._adios, b"hpckpt-write"), "adios2_declare_io")
        _call("adios2_set_engine", self._io, engine.encode())
        for key, value in parameters.items():
            _call("adios2_set_parameter", self._io, key.encode(), value.encode())
        self._engine = _handle(c.adios2_open(self._io, str(path).encode(), _MODE_WRITE), "adios2_open")
        step_status = ctypes.c_int()
        _call(
            "adios2_begin_step", self._engine, _STEP_APPEND, ctypes.c_float(-1.0), ctypes.byref(step_status)
        )
        self._variables: dict[str, Any] = {}
        # read by ADIOS2 at the end of the step: kept alive until then
        self._deferred: list[np.ndarray] = []

    def put(
        self, name: str, kind: str, array: np.ndarray, shape: list[int], start: list[int], count: list[int]
    ) -> None:
        """Put the C-contiguous ``array`` (a native ADIOS2 type) as the box ``start``,
        ``count`` of variable ``name`` (``shape`` empty: a local array); ADIOS2 reads it
        when the step ends (:meth:`close`), so it must not change before.
        """
        c = _load()
        variable = self._variables.get(name)
        if variable is None:
            variable = c.adios2_define_variable(
                self._io, name.encode(), _TYPE_CODES[array.dtype], len(count), _sizes(shape), _sizes(start),
                _sizes(count), 0,
            )
            _handle(variable, f"adios2_define_variable({name!r})")
            kind_text = ctypes.c_char_p(kind.encode())
            kind_pointer = ctypes.cast(kind_text, ctypes.c_void_p)
            attribute = c.adios2_define_variable_attribute(
                self._io, b"hpckpt_kind", _STRING, kind_pointer, name.encode(), b"/"
            )
            _handle(attribute, f"adios2_define_variable_attribute({name!r})")
            self._variables[name] = variable
        elif shape:
            _call("adios2_set_selection", variable, len(count), _sizes(start), _sizes(count))
        else:
            _call("adios2_set_selection", variable, len(count), None, _sizes(count))
        self._deferred.append(array)
        _call("adios2_put", self._engine, variable, ctypes.c_void_p(array.ctypes.data), _MODE_DEFERRED)

    def write_now(self) -> None:
        """Have BP5 write the data put so far (``PerformDataWrite``): memory put before
        may change once this returns. Collective: every rank calls it as often.
        """
        _call("adios2_perform_data_write", self._engine)

    def close(self) -> None:
        """End the step, close the engine and free ADIOS2 (the files are complete)."""
        try:
            _call("adios2_end_step", self._engine)
            _call("adios2_close", self._engine)
        finally:
            self._deferred.clear()
            _call("adios2_finalize", self._adios)


def reader_profile(path: Path) -> Path:
    """The file that BP5's reader (2.12) writes at every close, whatever its parameters:
    ``/tmp/<directory name>_<process id in hex>_profiling.json``. :class:`BP5File`
    removes it, so that restores leave nothing in ``/tmp`` (one file per rank and job).
    """
    return Path("/tmp") / f"{path.name}_{os.getpid():x}_profiling.json"


class BP5File:
    """A BP5 directory open for reading by this process alone, in random-access mode.
    Not collective: a reader that fails cannot hang its peers. Use it as a context
    manager (closing frees ADIOS2).
    """

    def __init__(self, path: Path, engine: str, parameters: Mapping[str, str] | None = None) -> None:
        c = _load()
        self._profile = reader_profile(path)
        self._adios = _handle(c.adios2_init_serial(), "adios2_init_serial")
        try:
            self._io = _handle(c.adios2_declare_io(self._adios, b"hpckpt-read"), "adios2_declare_io")
            _call("adios2_set_engine", self._io, engine.encode())
            for key, value in (parameters or {}).items():
                _call("adios2_set_parameter", self._io, key.encode(), value.encode())
            opened = c.adios2_open(self._io, str(path).encode(), _MODE_READ_RANDOM_ACCESS)
            self._engine = _handle(opened, f"adios2_open({str(path)!r})")
        except BaseException:
            _call("adios2_finalize", self._adios)
            raise

    def __enter__(self) -> BP5File:
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            _call("adios2_close", self._engine)
        finally:
            _call("adios2_finalize", self._adios)
            self._profile.unlink(missing_ok=True)

    def variable(self, name: str) -> Any:
        """The variable ``name``; ``KeyError`` when the step has none."""
        variable = _load().adios2_inquire_variable(self._io, name.encode())
        if not variable:
            raise KeyError(f"no variable {name!r}")
        return variable

    def shape(self, variable: Any) -> list[int]:
        """The global shape of ``variable`` (empty for a local array)."""
        return self._dimensions("adios2_variable_shape", variable)

    def block_count(self, variable: Any, block_id: int) -> list[int]:
        """The shape of block ``block_id`` of the local array ``variable``, which it selects."""
        _call("adios2_set_block_selection", variable, block_id)
        return self._dimensions("adios2_variable_count", variable)

    def type_name(self, variable: Any) -> str:
        """The NumPy name of ``variable``'s type (``"float32"``, ...; else ``"ADIOS2 type N"``)."""
        code = ctypes.c_int()
        _call("adios2_variable_type", ctypes.byref(code), variable)
        return _TYPE_NAMES.get(code.value, f"ADIOS2 type {code.value}")

    def get(
        self, variable: Any, array: np.ndarray, start: list[int] | None, count: list[int],
        block_id: int | None = None,
    ) -> None:
        """Queue the read of the box ``start``, ``count`` of the global array ``variable``,
        or of the whole block ``block_id`` of a local one (``start`` None), into
        C-contiguous ``array`` (``count`` elements per axis, of the variable's type,
        which the caller checked: :meth:`type_name`). :meth:`perform_gets` reads it;
        ``array`` must stay alive until then, or until the file is closed (which reads
        whatever is still queued).
        """
        if list(array.shape) != count or not array.flags.c_contiguous:
            layout = "C-contiguous" if array.flags.c_contiguous else "strided"
            raise ValueError(
                f"a box of {count} elements does not fit a {layout} array of shape {list(array.shape)}"
            )
        if start is not None:
            _call("adios2_set_selection", variable, len(count), _sizes(start), _sizes(count))
        elif block_id is not None:
            _call("adios2_set_block_selection", variable, block_id)
        _call("adios2_get", self._engine, variable, ctypes.c_void_p(array.ctypes.data), _MODE_DEFERRED)

    def perform_gets(self) -> None:
        """Read every queued :meth:`get` (BP5 reads them in its reader threads)."""
        _call("adios2_perform_gets", self._engine)

    @staticmethod
    def _dimensions(function: str, variable: Any) -> list[int]:
        ndims = ctypes.c_size_t()
        _call("adios2_variable_ndims", ctypes.byref(ndims), variable)
        values = (ctypes.c_size_t * max(1, ndims.value))()
        _call(function, values, variable)
        return list(values[: ndims.value])
