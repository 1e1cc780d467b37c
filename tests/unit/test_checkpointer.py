"""The public facade, hpckpt/checkpointer.py, on one rank (COMM_SELF, no mpiexec): a state
saved with each backend restores bit for bit, and what the Checkpointer reports, refuses
and leaves behind in its run directory. (Option values are checked in
tests/unit/test_options.py; many ranks in tests/mpi.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import hpckpt
from hpckpt.protocols.restore_checks import STRICT_HINT
from tests.helpers import BACKEND_VARIANTS


def make_state(value: float) -> dict[str, Any]:
    """A state with every kind of leaf: arrays of three kinds and dtypes, nested plain values."""
    rng = np.random.default_rng(int(value))
    return {
        "u": hpckpt.Distributed(rng.standard_normal((6, 5)) * value, global_shape=(6, 5), offset=(0, 0)),
        "ids": hpckpt.Local(np.arange(7, dtype=np.int32) + int(value)),
        "w": hpckpt.Replicated(np.linspace(0.0, value, 9, dtype=np.float32)),
        "solver": {"it": int(value), "dt": value / 3, "history": [1, "two", None, True]},
    }


def zeros_like(state: dict[str, Any]) -> dict[str, Any]:
    """A state of the same structure as ``state``, its arrays zero and its values blank."""
    return {
        "u": hpckpt.Distributed(np.zeros((6, 5)), global_shape=(6, 5), offset=(0, 0)),
        "ids": hpckpt.Local(np.zeros(7, dtype=np.int32)),
        "w": hpckpt.Replicated(np.zeros(9, dtype=np.float32)),
        "solver": {"it": 0, "dt": 0.0, "history": [0, "", None, False]},
    }


def assert_same(restored: dict[str, Any], saved: dict[str, Any]) -> None:
    for key in ("u", "ids", "w"):
        assert restored[key].array.dtype == saved[key].array.dtype, key
        assert restored[key].array.tobytes() == saved[key].array.tobytes(), key
    assert restored["solver"] == saved["solver"]


def open_self(run_dir: Path, **options: Any) -> hpckpt.Checkpointer:
    """A Checkpointer of this process alone."""
    return hpckpt.Checkpointer(run_dir, comm=MPI.COMM_SELF, **options)


@pytest.mark.parametrize("variant", list(BACKEND_VARIANTS))
def test_a_state_saved_with_each_backend_restores_bit_for_bit(tmp_path, variant):
    """Every backend and posix variant: a new Checkpointer restores the newest step into a
    zeroed state exactly, and reports which step it read."""
    saved = make_state(2.0)
    with open_self(tmp_path / "run", **BACKEND_VARIANTS[variant]) as checkpointer:
        checkpointer.save(1, make_state(1.0))
        checkpointer.save(2, saved)
    with open_self(tmp_path / "run", **BACKEND_VARIANTS[variant]) as checkpointer:
        restored = zeros_like(saved)
        assert checkpointer.restore(restored) == 2
        assert checkpointer.last_restore.step == 2 and checkpointer.last_restore.missing == ()
        assert checkpointer.steps() == [1, 2]
    assert_same(restored, saved)
    manifest = json.loads((tmp_path / "run" / "step-00000002" / "manifest.json").read_text())
    assert manifest["backend"] == BACKEND_VARIANTS[variant]["backend"] and manifest["world_size"] == 1


def test_an_empty_run_directory_restores_nothing_and_leaves_the_state_alone(tmp_path):
    """A fresh start: restore returns None, the state is untouched, no step is listed."""
    state = make_state(5.0)
    with open_self(tmp_path / "fresh", backend="posix") as checkpointer:
        assert checkpointer.restore(state) is None
        assert checkpointer.last_restore is None
        assert checkpointer.steps() == [] and checkpointer.latest_step() is None
    assert_same(state, make_state(5.0))


def test_a_chosen_step_is_restored_and_a_step_never_committed_is_named(tmp_path):
    """``restore(step=S)`` reads S and no other; an uncommitted S raises MissingStepError
    listing the committed steps and leaves the state as it was."""
    with open_self(tmp_path / "run", backend="posix", keep=5) as checkpointer:
        for step in (10, 20, 30):
            checkpointer.save(step, make_state(float(step)))
        state = zeros_like(make_state(0.0))
        assert checkpointer.restore(state, step=20) == 20
        assert_same(state, make_state(20.0))
        with pytest.raises(hpckpt.MissingStepError) as info:
            checkpointer.restore(state, step=25)
        committed = "(committed: 10, 20, 30)"
        assert str(info.value) == f"step 25 is not a committed step of {tmp_path / 'run'} {committed}"
        assert state["solver"]["it"] == 20


def test_a_state_that_changed_is_refused_or_partly_restored_when_not_strict(tmp_path):
    """A leaf the step lacks is a StateMismatchError; with ``strict=False`` the leaves of
    both are restored, the rest reported in ``last_restore`` and a PartialRestoreWarning."""
    with open_self(tmp_path / "run", backend="posix") as checkpointer:
        checkpointer.save(1, {"u": hpckpt.Local(np.arange(3.0)), "old": 4, "it": 1})
        grown = {"u": hpckpt.Local(np.zeros(3)), "head": hpckpt.Local(np.full(2, -1.0)), "it": 0}
        with pytest.raises(hpckpt.StateMismatchError, match="local leaf 'head' is not in the checkpoint"):
            checkpointer.restore(grown)
        with pytest.warns(hpckpt.PartialRestoreWarning, match=r"without the state's leaves \['head'\]"):
            assert checkpointer.restore(grown, strict=False) == 1
    assert grown["u"].array.tolist() == [0.0, 1.0, 2.0] and grown["it"] == 1
    assert grown["head"].array.tolist() == [-1.0, -1.0]
    assert checkpointer.last_restore.missing == ("head",) and checkpointer.last_restore.unexpected == ("old",)


def test_a_mismatch_of_many_leaves_lists_twenty_and_counts_the_rest(tmp_path):
    with open_self(tmp_path / "run", backend="posix") as checkpointer:
        checkpointer.save(1, {f"a{index:03d}": hpckpt.Local(np.zeros(2)) for index in range(50)})
        wider = {f"a{index:03d}": hpckpt.Local(np.zeros(3)) for index in range(50)}
        wider["new"] = hpckpt.Local(np.zeros(1))
        with pytest.raises(hpckpt.StateMismatchError) as info:
            checkpointer.restore(wider)
    lines = str(info.value).splitlines()
    block = "but the checkpoint's block (of rank 0) has (2,)"
    assert lines[1:21] == [f"  leaf 'a{index:03d}' on rank 0 has shape (3,) {block}" for index in range(20)]
    assert lines[21:] == ["  and 31 more differences", f"  {STRICT_HINT}"]


def test_retention_keeps_the_newest_steps_and_the_best_metric(tmp_path):
    """``keep=2, keep_best=1``: the two newest steps and the one with the lowest metric stay."""
    with open_self(tmp_path / "run", backend="posix", keep=2, keep_best=1) as checkpointer:
        for step, metric in ((1, 0.5), (2, 0.1), (3, 0.4), (4, 0.3), (5, 0.2)):
            checkpointer.save(step, {"it": step}, metric=metric)
        assert checkpointer.steps() == [2, 4, 5] and checkpointer.latest_step() == 5
    assert sorted(path.name for path in (tmp_path / "run").glob("step-*")) == [
        "step-00000002", "step-00000004", "step-00000005"
    ]


def test_the_stats_count_committed_saves_and_stay_readable_after_close(tmp_path):
    """``saves``, ``save_seconds`` and ``last_save`` describe the committed saves; a closed
    Checkpointer still reports them but refuses to work."""
    with open_self(tmp_path / "run", backend="posix") as checkpointer:
        assert checkpointer.saves == 0 and checkpointer.last_save is None
        checkpointer.save(1, make_state(1.0))
        checkpointer.save(2, make_state(2.0))
        assert checkpointer.restored_level is None  # one level only
    assert checkpointer.saves == 2 and checkpointer.save_seconds > 0 and checkpointer.last_save is not None
    with pytest.raises(ValueError, match="is closed"):
        checkpointer.save(3, make_state(3.0))
    with pytest.raises(ValueError, match="is closed"):
        checkpointer.comm  # noqa: B018 - the property is what is tested


def test_hpckpt_talks_on_its_own_duplicate_of_the_communicator(tmp_path):
    """The Checkpointer's communicator is a congruent duplicate, never the application's."""
    with open_self(tmp_path / "run", backend="posix") as checkpointer:
        assert checkpointer.comm != MPI.COMM_SELF
        assert MPI.Comm.Compare(checkpointer.comm, MPI.COMM_SELF) == MPI.CONGRUENT


def test_a_second_checkpointer_of_an_open_run_directory_is_refused_until_the_first_closes(tmp_path):
    """The run directory's lock names the holder; closing (even on an error) frees it."""
    with open_self(tmp_path / "run", backend="posix"):
        with pytest.raises(hpckpt.HpckptError, match="is in use by another job"):
            open_self(tmp_path / "run", backend="posix")
    with pytest.raises(RuntimeError, match="the application failed"):
        with open_self(tmp_path / "run", backend="posix"):
            raise RuntimeError("the application failed")
    with open_self(tmp_path / "run", backend="posix") as checkpointer:
        checkpointer.save(1, {"it": 1})


