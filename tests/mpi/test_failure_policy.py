"""on_failure="warn": a failed, stuck or skipped save is recorded alike on every rank and the
application goes on; the committed steps are untouched; "raise" keeps raising."""

import resource
import signal
import threading
import warnings
from contextlib import contextmanager

import numpy as np
import pytest

import hpckpt
from hpckpt._hooks import install_point_hook
from hpckpt.errors import SaveFailedWarning, SaveFailuresError
from hpckpt.testing.faults import ENV as FAULT_ENV

MPI = pytest.importorskip("mpi4py.MPI")
pytestmark = pytest.mark.mpi(min_size=2)


def state_of(comm, value: float) -> dict:
    return {"u": hpckpt.Local(np.full(2000, float(value) + comm.rank)), "it": float(value)}


def records(checkpointer) -> list[tuple]:
    return [(f.step, f.kind, f.phase, f.ranks) for f in checkpointer.stats.failures]


@contextmanager
def files_limited_to_4_kib_on(comm, rank: int):
    """Rank ``rank``'s files may not grow past 4 KiB inside the block (RLIMIT_FSIZE): its
    writes fail with EFBIG from the kernel (SIGXFSZ ignored, as a job that handles errors
    does). The limit and the signal's handler are put back on leaving.
    """
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        if comm.rank == rank:
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limits[1]))
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)


def save_quietly(checkpointer, step: int, state) -> None:
    """``checkpointer.save(step, state)`` with its SaveFailedWarning silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SaveFailedWarning)
        checkpointer.save(step, state)


def test_a_failed_blocking_save_is_recorded_on_every_rank_and_the_next_commits(
    world, mpi_tmp_path, monkeypatch
):
    with hpckpt.Checkpointer(mpi_tmp_path / "warn", comm=world, backend="posix", on_failure="warn") as ckpt:
        ckpt.save(1, state_of(world, 1.0))
        monkeypatch.setenv(FAULT_ENV, "save.commit:0:raise")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert ckpt.save(2, state_of(world, 2.0)) is None  # nothing raised
        monkeypatch.delenv(FAULT_ENV)
        warned = [w for w in caught if issubclass(w.category, SaveFailedWarning)]
        assert len(warned) == (1 if world.rank == 0 else 0)
        assert not warned or warned[0].filename == __file__  # it points at the application's call
        assert records(ckpt) == [(2, "failed", "save step 2: commit", (0,))]
        assert world.allgather(records(ckpt)) == [records(ckpt)] * world.size
        assert "InjectedFault" in ckpt.stats.failures[0].reason
        assert ckpt.steps() == [1] and ckpt.stats.failed_in_a_row == 1
        ckpt.save(3, state_of(world, 3.0))
        assert ckpt.steps() == [1, 3] and ckpt.stats.failed_in_a_row == 0


def test_a_real_write_error_on_one_rank_is_agreed_not_aborted(world, mpi_tmp_path):
    """Rank 1's files may not grow past 4 KiB (RLIMIT_FSIZE): its write fails with EFBIG
    from the kernel, inside the posix backend's I/O."""
    options = {"backend": "posix", "on_failure": "warn"}
    with hpckpt.Checkpointer(mpi_tmp_path / "efbig", comm=world, **options) as ckpt:
        ckpt.save(1, {"u": hpckpt.Local(np.zeros(10))})
        with files_limited_to_4_kib_on(world, 1):
            save_quietly(ckpt, 2, state_of(world, 2.0))
        assert records(ckpt) == [(2, "failed", "save step 2: write", (1,))]
        assert "File too large" in ckpt.stats.failures[0].reason
        assert ckpt.steps() == [1]
        ckpt.save(3, state_of(world, 3.0))
        assert ckpt.steps() == [1, 3]


def test_a_failed_background_save_is_recorded_at_the_next_call(world, mpi_tmp_path, monkeypatch):
    with hpckpt.Checkpointer(mpi_tmp_path / "bg", comm=world, on_failure="warn") as ckpt:
        monkeypatch.setenv(FAULT_ENV, "save.commit:0:raise")
        ckpt.save(1, state_of(world, 1.0), blocking=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SaveFailedWarning)
            ckpt.wait()
        monkeypatch.delenv(FAULT_ENV)
        assert records(ckpt) == [(1, "failed", "save step 1: commit", (0,))]
        ckpt.save(2, state_of(world, 2.0), blocking=False)
        ckpt.wait()
        assert ckpt.steps() == [2]


