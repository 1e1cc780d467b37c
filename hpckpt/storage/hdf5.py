"""HDF5 backend: one file per step, laid out by rank 0 with h5py, its data written by every rank.

Layout of ``data.h5`` (readable with plain h5py and ``h5dump``):

- a distributed or replicated leaf ``a/b`` is the dataset ``/a/b`` holding the whole
  global array, contiguous; each rank writes its hyperslab's bytes at the dataset's file
  offset (rank 0 creates the file and the datasets first), whole pages of large
  blocks with direct I/O (:mod:`hpckpt.storage.direct`);
- a local leaf ``a/b`` is the 1-D dataset ``/a/b`` of its dtype holding every rank's
  block, flattened in C order, one after the other in rank order; a block's
  ``location`` in the manifest gives its first element (``"start"``) and the leaf's
  the dataset's length (``"elements"``). (Before 2026-12-03 it was the group ``/a/b``
  with a dataset per rank, ``rank-00003``, which hpckpt still reads: at 100,000 ranks,
  rank 0 spent 21 s creating them);
- a partial array (an incremental step's changed blocks, one rank's own checkpoint) is
  concatenated the same way: the 1-D dataset ``/a/b`` holds its blocks one after the
  other, each flattened in C order, from the element ``"start"`` (until 2026-12-03 a
  dataset per block, ``/a/b/rank-00003``, which hpckpt still reads);
- every dataset has the attribute ``hpckpt_kind``.

A ``data.h5`` already in the step directory (recycled by retention from the deleted
step) whose datasets are exactly those of the new step (same paths, shapes, dtypes,
contiguous) is written over in place at the same offsets: no blocks are freed and
allocated again. Any other file is truncated and created anew. h5py need not be built
with MPI: no HDF5 call is collective.

Restore opens the file with HDF5's default driver (independent, so a rank that fails
while reading cannot leave the others waiting in a collective call) to check each
dataset, and reads a contiguous dataset's bytes with ``preadv`` at its offset.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from .._checks import require_count
from .._comm import await_everyone
from ..model.layout import running_totals
from ..model.manifest import Block, LeafRecord
from . import direct
from .base import NO_ANNOTATIONS, Annotations, Backend, BlockData, Capabilities, GroupLayout, Landed
from .positioned import read_into

if TYPE_CHECKING:
    from mpi4py import MPI

    from .lustre import Striping

FILE_NAME = "data.h5"
LAYOUT_ATTRIBUTE = "hpckpt_layout"  # digest of the datasets hpckpt created in the file
PER_RANK = "per_rank"  # block location key: the block is a dataset of its own
START = "start"  # block location key: a concatenated block's first element (Local leaves, partial arrays)
ELEMENTS = "elements"  # leaf location key: the length of a concatenated leaf's dataset
HDF5Extent: TypeAlias = dict[str, int]  # a group's: per Local and distributed leaf, its blocks' elements
# a group's start: per concatenated leaf, the elements of the earlier groups' blocks and of every group's
HDF5Start: TypeAlias = dict[str, tuple[int, int]]


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as exc:
        raise ImportError("the hdf5 backend needs h5py; run `make install` or `pip install h5py`") from exc
    return h5py


def rank_dataset_name(rank: int) -> str:
    """Name of ``rank``'s dataset inside a leaf's group, in files written before
    2026-12-03 (a Local leaf's, a partial array's)."""
    return f"rank-{rank:05d}"


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
        Write whole pages of large blocks with direct I/O (default), the rest through
        the page cache (:mod:`hpckpt.storage.direct`); False: everything buffered.

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

    def layout(self, records: Sequence[LeafRecord], start: HDF5Start | None = None) -> tuple[LeafRecord, ...]:
        """Each leaf lives in ``data.h5`` at the dataset of its path; a block of a Local
        leaf or of a partial array at its first element there (after the ``start`` of a
        group's, which names those leaves: per leaf, the elements of the earlier groups'
        blocks and of every rank's)."""
        return tuple(_placed(record, start) for record in records)

    def group_extent(self, records: Sequence[LeafRecord], ranks: range) -> HDF5Extent:
        """Per Local and distributed leaf, the elements of the group's blocks."""
        return {record.path: sum(block.size for block in record.blocks) for record in records if record.kind != "replicated"}

    def group_starts(self, extents: Sequence[HDF5Extent], headers: Sequence[LeafRecord]) -> list[HDF5Start]:
        """Per group, per leaf whose blocks are concatenated: the elements before it,
        and every rank's. Those are the Local leaves and the partial arrays: distributed
        leaves whose blocks, added up over the groups, do not fill them (an incremental
        step reuses the others)."""
        starts, totals = running_totals(extents)
        joined = [header.path for header in headers if header.path in totals
                  and (header.kind == "local" or totals[header.path] < math.prod(header.whole_shape))]  # fmt: skip
        return [{path: (start[path], totals[path]) for path in joined} for start in starts]

    def write(
        self, comm: MPI.Comm, directory: Path, records: Sequence[LeafRecord], blocks: Sequence[BlockData],
        annotations: Annotations = NO_ANNOTATIONS,
    ) -> list[str]:
        """Rank 0 lays out ``data.h5``; then every rank writes its ``blocks`` with ``pwrite``.

        Collective over ``comm`` (a broadcast): rank 0 passes every record (laid out in
        groups: every record with its own blocks only), another rank its part
        (:meth:`~hpckpt.storage.base.Backend.parts`). Rank 0 creates the file and one
        dataset per leaf with serial HDF5, contiguous and allocated at once (or reuses a
        recycled file of the same layout) and broadcasts their file offsets; each rank
        then writes the C-order runs of its blocks at those offsets
        (:func:`~hpckpt.storage.direct.write_pieces`): no HDF5, no MPI and no GIL in the
        data path, so a save in a background thread cannot deadlock with the
        application's MPI calls.
        """
        path = directory / FILE_NAME
        failure: str | None = None
        error: Exception | None = None
        offsets: dict[str, int | None] = {}  # each leaf's dataset's, by name
        if comm.rank == 0:
            try:
                offsets = self._lay_out_file(path, records, annotations)
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
        pieces = [piece for data in blocks if data.block.size
                  for piece in _file_pieces(data, offsets[data.record.location["dataset"]])]  # fmt: skip
        direct.write_pieces(path, pieces, self.direct_io)
        return [FILE_NAME]

    def _lay_out_file(self, path: Path, records: Sequence[LeafRecord], annotations: Annotations) -> dict[str, int | None]:
        """Create ``path`` with every dataset of ``records`` and the axis names of
        ``annotations`` as dimension scales (or reuse a recycled file with exactly that
        layout), its plain values as root attributes; each dataset's file offset by name
        (None: an empty array, which has no storage). Serial (rank 0)."""
        digest = _layout_digest(records, annotations.dims)
        recycled = self._recycled_offsets(path, digest, records, annotations.values)
        if recycled is not None:
            return recycled
        options = {}
        if self.alignment:
            options = {"alignment_threshold": self.alignment_threshold, "alignment_interval": self.alignment}
        elif self.direct_io:
            options = {"alignment_threshold": direct.DIRECT_MIN, "alignment_interval": direct.ALIGNMENT}
        with self._h5py.File(path, "w", **options) as h5:
            h5.attrs["hpckpt_format"] = "hpckpt"
            created = {record.location["dataset"]: self._create(h5, record) for record in records}
            _attach_dimension_scales(h5, records, annotations.dims)
            _set_value_attributes(h5, annotations.values)
            h5.attrs[LAYOUT_ATTRIBUTE] = digest  # a recycled copy of the file may be written in place
            return {name: dataset_id.get_offset() for name, dataset_id in created.items()}

    def _recycled_offsets(self, path: Path, digest: str, records: Sequence[LeafRecord],
                          values: Mapping[str, Any]) -> dict[str, int | None] | None:  # fmt: skip
        """Each dataset's file offset by name, if ``path`` exists and holds exactly the
        contiguous datasets of the layout ``digest`` names (hpckpt created it for that
        layout: its ``hpckpt_layout`` attribute; reading it costs one attribute, where
        listing every dataset cost 0.12 ms each), with its value attributes replaced by
        ``values``; else None. One open of the file."""
        if not path.exists():
            return None
        try:
            with self._h5py.File(path, "r+") as h5:
                if h5.attrs.get(LAYOUT_ATTRIBUTE) != digest:
                    return None
                _set_value_attributes(h5, values)
                return {record.location["dataset"]: _open(h5, record.location["dataset"]).get_offset() for record in records}
        except (OSError, KeyError):  # not HDF5, or damaged: created anew
            return None

    def _create(self, h5: Any, record: LeafRecord) -> Any:
        """Create the dataset of laid-out ``record``; its id."""
        dataset_id = _new_dataset(h5.id, record.path, _dataset_shape(record), np.dtype(record.dtype))
        self._h5py.Dataset(dataset_id).attrs["hpckpt_kind"] = str(record.kind)
        return dataset_id

    def read(self, directory: Path, requests: Sequence[BlockData], landed: Landed | None = None) -> None:
        """Fill each request's ``array`` from ``data.h5``, reporting its bytes to ``landed`` as
        they arrive. Independent (not collective).

        HDF5 opens the file and checks each dataset against the manifest; the bytes of a
        contiguous dataset are then read with ``preadv`` at its file offset (the mirror of
        :meth:`write`: no GIL held, and in pieces that are checksummed while the next is
        read); any other dataset (chunked, from hpckpt before 2026-12) through HDF5.
        """
        if not requests:
            return
        path = directory / FILE_NAME
        file_size = path.stat().st_size
        descriptor = os.open(path, os.O_RDONLY)
        try:
            with self._h5py.File(path, "r") as h5:
                for request in requests:
                    record, block = request.record, request.block
                    name = _dataset_name(record, block)
                    per_rank = _per_rank(record, block)
                    dataset_id = _open(h5, name)
                    if per_rank:
                        expected, offset, out = block.shape, (0,) * len(block.shape), request.array
                    elif START in block.location:  # its elements, flattened, among the leaf's other blocks
                        expected = _concatenated_extent(dataset_id, f"{path}:{name}", block)
                        offset, out = (block.location[START],), request.array.reshape(-1)
                    else:
                        expected, offset, out = record.whole_shape, block.offset, request.array
                    dataset_offset = _check_dataset(dataset_id, f"{path}:{name}", expected, np.dtype(record.dtype),
                                                    file_size)  # fmt: skip
                    if dataset_offset is None:
                        _read_box(dataset_id, offset, out)
                        if landed is not None:
                            landed(request, request.array.nbytes)
                        continue
                    progress = None if landed is None else partial(landed, request)
                    _read_runs(descriptor, path, dataset_offset, expected, offset, out, progress)
        finally:
            os.close(descriptor)


def _check_dataset(dataset_id: Any, name: str, shape: tuple[int, ...], dtype: np.dtype, file_size: int) -> int | None:
    """Refuse (KeyError, saying what differs) a dataset whose shape, dtype or storage is not
    what the manifest declares, before HDF5 reads it: the file has no metadata checksums,
    and a damaged datatype or extent could make the read allocate or convert gigabytes.
    Returns the file offset of a contiguous dataset's storage; None for a chunked or
    unallocated one."""
    from h5py import h5d

    if dataset_id.shape != shape:
        raise KeyError(f"dataset {name} has shape {dataset_id.shape}, expected {shape}")
    try:
        stored_dtype = dataset_id.dtype
    except (TypeError, ValueError) as exc:  # a datatype NumPy has no dtype for (e.g. a 20-byte integer)
        raise KeyError(f"dataset {name} has a datatype hpckpt cannot read ({exc}), expected {dtype}") from exc
    if stored_dtype != dtype:
        raise KeyError(f"dataset {name} has dtype {stored_dtype}, expected {dtype}")
    layout = dataset_id.get_create_plist().get_layout()
    stored = dataset_id.get_storage_size()
    if layout == h5d.CONTIGUOUS:
        offset = dataset_id.get_offset()
        if offset is not None and (stored != math.prod(shape) * dtype.itemsize or offset + stored > file_size):
            raise KeyError(
                f"dataset {name} claims {stored} bytes at offset {offset}; expected "
                f"{math.prod(shape) * dtype.itemsize} bytes inside the file's {file_size}"
            )
        return offset
    if layout != h5d.CHUNKED or stored > file_size:  # chunked: partial arrays of hpckpt before 2026-12
        raise KeyError(f"dataset {name} has layout {layout} with {stored} bytes stored; hpckpt writes contiguous "
                       f"datasets inside the file's {file_size} bytes")
    return None


def _placed(record: LeafRecord, start: Mapping[str, tuple[int, int]] | None) -> LeafRecord:
    """``record`` laid out (:meth:`HDF5Backend.layout`): a Local leaf's blocks, and those
    of a partial array, concatenated (:func:`_concatenated`); laid out in groups, those
    of the leaves ``start`` names. Direct construction: dataclasses.replace costs 5 us a
    call, 10,000s per save."""
    location: dict[str, Any] = {"file": FILE_NAME, "dataset": f"/{record.path}"}
    if not (record.path in start if start is not None else record.kind == "local" or _partial(record)):
        return LeafRecord(record.path, record.kind, record.dtype, record.global_shape, record.blocks, location,
                          record.encoding)  # fmt: skip
    first, location[ELEMENTS] = start[record.path] if start is not None else (0, sum(b.size for b in record.blocks))
    placed = []
    for b in record.blocks:
        placed.append(Block(b.rank, b.offset, b.shape, b.checksum, {**b.location, START: first}, b.members))
        first += b.size
    return LeafRecord(record.path, record.kind, record.dtype, record.global_shape, tuple(placed), location, record.encoding)


def _per_rank(record: LeafRecord, block: Block) -> bool:
    """Whether ``block`` is a dataset of its own, ``rank-NNNNN`` in the leaf's group (files
    written before 2026-12-03: a partial array's block, marked ``"per_rank"``, or a Local
    block without ``"start"``)."""
    return bool(block.location.get(PER_RANK)) or (record.kind == "local" and START not in block.location)


def _partial(record: LeafRecord) -> bool:
    """True for a distributed leaf whose blocks do not cover its global array (an
    incremental step's changed blocks, one rank's own checkpoint)."""
    covered = sum(block.size for block in record.blocks)
    return record.kind == "distributed" and covered < math.prod(record.whole_shape)


def _concatenated(record: LeafRecord) -> bool:
    """Whether laid-out ``record``'s dataset holds its blocks one after the other, each
    flattened, from the element its ``"start"`` gives: a Local leaf's, or a partial
    array's (its location says how many elements: ``"elements"``)."""
    return ELEMENTS in record.location


def _concatenated_extent(dataset_id: Any, name: str, block: Block) -> tuple[int, ...]:
    """The shape of the concatenation that holds ``block`` from its ``"start"``:
    KeyError, saying what differs, unless it is 1-D and holds the block's elements. (Its
    length is the step's that wrote it: an incremental step's leaf may hold its own
    blocks and reuse others from an earlier step's dataset of another length.)"""
    start = block.location[START]
    if len(dataset_id.shape) != 1 or not 0 <= start <= start + block.size <= dataset_id.shape[0]:
        raise KeyError(f"dataset {name} has shape {dataset_id.shape}, expected a 1-D dataset holding elements "
                       f"{start} to {start + block.size} (rank {block.rank}'s block)")  # fmt: skip
    return tuple(dataset_id.shape)


def _dataset_shape(record: LeafRecord) -> tuple[int, ...]:
    """The shape of laid-out ``record``'s dataset: its concatenated elements, or the global array."""
    return (int(record.location[ELEMENTS]),) if _concatenated(record) else record.whole_shape


def _layout_digest(records: Sequence[LeafRecord], dims: Mapping[str, tuple[str, ...]]) -> str:
    """A digest of the datasets (names, shapes, dtypes) a file of ``records`` holds, and of their axis names."""
    listing = sorted((record.location["dataset"], list(_dataset_shape(record)), np.dtype(record.dtype).str)
                     for record in records)  # fmt: skip
    named = sorted((path, list(names)) for path, names in dims.items())
    return hashlib.sha256(json.dumps([listing, named]).encode()).hexdigest()


def _attach_dimension_scales(h5: Any, records: Sequence[LeafRecord], dims: Mapping[str, tuple[str, ...]]) -> None:
    """Name the axes of each global array that has ``dims``: one dimension scale per axis
    name at the file's root (netCDF-4's dimensions, which h5netcdf and xarray show),
    attached to the datasets. ValueError for a name given two lengths, or taken by a leaf."""
    lengths: dict[str, tuple[int, str]] = {}
    named = [record for record in records if dims.get(record.path) and not _concatenated(record)]
    for record in named:
        for name, length in zip(dims[record.path], record.whole_shape):
            first = lengths.setdefault(name, (length, record.path))
            if first[0] != length:
                raise ValueError(f"axis {name!r} has length {first[0]} in leaf {first[1]!r} but {length} in "
                                 f"{record.path!r}; axes of one name must have one length")  # fmt: skip
    for name, (length, _) in lengths.items():
        if name in h5:
            raise ValueError(f"axis name {name!r} is also the path of a leaf; give the axis another name")
        scale = h5.create_dataset(name, shape=(length,), dtype="f4")  # no storage: a dimension, not a variable
        scale.make_scale(f"This is a netCDF dimension but not a netCDF variable.{length:10d}")
    for record in named:
        dataset = h5[record.path]
        for axis, name in enumerate(dims[record.path]):
            dataset.dims[axis].attach_scale(h5[name])


def _set_value_attributes(h5: Any, values: Mapping[str, Any]) -> None:
    """The plain values as attributes of the file's root, named by path (None and
    integers beyond 64 bits are left out; so are paths starting with ``hpckpt``, the
    names of hpckpt's own attributes), replacing those of an earlier step."""
    for name in [name for name in h5.attrs if not name.startswith("hpckpt")]:
        del h5.attrs[name]
    for path, value in values.items():
        if path.startswith("hpckpt") or value is None or (isinstance(value, int) and not -(2**63) <= value < 2**63):
            continue
        h5.attrs[path] = value


def _dataset_name(record: LeafRecord, block: Block) -> str:
    """The dataset that holds ``block`` of laid-out ``record``: the leaf's, or the block's
    own inside the leaf's group (:func:`_per_rank`)."""
    base = record.location["dataset"]
    return f"{base}/{rank_dataset_name(block.rank)}" if _per_rank(record, block) else base


def _open(h5: Any, name: str) -> Any:
    """Dataset ``name``'s id, with the low-level ``h5d.open`` (h5py's ``group[name]`` costs 30 us)."""
    from h5py import h5d

    return h5d.open(h5.id, name.encode())


def _selections(dataset_id: Any, offset: tuple[int, ...], shape: tuple[int, ...]) -> tuple[Any, Any]:
    from h5py import h5s

    file_space = dataset_id.get_space()
    if not shape:
        return h5s.create(h5s.SCALAR), file_space
    memory_space = h5s.create_simple(shape)
    if file_space.get_simple_extent_type() == h5s.NULL or 0 in shape:
        file_space.select_none()
        memory_space.select_none()
    else:
        file_space.select_hyperslab(offset, shape)
    return memory_space, file_space


def _new_dataset(parent_id: Any, name: str, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """Create dataset ``name`` under ``parent_id`` (intermediate groups too): contiguous,
    its storage allocated now and never filled, so ``get_offset`` gives its bytes' place
    in the file. The low-level call: h5py's ``create_dataset`` leaves a scalar dataset
    unallocated."""
    from h5py import h5d, h5p, h5s, h5t

    properties = h5p.create(h5p.DATASET_CREATE)
    properties.set_layout(h5d.CONTIGUOUS)
    properties.set_alloc_time(h5d.ALLOC_TIME_EARLY)
    properties.set_fill_time(h5d.FILL_TIME_NEVER)
    links = h5p.create(h5p.LINK_CREATE)
    links.set_create_intermediate_group(True)
    space = h5s.create(h5s.SCALAR) if not shape else h5s.create_simple(shape)
    return h5d.create(parent_id, name.encode(), h5t.py_create(dtype, logical=True), space, dcpl=properties, lcpl=links)


def file_runs(global_shape: tuple[int, ...], offset: tuple[int, ...], shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """Where a box of a C-order array lies in it: the element offsets of its contiguous
    runs (in the box's own C order) and the elements per run. Pure."""
    if not shape:
        return np.zeros(1, dtype=np.int64), 1
    axis = len(shape) - 1
    while axis > 0 and shape[axis] == global_shape[axis]:  # whole trailing axes join the runs
        axis -= 1
    strides = np.cumprod((1, *global_shape[:0:-1]), dtype=np.int64)[::-1]
    outer = np.indices(shape[:axis], dtype=np.int64).reshape(axis, -1) if axis else np.zeros((0, 1), np.int64)
    starts = ((outer + np.array(offset[:axis], dtype=np.int64)[:, None]) * strides[:axis, None]).sum(axis=0)
    return starts + offset[axis] * strides[axis], int(shape[axis] * strides[axis])


def _file_pieces(data: BlockData, dataset_offset: int | None) -> list[tuple[int, memoryview]]:
    """Where ``data``'s bytes go in the file, whose dataset storage starts at
    ``dataset_offset``: (file offset, bytes) of each contiguous run."""
    record, block = data.record, data.block
    if dataset_offset is None:
        raise OSError(f"dataset {record.location['dataset']} has no contiguous storage to write into")
    itemsize = np.dtype(record.dtype).itemsize
    raw = data.array.reshape(-1).view(np.uint8).data
    if START in block.location:
        return [(dataset_offset + block.location[START] * itemsize, raw)]
    starts, run = file_runs(record.whole_shape, block.offset, block.shape)
    run_bytes = run * itemsize
    return [(dataset_offset + start * itemsize, raw[index * run_bytes : (index + 1) * run_bytes])
            for index, start in enumerate(starts.tolist())]  # fmt: skip


def _read_box(dataset_id: Any, offset: tuple[int, ...], out: np.ndarray) -> None:
    if out.size == 0:
        return
    memory_space, file_space = _selections(dataset_id, offset, out.shape)
    dataset_id.read(memory_space, file_space, out)


def _read_runs(
    descriptor: int,
    path: Path,
    dataset_offset: int,
    shape: tuple[int, ...],
    offset: tuple[int, ...],
    out: np.ndarray,
    progress: Callable[[int], None] | None,
) -> None:
    """Fill ``out``, the box at ``offset`` of a contiguous dataset of ``shape`` stored from
    byte ``dataset_offset``, run by run in the box's C order; ``progress(bytes in place)``
    after each piece."""
    if out.size == 0:
        return
    itemsize = out.dtype.itemsize
    starts, run = file_runs(shape, offset, out.shape)
    if len(starts) == 1:
        read_into(descriptor, out, dataset_offset + int(starts[0]) * itemsize, path, progress)
        return
    flat = out.reshape(-1)
    for index, start in enumerate(starts.tolist()):
        read_into(descriptor, flat[index * run : (index + 1) * run], dataset_offset + start * itemsize, path)
        if progress is not None:
            progress((index + 1) * run * itemsize)
