"""ADIOS2 backend: one BP5 directory per step, written collectively over MPI.

Layout of ``data.bp`` (readable with plain ``adios2.FileReader``):

- a distributed or replicated leaf ``a/b`` is the global array variable ``a/b`` of
  shape ``global_shape``; each rank puts its box (``start`` = offset, ``count`` =
  shape), and of a replicated array each of ranks 0, 1, ... its row chunk;
- a local leaf ``a/b`` is the local array variable ``a/b`` (no global shape); each
  rank's non-empty block is one ADIOS2 block, and the manifest gives its block id
  (blocks are numbered in rank order, empty ones are not stored); a rank's pack of more
  than :data:`PACK_PIECE` bytes is stored as consecutive blocks of that many bytes (the
  last holds the rest), its location's ``pieces`` and ``piece_elements`` say how, so
  that each is filled while BP5 writes the one before (:meth:`ADIOS2Backend.write`);
- a 0-d array is stored as a 1-element 1-D array; a dtype ADIOS2 has no type for
  (bool, float16, non-native byte order, ...) is stored as ``uint8`` with one more,
  last, axis of ``itemsize`` bytes, and the leaf's ``location`` says
  ``"encoding": "bytes"``;
- each variable has the attribute ``hpckpt_kind``.

Writes go through ADIOS2's C API with the engine parameters of the backend. The
defaults (:data:`DEFAULT_PARAMETERS`) make every rank write its own bytes into its
node's subfile (``AggregationType=EveryoneWrites``; ``NumAggregators`` left at 0, one
subfile per node): on one node that is twice as fast as BP5's default shared-memory
aggregation, where one rank gathers and writes the others' data (docs/performance.md). At thousands of
ranks, pass ``{"NumAggregators": "<ranks per node or fewer>"}`` or
``{"AggregationType": "TwoLevelShm"}`` to spare the file system's metadata servers.
``StatsLevel=0``: BP5 keeps no min/max of each block (hpckpt's checksums cover the
data); computing them cost a third of the CPU time of a 512 MiB save, which a
non-blocking save takes from the application (pass ``{"StatsLevel": "1"}`` for tools
that show them, such as ``bpls -l``). With an ADIOS2 that has hpckpt's BP5 patches
(``tools/adios2-patches``; ``make install`` builds it), steps are written with
``DirectIO``: page-aligned arrays (the pack, a non-blocking save's snapshot) from their
own memory, bypassing the page cache (see :class:`ADIOS2Backend`'s ``direct_io``), and
with ``QuietWait``: at the end of a step, a rank waits for slower ranks asleep.
Reads open the step in random-access mode, each process alone, so a failing reader
cannot hang its peers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from ..model.group_merge import running_totals
from ..model.kinds import LeafKind
from ..model.manifest import PACK_PATH, PIECE_ELEMENTS, PIECES, Block, LeafRecord
from . import direct
from .adios2_c import (
    CONTIGUOUS_READ,
    DIRECT_READ,
    IN_PLACE_WRITE,
    QUIET_WAIT,
    ZERO_COPY,
    BP5Step,
    built_with_mpi,
    features,
    package_directory,
)
from .base import NO_ANNOTATIONS, Annotations, Backend, BlockData, Capabilities, GroupLayout, Landed
from .bp5_pieces import (
    PIECES_MIN,
    BlockPut,
    buffer_fills,
    goes_in_pieces,
    put_filled_pieces,
    put_in_pieces,
    writes_in_pieces,
)
from .bp5_reads import Wanted, read_step

if TYPE_CHECKING:
    from mpi4py import MPI

    from .lustre import Striping

DIRECTORY_NAME = "data.bp"
_DATA_FILE = re.compile(r"^data\.\d+$")
# No "Profile": BP5 (2.12) has no such parameter (BP4's) and writes profiling.json anyway.
DEFAULT_PARAMETERS: dict[str, str] = {
    "AggregationType": "EveryoneWrites",
    "StatsLevel": "0",
}
# BP5 copies a deferred Put under MinDeferredSize (4 MiB) into its buffer at once, as if it
# were synchronous: the pieces of 1-4 MiB (bp5_pieces) and the page-aligned arrays of that
# size went through a second copy, into a new buffer each step. From PIECES_MIN they are
# written from their own memory: later saves of a torch state took 0.291 s against 0.360 s
# (2 ranks, medians of 10, alternating), its cold restores 0.424 s against 0.443 s.
DIRECT_PARAMETERS = {"DirectIO": "true", "DirectIOAlignOffset": str(direct.ALIGNMENT),
                     "DirectIOAlignBuffer": str(direct.ALIGNMENT), "MinDeferredSize": str(PIECES_MIN)}
# With the feature IN_PLACE_WRITE: the data files of a recycled data.bp/ are written over
# in place and cut to size at close, instead of truncated at open and allocated again.
IN_PLACE_PARAMETERS = {"TruncateDataFiles": "false"}
# With the feature QUIET_WAIT: a rank that has written its step's data waits for the slower
# ones asleep at the step's end, not inside ADIOS2's MPI calls, where MPICH busy-polls: a
# non-blocking save's waiting took a core from the application's compute (60-160 ms of CPU
# per save here). The pieces of a step written in pieces are waited for as before.
QUIET_PARAMETERS = {"QuietWait": "true"}
# A rank's pack (its small Local leaves' bytes, gathered as they are written) of more than this
# many bytes is stored in pieces of this many, each filled while BP5 writes the one before.
PACK_PIECE = 32 << 20
ADIOS2Extent: TypeAlias = dict[str, int]  # a group's: per Local leaf, how many ADIOS2 blocks hold its bytes
ADIOS2Start: TypeAlias = dict[str, int]  # a group's: per Local leaf, its first block id
_NATIVE_TYPES = {
    np.dtype(name)
    for name in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
    + ("float32", "float64", "complex64", "complex128")
}


_ADIOS2_FIX = (
    "build ADIOS2 with ADIOS2_USE_MPI=ON against the MPI that mpi4py uses (docs/install.md, "
    "'ADIOS2 with MPI'; `make install` does it in a checkout), or use backend='hdf5' or 'posix', "
    "which need no ADIOS2"
)


def _require_adios2() -> None:
    """Raise ``ImportError`` saying how to install it unless ADIOS2 is there, built with
    MPI (told without importing the adios2 package, see :func:`~.adios2_c.package_directory`).
    """
    try:
        directory = package_directory()
    except ImportError as exc:
        raise ImportError(
            f"the adios2 backend needs the adios2 Python package built with MPI: {_ADIOS2_FIX}"
        ) from exc
    if not built_with_mpi(directory):
        raise ImportError(
            "the adios2 backend needs ADIOS2 built with MPI, and this one is not (no libadios2_c_mpi: "
            f"adios2.is_built_with_mpi is False, as in PyPI's adios2 wheel): {_ADIOS2_FIX}"
        )


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


def _most(comm: MPI.Comm, count: int) -> int:
    """The largest ``count`` of any rank of ``comm``. Collective: one reduction."""
    from mpi4py import MPI

    counts = np.array([count], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, counts, op=MPI.MAX)
    return int(counts[0])


def stored_pieces(record: LeafRecord, block: Block) -> int:
    """How many ADIOS2 blocks hold the Local ``block`` of ``record``: a pack's block of more
    than :data:`PACK_PIECE` bytes is stored in pieces of that many; any other whole. Pure.
    """
    if record.path != PACK_PATH or block.size <= PACK_PIECE:
        return 1
    return -(-block.size // PACK_PIECE)


def _local_locations(record: LeafRecord, first_id: int) -> dict[int, dict[str, int]]:
    """The location of each non-empty block of the Local ``record``, by rank: its ADIOS2
    block id, from ``first_id`` on in rank order, and where it is stored in pieces, how
    many and of how many elements (:func:`stored_pieces`). Pure.
    """
    locations = {}
    next_id = first_id
    for block in sorted(record.blocks, key=lambda b: b.rank):
        if block.size:
            pieces = stored_pieces(record, block)
            location = {"block_id": next_id}
            if pieces > 1:
                location |= {PIECES: pieces, PIECE_ELEMENTS: PACK_PIECE}
            locations[block.rank] = location
            next_id += pieces
    return locations


def _selection(record: LeafRecord, block: Block) -> tuple[list[int], list[int], list[int]]:
    """The stored variable's shape, and ``block``'s start and count in it."""
    extra = [record.itemsize] if record.location.get("encoding") == "bytes" else []
    count = list(block.shape or (1,)) + extra
    if record.kind == LeafKind.LOCAL:
        return [], [], count
    shape = list(record.global_shape or (1,)) + extra
    start = list(block.offset or (0,)) + [0] * len(extra)
    return shape, start, count


class ADIOS2Backend(Backend, GroupLayout[ADIOS2Extent, ADIOS2Start]):
    """ADIOS2 BP5 storage (see the module docstring for the layout).

    Parameters
    ----------
    parameters
        Engine parameters (``NumAggregators``, ``AggregationType``,
        ``BufferChunkSize``, ``MaxShmSize``, ...), merged over
        :data:`DEFAULT_PARAMETERS`; values are strings, as ADIOS2 takes them.
    engine
        The ADIOS2 engine (default ``BP5``).
    direct_io
        Write with BP5's ``DirectIO`` where the loaded ADIOS2 writes page-aligned deferred
        Puts from their own memory (it lists the feature
        :data:`~hpckpt.storage.adios2_c.ZERO_COPY`: the patch in ``tools/adios2-patches``
        that ``make install`` applies) and the step's file system takes ``O_DIRECT``
        (default); the pack, a non-blocking save's snapshot and
        restored arrays are page-aligned and written from their memory, large unaligned
        blocks of global arrays go in pieces through two aligned buffers
        (:mod:`~hpckpt.storage.bp5_pieces`), and BP5 copies the others. An ADIOS2 without
        the feature (a site's module) copies every Put with ``DirectIO``, which measured
        slower than the page cache: it writes through the page cache. False: always
        through the page cache. A ``DirectIO`` in ``parameters`` wins. Reads, where the
        loaded ADIOS2 lists :data:`~hpckpt.storage.adios2_c.DIRECT_READ` (and unless
        ``parameters`` set ``DirectIO`` off), open steps with ``DirectIO``
        (:attr:`read_parameters`): BP5 then reads the slabs of a box that
        land in page-aligned memory (the arrays a restore allocates, an application's
        aligned arrays) with ``O_DIRECT``, large slabs into other memory (a torch
        tensor's) through bounce buffers, and small ones through the page cache
        (:mod:`~hpckpt.storage.bp5_reads`).

    Laid out in groups: a group's Local blocks are numbered after the earlier groups'
    (:meth:`group_starts`). Writes in place (a recycled ``data.bp/`` is written into, see
    :meth:`write`; where the loaded ADIOS2 lists the feature
    :data:`~hpckpt.storage.adios2_c.IN_PLACE_WRITE`, over the old data files' blocks
    without truncating them: ``TruncateDataFiles=false``, which ``parameters`` may
    override) and collectively (the aggregators gather the other ranks' data and
    metadata). Where the loaded ADIOS2 lists
    :data:`~hpckpt.storage.adios2_c.QUIET_WAIT`, ``QuietWait=true``: a rank that has
    written its data waits for the slower ranks asleep, not spinning inside MPI.
    """

    name = "adios2"
    capabilities = Capabilities(writes_in_place=True, collective_write=True)

    @classmethod
    def striped_options(cls, striping: Striping, options: Mapping[str, Any]) -> dict[str, Any]:
        """One subfile per stripe target (two-level aggregation), the given parameters first."""
        striped = {"AggregationType": "TwoLevelShm", "NumAggregators": str(striping.count)}
        return {**options, "parameters": {**striped, **options.get("parameters", {})}}

    def __init__(
        self, parameters: Mapping[str, Any] | None = None, engine: str = "BP5", direct_io: bool = True
    ) -> None:
        _require_adios2()
        self.engine = engine
        available = features()
        in_place = IN_PLACE_PARAMETERS if IN_PLACE_WRITE in available else {}
        quiet = QUIET_PARAMETERS if QUIET_WAIT in available else {}
        given = {str(k): str(v) for k, v in (parameters or {}).items()}
        self.parameters = {**DEFAULT_PARAMETERS, **in_place, **quiet, **given}
        chosen = [value for key, value in self.parameters.items() if key.lower() == "directio"]  # any case
        self.direct_io = bool(direct_io) and not chosen and ZERO_COPY in available
        wants_direct = bool(direct_io) and (not chosen or chosen[-1].lower() in ("true", "on"))
        self.read_parameters = {"DirectIO": "true"} if wants_direct and DIRECT_READ in available else {}
        self.reads_in_place = CONTIGUOUS_READ in available  # rows straight into the caller's memory
        self._takes_direct: dict[Path, bool] = {}  # per run directory: whether it takes O_DIRECT

    @property
    def reads_direct(self) -> bool:
        """Whether steps are read with ``DirectIO`` (:attr:`read_parameters`): large reads
        with ``O_DIRECT``, those into memory off a page through bounce buffers.
        """
        return bool(self.read_parameters)

    def write_parameters(self, directory: Path) -> dict[str, str]:
        """The engine parameters of a step written into ``directory`` (created if missing,
        as BP5 would): :data:`DIRECT_PARAMETERS` added where ``direct_io`` holds (see the
        class) and ``directory``'s file system takes ``O_DIRECT`` (a probe file, removed;
        once per run directory, ``directory``'s parent, not at every save). Not
        collective: every rank of a step gets the same answer from the same directory.
        """
        if not self.direct_io:
            return self.parameters
        takes = self._takes_direct.get(directory.parent)
        if takes is None:
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f".direct-probe-{os.getpid()}"
            descriptor = direct.open_direct(probe, os.O_WRONLY | os.O_CREAT)
            takes = descriptor >= 0
            if takes:
                os.close(descriptor)
            probe.unlink(missing_ok=True)
            self._takes_direct[directory.parent] = takes
        return {**self.parameters, **DIRECT_PARAMETERS} if takes else self.parameters

    def layout(
        self, records: Sequence[LeafRecord], start: ADIOS2Start | None = None
    ) -> tuple[LeafRecord, ...]:
        """Variables are named by leaf path; local blocks get their ADIOS2 block id: their
        index among the ADIOS2 blocks holding bytes, in rank order (after the ``start`` of
        a group's, per Local leaf); a block stored in pieces (:func:`stored_pieces`) has
        the ids from its own on, and its location says how many and of how many elements.
        """
        placed = []
        for record in records:
            location: dict[str, Any] = {"directory": DIRECTORY_NAME, "variable": record.path}
            if stores_bytes(record.dtype):
                location["encoding"] = "bytes"
            blocks = record.blocks
            if record.kind == LeafKind.LOCAL:
                locations = _local_locations(record, (start or {}).get(record.path, 0))
                # Direct construction: dataclasses.replace costs 5 us a call, 10,000s per save.
                blocks = tuple(
                    Block(b.rank, b.offset, b.shape, b.checksum, locations[b.rank], b.members)
                    if b.size
                    else b
                    for b in blocks
                )
            placed.append(
                LeafRecord(record.path, record.kind, record.dtype, record.global_shape, blocks, location,
                           record.encoding)
            )
        return tuple(placed)

    def group_extent(self, records: Sequence[LeafRecord], ranks: range) -> ADIOS2Extent:
        """Per Local leaf, how many ADIOS2 blocks hold the bytes of the group's blocks."""
        return {
            record.path: sum(stored_pieces(record, block) for block in record.blocks if block.size)
            for record in records
            if record.kind == LeafKind.LOCAL
        }

    def group_starts(
        self, extents: Sequence[ADIOS2Extent], headers: Sequence[LeafRecord]
    ) -> list[ADIOS2Start]:
        """Per group, per Local leaf: the blocks holding bytes before it (its first block id)."""
        return running_totals(extents)[0]

    def write(
        self,
        comm: MPI.Comm,
        directory: Path,
        records: Sequence[LeafRecord],
        blocks: Sequence[BlockData],
        annotations: Annotations = NO_ANNOTATIONS,
    ) -> list[str]:
        """Put every non-empty block in one BP5 step and close it. Collective over ``comm``.

        Through ADIOS2's C API (:mod:`hpckpt.storage.adios2_c`), which releases the
        GIL in every call, so a save in a background thread cannot deadlock with the
        application's own MPI calls. ``annotations`` are not shown (the manifest holds
        them).

        A process writing several blocks of one local leaf (``hpckpt convert``) must
        pass them in rank order, so block ids match the layout.
        """
        root = directory / DIRECTORY_NAME
        # A data.bp/ recycled from a deleted step is written into: BP5 writes over the data
        # files it writes again (with IN_PLACE_PARAMETERS; an unpatched BP5 truncates and
        # reuses them, still cheaper here than new files while old ones are freed) and
        # removes the others (tests/mpi/test_conformance.py checks both).
        parameters = self.write_parameters(directory)
        in_pieces = writes_in_pieces(parameters)
        whole: list[BlockPut] = []
        later: list[BlockPut] = []
        pieced = [data for data in blocks if PIECES in data.block.location]  # filled as written
        for data in blocks:
            if data.block.size and PIECES not in data.block.location:
                record = data.record
                stored = _stored_view(data.contents(), record.location.get("encoding") == "bytes")
                put = BlockPut(record.path, str(record.kind), stored, *_selection(record, data.block))
                (later if in_pieces and goes_in_pieces(put) else whole).append(put)
        fills = buffer_fills(later)
        piece_writes = sum(data.block.location[PIECES] for data in pieced)  # one per piece
        writes = _most(comm, piece_writes + len(fills)) if in_pieces else 0
        step = BP5Step(comm, root, self.engine, parameters)
        for put in whole:
            step.put(put.name, put.kind, put.array, put.shape, put.start, put.count)
        for data in pieced:
            put_filled_pieces(step, data, in_pieces)
        if writes:
            put_in_pieces(step, fills, writes - piece_writes)
        step.close()
        return [DIRECTORY_NAME] + sorted(f"{DIRECTORY_NAME}/{name}" for name in os.listdir(root))

    def writes_gathered(self, path: str) -> bool:
        """The pack is filled as BP5 writes it, a piece at a time (:func:`stored_pieces`)."""
        return path == PACK_PATH

    def written_files(self, files: Sequence[str], rank: int, size: int) -> list[str]:
        """Every file of ``data.bp/``: which rank aggregates which subfile is ADIOS2's choice."""
        return [name for name in files if name != DIRECTORY_NAME]

    def metadata_files(self, files: Sequence[str]) -> list[str]:
        """Everything in ``data.bp/`` but the data files: ``md.idx``, ``md.0``, ``mmd.0``, ...

        A flipped byte in them made ADIOS2 crash the process; checksummed, they are
        refused before ADIOS2 reads them.
        """
        prefix = DIRECTORY_NAME + "/"
        return [
            name for name in files if name.startswith(prefix) and not _DATA_FILE.match(name[len(prefix):])
        ]

    def read(self, directory: Path, requests: Sequence[BlockData], landed: Landed | None = None) -> None:
        """Fill each request's ``array`` from ``data.bp``, reporting its bytes to ``landed``
        as they land. Independent (this process opens the step alone).

        A box of a global array is read in slabs along its first axis (a local block
        whole), planned before the first read, so that a missing variable or another
        shape is refused before ADIOS2 reads anything; a helper thread makes BP5's
        gets while this one copies the slabs read through bounce buffers into place and
        checksums follow (:mod:`~hpckpt.storage.bp5_reads` says which slab is read how).
        """
        requests = [request for request in requests if request.block.size]
        if not requests:
            return
        path = directory / DIRECTORY_NAME
        if not path.is_dir():
            raise FileNotFoundError(f"{path} does not exist")
        wanted = [
            Wanted(request, _stored_view(request.array, request.record.location.get("encoding") == "bytes"),
                   *_selection(request.record, request.block))
            for request in requests
        ]
        read_step(
            path, self.engine, self.read_parameters, wanted, self.reads_in_place, self.reads_direct, landed
        )