def test_too_many_failures_in_a_row_raise_on_every_rank(world, mpi_tmp_path, monkeypatch):
    options = {"backend": "posix", "on_failure": "warn", "max_failed_saves": 2}
    with hpckpt.Checkpointer(mpi_tmp_path / "many", comm=world, **options) as ckpt:
        ckpt.save(1, state_of(world, 1.0))
        monkeypatch.setenv(FAULT_ENV, "save.commit:0:raise")
        save_quietly(ckpt, 2, state_of(world, 2.0))
        monkeypatch.setenv(FAULT_ENV, "save.sync:1:raise")
        with pytest.raises(SaveFailuresError, match="2 saves in a row did not commit") as info:
            ckpt.save(3, state_of(world, 3.0))
        monkeypatch.delenv(FAULT_ENV)
        assert "step 2 failed in phase 'save step 2: commit'" in str(info.value)
        assert "step 3 failed in phase 'save step 3: sync'" in str(info.value)
        assert ckpt.steps() == [1]


def test_stuck_storage_abandons_the_save_skips_the_next_and_commits_once_it_answers(
    world, mpi_tmp_path, monkeypatch
):
    """Rank 1's background write of step 2 does not return until the test lets it (its
    storage stuck): every rank records step 2 abandoned (rank 1, the write phase) and the
    saves meanwhile skipped; the application's steps go on; after the storage answers, a
    save commits without a restart."""
    monkeypatch.setenv("HPCKPT_PHASE_TIMEOUT", "2")
    storage_answers = threading.Event()

    def stuck(name: str) -> None:
        if (world.rank == 1 and name == "save.collective_io" and not storage_answers.is_set()
                and threading.current_thread().name == "hpckpt-background-save"):
            storage_answers.wait(60)

    options = {"backend": "posix", "on_failure": "warn", "max_failed_saves": 100}
    replaced = install_point_hook(None)
    try:
        with hpckpt.Checkpointer(mpi_tmp_path / "stuck", comm=world, **options) as ckpt:
            ckpt.save(1, state_of(world, 1.0), blocking=False)
            ckpt.wait()
            install_point_hook(stuck)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SaveFailedWarning)
                step = 2
                ckpt.save(step, state_of(world, step), blocking=False)
                while not any(f.kind == "abandoned" for f in ckpt.stats.failures):
                    step += 1
                    ckpt.save(step, state_of(world, step), blocking=False)
                skipped_while_stuck = step + 1
                ckpt.save(skipped_while_stuck, state_of(world, skipped_while_stuck), blocking=False)
                storage_answers.set()
                world.Barrier()
                final = skipped_while_stuck + 1
                # skipped until rank 1's abandoned thread has ended
                while ckpt.save(final, state_of(world, final), blocking=False) is None:
                    final += 1
                ckpt.wait()
            kinds = {f.step: f.kind for f in ckpt.stats.failures}
            abandoned = next(f for f in ckpt.stats.failures if f.kind == "abandoned")
            assert (abandoned.step, abandoned.phase, abandoned.ranks) == (2, "save step 2: write", (1,))
            assert kinds[skipped_while_stuck] == "skipped"
            assert world.allgather(records(ckpt)) == [records(ckpt)] * world.size
            assert ckpt.steps() == [1, final]
            restored = state_of(world, 0.0)
            assert ckpt.restore(restored) == final and restored["u"].array[0] == final + world.rank
    finally:
        install_point_hook(replaced)


def test_a_failed_node_local_save_is_agreed_and_recorded(world, mpi_tmp_path, monkeypatch):
    """Rank 1's node-local files may not grow past 4 KiB: its own copy of step 2 fails on
    it alone (a rank's own step is a one-rank save); every rank records step 2 failed and
    the next local save, with its partner copies, commits."""
    monkeypatch.setenv("HPCKPT_RANKS_PER_NODE", "1")
    options = {"backend": "posix", "on_failure": "warn", "local_dir": str(mpi_tmp_path / "local"),
               "redundancy": "partner", "flush_every": 0}
    with hpckpt.Checkpointer(mpi_tmp_path / "levels", comm=world, **options) as ckpt:
        ckpt.save(1, state_of(world, 1.0))
        with files_limited_to_4_kib_on(world, 1):
            save_quietly(ckpt, 2, state_of(world, 2.0))
        assert records(ckpt) == [(2, "failed", "local step 2: write", (1,))]
        assert "File too large" in ckpt.stats.failures[0].reason
        ckpt.save(3, state_of(world, 3.0))
        restored = state_of(world, 0.0)
        assert ckpt.restore(restored) == 3 and ckpt.stats.restored_level == "node-local"
        assert restored["u"].array[0] == 3.0 + world.rank
