"""Parallel HDF5 backend: one file per step, written collectively through h5py's mpio driver.

Layout of ``data.h5`` (readable with plain h5py and ``h5dump``):

- a distributed or replicated leaf ``a/b`` is the dataset ``/a/b`` holding the whole
  global array; each rank writes its hyperslab with collective I/O;
- a local leaf ``a/b`` is the group ``/a/b`` with one dataset per rank, ``rank-00003``;
- every dataset (or local group) has the attribute ``hpckpt_kind``.

Restore reads with independent I/O through the default driver, so a rank that fails
while reading cannot leave the others waiting in a collective call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..model.manifest import LeafRecord
from .base import ReadRequest

if TYPE_CHECKING:
    from mpi4py import MPI

FILE_NAME = "data.h5"


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
    """Parallel HDF5 storage (see the module docstring for the file layout)."""

    name = "hdf5"

    def __init__(self) -> None:
        self._h5py = _h5py()

    def location(self, record: LeafRecord) -> dict[str, str]:
        """The file and dataset (or group, for local leaves) that hold ``record``."""
        return {"file": FILE_NAME, "dataset": f"/{record.path}"}

    def write(
        self, comm: MPI.Comm, directory: Path, records: Sequence[LeafRecord], arrays: Mapping[str, np.ndarray]
    ) -> list[str]:
        """Create every dataset collectively, then write this rank's blocks.

        Collective over ``comm``: every rank passes the same ``records`` in the same
        order. Distributed leaves are written with collective hyperslab I/O (ranks
        with an empty box take part with an empty selection), replicated leaves by
        rank 0 alone, local leaves by their own rank, independently.
        """
        h5py = self._h5py
        with h5py.File(directory / FILE_NAME, "w", driver="mpio", comm=comm) as h5:
            h5.attrs["hpckpt_format"] = "hpckpt"
            datasets = {record.path: self._create(h5, record) for record in records}
            for record in records:
                array = arrays[record.path]
                if record.kind == "distributed":
                    box = record.block_of(comm.rank)
                    _write_box(datasets[record.path], box.offset, array, collective=True)
                elif record.kind == "replicated" and comm.rank == 0:
                    _write_box(datasets[record.path], (0,) * array.ndim, array, collective=False)
                elif record.kind == "local":
                    _write_box(datasets[record.path][comm.rank], (0,) * array.ndim, array, collective=False)
            h5.flush()  # MPI_File_sync on every rank: data durable before the commit
        return [FILE_NAME]

    def _create(self, h5: Any, record: LeafRecord) -> Any:
        if record.kind == "local":
            group = h5.create_group(record.path)
            group.attrs["hpckpt_kind"] = record.kind
            return [
                group.create_dataset(local_block_name(block.rank), shape=block.shape, dtype=record.dtype)
                for block in record.blocks
            ]
        dataset = h5.create_dataset(record.path, shape=record.global_shape, dtype=record.dtype)
        dataset.attrs["hpckpt_kind"] = record.kind
        return dataset

    def read(self, directory: Path, requests: Sequence[ReadRequest]) -> None:
        """Fill each request's ``out`` from ``data.h5``. Independent (not collective)."""
        if not requests:
            return
        with self._h5py.File(directory / FILE_NAME, "r") as h5:
            for request in requests:
                record = request.record
                if record.kind == "local":
                    dataset = h5[record.location["dataset"]][local_block_name(request.rank)]
                    expected = request.out.shape
                else:
                    dataset = h5[record.location["dataset"]]
                    expected = record.global_shape
                if dataset.shape != expected:
                    raise KeyError(f"dataset {dataset.name} has shape {dataset.shape}, expected {expected}")
                _read_box(dataset, request.offset, request.out)


def _selections(dataset: Any, offset: tuple[int, ...], shape: tuple[int, ...]) -> tuple[Any, Any]:
    from h5py import h5s

    file_space = dataset.id.get_space()
    if not shape:
        return h5s.create(h5s.SCALAR), file_space
    memory_space = h5s.create_simple(shape)
    if file_space.get_simple_extent_type() == h5s.NULL or 0 in shape:
        file_space.select_none()
        memory_space.select_none()
    else:
        file_space.select_hyperslab(offset, shape)
    return memory_space, file_space


def _write_box(dataset: Any, offset: tuple[int, ...], array: np.ndarray, *, collective: bool) -> None:
    from h5py import h5fd, h5p

    transfer = h5p.create(h5p.DATASET_XFER)
    if collective:
        transfer.set_dxpl_mpio(h5fd.MPIO_COLLECTIVE)
    memory_space, file_space = _selections(dataset, offset, array.shape)
    dataset.id.write(memory_space, file_space, array if array.size else np.empty((1,), array.dtype), dxpl=transfer)


def _read_box(dataset: Any, offset: tuple[int, ...], out: np.ndarray) -> None:
    if out.size == 0:
        return
    memory_space, file_space = _selections(dataset, offset, out.shape)
    dataset.id.read(memory_space, file_space, out)
