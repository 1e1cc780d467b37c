"""Restore on a different number of ranks than saved, on every backend, bit for bit.

Within one ``mpiexec -n 4``, the first W ranks save and the first R ranks restore
(W -> R in 4->2, 4->3, 2->4, 3->4); the others wait. Each rank must read only the
stored blocks that overlap its new box, which a recording wrapper around the real
backend checks.
"""

import numpy as np
import pytest

import hpckpt
from hpckpt.model.boxes import intersection
from hpckpt.storage import open_backend
from hpckpt.storage.base import NO_ANNOTATIONS, Backend

MPI = pytest.importorskip("mpi4py.MPI")
pytestmark = pytest.mark.mpi(min_size=4)

ROWS, COLS = 11, 7
GRIDS = {2: (1, 2), 3: (3, 1), 4: (2, 2)}  # ranks -> (row parts, column parts)


def split(n: int, parts: int, index: int) -> tuple[int, int]:
    base, extra = divmod(n, parts)
    return index * base + min(index, extra), base + (index < extra)


def global_rows(seed: int) -> np.ndarray:
    return np.arange(ROWS * COLS, dtype=np.float64).reshape(ROWS, COLS) * 1.5 + seed


def global_grid(seed: int) -> np.ndarray:
    return (np.arange(ROWS * COLS, dtype=np.int64).reshape(ROWS, COLS) * 7 + seed).astype(">i8")


