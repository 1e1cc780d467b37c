"""Error-bounded lossy compression (posix, lossy={pattern: tolerance}) under MPI.

Matching float leaves come back within the tolerance (never bit-exact is required),
every other leaf exactly; the reconstruction is what the checksums cover, so a damaged
stream is refused like any corrupt block; a restore on another rank count works too.
"""


import numpy as np
import pytest

import hpckpt
from tests.mpi.helpers import fallback_messages

MPI = pytest.importorskip("mpi4py.MPI")
pytest.importorskip("zfpy")
pytestmark = pytest.mark.mpi

ROWS, COLS, TOLERANCE = 48, 64, 1e-7
LOSSY = {"backend": "posix", "backend_options": {"lossy": {"solver/*": TOLERANCE}}}


def field() -> np.ndarray:
    x = np.linspace(0, 2, COLS)
    y = np.linspace(0, 1, ROWS)
    return np.exp(-y)[:, None] * np.sin(3 * x)[None, :]


def state(comm, values: np.ndarray | None) -> dict:
    base, extra = divmod(ROWS, comm.size)
    first = comm.rank * base + min(comm.rank, extra)
    rows = base + (comm.rank < extra)
    block = values[first : first + rows].copy() if values is not None else np.zeros((rows, COLS))
    return {
        "solver": {
            "x": hpckpt.Distributed(block, global_shape=(ROWS, COLS), offset=(first, 0)),
            "iteration": hpckpt.Replicated(np.array([17 if values is not None else 0])),
        },
        "exact": hpckpt.Distributed(block.copy(), global_shape=(ROWS, COLS), offset=(first, 0)),
    }


def test_lossy_leaves_come_back_within_the_tolerance_and_others_exactly(comm, run_dir):
    saved = state(comm, field())
    with hpckpt.Checkpointer(run_dir, comm=comm, **LOSSY) as checkpointer:
        checkpointer.save(1, saved)
        restored = state(comm, None)
        assert checkpointer.restore(restored) == 1
    error = np.abs(restored["solver"]["x"].array - saved["solver"]["x"].array).max()
    assert 0 < error <= TOLERANCE or saved["solver"]["x"].array.size == 0
    assert restored["exact"].array.tobytes() == saved["exact"].array.tobytes()
    assert restored["solver"]["iteration"].array.tolist() == [17]  # an int leaf: stored exactly
    manifest = hpckpt.CheckpointReader(run_dir).manifest(1)
    codecs = {r.path: {b.codec for b in r.blocks} for r in manifest.leaves}
    assert codecs == {"solver/x": {"zfp"}, "solver/iteration": {None}, "exact": {None}}
    assert hpckpt.CheckpointReader(run_dir).verify(1) == []


def test_a_damaged_lossy_stream_falls_back_to_the_previous_step(world, mpi_tmp_path):
    run_dir = mpi_tmp_path / "lossy-damaged"
    with hpckpt.Checkpointer(run_dir, comm=world, keep=2, **LOSSY) as checkpointer:
        checkpointer.save(1, state(world, field()))
        checkpointer.save(2, state(world, field() * 2))
        world.Barrier()
        if world.rank == 0:
            manifest = hpckpt.CheckpointReader(run_dir).manifest(2)
            block = next(r for r in manifest.leaves if r.path == "solver/x").blocks[-1]
            path = run_dir / "step-00000002" / block.location["file"]
            data = bytearray(path.read_bytes())
            data[block.location["offset"] + block.stored_bytes // 2] ^= 0xFF
            path.write_bytes(bytes(data))
        world.Barrier()
        restored = state(world, None)
        with fallback_messages(world) as messages:
            assert checkpointer.restore(restored) == 1
    assert any("ZFP stream does not match its stored checksum" in m for m in messages), messages
    assert checkpointer.last_restore.passed_over == tuple(messages)
    expected = state(world, field())["solver"]["x"].array
    assert np.abs(restored["solver"]["x"].array - expected).max() <= TOLERANCE


@pytest.mark.mpi(min_size=4)
def test_a_lossy_step_restores_on_another_number_of_ranks(world, mpi_tmp_path):
    run_dir = mpi_tmp_path / "lossy-4to3"
    with hpckpt.Checkpointer(run_dir, comm=world, **LOSSY) as checkpointer:
        checkpointer.save(1, state(world, field()))
    comm = world.Split(0 if world.rank < 3 else MPI.UNDEFINED, world.rank)
    if comm == MPI.COMM_NULL:
        return
    with hpckpt.Checkpointer(run_dir, comm=comm, **LOSSY) as checkpointer:
        restored = state(comm, None)
        assert checkpointer.restore(restored) == 1
    expected = state(comm, field())
    assert np.abs(restored["solver"]["x"].array - expected["solver"]["x"].array).max() <= TOLERANCE
    assert restored["exact"].array.tobytes() == expected["exact"].array.tobytes()
    comm.Free()
