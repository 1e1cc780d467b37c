"""A storage backend written outside hpckpt, registered here, passes the conformance suite.

:class:`NpyFilesBackend` stores each block in a file of its own, in NumPy's ``.npy``
format, with plain file I/O: what a third party's first backend might look like.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest

from hpckpt.model.manifest import Block, LeafRecord
from hpckpt.storage import Annotations, Backend, BlockData, Capabilities, register_backend
from hpckpt.storage.base import NO_ANNOTATIONS, Landed
from hpckpt.testing.conformance import BackendConformance

pytest.importorskip("mpi4py.MPI")
pytestmark = pytest.mark.mpi


def block_file(record: LeafRecord, block: Block) -> str:
    """``<leaf path, %-quoted>.<rank>.npy``: unique in a step, as a leaf has one block per rank."""
    return f"{quote(record.path, safe='')}.{block.rank}.npy"


class NpyFilesBackend(Backend):
    """One ``.npy`` file per stored block (empty blocks have none)."""

    name = "npyfiles"
    capabilities = Capabilities(repairable_in_job=True)  # no MPI calls, so no collective state

    def layout(self, records: Sequence[LeafRecord]) -> tuple[LeafRecord, ...]:
        """Each block that holds bytes is the file :func:`block_file` names."""
        placed = []
        for record in records:
            blocks = [replace(block, location={"file": block_file(record, block)}) if block.size else block
                      for block in record.blocks]
            placed.append(replace(record, blocks=tuple(blocks)))
        return tuple(placed)

    def write(
        self,
        comm: object,
        directory: Path,
        records: Sequence[LeafRecord],
        blocks: Sequence[BlockData],
        annotations: Annotations = NO_ANNOTATIONS,
    ) -> list[str]:
        """Write each of ``blocks`` to its file; no fsync (the protocol makes the files
        durable, see :meth:`written_files`). Every file of ``records`` is listed."""
        for data in blocks:
            if data.block.size:
                with open(directory / data.block.location["file"], "wb") as handle:
                    np.lib.format.write_array(handle, data.array, version=(1, 0), allow_pickle=False)
        return sorted(block.location["file"] for record in records for block in record.blocks if block.size)

    def written_files(self, files: Sequence[str], rank: int, size: int) -> list[str]:
        """The files of ``rank``'s blocks (all of them when one process wrote the step)."""
        return list(files) if size == 1 else [name for name in files if name.endswith(f".{rank}.npy")]

    def read(self, directory: Path, requests: Sequence[BlockData], landed: Landed | None = None) -> None:
        """Read each request's file whole, straight into its array, after checking its header."""
        for request in requests:
            path = directory / request.block.location["file"]
            with open(path, "rb") as handle:
                np.lib.format.read_magic(handle)  # ValueError for a file that is not .npy
                found = np.lib.format.read_array_header_1_0(handle)
                expected = (request.array.shape, False, request.array.dtype)
                if found != expected:
                    raise ValueError(f"{path} holds (shape, fortran order, dtype) {found}, not {expected}")
                if handle.readinto(request.array.reshape(-1).view(np.uint8)) != request.array.nbytes:
                    raise OSError(f"{path} ends before the {request.array.nbytes} bytes of its block")
            if landed is not None:
                landed(request, request.array.nbytes)


register_backend("npyfiles", lambda: NpyFilesBackend)


class TestNpyFilesBackend(BackendConformance):
    backend = "npyfiles"


def test_each_block_is_a_file_numpy_loads(tmp_path):
    """The files are plain .npy files: np.load gives back each rank's block."""
    from mpi4py import MPI

    import hpckpt

    rank = MPI.COMM_WORLD.rank
    run_dir = tmp_path / f"rank-{rank}"
    numbers = np.arange(10_000, dtype=">i4")
    state = {"a": {"ü": hpckpt.Distributed(numbers, global_shape=numbers.shape, offset=(0,))}}
    with hpckpt.Checkpointer(run_dir, comm=MPI.COMM_SELF, backend="npyfiles") as checkpointer:
        checkpointer.save(1, state)
    loaded = np.load(run_dir / "step-00000001" / "a%2F%C3%BC.0.npy")
    assert loaded.dtype == np.dtype(">i4") and loaded.tolist() == list(range(10_000))
