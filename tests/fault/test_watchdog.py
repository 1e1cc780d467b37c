"""A rank stopped (SIGSTOP) in any phase ends the job with a message naming it and the
phase, within the deadline, instead of leaving the others waiting forever."""

import os
import re
import subprocess
import sys
import time

import pytest

from tests.fault.helpers import heat_command, run
from tests.processes import run_group

DEADLINE = 3  # HPCKPT_PHASE_TIMEOUT for these jobs, seconds
PHASES = {  # fault point -> the phase whose agreement the stopped rank never reaches
    "save.plan": "save step 20: plan",
    "save.write": "save step 20: write",
    "save.sync": "save step 20: sync",
    "save.commit": "save step 20: commit",
    "save.retain": "save step 20: retain",
}


@pytest.mark.parametrize("point", list(PHASES))
def test_a_rank_stopped_in_a_phase_is_named_and_the_job_aborts(tmp_path, point):
    log = tmp_path / "faults.log"
    started = time.monotonic()
    stopped = run(
        heat_command(3, tmp_path / "run", "--backend", "posix", iters=60),
        env={
            "HPCKPT_FAULT": f"{point}:1:stop:2",
            "HPCKPT_FAULT_LOG": str(log),
            "HPCKPT_PHASE_TIMEOUT": str(DEADLINE),
        },
    )
    elapsed = time.monotonic() - started
    assert stopped.returncode != 0
    assert log.read_text().split()[:4] == [point, "1", "stop", "2"]  # rank 1 stopped at its 2nd save
    message = re.search(
        r"hpckpt: phase '(.*?)': rank\(s\) (.*?) of 3 have not arrived; the others wait there "
        r"after (\d+) s \(rank 0 on ",
        stopped.stderr,
    )
    assert message, stopped.stderr[-3000:]
    assert message.group(1) == PHASES[point] and message.group(2) == "1" and int(message.group(3)) >= DEADLINE
    # rank 0's abort ended every rank: rank 2 never reached its own deadline (three times longer)
    assert "rank 0 has not reported who" not in stopped.stderr, stopped.stderr[-3000:]
    assert elapsed < DEADLINE + 20


def test_an_abort_ends_every_rank_whatever_communicator_waited(tmp_path):
    """abort_job, called by rank 0 of a duplicate of MPI_COMM_WORLD (as a checkpointer's
    phases run), ends the other ranks at once: MPICH's MPI_Abort on any communicator but
    MPI_COMM_WORLD ends only the calling process."""
    script = (
        "import time\n"
        "from mpi4py import MPI\n"
        "from hpckpt._comm import abort_job\n"
        "comm = MPI.COMM_WORLD.Dup()\n"
        "comm.Barrier()\n"
        "if comm.rank == 0:\n"
        "    abort_job(3)\n"
        "time.sleep(30)\n"
        "print(f'rank {comm.rank} still running', flush=True)\n"
    )
    started = time.monotonic()
    ended = run(["mpiexec", "-n", "3", sys.executable, "-c", script])
    # the job ends with the abort's code, at once: no rank sleeps its 30 s out. (MPICH's own
    # "MPI_Abort(MPI_COMM_WORLD, 3)" line is not asserted: the abort kills the processes
    # while their output may still be in the pipe to mpiexec, and CI once lost it.)
    assert ended.returncode == 3 and "still running" not in ended.stdout, ended.stdout + ended.stderr[-3000:]
    assert time.monotonic() - started < 25


def test_a_stopped_rank_0_is_reported_by_the_others(tmp_path):
    """The others abort the job, rank 0 stopped with it."""
    stderr = stopped_job_stderr(tmp_path, "save.sync:0:stop:2", "posix")
    reports = re.findall(
        r"hpckpt: phase 'save step 20: sync': not every rank has arrived and rank 0 has not "
        r"reported who \(it may be the one missing\) after \d+ s \(rank ([12]) on ",
        stderr,
    )
    assert reports, stderr[-3000:]


@pytest.mark.parametrize(
    ("stopped", "reporter", "named"),
    [
        ("3", "2", "rank(s) 3 of 4 have not arrived"),
        ("2", "0", "rank(s) 2 of 4 have not arrived (nor reported for ranks 3)"),
    ],
)
def test_a_stopped_rank_of_another_group_is_named_by_its_leader_or_by_rank_0(
    tmp_path, stopped, reporter, named
):
    """At 4 ranks the arrival notices travel in two groups, ranks 0-1 and 2-3: rank 2
    collects its group's and names a stopped rank 3; rank 0 names rank 2 when that
    leader itself never reports (it cannot tell whether rank 3 arrived)."""
    stderr = stopped_job_stderr(tmp_path, f"save.sync:{stopped}:stop:2", "posix", ranks=4)
    reports = re.findall(
        r"hpckpt: phase 'save step 20: sync': (.*?); the others wait there after \d+ s "
        r"\(rank (\d) on ",
        stderr,
    )
    assert reports == [(named, reporter)], stderr[-3000:]


