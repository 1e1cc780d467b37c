"""Restoring a chosen step (``step=S``) and a state that gained or lost leaves
(``strict=False``): what is restored, what is left alone and reported, alike on every
rank; a step that is not committed is named on every rank, with those that are."""

import warnings

import numpy as np
import pytest

import hpckpt
from tests.mpi.helpers import fallback_warning

pytestmark = pytest.mark.mpi(min_size=2)


def field(comm, value: float) -> hpckpt.Distributed:
    return hpckpt.Distributed(
        np.full((3, 4), value), global_shape=(3 * comm.size, 4), offset=(3 * comm.rank, 0)
    )


def test_a_chosen_step_is_restored_and_a_missing_one_is_named_on_every_rank(world, mpi_tmp_path):
    with hpckpt.Checkpointer(mpi_tmp_path / "steps", comm=world, keep=3) as checkpointer:
        for step in (10, 20, 30):
            checkpointer.save(step, {"u": field(world, float(step)), "it": step})
        state = {"u": field(world, 0.0), "it": 0}
        assert checkpointer.restore(state, step=20) == 20
        assert state["it"] == 20 and np.all(state["u"].array == 20.0)
        assert checkpointer.last_restore == hpckpt.protocols.restore.Restored(20)
        with pytest.raises(hpckpt.MissingStepError) as info:
            checkpointer.restore(state, step=25)
        assert str(info.value) == (
            f"step 25 is not a committed step of {mpi_tmp_path / 'steps'} (committed: 10, 20, 30)"
        )
        assert state["it"] == 20  # untouched
        assert checkpointer.restore(state) == 30 and state["it"] == 30


def test_a_chosen_corrupt_step_raises_instead_of_falling_back(world, mpi_tmp_path):
    with hpckpt.Checkpointer(mpi_tmp_path / "corrupt", comm=world, keep=2, backend="posix") as checkpointer:
        checkpointer.save(1, {"u": field(world, 1.0)})
        checkpointer.save(2, {"u": field(world, 2.0)})
        if world.rank == 0:
            data = sorted((mpi_tmp_path / "corrupt" / "step-00000002").glob("data-*.bin"))[0]
            with open(data, "r+b") as handle:
                handle.write(b"\xff" * 8)
        world.Barrier()
        state = {"u": field(world, 0.0)}
        with (
            warnings.catch_warnings(record=True),
            pytest.raises(hpckpt.CorruptCheckpointError, match="step 2: leaf 'u'"),
        ):
            checkpointer.restore(state, step=2)
        with fallback_warning(world, match="falling back to step 1"):
            assert checkpointer.restore(state) == 1


def test_a_state_with_new_and_dropped_leaves_restores_what_both_have(world, mpi_tmp_path):
    with hpckpt.Checkpointer(mpi_tmp_path / "grown", comm=world) as checkpointer:
        checkpointer.save(
            5, {"u": field(world, 5.0), "old": hpckpt.Replicated(np.arange(3.0)), "it": 5, "lr": 0.1}
        )
        grown = {"u": field(world, 0.0), "head": hpckpt.Local(np.full(2, -1.0)), "it": 0, "epoch": 7}
        with pytest.raises(hpckpt.StateMismatchError) as info:
            checkpointer.restore(grown)
        message = str(info.value)
        assert "local leaf 'head' is not in the checkpoint" in message
        assert "plain value 'epoch' is not in" in message
        assert "replicated leaf 'old' is in the checkpoint but not in the state" in message
        assert "strict=False" in message

        if world.rank == 0:
            with pytest.warns(
                hpckpt.PartialRestoreWarning, match=r"without the state's leaves \['epoch', 'head'\]"
            ):
                assert checkpointer.restore(grown, strict=False) == 5
        else:
            assert checkpointer.restore(grown, strict=False) == 5
        assert np.all(grown["u"].array == 5.0) and grown["it"] == 5
        assert np.all(grown["head"].array == -1.0) and grown["epoch"] == 7  # left as they were
        report = checkpointer.last_restore
        assert report.missing == ("epoch", "head") and set(report.unexpected) == {"old", "lr"}
        assert world.allgather(report) == [report] * world.size

        wrong = {
            "u": hpckpt.Distributed(
                np.zeros((3, 4), dtype=np.float32),
                global_shape=(3 * world.size, 4),
                offset=(3 * world.rank, 0),
            )
        }
        with pytest.raises(hpckpt.StateMismatchError, match="leaf 'u' has dtype float32"):
            checkpointer.restore(wrong, strict=False)  # leaves of both that differ are still refused


def test_uncoordinated_checkpoints_refuse_the_choices(world, mpi_tmp_path):
    with hpckpt.Checkpointer(mpi_tmp_path / "unco", comm=world, protocol="uncoordinated") as checkpointer:
        checkpointer.save(1, {"x": hpckpt.Local(np.zeros(2))})
        with pytest.raises(ValueError, match="step and strict=False apply to the coordinated protocol"):
            checkpointer.restore({"x": hpckpt.Local(np.zeros(2))}, step=1)


def test_a_value_known_on_one_rank_becomes_a_plain_value_of_the_state(world, mpi_tmp_path):
    last = world.size - 1
    with hpckpt.Checkpointer(mpi_tmp_path / "bcast", comm=world) as checkpointer:
        mine = {"best_loss": 0.25, "stop": False, "history": [1, 2]} if world.rank == last else None
        shared = checkpointer.broadcast(mine, root=last)
        assert shared == {"best_loss": 0.25, "stop": False, "history": [1, 2]}
        checkpointer.save(1, {"u": field(world, 1.0), "eval": shared})  # plain values equal on every rank
        bad = {"loss": np.float32(0.5)} if world.rank == 0 else None
        with pytest.raises(hpckpt.CollectiveError) as info:
            checkpointer.broadcast(bad)
        assert list(info.value.failures) == [0]
        assert "'loss' is a float32; expected int, float" in info.value.failures[0]
        with pytest.raises(ValueError, match=f"broadcast root {world.size} is not a rank"):
            checkpointer.broadcast(1, root=world.size)