def test_due_follows_the_schedule_and_needs_one(tmp_path):
    """``due`` answers from the schedule; without one it is a ValueError saying how to give it."""
    with open_self(tmp_path / "a", backend="posix") as checkpointer:
        with pytest.raises(ValueError, match="due\\(\\) needs a schedule"):
            checkpointer.due(1)
    with open_self(tmp_path / "b", backend="posix", schedule=hpckpt.Schedule(steps=5)) as checkpointer:
        assert [step for step in range(1, 16) if checkpointer.due(step)] == [5, 10, 15]


def test_broadcast_gives_a_plain_value_and_refuses_others(tmp_path):
    """A plain value comes back equal; a value JSON would change (a tuple) or cannot hold (a
    numpy scalar) is refused with a CollectiveError naming it; a root outside the ranks is
    a ValueError."""
    with open_self(tmp_path / "run", backend="posix") as checkpointer:
        value = {"best": 0.5, "pair": [1, 2], "stop": False, "note": None}
        assert checkpointer.broadcast(value) == value
        with pytest.raises(hpckpt.CollectiveError, match="'pair' is a tuple"):
            checkpointer.broadcast({"pair": (1, 2)})
        with pytest.raises(hpckpt.CollectiveError, match="'loss' is a float32"):
            checkpointer.broadcast({"loss": np.float32(0.5)})
        with pytest.raises(ValueError, match="broadcast root 1 is not a rank of the 1 ranks"):
            checkpointer.broadcast(1, root=1)


