"""Reliability: one job per run directory, named; files never world-writable; full, read-only
and impossible run directories give clear errors on every rank and keep the committed steps."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hpckpt.storage.lock import RunLock
from tests.fault.helpers import JOB_TIMEOUT, heat_command, run
from tests.helpers import BACKENDS
from tests.processes import run_group


def test_a_second_job_on_the_same_run_directory_is_refused_naming_the_holder(tmp_path):
    holder = RunLock(tmp_path / "run")
    holder.acquire()  # this test process plays the first job
    try:
        result = run(heat_command(2, tmp_path / "run"))
    finally:
        holder.release()
    assert result.returncode != 0
    assert "phase 'open run directory' failed on rank(s) 0 of 2" in result.stderr
    holder = f"(host {socket.gethostname()} pid {os.getpid()}"
    assert f"run directory {tmp_path / 'run'} is in use by another job {holder}" in result.stderr
    assert not list((tmp_path / "run").glob("step-*"))  # nothing was written
    again = run(heat_command(2, tmp_path / "run"))  # once the holder is gone, the job runs
    assert again.returncode == 0, again.stderr[-2000:]


def test_nothing_a_save_creates_is_world_writable(tmp_path):
    previous = os.umask(0)  # even with the most permissive umask
    try:
        result = run(heat_command(2, tmp_path / "run", "--backend", "posix", iters=30))
    finally:
        os.umask(previous)
    assert result.returncode == 0, result.stderr[-2000:]
    for path in [tmp_path / "run", *(tmp_path / "run").rglob("*")]:
        assert not path.stat().st_mode & stat.S_IWOTH, path


@pytest.fixture
def small_fs(tmp_path):
    """A real 3 MiB tmpfs, mounted for the test (root only)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m,mode=0755", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here: {result.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill(run_dir: Path, backend: str, ranks: int = 4) -> subprocess.CompletedProcess:
    command = [
        "mpiexec", "-n", str(ranks), sys.executable, "-m", "tests.jobs.fill_disk",
        str(run_dir), backend, "384", "3",
    ]
    return run_group(command, timeout=JOB_TIMEOUT)


@pytest.mark.parametrize("backend", BACKENDS)
def test_disk_full_is_a_clear_error_on_every_rank_and_the_previous_step_survives(small_fs, backend):
    """Steps of 1.1 MiB on 3 MiB: step 1 fits, step 2 does not."""
    run_dir = small_fs / "run"
    result = fill(run_dir, backend)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(4):
        assert (
            f"rank {rank}: CollectiveError: rank 0: NoSpaceError: [Errno 28] no space left for step 2 "
            f"in {run_dir}: it needs 2.1 MiB (data and metadata) and the file system has"
        ) in result.stdout, result.stdout
        assert f"rank {rank}: restored step 1 intact" in result.stdout
    assert "nothing was written and the committed steps 1 are intact" in result.stdout
    assert sorted(path.name for path in run_dir.iterdir()) == [".hpckpt.lock", "step-00000001"]


def test_read_only_run_directory_is_a_clear_error_on_every_rank(small_fs):
    run_dir = small_fs / "run"
    assert fill(run_dir, "hdf5").returncode == 0  # step 1 committed
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    result = fill(run_dir, "hdf5")
    assert result.returncode != 0
    for rank in range(4):
        assert (
            f"rank {rank}: CollectiveError: rank 0: InvalidStateError: cannot use run directory {run_dir}: "
            f"Read-only file system ({run_dir / '.hpckpt.lock'})"
        ) in result.stdout, result.stdout


def test_run_directory_under_a_file_is_a_clear_error_on_every_rank(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    run_dir = tmp_path / "file" / "run"
    result = fill(run_dir, "posix", ranks=2)
    for rank in range(2):
        assert (
            f"rank {rank}: CollectiveError: rank 0: InvalidStateError: cannot use run directory {run_dir}: "
            "Not a directory"
        ) in result.stdout, result.stdout
