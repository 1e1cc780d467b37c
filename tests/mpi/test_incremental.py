"""Incremental steps on every backend: only changed blocks are written, restore composes.

A block is reused when its leaf, rank, box and checksum equal the base step's; the
manifest points at the step whose files hold it, retention keeps that step, and every
``incremental``-th save in a row is full.
"""

import shutil
import warnings

import numpy as np
import pytest

import hpckpt
from hpckpt.catalog import CheckpointReader
from hpckpt.errors import CheckpointFallbackWarning, CollectiveError, CorruptCheckpointError
from hpckpt.model.delta import home_step
from hpckpt.model.manifest import PACK_PATH
from tests.mpi.helpers import fallback_messages

from .test_conformance import assert_same, make_state

MPI = pytest.importorskip("mpi4py.MPI")
pytestmark = pytest.mark.mpi


def homes(run_dir, step: int) -> dict[tuple[str, int], int]:
    """(leaf, block rank) -> the step whose files hold that block of ``step``."""
    manifest = CheckpointReader(run_dir).manifest(step)
    return {
        (record.path, block.rank): home_step(block, step)
        for record in manifest.leaves
        for block in record.blocks
    }


def data_bytes(step_dir) -> int:
    return sum(
        path.stat().st_size for path in step_dir.rglob("*") if path.is_file() and path.name != "manifest.json"
    )


def test_only_changed_blocks_are_written_and_restore_composes(comm, run_dir, backend):
    state = make_state(comm, seed=1)
    with hpckpt.Checkpointer(run_dir, comm=comm, incremental=4, **backend) as checkpointer:
        checkpointer.save(1, state)
        if comm.rank == 0:
            state["field"].array[0, 0] += 1.0  # rank 0's block of one distributed leaf
            state["flags"].array[0] = not state["flags"].array[0]  # and of its pack of Local leaves
        state["weights"].array[1, 2] = 7.0  # a replicated leaf
        state["step_info"]["iteration"] = 99
        checkpointer.save(2, state)
        written = checkpointer.last_save.written_bytes
        fresh = make_state(comm, seed=2)
        assert checkpointer.restore(fresh) == 2
    assert_same(state, fresh)
    where = homes(run_dir, 2)
    changed = {("field", 0), ("weights", 0), (PACK_PATH, 0)}
    assert {key for key, home in where.items() if home == 2} == changed
    assert all(home == 1 for key, home in where.items() if key not in changed)
    assert written < checkpointer.last_save.local_bytes or comm.rank != 0
    if comm.rank == 0:
        assert data_bytes(run_dir / "step-00000002") < data_bytes(run_dir / "step-00000001")
        assert CheckpointReader(run_dir).manifest(2).delta_base == 1
    assert CheckpointReader(run_dir).verify(2) == []


def test_a_full_step_every_k_saves_and_retention_keeps_what_is_read(comm, run_dir, backend):
    state = make_state(comm, seed=3)
    kept, full = [], []
    with hpckpt.Checkpointer(run_dir, comm=comm, keep=1, incremental=3, **backend) as checkpointer:
        for step in range(1, 8):
            state["field"].array[...] = step + comm.rank
            checkpointer.save(step, state)
            kept.append(checkpointer.steps())
            full.append(CheckpointReader(run_dir).manifest(step).delta_base is None)
            fresh = make_state(comm, seed=4)
            assert checkpointer.restore(fresh) == step
            assert_same(state, fresh)
    assert full == [True, False, False, True, False, False, True]
    assert kept == [[1], [1, 2], [1, 3], [4], [4, 5], [4, 6], [7]]


def test_a_delta_over_a_chosen_base_step(comm, run_dir, backend):
    base_model = make_state(comm, seed=5)
    with hpckpt.Checkpointer(run_dir, comm=comm, keep=1, **backend) as checkpointer:
        checkpointer.save(0, base_model)
        tuned = make_state(comm, seed=5)
        for step in (10, 20):
            tuned["weights"].array[...] += 1.0  # "fine-tuning" touches one leaf
            checkpointer.save(step, tuned, base=0)
        assert checkpointer.steps() == [0, 20]
        fresh = make_state(comm, seed=6)
        assert checkpointer.restore(fresh) == 20
    assert_same(tuned, fresh)
    assert {home for key, home in homes(run_dir, 20).items() if key[0] != "weights"} == {0}
    assert homes(run_dir, 20)[("weights", 0)] == 20


