"""Reliability: one job per run directory, named; files never world-writable."""

from __future__ import annotations

import os
import socket
import stat

from hpckpt.storage.lock import RunLock
from tests.fault.conftest import heat_command, run


def test_a_second_job_on_the_same_run_directory_is_refused_naming_the_holder(tmp_path):
    holder = RunLock(tmp_path / "run")
    holder.acquire()  # this test process plays the first job
    try:
        result = run(heat_command(2, tmp_path / "run"))
    finally:
        holder.release()
    assert result.returncode != 0
    assert "phase 'open run directory' failed on rank(s) 0 of 2" in result.stderr
    assert f"run directory {tmp_path / 'run'} is in use by another job (host {socket.gethostname()} pid {os.getpid()}" in result.stderr
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
