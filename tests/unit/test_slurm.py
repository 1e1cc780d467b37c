"""hpckpt.slurm: reading Slurm's time left, and agreeing to stop on a signal or near the limit."""

import os
import signal
import time

import pytest

import hpckpt
from hpckpt.slurm import JobControl, parse_time_left, signal_number

MPI = pytest.importorskip("mpi4py.MPI")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0:57", 57),
        ("12:00", 720),
        ("1:02:03", 3723),
        ("2-00:00:01", 172801),
        ("UNLIMITED", None),
        ("NOT_SET", None),
    ],
)
def test_time_left_formats_of_squeue(text, seconds):
    assert parse_time_left(text + "\n") == seconds


def test_unreadable_time_left_is_an_error():
    with pytest.raises(ValueError, match="cannot read the time left from squeue: '5 minutes'"):
        parse_time_left("5 minutes")


@pytest.mark.parametrize("name", ["USR2", "SIGUSR2", "usr2", str(int(signal.SIGUSR2))])
def test_signal_names(name):
    assert signal_number(name) == signal.SIGUSR2


def test_unknown_signal_is_an_error():
    with pytest.raises(ValueError, match="unknown signal 'USR3'; expected a name such as USR1 or TERM"):
        signal_number("USR3")


def test_a_stop_signal_stops_at_the_next_call_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGUSR1)
    with JobControl(MPI.COMM_SELF, end_time=None) as job:
        assert not job.should_stop()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert job.should_stop() and job.stop_reason == "SIGUSR1 received"
    assert signal.getsignal(signal.SIGUSR1) is before


def test_the_configured_signal_replaces_usr1(monkeypatch):
    monkeypatch.setenv("HPCKPT_STOP_SIGNAL", "USR2")
    with JobControl(MPI.COMM_SELF) as job:
        assert job.signals == (signal.SIGTERM, signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGTERM)
        assert job.should_stop() and job.stop_reason == "SIGTERM received"


def test_stops_before_the_end_time_by_margin_plus_two_steps():
    with JobControl(MPI.COMM_SELF, margin=10, end_time=time.time() + 10.6) as job:
        assert not job.should_stop()
        time.sleep(0.2)  # the longest step: now 0.2 s, so stop with 10.4 s left
        assert job.should_stop() and job.stop_reason.startswith("wall-time limit near (10 s left)")


def test_end_time_from_the_environment_and_restart_count(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(time.time() + 3600))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    with JobControl(MPI.COMM_SELF) as job:
        assert 3590 < job.seconds_left() <= 3600 and not job.should_stop()
        assert job.describe().startswith("Slurm job 42, restart 2; 3600 s of wall time left;")


def test_ready_file_tells_hpckpt_run_the_handlers_are_in_place(monkeypatch, tmp_path):
    ready = tmp_path / "ready"
    monkeypatch.setenv("HPCKPT_READY_FILE", str(ready))
    with JobControl(MPI.COMM_SELF):
        assert ready.exists()


def test_bad_margin_is_an_error():
    with pytest.raises(ValueError, match="the stop margin must be >= 0 seconds, got -1"):
        JobControl(MPI.COMM_SELF, margin=-1)


def test_a_bad_end_time_is_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("HPCKPT_END_TIME", "tomorrow")
    with pytest.raises(hpckpt.CollectiveError, match="HPCKPT_END_TIME='tomorrow' is not a Unix time"):
        JobControl(MPI.COMM_SELF)
