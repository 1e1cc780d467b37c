"""Parallel HDF5 backend: one file per step, written collectively through h5py's mpio driver.

Layout of ``data.h5`` (readable with plain h5py and ``h5dump``):

- a distributed or replicated leaf ``a/b`` is the dataset ``/a/b`` holding the whole
  global array; each rank writes its hyperslab with collective I/O;
- a local leaf ``a/b`` is the group ``/a/b`` with one dataset per rank, ``rank-00003``;
- every dataset (or local group) has the attribute ``hpckpt_kind``.

A ``data.h5`` already in the step directory (recycled by retention from the deleted
step) whose datasets are exactly those of the new step (same paths, shapes, dtypes,
contiguous) is opened ``r+`` and written over in place: no blocks are freed and
allocated again. Any other file is truncated and created anew.

Restore reads with independent I/O through the default driver, so a rank that fails
while reading cannot leave the others waiting in a collective call.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..model.manifest import LeafRecord
from .base import BlockData

if TYPE_CHECKING:
    from mpi4py import MPI

FILE_NAME = "data.h5"
LAYOUT_ATTRIBUTE = "hpckpt_layout"  # digest of the datasets hpckpt created in the file


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as exc:
        raise ImportError("the hdf5 backend needs h5py; run `make install` or `pip install h5py`") from exc
    if not h5py.get_config().mpi:
        raise ImportError(
            "the hdf5 backend needs h5py built with MPI (h5py.get_config().mpi is False); "
            "rebuild it with CC=mpicc HDF5_MPI=ON (see docs/install.md)"
        )
    return h5py


def local_block_name(rank: int) -> str:
    """Name of ``rank``'s dataset inside a local leaf's group."""
    return f"rank-{rank:05d}"


class HDF5Backend:
    """Parallel HDF5 storage (see the module docstring for the file layout).

    Parameters
    ----------
    hints
        MPI-IO hints for the files written in parallel (``cb_nodes``,
        ``romio_cb_write``, ``striping_factor``, ``striping_unit``, ...), as strings.
    alignment
        Align every dataset of ``alignment_threshold`` bytes or more to a multiple of
        this many bytes (the stripe size on Lustre). Default: ``hints["striping_unit"]``
        if given, else no alignment.
    alignment_threshold
        The smallest dataset that is aligned (default 64 KiB).
    """

    name = "hdf5"
    writes_in_place = True

    def __init__(
        self,
        hints: Mapping[str, str] | None = None,
        alignment: int | None = None,
        alignment_threshold: int = 65536,
    ) -> None:
        self._h5py = _h5py()
        self.hints = {str(key): str(value) for key, value in (hints or {}).items()}
        if alignment is None and "striping_unit" in self.hints:
            alignment = int(self.hints["striping_unit"])
        for name, value in (("alignment", alignment), ("alignment_threshold", alignment_threshold)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"hdf5 backend: {name} must be an integer >= 1, got {value!r}")
        self.alignment, self.alignment_threshold = alignment, alignment_threshold

    def _file_options(self, comm: MPI.Comm) -> dict[str, Any]:
        """h5py.File keywords: the mpio driver with the hints (several ranks), and alignment."""
        options: dict[str, Any] = {}
        if comm.size > 1:  # one process writes through the default POSIX driver
            from mpi4py import MPI

            info = MPI.Info.Create()
            for key, value in self.hints.items():
                info.Set(key, value)
            options.update(driver="mpio", comm=comm, info=info)
        if self.alignment:
            options.update(alignment_threshold=self.alignment_threshold, alignment_interval=self.alignment)
        return options

    def layout(self, records: Sequence[LeafRecord]) -> tuple[LeafRecord, ...]:
        """Each leaf lives in ``data.h5`` at the dataset (or, if local, group) of its path."""
        return tuple(  # direct construction: dataclasses.replace costs 5 us a call
            LeafRecord(r.path, r.kind, r.dtype, r.global_shape, r.blocks, {"file": FILE_NAME, "dataset": f"/{r.path}"}, r.encoding)
            for r in records
        )

    def write(
        self, comm: MPI.Comm, directory: Path, records: Sequence[LeafRecord], blocks: Sequence[BlockData]
    ) -> list[str]:
        """Create every dataset collectively, then write ``blocks``.

        Collective over ``comm``: every rank passes the same ``records``. Distributed
        blocks are written with collective hyperslab I/O, one call per block, so with
        several ranks each passes exactly its own block of each distributed leaf
        (empty boxes take part with an empty selection). Replicated and local blocks
        are written independently.
        """
        digest = _layout_digest(records)
        h5, reused = self._open_for_write(directory / FILE_NAME, digest, comm)
        with h5:
            h5.attrs["hpckpt_format"] = "hpckpt"
            created: dict[str, Any] = {}
            if not reused:
                for record in records:
                    created.update(self._create(h5, record))
                if digest is not None:  # every dataset exists: a recycled copy may be written in place
                    h5.attrs[LAYOUT_ATTRIBUTE] = digest
            for data in blocks:
                record, block = data.record, data.block
                if record.kind == "distributed" and 0 in record.global_shape:
                    continue  # an empty dataset: nothing to write, on every rank alike
                if record.kind != "distributed" and block.size == 0:
                    continue
                name = _dataset_name(record, block.rank)
                dataset_id = _open(h5, name) if reused else created[name]  # a rank opens only its own
                if record.kind == "local":
                    _write_box(dataset_id, (0,) * data.array.ndim, data.array, collective=False)
                else:
                    collective = record.kind == "distributed" and comm.size > 1
                    _write_box(dataset_id, block.offset, data.array, collective=collective)
        return [FILE_NAME]

    def _open_for_write(self, path: Path, digest: str | None, comm: MPI.Comm) -> tuple[Any, bool]:
        """The open file, and whether it is a recycled one whose datasets are reused
        (``digest``: the :func:`_layout_digest` of the records to write).

        Collective over ``comm``: rank 0 alone inspects a recycled file (serially, with
        the default driver) and broadcasts the decision, so every rank then makes the
        same single collective open. One process (a rank's own checkpoint, ``hpckpt
        convert``) uses the default POSIX driver: MPI-IO on COMM_SELF only adds cost.
        """
        reuse = comm.bcast(self._reusable(path, digest) if comm.rank == 0 else None, root=0)
        return self._h5py.File(path, "r+" if reuse else "w", **self._file_options(comm)), reuse

    def _reusable(self, path: Path, digest: str | None) -> bool:
        """Whether ``path`` exists and holds exactly the contiguous datasets of the layout
        ``digest`` names: whether hpckpt created it for that layout (its ``hpckpt_layout``
        attribute; reading it costs one attribute, where listing every dataset cost 0.12 ms
        each)."""
        if digest is None or not path.exists():
            return False
        try:
            with self._h5py.File(path, "r") as h5:
                return h5.attrs.get(LAYOUT_ATTRIBUTE) == digest
        except OSError:
            return False

    def _create(self, h5: Any, record: LeafRecord) -> dict[str, Any]:
        """Create the dataset of ``record`` (a group of one per rank if local); their ids by name."""
        if record.kind == "local":
            group = h5.create_group(record.path)
            group.attrs["hpckpt_kind"] = record.kind
            return {
                _dataset_name(record, block.rank): group.create_dataset(
                    local_block_name(block.rank), shape=block.shape, dtype=record.dtype
                ).id
                for block in record.blocks
            }
        stored = [block.shape for block in record.blocks if block.size]
        # A partial array (one rank's own checkpoint) is chunked by its box, so the file
        # holds that box only, not the whole global array.
        chunks = max(stored, key=math.prod) if _partial(record) and stored else None
        dataset = h5.create_dataset(record.path, shape=record.global_shape, dtype=record.dtype, chunks=chunks)
        dataset.attrs["hpckpt_kind"] = record.kind
        return {_dataset_name(record, 0): dataset.id}

    def written_files(self, files: Sequence[str], rank: int, size: int) -> list[str]:
        """``data.h5``: every rank writes its hyperslabs into it."""
        return list(files)

    def metadata_files(self, files: Sequence[str]) -> list[str]:
        """None: every stored byte is in a block (posix) or the library checks its own (hdf5)."""
        return []

    def read(self, directory: Path, requests: Sequence[BlockData]) -> None:
        """Fill each request's ``array`` from ``data.h5``. Independent (not collective)."""
        if not requests:
            return
        path = directory / FILE_NAME
        file_size = path.stat().st_size
        with self._h5py.File(path, "r") as h5:
            for request in requests:
                record, block = request.record, request.block
                name = _dataset_name(record, block.rank)
                expected = block.shape if record.kind == "local" else record.global_shape
                dataset_id = _open(h5, name)
                _check_dataset(dataset_id, f"{path}:{name}", expected, np.dtype(record.dtype), file_size)
                _read_box(dataset_id, block.offset if record.kind != "local" else (0,) * len(expected), request.array)