@pytest.mark.parametrize(
    ("stopped", "reporter", "named"),
    [
        ("3", "2", "rank(s) 3 of 4 have not arrived"),
        ("2", "0", "rank(s) 2 of 4 have not arrived (nor reported for ranks 3)"),
    ],
)
def test_a_rank_stopped_in_the_merge_in_groups_is_named(tmp_path, monkeypatch, stopped, reporter, named):
    """The first save's plans merged by the groups' leaders (from 2 ranks on here): a
    member stopped before its leader's merge is named by that leader, a stopped leader
    by rank 0."""
    monkeypatch.setenv("HPCKPT_MANIFEST_SHARD_RANKS", "2")
    stderr = stopped_job_stderr(tmp_path, f"save.merge:{stopped}:stop:1", "posix", ranks=4)
    reports = re.findall(
        r"hpckpt: phase 'save step 10: merge in groups': (.*?); the others wait there after \d+ s "
        r"\(rank (\d) on ",
        stderr,
    )
    assert reports == [(named, reporter)], stderr[-3000:]


def test_a_rank_stopped_while_restoring_is_named(tmp_path):
    run_dir = tmp_path / "run"
    assert run(heat_command(3, run_dir, "--backend", "posix", iters=20)).returncode == 0
    stopped = run(
        heat_command(3, run_dir, "--backend", "posix", iters=40),
        env={"HPCKPT_FAULT": "restore.read:2:stop", "HPCKPT_PHASE_TIMEOUT": str(DEADLINE)},
    )
    assert stopped.returncode != 0
    assert "hpckpt: phase 'restore step 10: read': rank(s) 2 of 3 have not arrived" in stopped.stderr, (
        stopped.stderr[-3000:]
    )


def test_the_deadline_must_be_a_number(tmp_path):
    bad = run(heat_command(2, tmp_path / "run", iters=20), env={"HPCKPT_PHASE_TIMEOUT": "soon"})
    assert bad.returncode != 0
    assert (
        "HPCKPT_PHASE_TIMEOUT='soon': expected a number of seconds >= 0 (0 turns the watchdog off)"
        in bad.stderr
    )


def test_a_rank_that_never_joins_the_collective_write_is_named(tmp_path):
    """Rank 1 stops at the write of an ADIOS2 save: the others wait for it before entering
    ADIOS2's collective I/O, where rank 0 can still see who is missing."""
    stderr = stopped_job_stderr(tmp_path, "save.write:1:stop:2", "adios2")
    assert (
        "hpckpt: phase 'save step 20: write (before the collective I/O)': rank(s) 1 of 3 have not arrived; "
        "the others wait there after"
    ) in stderr, stderr[-3000:]


def test_ranks_left_inside_collective_io_abort_the_job(tmp_path):
    """Rank 1 stops after every rank arrived, just before ADIOS2's collective write: the
    others wait inside ADIOS2, not at an agreement, and say so once the write's deadline
    has passed (from inside the library they cannot see who is missing)."""
    stderr = stopped_job_stderr(tmp_path, "save.collective_io:1:stop:2", "adios2")
    reports = re.findall(
        r"hpckpt: phase 'save step 20: write': this rank is still inside the phase's collective I/O, "
        r"which another rank has not joined or finished after \d+ s \(rank ([02]) on ",
        stderr,
    )
    assert reports, stderr[-3000:]


def stopped_job_stderr(tmp_path, fault: str, backend: str, ranks: int = 3) -> str:
    """The stderr of a heat job with ``fault`` (``POINT:RANK:stop:NTH``), after checking
    the fault log shows it landed. An abort ends every rank, the stopped one too (a rank
    other than a leader aborts after the deadline and two grace periods as long); a job
    still running after three deadlines and ten seconds is killed, and its output read
    all the same."""
    log = tmp_path / "faults.log"
    env = {
        **os.environ,
        "HPCKPT_FAULT": fault,
        "HPCKPT_FAULT_LOG": str(log),
        "HPCKPT_PHASE_TIMEOUT": str(DEADLINE),
    }
    try:
        stderr = run_group(
            heat_command(ranks, tmp_path / "run", "--backend", backend, iters=60),
            timeout=3 * DEADLINE + 10,
            env=env,
        ).stderr
    except subprocess.TimeoutExpired as stuck:
        stderr = stuck.stderr
    assert log.read_text().split()[:4] == fault.split(":")
    return stderr