def grid_box(size: int, rank: int) -> tuple[tuple[int, int], tuple[int, int]]:
    row_parts, col_parts = GRIDS[size]
    (r0, nr), (c0, nc) = split(ROWS, row_parts, rank // col_parts), split(COLS, col_parts, rank % col_parts)
    return (r0, c0), (nr, nc)


def make_state(comm, seed: int) -> dict:
    """Row blocks and a 2-D grid of ``global_*(seed)``, replicated and local leaves."""
    first, count = split(ROWS, comm.size, comm.rank)
    (r0, c0), (nr, nc) = grid_box(comm.size, comm.rank)
    if seed < 0:  # an empty target to restore into
        rows, grid = np.zeros((count, COLS)), np.zeros((nr, nc), dtype=">i8")
    else:
        rows, grid = global_rows(seed)[first : first + count], global_grid(seed)[r0 : r0 + nr, c0 : c0 + nc]
    return {
        "rows": hpckpt.Distributed(rows.copy(), global_shape=(ROWS, COLS), offset=(first, 0)),
        "grid": hpckpt.Distributed(grid.copy(), global_shape=(ROWS, COLS), offset=(r0, c0)),
        "table": hpckpt.Replicated(np.linspace(0, 1, 5) + max(seed, 0)),
        "seed": seed,
    }


class RecordingBackend(Backend):
    """A real backend that also records which stored blocks this rank reads."""

    def __init__(self, backend) -> None:
        self.inner, self.name, self.reads = backend, backend.name, []

    def layout(self, records):
        return self.inner.layout(records)

    def write(self, comm, directory, records, blocks, annotations=NO_ANNOTATIONS):
        return self.inner.write(comm, directory, records, blocks, annotations)

    def read(self, directory, requests, landed=None):
        self.reads += [(request.record.path, request.block.rank) for request in requests]
        self.inner.read(directory, requests, landed)


def group(world, size: int):
    return world.Split(0 if world.rank < size else MPI.UNDEFINED, world.rank)


def readers_after_writers(world, readers: int, backend: dict):
    """Once the writers are done: the first ``readers`` ranks' communicator and a recording
    backend for them (None, None on the other ranks)."""
    world.Barrier()
    comm = group(world, readers)
    if comm == MPI.COMM_NULL:
        return None, None
    return comm, RecordingBackend(open_backend(backend["backend"], backend.get("backend_options")))


@pytest.mark.parametrize(("writers", "readers"), [(4, 2), (4, 3), (2, 4), (3, 4)])
def test_restore_on_another_number_of_ranks(world, mpi_tmp_path, backend, writers, readers):
    run_dir = mpi_tmp_path / f"{writers}to{readers}"
    comm = group(world, writers)
    if comm != MPI.COMM_NULL:
        with hpckpt.Checkpointer(run_dir, comm=comm, **backend) as checkpointer:
            state = make_state(comm, seed=3)
            state["rng"] = hpckpt.Local(np.arange(comm.rank + 2, dtype=np.uint32) * 10 + comm.rank)
            checkpointer.save(5, state)
        comm.Free()
    comm, recording = readers_after_writers(world, readers, backend)
    if comm is None:
        return
    with hpckpt.Checkpointer(run_dir, comm=comm, backend=recording) as checkpointer:
        target = make_state(comm, seed=-1)
        target["rng"] = hpckpt.Local(np.zeros(comm.rank % writers + 2, dtype=np.uint32))
        expected = f"local leaf 'rng' was written by {writers} ranks but is restored on {readers}"
        with pytest.raises(hpckpt.StateMismatchError, match=expected):
            checkpointer.restore(target)
        recording.reads.clear()
        assert checkpointer.restore(target, local_from=lambda rank: rank % writers) == 5
    expected = make_state(comm, seed=3)
    for path in ("rows", "grid", "table"):
        assert target[path].array.dtype == expected[path].array.dtype, path
        assert target[path].array.tobytes() == expected[path].array.tobytes(), path
    assert target["seed"] == 3
    source = comm.rank % writers
    assert target["rng"].array.tolist() == [10 * i + source for i in range(source + 2)]
    # Only the stored blocks that overlap this rank's new boxes were read.
    first, count = split(ROWS, comm.size, comm.rank)
    boxes = {r: ((split(ROWS, writers, r)[0], 0), (split(ROWS, writers, r)[1], COLS)) for r in range(writers)}
    wanted_rows = {r for r in range(writers) if intersection(((first, 0), (count, COLS)), boxes[r])}
    wanted_grid = {
        r for r in range(writers) if intersection(grid_box(comm.size, comm.rank), grid_box(writers, r))
    }
    assert {r for p, r in recording.reads if p == "rows"} == wanted_rows
    assert {r for p, r in recording.reads if p == "grid"} == wanted_grid
    comm.Free()


@pytest.mark.parametrize(("writers", "readers"), [(4, 3), (2, 4)])
def test_a_large_replicated_array_is_written_in_chunks_and_each_chunk_read_once(
    world, mpi_tmp_path, backend, writers, readers
):
    from hpckpt.model.layout import MIN_REPLICATED_CHUNK, replicated_chunks
    from hpckpt.model.plans import writer_chunk

    rows = (writers * MIN_REPLICATED_CHUNK + 5 * 8 * 64) // (8 * 64)  # a little over ``writers`` chunks
    table = np.arange(rows * 64, dtype=np.float64).reshape(rows, 64) / 3
    run_dir = mpi_tmp_path / f"replicated-{writers}to{readers}"
    comm = group(world, writers)
    if comm != MPI.COMM_NULL:
        with hpckpt.Checkpointer(run_dir, comm=comm, **backend) as checkpointer:
            checkpointer.save(1, {"table": hpckpt.Replicated(table.copy())})
            (_, (own_rows, _)) = replicated_chunks(table.shape, 8, writers)[writer_chunk("table", comm.rank,
                                                                                         writers)]
            # every writer its chunk
            written, chunk_bytes = checkpointer.last_save.written_bytes, own_rows * 64 * 8
            compressed = "compression" in backend.get("backend_options", {})
            assert 0 < written < chunk_bytes if compressed else written == chunk_bytes
        comm.Free()
    comm, recording = readers_after_writers(world, readers, backend)
    if comm is None:
        return
    target = {"table": hpckpt.Replicated(np.zeros_like(table))}
    with hpckpt.Checkpointer(run_dir, comm=comm, backend=recording) as checkpointer:
        assert checkpointer.restore(target) == 1
    assert target["table"].array.tobytes() == table.tobytes()
    read = sorted(rank for reads in comm.allgather(recording.reads) for _, rank in reads)
    assert read == list(range(len(replicated_chunks(table.shape, 8, writers)))) == list(range(writers))
    comm.Free()
