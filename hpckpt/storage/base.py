"""The storage interface: where and how the bytes of a step go.

A backend knows nothing of protocols; it stores and fetches *blocks*: the part of a
leaf one rank wrote (see :class:`~hpckpt.model.manifest.Block`). Per saved step the
protocol calls:

1. ``layout(records)`` on every rank (pure, no I/O): the records with the backend's
   ``location`` filled in for each leaf and, where the backend needs it, each block;
   every rank computes the same layout from the same records;
2. ``write(comm, directory, records, blocks, annotations)`` on every rank together (collective),
   into the step's temporary directory, which exists when it is called. ``blocks``
   are the blocks this process writes: with more than one rank, each rank passes its
   own block of every distributed and local leaf (empty ones included) and rank 0 the
   replicated ones; a single process (``hpckpt convert``) may pass every block.
   Returns every file name of the step (relative to ``directory``); then each rank
   fsyncs ``written_files(files, rank, size)``, the files it may have written.
   ``annotations`` (the plain values, the axis names) are passed only to a backend
   that declares ``shows_annotations`` (it shows them to other tools in its files);
   the manifest holds them in any case.

and per restored step:

3. ``read(directory, requests, landed)`` on each rank independently, whole stored
   blocks only; a missing file, variable or dataset raises ``KeyError`` or ``OSError``.
   ``landed(request, n)``, when given, is called each time the first ``n`` bytes of a
   request's array are in place (in increasing order), so that the reader can
   checksum them while the rest is read.

Backends derive from :class:`Backend`, which declares their optional capabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..model.layout import records_by_rank
from ..model.manifest import Block, LeafRecord

if TYPE_CHECKING:
    from mpi4py import MPI

    from .lustre import Striping


class Encoded(NamedTuple):
    """A block as a backend stores it: ``stored`` bytes made by ``codec`` (None: the array
    itself), and ``restored``, what reading them gives back (the array, unless lossy)."""

    stored: np.ndarray
    codec: str | None
    restored: np.ndarray


@dataclass(frozen=True)
class BlockData:
    """One stored block and its bytes: ``array`` (C-contiguous) is written, or read into."""

    record: LeafRecord
    block: Block
    array: np.ndarray


@dataclass(frozen=True)
class Annotations:
    """What a step says besides its arrays' bytes, for backends that show it to other
    tools (hdf5: attributes and dimension scales): the plain values by path, and the
    axis names of global arrays (``dims=``) by path."""

    values: Mapping[str, Any] = field(default_factory=dict)
    dims: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


NO_ANNOTATIONS = Annotations()
Landed = Callable[[BlockData, int], None]  # (request, bytes of its array now in place from the start)


class Backend:
    """The base class of every storage backend (see the module docstring for call order).

    A backend sets ``name`` and implements ``layout``, ``write`` and ``read``; the
    capabilities below are off unless it declares them:

    - ``writes_in_place = True``: ``write`` overwrites files that already exist in the
      step directory without truncating them first (and cuts them to size after), so
      retention recycles a deleted step's files for the next save (storage/commit.py);
    - ``collective_write = True``: ``write`` makes collective calls inside the I/O
      library (ADIOS2's aggregation); the protocol first waits, under the watchdog, for
      every rank to arrive, so a rank that never joins is named (hpckpt/_comm.py);
    - ``shows_annotations = True``: ``write`` takes a fifth argument, the step's
      :class:`Annotations`, and shows them to other tools in its files (hdf5);
    - ``repairable_in_job = True``: a save can be repeated over a communicator that
      in-job recovery (ULFM) repaired; the backend's library keeps no collective
      state across saves (recovery="ulfm" needs it);
    - ``striped_options(striping, options)``: the backend's options tuned for the
      Lustre striping of the step directories (storage/lustre.py), where not given;
    - ``encode(path, array) -> Encoded``: the bytes stored for a block of leaf ``path``
      (compression), called on each rank before the layout; ``layout`` then finds each
      block's size and codec in ``block.location["stored_bytes"]`` and ``["codec"]``,
      and ``read`` decodes (see storage/posix.py). None: blocks are stored as they are;
    - ``stores_exactly(path)``: False where ``encode`` is lossy for leaf ``path``, whose
      small Local blocks are then not packed with others (model/layout.py).
    """

    name: str = ""
    lays_out_in_groups: bool = False  # see layout()
    writes_in_place: bool = False
    collective_write: bool = False
    shows_annotations: bool = False
    repairable_in_job: bool = False
    encode: Callable[[str, np.ndarray], Encoded] | None = None

    @classmethod
    def striped_options(cls, striping: Striping, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` with this backend's defaults for ``striping`` filled in where not
        given. Pure. Default: unchanged."""
        return dict(options)

    def stores_exactly(self, path: str) -> bool:
        """Whether a restore gives back leaf ``path``'s bytes exactly. Pure. Default: True."""
        return True

    def layout(self, records: Sequence[LeafRecord], start: Any = None) -> tuple[LeafRecord, ...]:
        """``records`` with their storage locations filled in. Pure and deterministic.

        Where :attr:`lays_out_in_groups`, ``records`` may hold the blocks of a group of
        consecutive ranks only (a leader's, see model/layout.py ``merge_group``), and
        ``start``, the group's from :meth:`group_starts`, says where the blocks of the
        ranks before it end. The blocks are placed as in a layout of all ranks.
        """
        raise NotImplementedError

    def group_extent(self, records: Sequence[LeafRecord], ranks: range) -> Any:
        """What the blocks of a group's ``records`` (a leader's, merged from the plans of
        its ``ranks``) take up, for the groups after it: small, sent to rank 0. Pure.
        Default: None (no block's place depends on another group's)."""
        return None

    def group_starts(self, extents: Sequence[Any], headers: Sequence[LeafRecord]) -> list[Any]:
        """Each group's ``start`` for :meth:`layout`, from every group's
        :meth:`group_extent` in rank order (rank 0, whose group is first, lays out the
        step's ``headers``, the records it writes without blocks, with its own; it may
        say what the whole step takes). Pure. Default: None for each."""
        return [None] * len(extents)

    def parts(self, records: Sequence[LeafRecord], ranks: range) -> list[tuple[LeafRecord, ...]]:
        """What each rank of ``ranks`` passes to :meth:`write` as its ``records``, of the
        laid-out ``records`` (rank 0 passes them all, unless laid out in groups). Pure;
        computed once per layout. Default: every record, with only that rank's blocks."""
        return records_by_rank(records, ranks)

    def write(
        self, comm: MPI.Comm, directory: Path, records: Sequence[LeafRecord], blocks: Sequence[BlockData]
    ) -> list[str]:
        """Write ``blocks``; return the step's file names. Collective over ``comm``: rank 0
        passes every laid-out record, another rank its part (:meth:`parts`). (A backend
        that ``shows_annotations`` takes the step's :class:`Annotations` too.)"""
        raise NotImplementedError

    def read(self, directory: Path, requests: Sequence[BlockData], landed: Landed | None = None) -> None:
        """Fill each request's ``array`` with its stored block (``landed``: see the module).
        Independent, per rank."""
        raise NotImplementedError

    def written_files(self, files: Sequence[str], rank: int, size: int) -> list[str]:
        """The files among ``files`` (from :meth:`write`) that rank ``rank`` of ``size``
        may have written: it makes them durable before the commit. Pure. Default: all."""
        return list(files)

    def metadata_files(self, files: Sequence[str]) -> list[str]:
        """The files among ``files`` (from :meth:`write`) that the library parses but no
        block checksum covers (indexes, metadata). The commit checksums them whole and
        restore checks them before the library opens the step. Pure. Default: none."""
        return []