def test_bad_base_and_resaving_a_base_step_are_refused_everywhere(comm, run_dir, backend):
    state = make_state(comm, seed=7)
    with hpckpt.Checkpointer(run_dir, comm=comm, keep=5, incremental=5, **backend) as checkpointer:
        no_base = r"base step 5 is not a committed step before it .*\(committed: none\)"
        with pytest.raises(CollectiveError, match=no_base):
            checkpointer.save(6, state, base=5)
        checkpointer.save(1, state)
        checkpointer.save(2, state)
        still_read = r"cannot save step 1 again .*: incremental steps \[2\] read blocks"
        with pytest.raises(CollectiveError, match=still_read):
            checkpointer.save(1, state)
        assert checkpointer.steps() == [1, 2]
        fresh = make_state(comm, seed=8)
        assert checkpointer.restore(fresh) == 2
    assert_same(state, fresh)


@pytest.mark.parametrize("shard_ranks", ["1024", "2"], ids=["whole", "in-groups"])
def test_a_missing_base_step_is_reported_and_a_full_step_is_used(
    world, mpi_tmp_path, backend, shard_ranks, monkeypatch
):
    monkeypatch.setenv("HPCKPT_MANIFEST_SHARD_RANKS", shard_ranks)  # 2: merged in groups, sharded
    run_dir = mpi_tmp_path / "missing-base"
    first, second = make_state(world, seed=9), make_state(world, seed=10)
    with hpckpt.Checkpointer(run_dir, comm=world, keep=5, incremental=2, **backend) as checkpointer:
        checkpointer.save(1, first)
        checkpointer.save(2, first)  # incremental over 1: reads everything from step 1
        checkpointer.save(3, second)  # full (every 2nd)
        checkpointer.save(4, second)  # incremental over 3
        world.Barrier()
        if world.rank == 0:
            shutil.rmtree(run_dir / "step-00000003")
        world.Barrier()
        fresh = make_state(world, seed=11)
        with fallback_messages(world) as messages:
            assert checkpointer.restore(fresh) == 2
    assert_same(first, fresh)
    assert any("step 4 reads blocks of step 3, which is unusable" in m for m in messages), messages
    if world.rank == 0:
        shutil.rmtree(run_dir / "step-00000001")
    world.Barrier()
    with hpckpt.Checkpointer(run_dir, comm=world, **backend) as checkpointer:
        with pytest.raises(CorruptCheckpointError, match="step 2 reads blocks of step 1, which is unusable"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CheckpointFallbackWarning)
                checkpointer.restore(make_state(world, seed=12))


def test_non_blocking_incremental_saves(world, mpi_tmp_path, backend):
    run_dir = mpi_tmp_path / "async-incremental"
    state = make_state(world, seed=13)
    expected = []
    with hpckpt.Checkpointer(run_dir, comm=world, keep=2, incremental=3, **backend) as checkpointer:
        for step in (1, 2, 3):
            state["field"].array[...] = np.float64(step)
            checkpointer.save(step, state, blocking=False)
            expected.append(make_state(world, seed=13))
            expected[-1]["field"].array[...] = np.float64(step)
        state["field"].array[...] = -1.0  # after the snapshot: not in step 3
        checkpointer.wait()
        fresh = make_state(world, seed=14)
        assert checkpointer.restore(fresh) == 3
    assert_same(expected[-1], fresh)
    assert homes(run_dir, 3)[("weights", 0)] == 1


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("shard_ranks", ["1024", "2"], ids=["whole", "in-groups"])
def test_an_incremental_step_restores_on_another_number_of_ranks(
    world, mpi_tmp_path, backend, shard_ranks, monkeypatch
):
    monkeypatch.setenv("HPCKPT_MANIFEST_SHARD_RANKS", shard_ranks)  # 2: merged in groups, sharded
    from .test_rank_change import COLS, ROWS, global_rows, group, split
    from .test_rank_change import make_state as grid_state

    run_dir = mpi_tmp_path / "incremental-4to3"
    with hpckpt.Checkpointer(run_dir, comm=world, incremental=3, **backend) as checkpointer:
        state = grid_state(world, seed=3)
        checkpointer.save(1, state)
        if world.rank == 1:
            state["rows"].array[...] *= -1.0
        checkpointer.save(2, state)
    expected = global_rows(3)
    first, count = split(ROWS, 4, 1)
    expected[first : first + count] *= -1.0
    comm = group(world, 3)
    if comm == MPI.COMM_NULL:
        return
    with hpckpt.Checkpointer(run_dir, comm=comm, **backend) as checkpointer:
        target = grid_state(comm, seed=-1)
        assert checkpointer.restore(target) == 2
    first, count = split(ROWS, 3, comm.rank)
    assert target["rows"].array.tobytes() == expected[first : first + count].tobytes()
    assert target["rows"].array.shape == (count, COLS)
    assert homes(run_dir, 2)[("rows", 1)] == 2 and homes(run_dir, 2)[("rows", 0)] == 1
    comm.Free()
