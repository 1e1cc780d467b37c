"""Failures on one rank reach every rank; mismatched trees and corrupt steps are named."""


import h5py
import numpy as np
import pytest

import hpckpt
from hpckpt.testing.faults import ENV as FAULT_ENV
from tests.mpi.helpers import fallback_warning

pytestmark = pytest.mark.mpi(min_size=2)


def field_state(comm, value: float) -> dict:
    start, rows = 3 * comm.rank, 3
    local = np.full((rows, 4), value)
    return {"u": hpckpt.Distributed(local, global_shape=(3 * comm.size, 4), offset=(start, 0)), "it": value}


def test_bad_leaf_on_one_rank_raises_the_same_collective_error_everywhere(world, mpi_tmp_path):
    last = world.size - 1
    with hpckpt.Checkpointer(mpi_tmp_path / "bad", comm=world) as checkpointer:
        checkpointer.save(1, field_state(world, 1.0))
        state = field_state(world, 2.0)
        if world.rank == last:
            state["names"] = hpckpt.Local(np.array(["a", "b"]))
        else:
            state["names"] = hpckpt.Local(np.zeros(2))
        with pytest.raises(hpckpt.CollectiveError) as info:
            checkpointer.save(2, state)
        assert info.value.phase == "save step 2: plan"
        assert list(info.value.failures) == [last]
        assert f"rank(s) {last} of {world.size}" in str(info.value)
        assert "leaf 'names': dtype <U1 cannot be stored" in info.value.failures[last]
        restored = field_state(world, 0.0)
        assert checkpointer.restore(restored) == 1  # the committed step is untouched
        assert restored["u"].array.tolist() == field_state(world, 1.0)["u"].array.tolist()


def test_injected_failure_of_rank_0_in_commit_keeps_the_previous_step(world, mpi_tmp_path, monkeypatch):
    with hpckpt.Checkpointer(mpi_tmp_path / "commit", comm=world) as checkpointer:
        checkpointer.save(1, field_state(world, 1.0))
        monkeypatch.setenv(FAULT_ENV, "save.commit:0:raise")
        with pytest.raises(hpckpt.CollectiveError) as info:
            checkpointer.save(2, field_state(world, 2.0))
        monkeypatch.delenv(FAULT_ENV)
        assert info.value.phase == "save step 2: commit" and list(info.value.failures) == [0]
        assert "InjectedFault: injected fault at save.commit on rank 0" in info.value.failures[0]
        assert checkpointer.steps() == [1]
        state = field_state(world, 0.0)
        assert checkpointer.restore(state) == 1 and state["it"] == 1.0


def replicated_state(comm, value: float) -> dict:
    """A field and replicated arrays, which a restore reads in chunks and broadcasts while it reads."""
    state = field_state(comm, value)
    state["weights"] = [hpckpt.Replicated(np.full((64, 5 + index), value + index)) for index in range(6)]
    return state


@pytest.mark.parametrize("make_state", [field_state, replicated_state], ids=["field", "replicated"])
def test_failure_while_reading_on_one_rank(world, mpi_tmp_path, monkeypatch, make_state):
    with hpckpt.Checkpointer(mpi_tmp_path / "read", comm=world) as checkpointer:
        checkpointer.save(1, make_state(world, 1.0))
        monkeypatch.setenv(FAULT_ENV, "restore.read:1:raise")
        with pytest.raises(hpckpt.CollectiveError) as info:
            checkpointer.restore(make_state(world, 0.0))
        assert info.value.phase == "restore step 1: read" and list(info.value.failures) == [1]
        assert "InjectedFault: injected fault at restore.read on rank 1" in info.value.failures[1]
        monkeypatch.delenv(FAULT_ENV)
        state = make_state(world, 0.0)
        assert checkpointer.restore(state) == 1
        assert all(np.array_equal(leaf.array, np.full_like(leaf.array, 1.0 + index))
                   for index, leaf in enumerate(state.get("weights", [])))


