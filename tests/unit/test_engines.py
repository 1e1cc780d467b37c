"""The engines behind the Checkpointer (hpckpt/engines/) on one rank, COMM_SELF: which
engine the options choose, and what each one's contract allows and refuses. (Their
behaviour across ranks is in tests/mpi: test_async.py, test_logged_comm.py, ...)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import hpckpt
from hpckpt.engines import CoordinatedEngine, MultiLevelEngine, UncoordinatedEngine, open_engine
from hpckpt.options import NodeLocal, Options, Storage
from hpckpt.storage.commit import RunDirectory


def state(value: float) -> dict[str, Any]:
    return {"x": hpckpt.Local(np.full(5, value)), "it": int(value)}


def open_self(run_dir: Path, **options: Any) -> hpckpt.Checkpointer:
    """A Checkpointer of this process alone, with the posix backend."""
    return hpckpt.Checkpointer(run_dir, comm=MPI.COMM_SELF, backend="posix", **options)


def options_of(mode: str, tmp_path: Path) -> Options:
    """The options of one mode, with the posix backend (node-local level under tmp_path)."""
    storage = Storage(backend="posix")
    if mode == "uncoordinated":
        return Options(storage=storage, protocol="uncoordinated")
    if mode == "multilevel":
        return Options(storage=storage, node_local=NodeLocal(directory=tmp_path / "local", flush_every=0))
    return Options(storage=storage)


@pytest.mark.parametrize(
    ("mode", "engine"),
    [
        ("coordinated", CoordinatedEngine),
        ("uncoordinated", UncoordinatedEngine),
        ("multilevel", MultiLevelEngine),
    ],
)
def test_open_engine_chooses_the_engine_the_options_name(tmp_path, mode, engine):
    """``open_engine``: the protocol, then a node-local level, choose the engine, which
    saves over the communicator it is given; the Checkpointer holds the same kind."""
    options = options_of(mode, tmp_path)
    control = MPI.COMM_SELF.Dup()
    try:
        run_dir = RunDirectory(tmp_path / "direct", None)
        opened = open_engine(control, run_dir, options.storage.open_backend(), options)
        assert type(opened) is engine and opened.control is control
        assert opened.save(1, state(1.0), blocking=True, metric=None, base=None) is None
        assert opened.stats.saves == 1
        assert opened.steps() == ([] if mode == "multilevel" else [1])  # flush_every=0: node-local only
        opened.close(drain=True)
    finally:
        control.Free()
    with hpckpt.Checkpointer(tmp_path / "facade", comm=MPI.COMM_SELF, options=options) as checkpointer:
        assert type(checkpointer.engine) is engine


def test_coordinated_saves_block_or_run_in_the_background_and_report_alike(tmp_path):
    """A blocking save returns None; non-blocking ones return handles, up to
    ``max_in_flight`` at once; every committed save is counted once, whichever way."""
    with open_self(tmp_path / "run", max_in_flight=2, keep=5) as checkpointer:
        assert isinstance(checkpointer.engine, CoordinatedEngine)
        assert checkpointer.save(1, state(1.0)) is None
        handles = [checkpointer.save(step, state(float(step)), blocking=False) for step in (2, 3, 4)]
        assert [handle.step for handle in handles] == [2, 3, 4]
        checkpointer.wait()
        assert all(handle.done() for handle in handles)
        assert checkpointer.steps() == [1, 2, 3, 4] and checkpointer.saves == 4
        restored = state(0.0)
        assert checkpointer.restore(restored) == 4 and restored["x"].array.tolist() == [4.0] * 5


def test_a_background_snapshot_of_a_bad_tree_fails_at_once_and_the_queue_goes_on(tmp_path):
    """A tree that cannot be saved fails ``save(blocking=False)`` itself (the snapshot is an
    agreed phase); the next non-blocking save still commits."""
    with open_self(tmp_path / "run") as checkpointer:
        with pytest.raises(hpckpt.CollectiveError, match="unsupported type set"):
            checkpointer.save(1, {"bad": {1}}, blocking=False)
        checkpointer.save(2, state(2.0), blocking=False).wait()
        assert checkpointer.steps() == [2]


def test_uncoordinated_saves_are_this_ranks_own_in_its_own_directory(tmp_path):
    """Each rank saves at any step into ``rank-RRRRR/``; steps are its own; a new
    Checkpointer restores its newest checkpoint."""
    with open_self(tmp_path / "run", protocol="uncoordinated", keep=2) as checkpointer:
        assert isinstance(checkpointer.engine, UncoordinatedEngine)
        for step in (3, 7, 8):
            assert checkpointer.save(step, state(float(step))) is None
        assert checkpointer.steps() == [7, 8] and checkpointer.saves == 3
    assert sorted(path.name for path in (tmp_path / "run" / "rank-00000").glob("step-*")) == [
        "step-00000007", "step-00000008"
    ]
    with open_self(tmp_path / "run", protocol="uncoordinated") as checkpointer:
        restored = state(0.0)
        assert checkpointer.restore(restored) == 8 and restored["it"] == 8


def test_uncoordinated_refuses_what_only_the_coordinated_protocol_does(tmp_path):
    """No non-blocking saves, no delta over a base, no chosen step on restore."""
    with open_self(tmp_path / "run", protocol="uncoordinated") as checkpointer:
        with pytest.raises(ValueError, match="blocking=False is available with the coordinated protocol"):
            checkpointer.save(1, state(1.0), blocking=False)
        checkpointer.save(1, state(1.0))
        with pytest.raises(ValueError, match=r"save\(base=\.\.\.\) works with the coordinated protocol"):
            checkpointer.save(2, state(2.0), base=1)
        with pytest.raises(ValueError, match="apply to the coordinated protocol only"):
            checkpointer.restore(state(0.0), step=1)


def test_the_uncoordinated_communicator_carries_logged_calls_and_refuses_others(tmp_path):
    """``comm`` is a logged communicator: its collectives work, a call it cannot log is an
    AttributeError that says why and what to use instead."""
    with open_self(tmp_path / "run", protocol="uncoordinated") as checkpointer:
        comm = checkpointer.comm
        assert (comm.Get_rank(), comm.Get_size()) == (0, 1)
        total = np.zeros(3)
        comm.Allreduce(np.arange(3.0), total)
        assert total.tolist() == [0.0, 1.0, 2.0]
        comm.Barrier()
        with pytest.raises(AttributeError, match="has no 'Allgather': only its logged calls"):
            comm.Allgather  # noqa: B018 - the refusal is what is tested
        assert comm.unlogged.Get_size() == 1


def test_multilevel_saves_go_to_the_node_local_level_and_every_kth_is_flushed(tmp_path):
    """With ``flush_every=2`` every save is node-local and every second one also reaches the
    run directory; restore reads the newest step from the node-local level, and from the
    file system once the node-local copies are gone."""
    local = tmp_path / "local"
    with open_self(tmp_path / "run", local_dir=local, flush_every=2, keep=5) as checkpointer:
        assert isinstance(checkpointer.engine, MultiLevelEngine)
        for step in (1, 2, 3):
            checkpointer.save(step, state(float(step)))
        checkpointer.wait()
        assert checkpointer.steps() == [2]  # the run directory's
        restored = state(0.0)
        assert checkpointer.restore(restored) == 3 and restored["it"] == 3
        assert checkpointer.restored_level == "node-local"
        with pytest.raises(ValueError, match=r"save\(base=\.\.\.\) works with the coordinated protocol"):
            checkpointer.save(4, state(4.0), base=2)
    for path in sorted(local.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    with open_self(tmp_path / "run", local_dir=local, flush_every=2) as checkpointer:
        restored = state(0.0)
        assert checkpointer.restore(restored) == 2 and restored["it"] == 2
        assert checkpointer.restored_level == "file system"