def _check_dataset(dataset_id: Any, name: str, shape: tuple[int, ...], dtype: np.dtype, file_size: int) -> None:
    """Refuse (KeyError, saying what differs) a dataset whose shape, dtype or storage is not
    what the manifest declares, before HDF5 reads it: the file has no metadata checksums,
    and a damaged datatype or extent could make the read allocate or convert gigabytes."""
    from h5py import h5d

    if dataset_id.shape != shape:
        raise KeyError(f"dataset {name} has shape {dataset_id.shape}, expected {shape}")
    if dataset_id.dtype != dtype:
        raise KeyError(f"dataset {name} has dtype {dataset_id.dtype}, expected {dtype}")
    layout = dataset_id.get_create_plist().get_layout()
    stored = dataset_id.get_storage_size()
    if layout == h5d.CONTIGUOUS:
        offset = dataset_id.get_offset()
        if offset is not None and (stored != math.prod(shape) * dtype.itemsize or offset + stored > file_size):
            raise KeyError(
                f"dataset {name} claims {stored} bytes at offset {offset}; expected "
                f"{math.prod(shape) * dtype.itemsize} bytes inside the file's {file_size}"
            )
    elif layout != h5d.CHUNKED or stored > file_size:
        raise KeyError(f"dataset {name} has layout {layout} with {stored} bytes stored; hpckpt writes contiguous "
                       f"datasets (chunked ones for partial arrays) inside the file's {file_size} bytes")


