"""Time-based schedules agree on every rank; retention keeps the best steps by metric."""

import time

import numpy as np
import pytest

import hpckpt
from hpckpt.schedule import daly_interval

MPI = pytest.importorskip("mpi4py.MPI")
pytestmark = pytest.mark.mpi(min_size=2)


def test_time_schedule_gives_every_rank_the_same_answer(world, mpi_tmp_path):
    schedule = hpckpt.Schedule(seconds=0.25)
    with hpckpt.Checkpointer(mpi_tmp_path / "time", comm=world, schedule=schedule) as checkpointer:
        answers = []
        for step in range(1, 9):
            time.sleep(0.02 * (world.rank + 1))  # ranks see different elapsed times
            due = checkpointer.due(step)
            answers.append(due)
            if due:
                checkpointer.save(step, {"x": step})
        everyone = world.allgather(answers)
        assert all(a == everyone[0] for a in everyone)
        assert any(answers) and not all(answers)


def test_auto_schedule_uses_the_slowest_ranks_measured_cost(world, mpi_tmp_path):
    schedule = hpckpt.Schedule(auto=True, mtbf=3600.0)
    state = {"u": hpckpt.Local(np.zeros(1000)), "it": 0}
    with hpckpt.Checkpointer(mpi_tmp_path / "auto", comm=world, schedule=schedule) as checkpointer:
        checkpointer.save(1, state)
        checkpointer.due(2)  # learns the cost of step 1
        costs = world.allgather(schedule._costs[-1])
        assert len(set(costs)) == 1  # agreed: the slowest rank's
        assert schedule.interval_seconds == pytest.approx(daly_interval(costs[0], 3600.0))
        intervals = world.allgather(schedule.interval_seconds)
        assert len(set(intervals)) == 1


def test_retention_keeps_the_newest_and_the_best_by_metric(world, mpi_tmp_path, backend):
    metrics = [5.0, 1.0, 4.0, 0.5, 3.0, 2.0]
    with hpckpt.Checkpointer(
        mpi_tmp_path / "best", comm=world, keep=2, keep_best=2, **backend
    ) as checkpointer:
        for step, metric in enumerate(metrics, start=1):
            checkpointer.save(
                step,
                {"x": hpckpt.Local(np.full(3, step)), "loss": metric},
                metric=metric,
                blocking=step % 2 == 0,
            )
        checkpointer.wait()
        assert checkpointer.steps() == [2, 4, 5, 6]  # newest two, plus the two lowest losses
    if world.rank == 0:
        reader = hpckpt.CheckpointReader(mpi_tmp_path / "best")
        assert [reader.manifest(step).metric for step in (2, 4)] == [1.0, 0.5]
    with hpckpt.Checkpointer(
        mpi_tmp_path / "worst", comm=world, keep=1, keep_best=1, best="max"
    ) as checkpointer:
        for step, metric in enumerate(metrics, start=1):
            checkpointer.save(step, {"x": step}, metric=metric)
        assert checkpointer.steps() == [1, 6]
