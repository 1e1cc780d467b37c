"""HDF5 backend: one file per step, laid out by rank 0 with h5py, its data written by every rank.

Layout of ``data.h5`` (readable with plain h5py and ``h5dump``):

- a distributed or replicated leaf ``a/b`` is the dataset ``/a/b`` holding the whole
  global array, contiguous; each rank writes its hyperslab's bytes at the dataset's file
  offset (rank 0 creates the file and the datasets first), whole pages of large
  blocks with direct I/O (:mod:`hpckpt.storage.direct`);
- a local leaf ``a/b`` is the 1-D dataset ``/a/b`` of its dtype holding every rank's
  block, flattened in C order, one after the other in rank order; a block's
  ``location`` in the manifest gives its first element (``"start"``) and the leaf's
  the dataset's length (``"elements"``). (Older writers made the group ``/a/b`` with a
  dataset per rank, ``rank-00003``, which hpckpt still reads: at 100,000 ranks, rank 0
  spent 21 s creating them);
- a partial array (an incremental step's changed blocks, one rank's own checkpoint) is
  concatenated the same way: the 1-D dataset ``/a/b`` holds its blocks one after the
  other, each flattened in C order, from the element ``"start"`` (older writers: a
  dataset per block, ``/a/b/rank-00003``, or a chunked dataset of the global shape,
  which hpckpt still reads);
- every dataset has the attribute ``hpckpt_kind``;
- the datasets of :data:`EARLY_BYTES` or more are created first, then the smaller ones,
  each part in the order of the lowest rank writing each (so they lie in the file in
  that order; HDF5 puts the small datasets after them or in the gaps that alignment
  left), and (in a file of :data:`MANY_DATASETS` or more) HDF5 gathers their headers in
  metadata blocks of 4 KiB per dataset, up to 1 MiB: the arrays that one rank writes
  whole (a model's replicated tensors under 4 MiB,
  :func:`~hpckpt.model.plans.writer_chunk`) follow each other, so that rank writes them
  in long direct runs. Rank 0 broadcasts the large datasets' offsets as soon as they
  exist, and the ranks write their bytes while it creates the rest: for a model's 588
  tensors, the ranks waited 6-7 ms for the 150 large ones, against 36 ms for them all
  (rank 0 alone).

Which of these layouts holds a block is told in one place,
:func:`~hpckpt.storage.hdf5_layout.stored_layout` (its docstring says which writers and
manifest versions made each).

A ``data.h5`` already in the step directory (recycled by retention from the deleted
step) whose datasets are exactly those of the new step (same paths, shapes, dtypes,
contiguous) is written over in place at the same offsets: no blocks are freed and
allocated again. Any other file is truncated and created anew. h5py need not be built
with MPI: no HDF5 call is collective.

Rank 0 also keeps each dataset's file offset in the root attributes ``hpckpt_offsets_N``
(:func:`~hpckpt.storage.hdf5_files.write_offsets`). Restore opens the file with HDF5's
default driver (independent, so a rank that fails while reading cannot leave the others
waiting in a collective call), finds each dataset of the global shape at its listed
offset (opening and checking a dataset cost 0.1 ms each, 30 ms for a model's 300
tensors, before the first byte was read) or, where the table has no usable entry (older
files, damage), opens and checks the dataset, and reads the contiguous datasets' bytes
with ``preadv`` at their offsets, all together: whole pages of large blocks, and runs of
blocks that lie together, directly (:mod:`hpckpt.storage.direct_read`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property, partial
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from .._checks import require_count
from .._comm import await_everyone
from .._hooks import point
from ..buffers.gathered import PieceBytes
from ..model.group_merge import running_totals
from ..model.kinds import LeafKind
from ..model.manifest import LeafRecord
from . import direct
from .base import NO_ANNOTATIONS, Annotations, Backend, BlockData, Capabilities, GroupLayout, Landed
from .direct_read import BlockFile, Segment
from .hdf5_files import (
    DatasetMaker,
    StoredBox,
    attach_dimension_scales,
    box_segments,
    check_dataset,
    concatenated_extent,
    file_pieces,
    layout_digest,
    listed_offsets,
    open_dataset,
    read_box,
    set_value_attributes,
    stored_offsets,
    write_offsets,
)
from .hdf5_layout import (
    FILE_NAME,
    HDF5Layout,
    block_start,
    dataset_name,
    dataset_path,
    dataset_shape,
    placed,
    stored_layout,
)

if TYPE_CHECKING:
    from mpi4py import MPI

    from .lustre import Striping

LAYOUT_ATTRIBUTE = "hpckpt_layout"  # digest of the datasets hpckpt created in the file
# A file of MANY_DATASETS datasets or more sets HDF5 metadata aside in blocks of 4 KiB per dataset
# (about what a header and its groups take), 1 MiB at most; what stays unused is a hole in the file.
# A smaller file keeps HDF5's 2 KiB blocks, and so its size.
MANY_DATASETS, META_BLOCK_PER_DATASET, META_BLOCK_MAX = 64, 4 << 10, 1 << 20
# Datasets of EARLY_BYTES or more are created first, and their bytes written while rank 0 creates the rest.
EARLY_BYTES = 64 << 10
HDF5Extent: TypeAlias = dict[str, int]  # a group's: per Local and distributed leaf, its blocks' elements
# a group's start: per concatenated leaf, the elements of the earlier groups' blocks and of every group's
HDF5Start: TypeAlias = dict[str, tuple[int, int]]


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as exc:
        raise ImportError("the hdf5 backend needs h5py: `pip install h5py` (hpckpt's [hdf5] extra)") from exc
    return h5py


def _first_writer(record: LeafRecord) -> float:
    """The lowest rank writing bytes of ``record`` (infinite for none: it sorts last)."""
    return min((block.rank for block in record.blocks if block.size), default=math.inf)


class HDF5Backend(Backend, GroupLayout[HDF5Extent, HDF5Start]):
    """Parallel HDF5 storage (see the module docstring for the file layout).

    Parameters
    ----------
    alignment
        Align every dataset of ``alignment_threshold`` bytes or more to a multiple of
        this many bytes (the stripe size on Lustre). Default: with ``direct_io``, the
        datasets large enough for direct writes (4 MiB) start on a page, so that
        page-aligned memory (a non-blocking save's snapshot) is written with no copy;
        else no alignment. (The data bypasses MPI-IO, so there are no MPI-IO hints: a
        Lustre step directory's striping, :mod:`hpckpt.storage.lustre`, sets the files'
        layout.)
    alignment_threshold
        The smallest dataset that is aligned (default 64 KiB).
    direct_io
        Write and read whole pages of large blocks with direct I/O (default;
        :mod:`hpckpt.storage.direct`, :mod:`hpckpt.storage.direct_read`), the rest
        through the page cache; False: every write and read buffered.

    Laid out in groups: a group's Local blocks start after the earlier groups' elements
    (:meth:`group_starts`). Shows the annotations: plain values as root attributes, axis
    names as dimension scales.
    """

    name = "hdf5"
    capabilities = Capabilities(writes_in_place=True, shows_annotations=True)

    @classmethod
    def striped_options(cls, striping: Striping, options: Mapping[str, Any]) -> dict[str, Any]:
        """Datasets aligned to the stripe size, so that no two ranks' hyperslabs share a stripe."""
        return {"alignment": striping.size, **options}

    def __init__(
        self,
        alignment: int | None = None,
        alignment_threshold: int = 65536,
        direct_io: bool = True,
    ) -> None:
        self._h5py = _h5py()
        for name, value in (("alignment", alignment), ("alignment_threshold", alignment_threshold)):
            if value is not None:
                require_count(value, f"hdf5 backend: {name}", 1)
        self.alignment, self.alignment_threshold = alignment, alignment_threshold
        self.direct_io = bool(direct_io)

    def writes_gathered(self, path: str) -> bool:
        """True: every block's bytes go into its dataset's file range (:meth:`write`)."""
        return True

    def layout(
        self, records: Sequence[LeafRecord], start: HDF5Start | None = None
    ) -> tuple[LeafRecord, ...]:
        """Each leaf lives in ``data.h5`` at the dataset of its path; a block of a Local
        leaf or of a partial array at its first element there (after the ``start`` of a
        group's, which names those leaves: per leaf, the elements of the earlier groups'
        blocks and of every rank's).
        """
        return tuple(placed(record, start) for record in records)

    def group_extent(self, records: Sequence[LeafRecord], ranks: range) -> HDF5Extent:
        """Per Local and distributed leaf, the elements of the group's blocks."""
        return {
            record.path: sum(block.size for block in record.blocks)
            for record in records
            if record.kind != LeafKind.REPLICATED
        }

    def group_starts(self, extents: Sequence[HDF5Extent], headers: Sequence[LeafRecord]) -> list[HDF5Start]:
        """Per group, per leaf whose blocks are concatenated: the elements before it,
        and every rank's. Those are the Local leaves and the partial arrays: distributed
        leaves whose blocks, added up over the groups, do not fill them (an incremental
        step reuses the others).
        """
        starts, totals = running_totals(extents)
        joined = [
            header.path
            for header in headers
            if header.path in totals
            and (header.kind == LeafKind.LOCAL or totals[header.path] < math.prod(header.whole_shape))
        ]
        return [{path: (start[path], totals[path]) for path in joined} for start in starts]

    def write(
        self, comm: MPI.Comm, directory: Path, records: Sequence[LeafRecord], blocks: Sequence[BlockData],
        annotations: Annotations = NO_ANNOTATIONS,
    ) -> list[str]:
        """Rank 0 lays out ``data.h5`` in two parts; every rank writes its ``blocks`` with
        ``pwrite`` as soon as their datasets have their offsets.

        Collective over ``comm`` (two broadcasts): rank 0 passes every record (laid out in
        groups: every record with its own blocks only), another rank its part
        (:meth:`~hpckpt.storage.base.Backend.parts`). Rank 0 creates the file with serial
        HDF5 and first the datasets of :data:`EARLY_BYTES` or more, contiguous and
        allocated at once (or reuses a recycled file of the same layout), and broadcasts
        their file offsets. Every rank writes the C-order runs of its blocks of those
        datasets, nearly all the bytes (:func:`~hpckpt.storage.direct.write_pieces`),
        while rank 0 creates the small datasets, the dimension scales and the attributes
        in a helper thread (:class:`_FileLayout`); a second broadcast gives the small
        datasets' offsets, and every rank writes the rest. No HDF5, no MPI and no GIL in
        the data path, so a save in a background thread cannot deadlock with the
        application's MPI calls.
        """
        path = directory / FILE_NAME
        layout = _FileLayout(self, path, records, annotations) if comm.rank == 0 else None
        early = _offsets_from_rank_zero(comm, path, layout.begin if layout else None)
        first = [data for data in blocks if dataset_path(data.record) in early]
        later = [data for data in blocks if dataset_path(data.record) not in early]
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpckpt-hdf5-layout") as helper:
            rest = helper.submit(layout.finish) if layout else None
            try:
                direct.write_pieces(path, _pieces(first, early), self.direct_io)
            finally:  # every rank takes part, also after a failed write
                late = _offsets_from_rank_zero(comm, path, rest.result if rest else None)
        direct.write_pieces(path, _pieces(later, late), self.direct_io)
        return [FILE_NAME]

    def _recycled_offsets(
        self, path: Path, digest: str, records: Sequence[LeafRecord], values: Mapping[str, Any]
    ) -> dict[str, int | None] | None:
        """Each dataset's file offset by name, if ``path`` (which exists) holds exactly the
        contiguous datasets of the layout ``digest`` names (hpckpt created it for that
        layout: its ``hpckpt_layout`` attribute; reading it costs one attribute, where
        listing every dataset cost 0.12 ms each), with its value attributes replaced by
        ``values``; else None. One open of the file. The offsets come from the file's
        table (:func:`~hpckpt.storage.hdf5_files.listed_offsets`: every dataset listed,
        inside the file, none overlapping), else from opening each dataset (17 ms for a
        model's 600).
        """
        try:
            with self._h5py.File(path, "r+") as h5:
                if h5.attrs.get(LAYOUT_ATTRIBUTE) != digest:
                    return None
                set_value_attributes(h5, values)
                file_size = path.stat().st_size
                listed = listed_offsets(stored_offsets(h5, file_size), records, file_size)
                if listed is not None:
                    return listed
                names = [dataset_path(record) for record in records]
                return {name: open_dataset(h5, name).get_offset() for name in names}
        except (OSError, KeyError):  # not HDF5, or damaged: created anew
            return None

    def stored_order(self, record: LeafRecord) -> tuple[float, ...]:
        """The order of the datasets in ``data.h5`` (see the module docstring): those of
        :data:`EARLY_BYTES` or more first, each part by the lowest rank writing each.
        """
        return (_dataset_bytes(record) < EARLY_BYTES, _first_writer(record))

    def read(self, directory: Path, requests: Sequence[BlockData], landed: Landed | None = None) -> None:
        """Fill each request's ``array`` from ``data.h5``, reporting its bytes to ``landed`` as
        they arrive. Independent (not collective).

        HDF5 opens the file and checks each dataset against the manifest; the bytes of a
        contiguous dataset are then read with ``preadv`` at its file offset (the mirror of
        :meth:`write`: no GIL held, whole pages of large blocks directly unless
        ``direct_io=False``, and in pieces that are checksummed while the next is read);
        any other dataset (chunked: a partial array of a step of version 1 or 2,
        :func:`~hpckpt.storage.hdf5_layout.stored_layout`) through HDF5.
        """
        if not requests:
            return
        path = directory / FILE_NAME
        file_size = path.stat().st_size
        with BlockFile(path, self.direct_io) as source, self._h5py.File(path, "r") as h5:
            offsets = stored_offsets(h5, file_size)
            segments: list[Segment] = []  # the contiguous datasets' bytes, read together
            for request in requests:
                progress = None if landed is None else partial(landed, request)
                box = _listed_box(offsets, request, file_size)
                if box is not None:
                    segments += box_segments(box, request.array, progress)
                    continue
                record, block = request.record, request.block
                name = dataset_name(record, block)
                dataset_id = open_dataset(h5, name)
                expected, offset, out = _selection(dataset_id, f"{path}:{name}", request)
                dataset_offset = check_dataset(
                    dataset_id, f"{path}:{name}", expected, np.dtype(record.dtype), file_size
                )
                if dataset_offset is None:
                    read_box(dataset_id, offset, out)
                    if landed is not None:
                        landed(request, request.array.nbytes)
                    continue
                segments += box_segments(StoredBox(dataset_offset, expected, offset), out, progress)
            source.read_segments(segments)


def _listed_box(offsets: dict[str, int | None], request: BlockData, file_size: int) -> StoredBox | None:
    """Where ``request``'s block lies, by the file's offsets table
    (:func:`~hpckpt.storage.hdf5_files.stored_offsets`): a box of its leaf's dataset of
    the global shape, listed at an offset that leaves the whole dataset inside the file;
    else None (the dataset is opened and checked instead).
    """
    record, block, shape = request.record, request.block, request.record.global_shape
    if stored_layout(record, block) is not HDF5Layout.WHOLE_ARRAY or shape is None:
        return None
    offset = offsets.get(dataset_path(record))
    if offset is None or offset + math.prod(shape) * record.itemsize > file_size:
        return None
    return StoredBox(offset, tuple(shape), tuple(block.offset))


def _selection(
    dataset_id: Any, name: str, request: BlockData
) -> tuple[tuple[int, ...], tuple[int, ...], np.ndarray]:
    """Where ``request``'s block is in dataset ``name`` (``dataset_id``), by its
    :func:`~hpckpt.storage.hdf5_layout.stored_layout`: the shape the dataset must have,
    the block's offset in it, and the array to fill in its C order (flattened, of a
    concatenated block).
    """
    record, block = request.record, request.block
    layout = stored_layout(record, block)
    if layout is HDF5Layout.DATASET_PER_RANK:
        return block.shape, (0,) * len(block.shape), request.array
    if layout is HDF5Layout.CONCATENATED:  # its elements, flattened, among the leaf's other blocks
        expected = concatenated_extent(dataset_id, name, block)
        return expected, (block_start(block),), request.array.reshape(-1)
    return record.whole_shape, block.offset, request.array


def _dataset_bytes(record: LeafRecord) -> int:
    """The bytes of laid-out ``record``'s dataset."""
    return math.prod(dataset_shape(record)) * record.itemsize


class _FileLayout:
    """Rank 0's making of one step's ``data.h5``, in two parts so that the ranks write
    the large datasets' bytes while the rest is made (:meth:`HDF5Backend.write`).

    :meth:`begin` creates the file and its datasets of :data:`EARLY_BYTES` or more, in
    the order of the lowest rank writing each; :meth:`finish` (in another thread, after
    :meth:`begin`) creates the small datasets (HDF5 places them after those, or in the
    gaps that alignment left), gives every dataset its ``hpckpt_kind`` (half the time
    of creating one), attaches the axis names of the annotations as dimension
    scales, sets their plain values as root attributes and the offsets table, and closes
    the file. A recycled file with exactly this layout is reused instead: :meth:`begin`
    gives every offset. Each gives its datasets' file offsets by name (None: an empty
    array, which has no storage). Serial (rank 0).
    """

    def __init__(
        self, backend: HDF5Backend, path: Path, records: Sequence[LeafRecord], annotations: Annotations
    ) -> None:
        self._backend, self._path, self._annotations = backend, path, annotations
        ordered = sorted(((backend.stored_order(record), record) for record in records), key=itemgetter(0))
        self._large = [record for (small, _), record in ordered if not small]
        self._small = [record for (small, _), record in ordered if small]
        self._records = records
        self._h5: Any = None
        self._maker: DatasetMaker | None = None
        self._offsets: dict[str, int | None] = {}
        self._created: list[tuple[Any, LeafRecord]] = []  # each dataset's id, with its record

    @cached_property
    def _digest(self) -> str:
        """The layout's digest (:func:`~hpckpt.storage.hdf5_files.layout_digest`): computed
        where a recycled file is checked, else by :meth:`finish`, after the large
        datasets' offsets went out.
        """
        return layout_digest(self._records, self._annotations.dims)

    def begin(self) -> dict[str, int | None]:
        """Create the file and its large datasets (or reuse a recycled file); their offsets."""
        point("hdf5.layout")
        backend, records = self._backend, self._large + self._small
        if self._path.exists():
            recycled = backend._recycled_offsets(self._path, self._digest, records, self._annotations.values)
            if recycled is not None:
                return recycled
        options: dict[str, Any] = {}
        if len(records) >= MANY_DATASETS:
            options["meta_block_size"] = min(META_BLOCK_MAX, META_BLOCK_PER_DATASET * len(records))
        if backend.alignment:
            options |= {"alignment_threshold": backend.alignment_threshold,
                        "alignment_interval": backend.alignment}
        elif backend.direct_io:
            options |= {"alignment_threshold": direct.DIRECT_MIN, "alignment_interval": direct.ALIGNMENT}
        self._h5 = backend._h5py.File(self._path, "w", **options)
        try:
            self._h5.attrs["hpckpt_format"] = "hpckpt"
            self._maker = DatasetMaker()
            return self._create(self._large)
        except BaseException:
            self._h5.close()
            self._h5 = None
            raise

    def finish(self) -> dict[str, int | None]:
        """Create the rest of a new file and close it; the small datasets' offsets ({} for
        a recycled file).
        """
        if self._h5 is None:
            return {}
        h5, records = self._h5, self._large + self._small
        try:
            point("hdf5.layout_rest")
            offsets = self._create(self._small)
            assert self._maker is not None
            for dataset_id, record in self._created:
                self._maker.label(dataset_id, str(record.kind))
            attach_dimension_scales(h5, records, self._annotations.dims)
            set_value_attributes(h5, self._annotations.values)
            write_offsets(h5, self._offsets)
            # a recycled copy of the file may be written in place
            h5.attrs[LAYOUT_ATTRIBUTE] = self._digest
            return offsets
        finally:
            h5.close()

    def _create(self, records: Sequence[LeafRecord]) -> dict[str, int | None]:
        """Create a dataset per record, in order; their offsets (also kept for the table).
        :meth:`finish` gives them their attributes.
        """
        assert self._maker is not None
        offsets = {}
        for record in records:
            shape, dtype = dataset_shape(record), np.dtype(record.dtype)
            dataset_id = self._maker.create(self._h5.id, record.path, shape, dtype)
            offsets[dataset_path(record)] = dataset_id.get_offset()
            self._created.append((dataset_id, record))
        self._offsets |= offsets
        return offsets


def _offsets_from_rank_zero(
    comm: MPI.Comm, path: Path, make: Callable[[], dict[str, int | None]] | None
) -> dict[str, int | None]:
    """The dataset offsets that rank 0's ``make()`` gives, on every rank; its exception
    raised on every rank (an OSError naming it elsewhere). Collective.
    """
    offsets: dict[str, int | None] = {}
    failure: str | None = None
    error: Exception | None = None
    if make is not None:
        try:
            offsets = make()
        except Exception as exc:  # noqa: BLE001 - sent to every rank, raised below
            failure, error = f"{type(exc).__name__}: {exc}", exc
    # The others wait for rank 0's layout sleeping, not inside the broadcast: MPICH
    # busy-polls there, which took a core from the application's compute while a
    # non-blocking save waited for the layout.
    await_everyone(comm, f"hdf5 layout of {path}")
    offsets, failure = comm.bcast((offsets, failure), root=0)
    if error is not None:
        raise error
    if failure is not None:
        raise OSError(f"rank 0 could not lay out {path}: {failure}")
    return offsets


def _pieces(blocks: Sequence[BlockData], offsets: Mapping[str, int | None]) -> list[tuple[int, PieceBytes]]:
    """(file offset, bytes) of each contiguous run of ``blocks``, their datasets at ``offsets``."""
    return [
        piece
        for data in blocks
        if data.block.size
        for piece in file_pieces(data, offsets[dataset_path(data.record)])
    ]