@pytest.mark.parametrize("where", ["hdf5.layout", "hdf5.layout_rest"])
def test_failure_of_rank_0s_hdf5_layout_fails_the_save_everywhere(world, mpi_tmp_path, monkeypatch, where):
    """Rank 0 lays out data.h5 in two parts, the small datasets while every rank writes
    the large ones: a failure in either part fails the save on every rank, and the next
    save into a new file is whole.
    """
    def state_of(value: float) -> dict:
        state = replicated_state(world, value)  # small datasets
        state["large"] = hpckpt.Replicated(np.full((256, 64), value))  # 128 KiB: laid out first
        return state

    with hpckpt.Checkpointer(mpi_tmp_path / where, comm=world, backend="hdf5") as checkpointer:
        checkpointer.save(1, state_of(1.0))
        monkeypatch.setenv(FAULT_ENV, f"{where}:0:raise")
        with pytest.raises(hpckpt.CollectiveError) as info:
            checkpointer.save(2, state_of(2.0))
        monkeypatch.delenv(FAULT_ENV)
        assert info.value.phase == "save step 2: write"
        assert sorted(info.value.failures) == list(range(world.size))
        assert f"InjectedFault: injected fault at {where} on rank 0" in info.value.failures[0]
        assert all("rank 0 could not lay out" in info.value.failures[rank] for rank in range(1, world.size))
        assert h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE) == 0  # rank 0 closed it
        assert checkpointer.steps() == [1]
        checkpointer.save(3, state_of(3.0))
        restored = state_of(0.0)
        assert checkpointer.restore(restored) == 3
        expected = state_of(3.0)
        assert np.array_equal(restored["large"].array, expected["large"].array)
        weights = zip(restored["weights"], expected["weights"], strict=True)
        assert all(np.array_equal(leaf.array, want.array) for leaf, want in weights)


def test_different_steps_on_different_ranks(world, mpi_tmp_path):
    with hpckpt.Checkpointer(mpi_tmp_path / "steps", comm=world) as checkpointer:
        with pytest.raises(
            hpckpt.InvalidStateError, match=r"different steps on different ranks \(rank 0: 5, rank 1: 6"
        ):
            checkpointer.save(5 + world.rank, field_state(world, 1.0))
        assert checkpointer.steps() == []


def test_overlapping_boxes_are_refused_on_every_rank(world, mpi_tmp_path):
    local = np.zeros((3, 4))
    state = {
        "u": hpckpt.Distributed(
            local, global_shape=(3 * world.size, 4), offset=(max(0, 3 * world.rank - 1), 0)
        )
    }
    with hpckpt.Checkpointer(mpi_tmp_path / "overlap", comm=world) as checkpointer:
        with pytest.raises(hpckpt.InvalidStateError, match="leaf 'u': the boxes of ranks 0 and 1 overlap"):
            checkpointer.save(1, state)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.pop("u"), "distributed leaf 'u' is in the checkpoint but not in the state"),
        (
            lambda s: s.update(extra=hpckpt.Replicated(np.zeros(2))),
            "replicated leaf 'extra' is not in the checkpoint",
        ),
        (lambda s: s.update(it2=3), "plain value 'it2' is not in the checkpoint"),
        (
            lambda s: s.update(u=hpckpt.Replicated(np.zeros((3, 4)))),
            "leaf 'u' is replicated in the state but distributed in the checkpoint",
        ),
        (
            lambda s: s["u"].__init__(
                s["u"].array.astype(np.float32), global_shape=s["u"].global_shape, offset=s["u"].offset
            ),
            "leaf 'u' has dtype float32 but the checkpoint has float64",
        ),
    ],
)
def test_mismatched_trees(world, mpi_tmp_path, change, message):
    with hpckpt.Checkpointer(mpi_tmp_path / "mismatch", comm=world) as checkpointer:
        checkpointer.save(4, field_state(world, 1.0))
        state = field_state(world, 0.0)
        change(state)
        with pytest.raises(hpckpt.StateMismatchError) as info:
            checkpointer.restore(state)
        assert "does not match checkpoint step 4" in str(info.value)
        assert message in str(info.value)


def test_other_global_shape(world, mpi_tmp_path):
    with hpckpt.Checkpointer(mpi_tmp_path / "shape", comm=world) as checkpointer:
        checkpointer.save(1, field_state(world, 1.0))
        wrong = {
            "u": hpckpt.Distributed(
                np.zeros((3, 5)), global_shape=(3 * world.size, 5), offset=(3 * world.rank, 0)
            ),
            "it": 0,
        }
        expected = r"leaf 'u' has global_shape \(\d+, 5\) but the checkpoint has \(\d+, 4\)"
        with pytest.raises(hpckpt.StateMismatchError, match=expected):
            checkpointer.restore(wrong)


