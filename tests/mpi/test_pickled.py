"""Pickled leaves: stored on every backend, never unpickled without allow_pickle=True."""

import sys
import warnings
from fractions import Fraction

import numpy as np
import pytest

import hpckpt
from tests.processes import run_group

pytestmark = pytest.mark.mpi(min_size=2)


class Planted:
    """Unpickling it opens (creates) ``path``: a stand-in for a hostile checkpoint."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def state_with(world, value) -> dict:
    rows = np.full((2, 3), float(world.rank))
    return {
        "u": hpckpt.Distributed(rows, global_shape=(2 * world.size, 3), offset=(2 * world.rank, 0)),
        "extra": hpckpt.Pickled(value),
    }


def test_pickled_objects_round_trip_per_rank_with_a_warning(world, mpi_tmp_path, backend):
    mine = {
        "rank": world.rank,
        "seen": {world.rank, 99},
        "ratio": Fraction(1, world.rank + 3),
        "name": "é" * world.rank,
    }
    with hpckpt.Checkpointer(mpi_tmp_path / "run", comm=world, **backend) as checkpointer:
        checkpointer.save(5, state_with(world, mine))
        restored = state_with(world, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert checkpointer.restore(restored, allow_pickle=True) == 5
    assert restored["extra"].value == mine
    messages = [str(w.message) for w in caught if issubclass(w.category, hpckpt.PickleWarning)]
    assert messages == (
        [
            "unpickling 'extra' of step 5 (allow_pickle=True): this runs code named in the checkpoint; "
            "use it only for checkpoints you trust"
        ]
        if world.rank == 0
        else []
    )


def test_without_allow_pickle_nothing_is_unpickled_and_every_rank_is_told(world, mpi_tmp_path):
    marker = mpi_tmp_path / "planted"
    run_dir = mpi_tmp_path / "hostile"
    with hpckpt.Checkpointer(run_dir, comm=world) as checkpointer:
        checkpointer.save(1, state_with(world, Planted(str(marker))))
        restored = state_with(world, "untouched")
        with pytest.raises(hpckpt.CollectiveError) as info:
            checkpointer.restore(restored)
    assert info.value.phase == "restore: pickled leaves"
    assert list(info.value.failures) == list(range(world.size))
    assert (
        "UnsafeLoadError: the state holds hpckpt.Pickled leaves ('extra'); restoring them unpickles "
        "data from the checkpoint, which can run any code. Pass allow_pickle=True"
    ) in info.value.failures[world.rank]
    assert restored["extra"].value == "untouched" and restored["u"].array.max() == world.rank
    world.Barrier()
    if world.rank == 0:  # the command-line tools read it without unpickling either
        for command in ("inspect", "verify"):
            result = run_group([sys.executable, "-m", "hpckpt", command, str(run_dir)], timeout=60)
            assert result.returncode == 0, result.stderr
        inspected = run_group([sys.executable, "-m", "hpckpt", "inspect", str(run_dir)], timeout=60)
        assert "pickled object" in inspected.stdout
    assert not marker.exists()


def test_a_pickled_leaf_restores_only_into_a_pickled_leaf(world, mpi_tmp_path):
    with hpckpt.Checkpointer(mpi_tmp_path / "kinds", comm=world) as checkpointer:
        checkpointer.save(1, state_with(world, [1, 2]))
        as_bytes = state_with(world, None)
        as_bytes["extra"] = hpckpt.Local(np.zeros(8, dtype=np.uint8), resizable=True)
        with pytest.raises(
            hpckpt.StateMismatchError, match=r"leaf 'extra' is an hpckpt\.Pickled object in the checkpoint"
        ):
            checkpointer.restore(as_bytes)


def test_a_non_blocking_save_keeps_the_object_as_it_was_when_save_returned(world, mpi_tmp_path):
    mine = {"rank": world.rank, "history": [1, 2]}
    with hpckpt.Checkpointer(mpi_tmp_path / "async", comm=world) as checkpointer:
        checkpointer.save(3, state_with(world, mine), blocking=False)
        mine["history"].append(99)  # after save returned: not in step 3
        checkpointer.wait()
        restored = state_with(world, None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", hpckpt.PickleWarning)
            assert checkpointer.restore(restored, allow_pickle=True) == 3
    assert restored["extra"].value == {"rank": world.rank, "history": [1, 2]}
