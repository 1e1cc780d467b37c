"""ADIOS2 backend: one BP5 directory per step, written collectively over MPI.

Layout of ``data.bp`` (readable with plain ``adios2.FileReader``):

- a distributed or replicated leaf ``a/b`` is the global array variable ``a/b`` of
  shape ``global_shape``; each rank puts its box (``start`` = offset, ``count`` =
  shape), and of a replicated array each of ranks 0, 1, ... its row chunk;
- a local leaf ``a/b`` is the local array variable ``a/b`` (no global shape); each
  rank's non-empty block is one ADIOS2 block, and the manifest gives its block id
  (blocks are numbered in rank order, empty ones are not stored);
- a 0-d array is stored as a 1-element 1-D array; a dtype ADIOS2 has no type for
  (bool, float16, non-native byte order, ...) is stored as ``uint8`` with one more,
  last, axis of ``itemsize`` bytes, and the leaf's ``location`` says
  ``"encoding": "bytes"``;
- each variable has the attribute ``hpckpt_kind``.

Writes go through ADIOS2's C API with the engine parameters of the backend. The
defaults (:data:`DEFAULT_PARAMETERS`) make every rank write its own subfile
(``AggregationType=EveryoneWrites``): on one node that is twice as fast as BP5's
default shared-memory aggregation into one file (docs/performance.md). At thousands of
ranks, pass ``{"NumAggregators": "<ranks per node or fewer>"}`` or
``{"AggregationType": "TwoLevelShm"}`` to spare the file system's metadata servers.
``StatsLevel=0``: BP5 keeps no min/max of each block (hpckpt's checksums cover the
data); computing them cost a third of the CPU time of a 512 MiB save, which a
non-blocking save takes from the application (pass ``{"StatsLevel": "1"}`` for tools
that show them, such as ``bpls -l``).
Reads open the step serially in random-access mode, so a failing reader cannot hang
its peers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..model.manifest import Block, LeafRecord
from .adios2_writer import BP5Step
from .base import Backend, BlockData, Landed

if TYPE_CHECKING:
    from mpi4py import MPI

    from .lustre import Striping

DIRECTORY_NAME = "data.bp"
_DATA_FILE = re.compile(r"^data\.\d+$")
DEFAULT_PARAMETERS: dict[str, str] = {"Profile": "Off", "AggregationType": "EveryoneWrites", "StatsLevel": "0"}
_NATIVE_TYPES = {
    np.dtype(name)
    for name in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
    + ("float32", "float64", "complex64", "complex128")
}


def _bindings() -> Any:
    try:
        import adios2
    except ImportError as exc:
        raise ImportError(
            "the adios2 backend needs the adios2 Python package built with MPI; run `make install` "
            "(docs/install.md builds it from source with ADIOS2_USE_MPI=ON)"
        ) from exc
    if not adios2.is_built_with_mpi:
        raise ImportError(
            "the adios2 backend needs ADIOS2 built with MPI (adios2.is_built_with_mpi is False); "
            "rebuild it with ADIOS2_USE_MPI=ON against the MPI that mpi4py uses (see docs/install.md)"
        )
    return adios2.bindings


def stores_bytes(dtype: str) -> bool:
    """True when arrays of ``dtype`` are stored as raw ``uint8`` (ADIOS2 lacks the type)."""
    return np.dtype(dtype) not in _NATIVE_TYPES or not np.dtype(dtype).isnative


def _stored_view(array: np.ndarray, as_bytes: bool) -> np.ndarray:
    """``array`` (C-contiguous) as ADIOS2 stores it, sharing its memory.

    The ADIOS2 bindings take writable buffers only: a read-only array is copied.
    """
    if not array.flags.writeable:
        array = array.copy()
    view = array.reshape(array.shape or (1,))
    return view.view(np.uint8).reshape(view.shape + (array.itemsize,)) if as_bytes else view


def _selection(record: LeafRecord, block: Block) -> tuple[list[int], list[int], list[int]]:
    """The stored variable's shape, and ``block``'s start and count in it."""
    extra = [record.itemsize] if record.location.get("encoding") == "bytes" else []
    count = list(block.shape or (1,)) + extra
    if record.kind == "local":
        return [], [], count
    shape = list(record.global_shape or (1,)) + extra
    start = list(block.offset or (0,)) + [0] * len(extra)
    return shape, start, count


class ADIOS2Backend(Backend):
    """ADIOS2 BP5 storage (see the module docstring for the layout).

    Parameters
    ----------
    parameters
        Engine parameters (``NumAggregators``, ``AggregationType``,
        ``BufferChunkSize``, ``MaxShmSize``, ...), merged over
        :data:`DEFAULT_PARAMETERS`; values are strings, as ADIOS2 takes them.
    engine
        The ADIOS2 engine (default ``BP5``).
    """

    name = "adios2"
    writes_in_place = True  # a recycled data.bp/ is written into (see write)
    collective_write = True  # the aggregators gather the other ranks' data and metadata

    @classmethod
    def striped_options(cls, striping: Striping, options: Mapping[str, Any]) -> dict[str, Any]:
        """One subfile per stripe target (two-level aggregation), the given parameters first."""
        striped = {"AggregationType": "TwoLevelShm", "NumAggregators": str(striping.count)}
        return {**options, "parameters": {**striped, **options.get("parameters", {})}}

    def __init__(self, parameters: Mapping[str, Any] | None = None, engine: str = "BP5") -> None:
        self._adios2 = _bindings()
        self.engine = engine
        self.parameters = {**DEFAULT_PARAMETERS, **{str(k): str(v) for k, v in (parameters or {}).items()}}

    def layout(self, records: Sequence[LeafRecord]) -> tuple[LeafRecord, ...]:
        """Variables are named by leaf path; local blocks get their ADIOS2 block id."""
        placed = []
        for record in records:
            location: dict[str, Any] = {"directory": DIRECTORY_NAME, "variable": record.path}
            if stores_bytes(record.dtype):
                location["encoding"] = "bytes"
            blocks = record.blocks
            if record.kind == "local":
                stored = [block for block in sorted(blocks, key=lambda b: b.rank) if block.size]
                ids = {block.rank: index for index, block in enumerate(stored)}
                # Direct construction: dataclasses.replace costs 5 us a call, 10,000s per save.
                blocks = tuple(
                    Block(b.rank, b.offset, b.shape, b.checksum, {"block_id": ids[b.rank]}, b.members) if b.size else b
                    for b in blocks
                )
            placed.append(
                LeafRecord(record.path, record.kind, record.dtype, record.global_shape, blocks, location, record.encoding)
            )
        return tuple(placed)

    def write(
        self, comm: MPI.Comm, directory: Path, records: Sequence[LeafRecord], blocks: Sequence[BlockData]
    ) -> list[str]:
        """Put every non-empty block in one BP5 step and close it. Collective over ``comm``.

        Through ADIOS2's C API (:mod:`hpckpt.storage.adios2_writer`), which releases the
        GIL in every call, so a save in a background thread cannot deadlock with the
        application's own MPI calls.

        A process writing several blocks of one local leaf (``hpckpt convert``) must
        pass them in rank order, so block ids match the layout.
        """
        root = directory / DIRECTORY_NAME
        # A data.bp/ recycled from a deleted step is written into: BP5 truncates and reuses
        # the files it writes again (far cheaper here than new files while old ones are
        # freed) and removes the others (tests/mpi/test_conformance.py checks both).
        step = BP5Step(comm, root, self.engine, self.parameters)
        for data in blocks:
            if data.block.size:
                record = data.record
                stored = _stored_view(data.array, record.location.get("encoding") == "bytes")
                step.put(record.path, record.kind, stored, *_selection(record, data.block))
        step.close()
        return [DIRECTORY_NAME] + sorted(f"{DIRECTORY_NAME}/{name}" for name in os.listdir(root))

    def written_files(self, files: Sequence[str], rank: int, size: int) -> list[str]:
        """Every file of ``data.bp/``: which rank aggregates which subfile is ADIOS2's choice."""
        return [name for name in files if name != DIRECTORY_NAME]

    def metadata_files(self, files: Sequence[str]) -> list[str]:
        """Everything in ``data.bp/`` but the data files: ``md.idx``, ``md.0``, ``mmd.0``, ...

        A flipped byte in them made ADIOS2 crash the process; checksummed, they are
        refused before ADIOS2 reads them.
        """
        prefix = DIRECTORY_NAME + "/"
        return [name for name in files if name.startswith(prefix) and not _DATA_FILE.match(name[len(prefix):])]

    def read(self, directory: Path, requests: Sequence[BlockData], landed: Landed | None = None) -> None:
        """Fill each request's ``array`` from ``data.bp``, reporting each whole one to
        ``landed``. Independent (serial ADIOS2)."""
        requests = [request for request in requests if request.block.size]
        if not requests:
            return
        bindings = self._adios2
        path = directory / DIRECTORY_NAME
        if not path.is_dir():
            raise FileNotFoundError(f"{path} does not exist")
        adios = bindings.ADIOS()
        io = adios.DeclareIO("hpckpt-read")
        io.SetEngine(self.engine)
        engine = io.Open(str(path), bindings.Mode.ReadRandomAccess)
        try:
            for request in requests:
                self._get(io, engine, path, request)
                if landed is not None:
                    landed(request, request.array.nbytes)
        finally:
            engine.Close()

    def _get(self, io: Any, engine: Any, path: Path, request: BlockData) -> None:
        """Read one stored block into ``request.array``, after checking its shape."""
        record, block = request.record, request.block
        variable = io.InquireVariable(record.location["variable"])
        if variable is None:
            raise KeyError(f"{path} has no variable {record.location['variable']!r}")
        shape, start, count = _selection(record, block)
        if record.kind == "local":
            block_id = block.location["block_id"]
            variable.SetBlockSelection(block_id)
            if list(variable.Count()) != count:
                raise KeyError(f"{path}: block {block_id} of {record.path!r} has count {variable.Count()}, not {count}")
        else:
            if list(variable.Shape()) != shape:
                raise KeyError(f"{path}: variable {record.path!r} has shape {variable.Shape()}, not {shape}")
            variable.SetSelection([start, count])
        as_bytes = record.location.get("encoding") == "bytes"
        engine.Get(variable, _stored_view(request.array, as_bytes), self._adios2.Mode.Sync)
