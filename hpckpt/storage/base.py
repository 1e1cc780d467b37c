"""The storage interface: where and how the bytes of a step go.

A backend knows nothing of protocols; it stores and fetches *blocks*: the part of a
leaf one rank wrote (see :class:`~hpckpt.model.records.Block`). A backend derives from
:class:`Backend`, implements its three abstract methods and declares its
:class:`Capabilities`; one that lays a step out in groups of ranks also implements
:class:`GroupLayout`. Per saved step the protocol calls:

1. ``encode(path, array)`` on every rank, for each block it stores, before the layout
   (not collective): the bytes stored (compression) and what reading them gives back;
2. ``layout(records)`` (pure, no I/O): the records with the backend's ``location``
   filled in for each leaf and, where the backend needs it, each block. Rank 0 lays
   out every rank's records, or, with a :class:`GroupLayout`, each group's leader its
   group's; every rank of a step gets the same locations;
3. ``parts(records, ranks)`` on the rank that laid them out: what each rank passes to
   ``write``;
4. ``write(comm, directory, records, blocks, annotations)`` on every rank together
   (collective), into the step's temporary directory, which exists when it is called.
   ``blocks`` are the blocks this process writes: with more than one rank, each rank
   passes its own block of every distributed and local leaf (empty ones included) and
   its chunk of the replicated ones; a single process (``hpckpt convert``) may pass
   every block. It returns file names relative to ``directory``: at least those this
   rank wrote (rank 0: those of every record it passed). ``annotations`` (the plain values,
   the axis names) are for a backend that shows them to other tools in its files; the
   manifest holds them in any case, so other backends ignore them;
5. ``written_files(files, rank, size)`` on every rank: the files it fsyncs before the
   commit (the backend itself need not fsync), and ``metadata_files(files)`` on rank 0:
   the files the commit checksums whole.

and per restored step:

6. ``read(directory, requests, landed)`` on each rank independently, whole stored
   blocks only; a missing file, variable or dataset raises ``KeyError`` or ``OSError``,
   damaged contents ``OSError``, ``KeyError`` or ``ValueError`` (restore then falls
   back to an older step). ``landed(request, n)``, when given, is called each time the
   first ``n`` bytes of a request's array are in place (in increasing order), so that
   the reader can checksum them while the rest is read.

The capabilities (all off unless a backend declares them) are:

- ``writes_in_place``: ``write`` overwrites files that already exist in the step
  directory without truncating them first (and cuts them to size after), so retention
  recycles a deleted step's files for the next save (storage/commit.py);
- ``collective_write``: ``write`` makes collective calls inside the I/O library
  (ADIOS2's aggregation); the protocol first waits, under the watchdog, for every rank
  to arrive, so a rank that never joins is named (hpckpt/_comm.py);
- ``shows_annotations``: ``write`` shows the step's :class:`Annotations` to other tools
  in its files (hdf5);
- ``repairable_in_job``: a save can be repeated over a communicator that in-job
  recovery (ULFM) repaired; the backend's library keeps no collective state across
  saves (``recovery="ulfm"`` needs it).

:mod:`hpckpt.testing.conformance` holds the tests every backend passes. docs/backends.md
walks through writing one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol, TypeVar, runtime_checkable

import numpy as np

from ..buffers.gathered import Gathered, PieceBytes
from ..model.layout import records_by_rank
from ..model.manifest import Block, LeafRecord

if TYPE_CHECKING:
    from mpi4py import MPI

    from .lustre import Striping


class Encoded(NamedTuple):
    """A block as a backend stores it: ``stored`` bytes made by ``codec`` (None: the array
    itself), and ``restored``, what reading them gives back (the array, unless lossy).
    """

    stored: np.ndarray
    codec: str | None
    restored: np.ndarray


@dataclass(frozen=True)
class BlockData:
    """One stored block and its bytes: ``array`` (C-contiguous) is written, or read into.

    A block to write may be ``gathered``: ``array`` is then its buffer, not yet filled
    (a pack, for a backend whose :meth:`Backend.writes_gathered` says so), and is read
    through :meth:`placed` or :meth:`contents`, never directly.
    """

    record: LeafRecord
    block: Block
    array: np.ndarray
    gathered: Gathered | None = None

    def placed(self, offset: int) -> list[tuple[int, PieceBytes]]:
        """(file offset, bytes) of the block written from file ``offset`` on: a gathered
        block as bytes that its writer fills as it goes.
        """
        if self.gathered is not None:
            return [(offset, self.gathered.bytes())]
        return [(offset, self.array.reshape(-1).view(np.uint8).data)]

    def contents(self) -> np.ndarray:
        """``array``, filled first where it is gathered."""
        return self.gathered.filled() if self.gathered is not None else self.array


def written_block(record: LeafRecord, block: Block, stored: np.ndarray | Gathered) -> BlockData:
    """The block to write holding ``stored``: an array, or a gathered block. Pure."""
    if isinstance(stored, Gathered):
        return BlockData(record, block, stored.buffer, stored)
    return BlockData(record, block, stored)


@dataclass(frozen=True)
class Annotations:
    """What a step says besides its arrays' bytes, for backends that show it to other
    tools (hdf5: attributes and dimension scales): the plain values by path, and the
    axis names of global arrays (``dims=``) by path.
    """

    values: Mapping[str, Any] = field(default_factory=dict)
    dims: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


#: A step with no plain values and no axis names: the default of :meth:`Backend.write`.
NO_ANNOTATIONS = Annotations()
Landed = Callable[[BlockData, int], None]  # (request, bytes of its array now in place from the start)


@dataclass(frozen=True)
class Capabilities:
    """What a backend's ``write`` does beyond the contract (see the module docstring):
    ``writes_in_place``, ``collective_write``, ``shows_annotations`` and
    ``repairable_in_job``, all off by default.
    """

    writes_in_place: bool = False
    collective_write: bool = False
    shows_annotations: bool = False
    repairable_in_job: bool = False


ExtentT = TypeVar("ExtentT")
StartT = TypeVar("StartT")


@runtime_checkable
class GroupLayout(Protocol[ExtentT, StartT]):
    """A backend that lays a step out in groups of consecutive ranks: each group's
    leader lays out its group's blocks, placed as in a layout of all ranks
    (model/layout.py ``merge_group``), so that no rank handles every block.

    The leaders send rank 0 each group's :meth:`group_extent` (``ExtentT``, small);
    rank 0 turns them into each group's ``start`` (``StartT``) with :meth:`group_starts`
    and sends them back; each leader then calls ``layout(records, start)``. A backend
    without it is laid out whole by rank 0. ``isinstance(backend, GroupLayout)`` tells.
    """

    def group_extent(self, records: Sequence[LeafRecord], ranks: range) -> ExtentT:
        """What the blocks of a group's ``records`` (a leader's, merged from the plans of
        its ``ranks``) take up, for the groups after it. Pure; called by each leader.
        """
        ...

    def group_starts(self, extents: Sequence[ExtentT], headers: Sequence[LeafRecord]) -> list[StartT]:
        """Each group's ``start`` for :meth:`layout`, from every group's
        :meth:`group_extent` in rank order. Rank 0, whose group is first, lays out the
        step's ``headers`` (every record, without blocks) with its own start. Pure;
        called by rank 0.
        """
        ...

    def layout(self, records: Sequence[LeafRecord], start: StartT | None = None) -> tuple[LeafRecord, ...]:
        """``records`` laid out; with a group's ``start``, ``records`` hold the blocks
        of that group's ranks only, placed as in a layout of all ranks. Pure.
        """
        ...


class Backend(ABC):
    """The base class of every storage backend (see the module docstring for call order).

    A backend sets ``name`` (the name it is registered under, recorded in manifests)
    and ``capabilities``, and implements :meth:`layout`, :meth:`write` and :meth:`read`.
    The other methods have defaults that suit a backend storing each block as it is.
    """

    name: str = ""
    capabilities: ClassVar[Capabilities] = Capabilities()

    @classmethod
    def striped_options(cls, striping: Striping, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` with this backend's defaults for the Lustre ``striping`` of the
        step directories (storage/lustre.py) filled in where not given. Pure; called on
        every rank before the backend is made. Default: unchanged.
        """
        return dict(options)

    def encode(self, path: str, array: np.ndarray) -> Encoded:
        """The bytes stored for ``array``, a block of leaf ``path`` (compression). Not
        collective; called on each rank before the layout. :meth:`layout` then finds an
        encoded block's size and codec in ``block.stored_bytes`` and ``block.codec``
        (it keeps them in the location it gives, with
        :func:`~hpckpt.model.records.encoded_location`), and :meth:`read` decodes (see
        storage/posix.py). Default: the array as it is.
        """
        return Encoded(array, None, array)

    def stores_exactly(self, path: str) -> bool:
        """Whether a restore gives back leaf ``path``'s bytes exactly: False where
        :meth:`encode` is lossy for it, whose small Local blocks are then not packed
        with others (model/layout.py). Pure. Default: True.
        """
        return True

    def writes_gathered(self, path: str) -> bool:
        """Whether :meth:`write` takes leaf ``path``'s block gathered (a pack:
        :class:`~hpckpt.buffers.gathered.Gathered`, filled as it is written), where
        :meth:`encode` stores its bytes as they are and :meth:`write` places each block's
        bytes with :meth:`BlockData.placed` or fills a gathered block's buffer itself,
        in order, before it writes each part (``BlockData.gathered.fill_to``). Pure.
        Default: False (filled before the write).
        """
        return False

    @abstractmethod
    def layout(self, records: Sequence[LeafRecord]) -> tuple[LeafRecord, ...]:
        """``records`` with their storage locations filled in. Pure and deterministic:
        the same records give the same layout on any rank. Called by the rank that lays
        out the step (rank 0, unless a :class:`GroupLayout`).
        """

    def parts(self, records: Sequence[LeafRecord], ranks: range) -> list[tuple[LeafRecord, ...]]:
        """What each rank of ``ranks`` passes to :meth:`write` as its ``records``, of the
        laid-out ``records`` (rank 0 passes them all, unless laid out in groups). Pure;
        computed once per layout. Default: every record, with only that rank's blocks.
        """
        return records_by_rank(records, ranks)

    def own_part(self, records: Sequence[LeafRecord], rank: int) -> tuple[LeafRecord, ...] | None:
        """``rank``'s entry of :meth:`parts` made from ``records`` that hold at least
        ``rank``'s own blocks (its part of a restored step), or None where that entry
        may need the blocks of other ranks too. Pure. Default: the default
        :meth:`parts`' entry; None for a backend with its own :meth:`parts`.
        """
        if type(self).parts is not Backend.parts:
            return None
        return self.parts(records, range(rank, rank + 1))[0]

    @abstractmethod
    def write(
        self,
        comm: MPI.Comm,
        directory: Path,
        records: Sequence[LeafRecord],
        blocks: Sequence[BlockData],
        annotations: Annotations = NO_ANNOTATIONS,
    ) -> list[str]:
        """Write ``blocks`` into ``directory``; return the step's file names (relative).

        Collective over ``comm``: rank 0 passes every laid-out record, another rank its
        part (:meth:`parts`). ``annotations`` are the step's plain values and axis names,
        for a backend that ``shows_annotations``; others ignore them. The protocol makes
        the files durable (:meth:`written_files`).
        """

    @abstractmethod
    def read(self, directory: Path, requests: Sequence[BlockData], landed: Landed | None = None) -> None:
        """Fill each request's ``array`` with its stored block, reporting the bytes in
        place to ``landed`` (see the module). Independent, per rank: no collective
        calls, so a rank that fails while reading cannot leave others waiting.
        """

    def stored_order(self, record: LeafRecord) -> tuple[float, ...]:
        """Where ``record``'s blocks lie in this backend's files, against other records':
        sorting records by it (stably: ties in manifest order) gives the order in which
        :meth:`read` reaches a rank's blocks. A restore broadcasts replicated chunks in
        that order, so that each chunk goes out as soon as its reader has it. Pure:
        every rank computes the same for the same record. Default: manifest order.
        """
        return ()

    def written_files(self, files: Sequence[str], rank: int, size: int) -> list[str]:
        """The files among ``files`` (from :meth:`write`) that rank ``rank`` of ``size``
        may have written: it makes them durable before the commit. Pure; called on
        every rank. Default: all.
        """
        return list(files)

    def metadata_files(self, files: Sequence[str]) -> list[str]:
        """The files among ``files`` (from :meth:`write`) that the library parses but no
        block checksum covers (indexes, metadata). The commit checksums them whole and
        restore checks them before the library opens the step. Pure; called on rank 0.
        Default: none.
        """
        return []