def test_corrupt_manifest_and_no_good_step(world, mpi_tmp_path):
    run_dir = mpi_tmp_path / "manifest"
    with hpckpt.Checkpointer(run_dir, comm=world) as checkpointer:
        checkpointer.save(1, field_state(world, 1.0))
        world.Barrier()
        if world.rank == 0:
            (run_dir / "step-00000001" / "manifest.json").write_text(
                '{"format": "hpckpt-manifest", "version"'
            )
        world.Barrier()
        with fallback_warning(world, match="no older committed step is left"):
            with pytest.raises(
                hpckpt.CorruptCheckpointError, match=r"no committed step in .* could be restored"
            ):
                checkpointer.restore(field_state(world, 0.0))


def test_a_damaged_replicated_chunk_makes_every_rank_fall_back(world, mpi_tmp_path):
    """Rank 1's data file of step 2 damaged: the replicated chunks it reads (and broadcasts
    while reading) fail their checksums on rank 1, and every rank restores step 1."""
    run_dir = mpi_tmp_path / "chunk"
    with hpckpt.Checkpointer(run_dir, comm=world, backend="posix") as checkpointer:
        checkpointer.save(1, replicated_state(world, 1.0))
        checkpointer.save(2, replicated_state(world, 2.0))
    data = run_dir / "step-00000002" / "data-00001.bin"
    if world.rank == 0:
        data.write_bytes(bytes(byte ^ 0xFF for byte in data.read_bytes()))
    world.Barrier()
    state = replicated_state(world, 0.0)
    with fallback_warning(world, match=r"step 2 .*leaf 'weights/\d', block of rank 1 .*checksum"):
        with hpckpt.Checkpointer(run_dir, comm=world, backend="posix") as checkpointer:
            assert checkpointer.restore(state) == 1
    for index, leaf in enumerate(state["weights"]):
        assert np.array_equal(leaf.array, np.full_like(leaf.array, 1.0 + index)), index


@pytest.mark.parametrize("layout", ["merged", "reused", "sharded"])
def test_replicated_copies_that_differ_are_refused_after_the_write_on_every_rank(
    world, mpi_tmp_path, monkeypatch, layout
):
    """Replicated arrays are compared by their chunk checksums after the write: one
    element of the last rank's copy differs, in a chunk another rank writes, and every
    rank raises the same error naming the leaf and that rank; nothing is committed, and
    the next save of alike copies commits."""
    if layout == "sharded":
        monkeypatch.setenv("HPCKPT_MANIFEST_SHARD_RANKS", "2")
    rows = (8 << 20) // 8 // 4  # two chunks of 4 MiB: written by two ranks

    def state(value: float, spoiled: bool) -> dict:
        big = np.full((rows, 4), value)
        if spoiled and world.rank == world.size - 1:
            big[-1, -1] += 1.0  # the last row: in the second chunk
        return {"it": value, "w": {"big": hpckpt.Replicated(big), "small": hpckpt.Replicated(np.arange(3.0))}}

    run_dir = mpi_tmp_path / f"replicas-{layout}"
    with hpckpt.Checkpointer(run_dir, comm=world) as checkpointer:
        if layout != "merged":
            checkpointer.save(1, state(1.0, spoiled=False))
        with pytest.raises(hpckpt.InvalidStateError) as info:
            checkpointer.save(2, state(2.0, spoiled=True))
        assert str(info.value) == (
            f"replicated leaf 'w/big' differs between rank 0 and rank {world.size - 1} (save of step 2, "
            "not committed); replicated arrays must be identical on every rank"
        )
        committed = [] if layout == "merged" else [1]
        assert checkpointer.steps() == committed
        assert not (run_dir / "step-00000002").exists()
        if committed:
            restored = state(0.0, spoiled=False)
            assert checkpointer.restore(restored) == 1
            assert np.array_equal(restored["w"]["big"].array, np.full((rows, 4), 1.0))
        checkpointer.save(3, state(3.0, spoiled=False))
        assert checkpointer.steps()[-1] == 3
