"""SIGKILL inside the commit sequence, retention, recycling, ``hpckpt gc`` and ``hpckpt
convert``: each kill lands where named (the fault log), the newest committed step is
the one expected at that point, and the next run resumes from it bit for bit."""

import os
import random
import sys

import pytest

from hpckpt.storage.commit import RunDirectory
from tests.fault.helpers import heat_command, run
from tests.fault.test_cli import cli
from tests.fault.trials import first_attempt, logged_fault, newest_committed
from tests.processes import run_group

# point -> (the occurrence that is killed, the newest step committed at the kill). Rank 0
# commits and deletes; saves every 10 iterations, keep=2: the 3rd save (step 30) is the
# first to delete a step (10) and keep its files for recycling, the 4th reuses them.
POINTS = {
    "commit.manifest": (3, 20),  # step 30's data durable, no manifest yet
    "commit.fsync": (3, 20),  # manifest written in step-30.tmp, not renamed
    "commit.rename": (3, 20),
    "commit.renamed": (3, 30),  # renamed into place, the run directory not yet fsync'd
    "retain.deleting": (1, 30),  # step 10 renamed to .deleting
    "retain.recycled": (1, 30),  # step 10's files moved to .recycle/
    "prepare.recycle": (1, 30),  # step 40.tmp holds a recycled file
}


@pytest.mark.parametrize("point", list(POINTS))
def test_a_kill_inside_the_commit_or_retention_keeps_the_newest_committed_step(
    tmp_path, point, reference_checksum
):
    nth, expected = POINTS[point]
    run_dir = tmp_path / "ckpt"
    command = heat_command(2, run_dir, "--backend", "hdf5", "--keep", "2")
    landed = first_attempt(command, tmp_path, 2, random.Random(0), fault=f"{point}:0:kill:{nth}")
    assert landed.rank == 0
    assert newest_committed(run_dir) == str(expected)
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.resumed_from == str(expected) and result.checksum == reference_checksum
    assert "CheckpointFallbackWarning" not in result.stderr


def test_a_killed_gc_leaves_every_kept_step_restorable(tmp_path, reference_checksum):
    run_dir = tmp_path / "ckpt"
    assert run(heat_command(2, run_dir, "--keep", "5", "--stop-at-iter", "60")).returncode == 0
    log = tmp_path / "gc.log"
    killed = cli_with_fault(run_dir, "retain.deleting:0:kill:2", log, "gc", "--keep", "1")
    assert killed.returncode == -9 and logged_fault(log).where == "retain.deleting"
    assert RunDirectory(run_dir).committed_steps() == [40, 50, 60]  # of 20-60: 20 deleted, 30 being deleted
    assert (run_dir / "step-00000030.deleting").is_dir()
    result = run(heat_command(2, run_dir, "--keep", "5"))
    assert result.returncode == 0 and result.resumed_from == "60" and result.checksum == reference_checksum
    again = cli("gc", run_dir, "--keep", "1")
    assert again.returncode == 0 and RunDirectory(run_dir).committed_steps() == [110]
    assert not list(run_dir.glob("*.deleting"))


def test_a_killed_convert_commits_nothing_and_can_be_run_again(tmp_path):
    source, target = tmp_path / "ckpt", tmp_path / "converted"
    assert run(heat_command(2, source, "--stop-at-iter", "30")).returncode == 0
    log = tmp_path / "convert.log"
    killed = cli_with_fault(
        source, "convert.written:0:kill", log, "convert", str(target), "--to", "adios2", "--step", "30"
    )
    assert killed.returncode == -9 and logged_fault(log).where == "convert.written"
    assert RunDirectory(target).committed_steps() == [] and (target / "step-00000030.tmp").is_dir()
    assert cli("verify", source).returncode == 0
    again = cli("convert", source, target, "--to", "adios2", "--step", "30")
    assert again.returncode == 0, again.stderr
    assert RunDirectory(target).committed_steps() == [30] and cli("verify", target).returncode == 0


def cli_with_fault(directory, fault: str, log, command: str, *args: str):
    """``hpckpt COMMAND DIRECTORY ARGS`` with ``HPCKPT_FAULT`` set, logging to ``log``."""
    env = {**os.environ, "HPCKPT_FAULT": fault, "HPCKPT_FAULT_LOG": str(log)}
    return run_group([sys.executable, "-m", "hpckpt", command, str(directory), *args], timeout=60, env=env)
