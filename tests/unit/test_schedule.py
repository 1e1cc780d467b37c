"""Daly's interval and the schedule's arguments."""

import math

import pytest

from hpckpt.schedule import MTBF_ENV, Schedule, daly_interval


def test_daly_interval_matches_the_formula_and_its_limits():
    cost, mtbf = 10.0, 3600.0
    ratio = cost / (2 * mtbf)
    expected = math.sqrt(2 * cost * mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost
    assert daly_interval(cost, mtbf) == pytest.approx(expected)
    assert daly_interval(cost, mtbf) == pytest.approx(261.7, abs=0.1)
    assert daly_interval(10.0, 4.0) == 4.0  # cost >= 2 MTBF: checkpoint every MTBF
    with pytest.raises(ValueError, match="checkpoint cost must be > 0 s"):
        daly_interval(0.0, 10.0)


def test_schedule_arguments_are_checked(monkeypatch):
    with pytest.raises(ValueError, match="give exactly one of steps=N, seconds=T or auto=True"):
        Schedule(steps=5, seconds=2.0)
    with pytest.raises(ValueError, match="steps must be an integer >= 1, got 0"):
        Schedule(steps=0)
    monkeypatch.delenv(MTBF_ENV, raising=False)
    with pytest.raises(
        ValueError, match="auto=True needs the mean time between failures: mtbf=SECONDS or HPCKPT_MTBF"
    ):
        Schedule(auto=True)
    monkeypatch.setenv(MTBF_ENV, "an hour")
    with pytest.raises(ValueError, match="HPCKPT_MTBF='an hour' is not a number of seconds"):
        Schedule(auto=True)
    monkeypatch.setenv(MTBF_ENV, "7200")
    auto = Schedule(auto=True)
    assert auto.mtbf == 7200.0 and auto.interval_seconds == pytest.approx(daly_interval(1.0, 7200.0))


def test_step_schedule_needs_no_communicator():
    every = Schedule(steps=4)
    assert [step for step in range(1, 13) if every.due(step, None)] == [4, 8, 12]
