"""Non-blocking saves: snapshot semantics, several in flight, errors on every rank, buffers reused."""

import numpy as np
import pytest

import hpckpt
from hpckpt.testing.faults import ENV as FAULT_ENV

MPI = pytest.importorskip("mpi4py.MPI")
pytestmark = pytest.mark.mpi(min_size=2)


def make_state(comm, value: float) -> dict:
    rows = 4
    block = np.full((rows, 1000), value) + comm.rank
    return {
        "u": hpckpt.Distributed(block, global_shape=(rows * comm.size, 1000), offset=(rows * comm.rank, 0)),
        "rng": hpckpt.Local(np.arange(comm.rank + 3, dtype=np.int64) * int(value)),
        "it": value,
    }


def test_the_snapshot_is_taken_when_save_returns(world, mpi_tmp_path, backend):
    with hpckpt.Checkpointer(mpi_tmp_path / "snap", comm=world, **backend) as checkpointer:
        state = make_state(world, 1.0)
        handle = checkpointer.save(1, state, blocking=False)
        state["u"].array[...] = -5.0  # the application moves on at once
        state["rng"].array[...] = -5
        handle.wait()
        assert handle.done() and handle.step == 1 and checkpointer.saves == 1
        target = make_state(world, 0.0)
        assert checkpointer.restore(target) == 1
    expected = make_state(world, 1.0)
    assert target["u"].array.tobytes() == expected["u"].array.tobytes()
    assert target["rng"].array.tolist() == expected["rng"].array.tolist() and target["it"] == 1.0


def test_several_in_flight_with_retention_and_app_traffic(world, mpi_tmp_path):
    with hpckpt.Checkpointer(mpi_tmp_path / "many", comm=world, keep=3, max_in_flight=2) as checkpointer:
        state = make_state(world, 0.0)
        for step in range(1, 7):
            state["u"].array[...] = step + world.rank
            state["it"] = float(step)
            checkpointer.save(step, state, blocking=False)
            total = world.allreduce(step)  # the application's own collectives meanwhile
            assert total == step * world.size
        checkpointer.wait()
        assert checkpointer.saves == 6
        assert checkpointer.steps() == [4, 5, 6]
        buffers = checkpointer.engine.buffer_bytes()
        state_bytes = state["u"].array.nbytes + state["rng"].array.nbytes
        assert buffers == 2 * state_bytes  # two buffer sets, reused by all six saves
        target = make_state(world, 0.0)
        assert checkpointer.restore(target) == 6
    assert np.all(target["u"].array == 6 + world.rank) and target["it"] == 6.0


def test_a_background_failure_is_raised_on_every_rank_at_the_next_call(world, mpi_tmp_path, monkeypatch):
    with hpckpt.Checkpointer(mpi_tmp_path / "fail", comm=world) as checkpointer:
        checkpointer.save(1, make_state(world, 1.0))
        monkeypatch.setenv(FAULT_ENV, "save.commit:0:raise")  # rank 0 is the one that commits
        checkpointer.save(2, make_state(world, 2.0), blocking=False)
        with pytest.raises(hpckpt.CollectiveError) as info:
            checkpointer.wait()
        monkeypatch.delenv(FAULT_ENV)
        assert info.value.phase == "save step 2: commit" and list(info.value.failures) == [0]
        assert checkpointer.steps() == [1]
        checkpointer.save(3, make_state(world, 3.0), blocking=False)
        checkpointer.wait()  # later saves work again
        assert checkpointer.steps() == [1, 3]


def test_a_bad_leaf_fails_the_snapshot_on_every_rank(world, mpi_tmp_path):
    with hpckpt.Checkpointer(mpi_tmp_path / "bad", comm=world, max_in_flight=1) as checkpointer:
        state = make_state(world, 1.0)
        if world.rank == 0:
            state["names"] = hpckpt.Local(np.array(["x"]))
        else:
            state["names"] = hpckpt.Local(np.zeros(1))
        with pytest.raises(hpckpt.CollectiveError, match="save step 1: snapshot"):
            checkpointer.save(1, state, blocking=False)
        del state["names"]
        checkpointer.save(2, state, blocking=False).wait()  # the buffer set came back
        assert checkpointer.steps() == [2]