def test_a_non_blocking_save_returns_a_handle_that_commits_on_wait(tmp_path):
    """``blocking=False`` returns a SaveHandle of the step; after ``wait`` it is done and
    the step is committed with the values of the moment save returned."""
    state = make_state(1.0)
    with open_self(tmp_path / "run", backend="posix") as checkpointer:
        handle = checkpointer.save(4, state, blocking=False)
        state["u"].array[...] = -1.0  # after the snapshot: not saved
        handle.wait()
        assert handle.step == 4 and handle.done()
        assert checkpointer.steps() == [4] and checkpointer.saves == 1
        restored = zeros_like(state)
        checkpointer.restore(restored)
    assert_same(restored, make_state(1.0))


def test_a_delta_over_a_base_step_restores_the_whole_state(tmp_path):
    """``save(..., base=B)`` stores only what changed since B and records B; the restore of
    the delta gives every byte."""
    first = make_state(1.0)
    second = make_state(1.0)
    second["w"] = hpckpt.Replicated(np.full(9, 7.0, dtype=np.float32))
    with open_self(tmp_path / "run", backend="posix", keep=5) as checkpointer:
        checkpointer.save(1, first)
        checkpointer.save(2, second, base=1)
        restored = zeros_like(second)
        assert checkpointer.restore(restored) == 2
    assert_same(restored, second)
    manifest = json.loads((tmp_path / "run" / "step-00000002" / "manifest.json").read_text())
    assert manifest["delta_base"] == 1


