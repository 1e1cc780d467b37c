"""Save/restore round trips of every leaf kind, with uneven boxes and strided views."""

import numpy as np
import pytest

import hpckpt

pytestmark = pytest.mark.mpi


def blocks(n: int, size: int, rank: int) -> tuple[int, int]:
    base, extra = divmod(n, size)
    return rank * base + min(rank, extra), base + (rank < extra)


def make_state(comm, seed: int) -> dict:
    """A tree with every leaf kind; values depend on ``seed`` and the rank."""
    rank, size = comm.rank, comm.size
    rng = np.random.default_rng([seed, rank])
    shared = np.random.default_rng(seed)
    start, rows = blocks(13, size, rank)
    field = rng.standard_normal((rows, 6))
    # A 2-D split, uneven in both dimensions: pairs of ranks share a block of rows, the
    # even rank takes columns [0, 4), the odd one [4, 7); an unpaired last rank takes all.
    grid_start, grid_rows = blocks(5, (size + 1) // 2, rank // 2)
    first_col, cols = (0, 7) if rank == size - 1 and size % 2 else ((0, 4) if rank % 2 == 0 else (4, 3))
    grid = rng.integers(0, 1000, (grid_rows, cols), dtype=np.int32)
    wide = rng.standard_normal((3, 2 * max(1, rows))) + 1j  # strided view below
    strided = wide[:, ::2][:, : max(1, rows)]
    return {
        "field": hpckpt.Distributed(field, global_shape=(13, 6), offset=(start, 0)),
        "nested": {"grid": hpckpt.Distributed(grid, global_shape=(5, 7), offset=(grid_start, first_col))},
        "complex": hpckpt.Local(strided),
        "particles": hpckpt.Local(rng.standard_normal((rank * 3, 2)).astype(np.float32)),
        "flags": hpckpt.Local(rng.integers(0, 2, 4 + rank).astype(bool)),
        "weights": hpckpt.Replicated(shared.standard_normal((4, 3))),
        "scale": hpckpt.Replicated(np.array(seed, dtype=np.int64)),
        "history": [0.5, seed, "text", None, True],
        "step_info": {"iteration": seed * 10, "name": f"run-{seed}"},
    }


def arrays_of(state: dict) -> dict:
    found = {}
    for slot in hpckpt.model.tree.flatten(state):
        value = slot.value
        found[slot.path] = np.array(value.array) if hasattr(value, "array") else value
    return found


def test_round_trip_of_every_leaf_kind(comm, run_dir):
    saved = make_state(comm, seed=1)
    with hpckpt.Checkpointer(run_dir, comm=comm) as checkpointer:
        assert checkpointer.restore(make_state(comm, seed=2)) is None
        checkpointer.save(10, saved)
        target = make_state(comm, seed=2)
        strided_target = target["complex"].array
        assert checkpointer.restore(target) == 10
    expected, restored = arrays_of(saved), arrays_of(target)
    assert expected.keys() == restored.keys()
    for path, value in expected.items():
        if isinstance(value, np.ndarray):
            assert restored[path].dtype == value.dtype, path
            assert restored[path].tobytes() == value.tobytes(), path
        else:
            assert restored[path] == value and type(restored[path]) is type(value), path
    assert target["complex"].array is strided_target  # filled in place, not replaced
    assert not strided_target.flags.c_contiguous
    assert target["history"][1] == 1 and target["step_info"]["name"] == "run-1"


def test_steps_latest_and_retention(comm, run_dir):
    state = make_state(comm, seed=3)
    with hpckpt.Checkpointer(run_dir, comm=comm, keep=2) as checkpointer:
        assert checkpointer.steps() == [] and checkpointer.latest_step() is None
        for step in (1, 2, 3, 4):
            state["step_info"]["iteration"] = step
            checkpointer.save(step, state)
        assert checkpointer.steps() == [3, 4]
        assert checkpointer.latest_step() == 4
        assert checkpointer.restore(state) == 4 and state["step_info"]["iteration"] == 4


def test_local_leaf_is_found_by_rank_with_plain_h5py(world, mpi_tmp_path):
    h5py = pytest.importorskip("h5py")
    state = {"rng": hpckpt.Local(np.arange(world.rank + 1, dtype=np.uint32) + 100 * world.rank)}
    with hpckpt.Checkpointer(mpi_tmp_path / "local", comm=world) as checkpointer:
        checkpointer.save(1, state)
    world.Barrier()
    with h5py.File(mpi_tmp_path / "local" / "step-00000001" / "data.h5", "r") as h5:
        for rank in range(world.size):
            stored = h5[f"rng/rank-{rank:05d}"][...]
            assert stored.tolist() == [100 * rank + i for i in range(rank + 1)]
        assert h5["rng"].attrs["hpckpt_kind"] == "local"