def _partial(record: LeafRecord) -> bool:
    """True for a distributed leaf whose blocks do not cover its global array."""
    covered = sum(block.size for block in record.blocks)
    return record.kind == "distributed" and covered < math.prod(record.global_shape)


def _expected_datasets(records: Sequence[LeafRecord]) -> dict[str, tuple[tuple[int, ...], np.dtype]] | None:
    """Each dataset a file of ``records`` holds, with shape and dtype; None if any is chunked."""
    expected = {}
    for record in records:
        dtype = np.dtype(record.dtype)
        if record.kind == "local":
            for block in record.blocks:
                expected[f"{record.path}/{local_block_name(block.rank)}"] = (tuple(block.shape), dtype)
        elif _partial(record):
            return None
        else:
            expected[record.path] = (tuple(record.global_shape), dtype)
    return expected


def _layout_digest(records: Sequence[LeafRecord]) -> str | None:
    """A digest of the datasets (names, shapes, dtypes) a file of ``records`` holds; None
    when one is chunked (a partial array), which is never written in place."""
    expected = _expected_datasets(records)
    if expected is None:
        return None
    listing = sorted((name, list(shape), dtype.str) for name, (shape, dtype) in expected.items())
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def _dataset_name(record: LeafRecord, rank: int) -> str:
    """The dataset that holds ``rank``'s block of laid-out ``record`` (local leaves: one per rank)."""
    base = record.location["dataset"]
    return f"{base}/{local_block_name(rank)}" if record.kind == "local" else base


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


def _write_box(dataset_id: Any, offset: tuple[int, ...], array: np.ndarray, *, collective: bool) -> None:
    from h5py import h5fd, h5p

    transfer = h5p.create(h5p.DATASET_XFER)
    if collective:
        transfer.set_dxpl_mpio(h5fd.MPIO_COLLECTIVE)
    memory_space, file_space = _selections(dataset_id, offset, array.shape)
    dataset_id.write(memory_space, file_space, array if array.size else np.empty((1,), array.dtype), dxpl=transfer)


def _read_box(dataset_id: Any, offset: tuple[int, ...], out: np.ndarray) -> None:
    if out.size == 0:
        return
    memory_space, file_space = _selections(dataset_id, offset, out.shape)
    dataset_id.read(memory_space, file_space, out)