class Model:
    """A Stateful object: it says what tree to save and puts restored values in place."""

    def __init__(self, weight: float) -> None:
        self.weights = np.full(4, weight)
        self.epoch = int(weight)
        self.loaded: Any = None

    def checkpoint_tree(self, *, for_restore: bool = False) -> dict[str, Any]:
        return {"weights": hpckpt.Local(self.weights), "epoch": self.epoch}

    def load_checkpoint_tree(self, tree: dict[str, Any], restored: Any) -> None:
        self.epoch, self.loaded = tree["epoch"], restored


def test_a_stateful_object_saves_its_tree_and_loads_what_was_restored(tmp_path):
    """save and restore take an object with ``checkpoint_tree``/``load_checkpoint_tree``:
    its arrays are filled in place, then it is handed the tree and the restore's report."""
    with open_self(tmp_path / "run", backend="posix") as checkpointer:
        checkpointer.save(3, Model(3.0))
        model = Model(0.0)
        assert checkpointer.restore(model) == 3
    assert model.weights.tolist() == [3.0] * 4 and model.epoch == 3 and model.loaded.step == 3


def test_pickled_leaves_restore_only_when_allowed(tmp_path):
    """A state holding a Pickled leaf is refused without ``allow_pickle`` (naming the leaf);
    with it, a PickleWarning is given and the object comes back."""
    with open_self(tmp_path / "run", backend="posix") as checkpointer:
        checkpointer.save(1, {"opt": hpckpt.Pickled({"seen": {1, 2}})})
        state = {"opt": hpckpt.Pickled()}
        with pytest.raises(hpckpt.HpckptError, match="'opt'"):
            checkpointer.restore(state)
        with pytest.warns(hpckpt.PickleWarning, match="allow_pickle=True"):
            assert checkpointer.restore(state, allow_pickle=True) == 1
    assert state["opt"].value == {"seen": {1, 2}}


def test_finish_marks_the_attempt_done_for_hpckpt_run(tmp_path, monkeypatch):
    """Under ``hpckpt run`` (HPCKPT_FINISHED_FILE set), ``finish`` creates that file, so a
    later non-zero exit is not relaunched; without it, it creates nothing."""
    marker = tmp_path / "finished"
    with open_self(tmp_path / "run", backend="posix") as checkpointer:
        checkpointer.save(1, {"it": 1}, blocking=False)
        checkpointer.finish()
        assert checkpointer.steps() == [1] and not marker.exists()
        monkeypatch.setenv("HPCKPT_FINISHED_FILE", str(marker))
        checkpointer.finish()
    assert marker.exists()


def test_recover_without_in_job_recovery_raises_the_failure_unchanged(tmp_path):
    """Without ``recovery="ulfm"`` there is nothing to repair: the very exception given is raised."""
    failure = RuntimeError("a rank died")
    with open_self(tmp_path / "run", backend="posix") as checkpointer:
        with pytest.raises(RuntimeError) as info:
            checkpointer.recover({"it": 0}, failure)
    assert info.value is failure


def test_a_failed_save_keeps_the_previous_step(tmp_path):
    """A tree that cannot be saved (a set among the plain values) fails the save on every
    rank, naming the leaf; the previous committed step stays and restores."""
    with open_self(tmp_path / "run", backend="posix") as checkpointer:
        checkpointer.save(1, make_state(1.0))
        bad = make_state(2.0)
        bad["solver"]["dt"] = {0.5}
        with pytest.raises(hpckpt.CollectiveError, match="leaf 'solver/dt' has unsupported type set"):
            checkpointer.save(2, bad)
        assert checkpointer.steps() == [1]
        restored = zeros_like(make_state(1.0))
        assert checkpointer.restore(restored) == 1
    assert_same(restored, make_state(1.0))
