"""``hpckpt run`` relaunches a failing command with HPCKPT_ATTEMPT, and keeps its status."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import run_group, started_group


def hpckpt_run(*args: str) -> subprocess.CompletedProcess:
    return run_group(
        [sys.executable, "-m", "hpckpt", "run", *args], timeout=60
    )


def test_relaunches_until_success_and_exports_attempt(tmp_path):
    log = tmp_path / "attempts"
    script = f'echo "$HPCKPT_ATTEMPT" >> {log}; [ "$HPCKPT_ATTEMPT" = 2 ]'
    result = hpckpt_run("--delay", "0", "--", "sh", "-c", script)
    assert result.returncode == 0
    assert log.read_text().split() == ["0", "1", "2"]
    assert "attempt 2/4 failed after" in result.stderr and "exit status 1" in result.stderr
    assert "attempt 3/4 succeeded" in result.stderr


def test_gives_up_and_returns_the_last_status(tmp_path):
    result = hpckpt_run("--max-restarts", "1", "--delay", "0", "--", "sh", "-c", "exit 7")
    assert result.returncode == 7
    assert "giving up after 2 attempt(s)" in result.stderr


def test_death_by_signal_is_reported_as_128_plus_signal():
    result = hpckpt_run("--max-restarts", "0", "--", "sh", "-c", "kill -KILL $$")
    assert result.returncode == 137
    assert "killed by SIGKILL" in result.stderr


@pytest.mark.parametrize("args", [[], ["--"], ["--max-restarts", "-1", "--", "true"]])
def test_usage_errors(args):
    result = hpckpt_run(*args)
    assert result.returncode == 2
    assert "usage: hpckpt run" in result.stderr


def test_a_stop_with_a_checkpoint_is_not_relaunched_and_keeps_status_75(tmp_path):
    log = tmp_path / "attempts"
    result = hpckpt_run(
        "--delay", "0", "--requeue", "--", "sh", "-c", f'echo "$HPCKPT_ATTEMPT" >> {log}; exit 75'
    )
    assert result.returncode == 75
    assert log.read_text().split() == ["0"]
    assert "attempt 1/4 stopped with a checkpoint after" in result.stderr
    assert "not relaunching" in result.stderr
    assert "--requeue: not inside a Slurm job (no SLURM_JOB_ID)" in result.stderr


def test_usr1_waits_until_the_command_is_ready_for_it(tmp_path):
    """A SIGUSR1 that arrives before the ranks' handlers exist is held, then delivered."""
    log = tmp_path / "log"
    script = (
        f'sleep 1; trap "echo got-usr1 >> {log}; exit 75" USR1; echo ready >> {log}; '
        'touch "$HPCKPT_READY_FILE"; while true; do sleep 0.05; done'
    )
    with started_group([sys.executable, "-m", "hpckpt", "run", "--", "sh", "-c", script]) as process:
        first = process.stderr.readline()  # hpckpt run's handlers are in place; the command's trap is not
        assert first.startswith("hpckpt run: attempt 1/4:")
        process.send_signal(signal.SIGUSR1)  # would kill the command now
        stderr = first + process.communicate(timeout=30)[1]
    assert process.returncode == 75, stderr
    assert log.read_text().split() == ["ready", "got-usr1"]


def test_a_job_that_called_finish_is_not_relaunched_after_a_failing_exit(tmp_path):
    log = tmp_path / "attempts"
    job = (  # a real Checkpointer on one rank: its last save, finish(), then an abort at exit
        "import os, numpy as np, hpckpt\n"
        f"open({str(log)!r}, 'a').write(os.environ['HPCKPT_ATTEMPT'] + '\\n')\n"
        f"with hpckpt.Checkpointer({str(tmp_path / 'run')!r}, backend='posix') as checkpointer:\n"
        "    checkpointer.save(1, {'x': hpckpt.Local(np.arange(4.0))})\n"
        "    checkpointer.finish()\n"
        "os._exit(3)\n"
    )
    result = hpckpt_run("--delay", "0", "--", sys.executable, "-c", job)
    assert result.returncode == 3, result.stderr
    assert log.read_text().split() == ["0"]  # one attempt: the finished job ran once
    assert (
        "attempt 1/4 finished its work (Checkpointer.finish) but then exited with exit status 3"
        in result.stderr
    )
    assert "relaunching" not in result.stderr.replace("not relaunching", "")
    assert not list(Path.cwd().glob(".hpckpt-finished-*"))  # the attempt's marker is cleaned up


def test_a_job_that_fails_before_finish_is_relaunched(tmp_path):
    job = "import os, sys; sys.exit(0 if os.environ['HPCKPT_ATTEMPT'] == '1' else 5)"
    result = hpckpt_run("--delay", "0", "--", sys.executable, "-c", job)
    assert result.returncode == 0 and "attempt 1/4 failed after" in result.stderr


def test_a_zero_status_after_the_ranks_were_told_to_stop_is_taken_as_a_stop(tmp_path):
    """MPICH's mpiexec can report 0 for ranks that exited 75 after it passed on a SIGTERM:
    JobControl's stop file tells ``hpckpt run`` that the work is not done."""
    log = tmp_path / "attempts"
    job = (  # one rank told to stop by a real signal, then exiting 0 as such a launcher reports it
        "import os, signal, sys\n"
        "from mpi4py import MPI\n"
        "from hpckpt.slurm import JobControl\n"
        f"open({str(log)!r}, 'a').write(os.environ['HPCKPT_ATTEMPT'] + '\\n')\n"
        "with JobControl(MPI.COMM_WORLD) as job:\n"
        "    os.kill(os.getpid(), signal.SIGUSR1)\n"
        "    assert job.should_stop()\n"
        "sys.exit(0)\n"
    )
    result = hpckpt_run("--delay", "0", "--", sys.executable, "-c", job)
    assert result.returncode == 75, result.stderr
    assert log.read_text().split() == ["0"]
    assert (
        "attempt 1/4 exited with status 0, but its ranks were told to stop (SIGUSR1 received) "
        "and to exit 75: the launcher lost their exit status; taking it as stopped with a checkpoint"
    ) in result.stderr
    assert "attempt 1/4 stopped with a checkpoint after" in result.stderr
    assert not list(Path.cwd().glob(".hpckpt-stop-*"))  # the attempt's marker is cleaned up
