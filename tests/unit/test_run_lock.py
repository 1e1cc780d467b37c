"""The run directory's lock as a lease, with real processes and real files on a local disk.

A holder whose node lost power on a distributed file system keeps its ``flock`` held for
minutes; here a helper process that is not the recorded holder plays that server, holding
``flock`` under a record of a foreign host that does not renew it (or does).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from hpckpt.errors import InvalidStateError
from hpckpt.storage import lock_record
from hpckpt.storage.lock import LOCK_NAME, TAKEOVER_PREFIX, RunLock
from tests.processes import started_group

LEASE = 1.5
HOLDER = """
import sys
from pathlib import Path
from hpckpt.storage.lock import RunLock
lock = RunLock(Path(sys.argv[1]))
lock.acquire()
print("locked", flush=True)
sys.stdin.readline()
lock.release()
"""
# Holds flock on the lock file under a foreign host's record; "renewing" increments its renewals.
STALE = """
import fcntl, json, os, select, sys
path, mode, record = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
def write():
    data = (json.dumps(record) + "\\n").encode()
    os.pwrite(descriptor, data, 0)
    os.ftruncate(descriptor, len(data))
    os.fsync(descriptor)
write()
print("ready", flush=True)
while not select.select([sys.stdin], [], [], 0.2)[0]:
    if mode == "renewing":
        record["renewals"] += 1
        write()
"""
RACER = """
import sys, warnings
from pathlib import Path
from hpckpt.errors import InvalidStateError
from hpckpt.storage.lock import RunLock
lock = RunLock(Path(sys.argv[1]))
try:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lock.acquire()
except InvalidStateError as exc:
    print("refused", exc, flush=True)
else:
    print("took", len(caught), flush=True)
    sys.stdin.readline()
    lock.release()
"""


@pytest.fixture
def lease(monkeypatch):
    monkeypatch.setenv("HPCKPT_LOCK_LEASE", str(LEASE))
    return LEASE


def python(script: str, *args: str) -> list[str]:
    return [sys.executable, "-c", script, *args]


def foreign_record(renewals: int = 7) -> lock_record.Record:
    """The record of a holder on another node (its boot id and PID namespace are not ours)."""
    return lock_record.Record(
        holder="ab" * 16, host="node-gone", boot="00000000-0000-0000-0000-000000000000", pidns=1,
        pid=4242, start=1, slurm_job="77", since="2026-01-01 00:00:00", flock=True, state="held",
        renewals=renewals, lease_s=LEASE,
    )


def stale_holder(run_dir: Path, mode: str) -> list[str]:
    run_dir.mkdir(exist_ok=True)
    record = lock_record.encode(foreign_record()).decode()
    return python(STALE, str(run_dir / LOCK_NAME), mode, record)


def record_of(run_dir: Path) -> lock_record.Record:
    record = lock_record.parse((run_dir / LOCK_NAME).read_bytes())
    assert record is not None
    return record


def timed_acquire(lock: RunLock) -> tuple[float, list[warnings.WarningMessage]]:
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lock.acquire()
    return time.monotonic() - start, caught


def test_a_released_lock_is_marked_released_and_taken_again_at_once(tmp_path, lease):
    lock = RunLock(tmp_path)
    took, caught = timed_acquire(lock)
    assert lock.held and not lock.lost and took < 1 and not caught
    record = record_of(tmp_path)
    assert (record.state, record.flock, record.pid, record.lease_s) == ("held", True, os.getpid(), LEASE)
    time.sleep(LEASE / 2)  # the thread renews every LEASE / 4 s
    assert record_of(tmp_path).renewals >= 1
    lock.release()
    assert not lock.held and record_of(tmp_path).state == "released"
    again = RunLock(tmp_path)
    took, caught = timed_acquire(again)
    assert took < 1 and not caught and record_of(tmp_path).holder != record.holder
    again.release()
    assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]  # no takeover token left behind


def test_a_live_holder_on_this_machine_is_refused_without_waiting_its_lease(tmp_path, lease):
    with started_group(python(HOLDER, str(tmp_path)), stdin=subprocess.PIPE) as holder:
        assert holder.stdout.readline() == "locked\n"
        start = time.monotonic()
        with pytest.raises(InvalidStateError) as refused:
            RunLock(tmp_path).acquire()
        assert time.monotonic() - start < 1.5  # the second given to a holder that is exiting, not the lease
        assert f"is in use by another job (host {os.uname().nodename} pid {holder.pid} slurm job" in str(
            refused.value)
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(10) == 0


def test_a_killed_holder_s_lock_is_taken_at_once(tmp_path, lease):
    with started_group(python(HOLDER, str(tmp_path)), stdin=subprocess.PIPE) as holder:
        assert holder.stdout.readline() == "locked\n"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
    assert record_of(tmp_path).state == "held"  # it never released
    lock = RunLock(tmp_path)
    took, caught = timed_acquire(lock)
    assert took < 1 and not caught and lock.held
    lock.release()


def test_a_gone_holder_whose_flock_stays_held_is_taken_over_after_its_lease(tmp_path, lease, capfd):
    with started_group(stale_holder(tmp_path, "frozen"), stdin=subprocess.PIPE) as stale:
        assert stale.stdout.readline() == "ready\n"
        lock = RunLock(tmp_path)
        took, caught = timed_acquire(lock)
        assert LEASE < took < LEASE * 1.25 + 1
        assert len(caught) == 1 and caught[0].category is RuntimeWarning
        assert re.fullmatch(
            f"run directory {re.escape(str(tmp_path))}: took over its lock from host node-gone pid 4242 "
            "slurm job 77 since 2026-01-01 00:00:00, which had not renewed it for [23] s; that job is taken "
            "to be gone \\(its node lost power or hung\\) and its lock left behind", str(caught[0].message))
        assert "its lock is held by host node-gone pid 4242" in capfd.readouterr().err
        assert (tmp_path / f"{TAKEOVER_PREFIX}{'ab' * 16}").exists()
        record = record_of(tmp_path)
        assert (record.pid, record.flock, record.state) == (os.getpid(), False, "held")
        stale.stdin.write("\n")
        stale.stdin.flush()
        assert stale.wait(10) == 0
    time.sleep(LEASE / 2)  # the flock is free now: the next renewal takes it
    assert record_of(tmp_path).flock
    lock.release()
    assert record_of(tmp_path).state == "released"
    again = RunLock(tmp_path)
    assert timed_acquire(again)[0] < 1
    again.release()
    assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]  # the normal take removed the old token


def test_a_foreign_holder_that_renews_is_refused_within_its_lease(tmp_path, lease):
    with started_group(stale_holder(tmp_path, "renewing"), stdin=subprocess.PIPE) as stale:
        assert stale.stdout.readline() == "ready\n"
        start = time.monotonic()
        with pytest.raises(InvalidStateError, match="another job \\(host node-gone pid 4242 slurm job 77"):
            RunLock(tmp_path).acquire()
        assert time.monotonic() - start < LEASE * 1.25
        assert record_of(tmp_path).host == "node-gone"  # untouched
        assert not list(tmp_path.glob(f"{TAKEOVER_PREFIX}*"))


def test_two_relaunches_taking_over_the_same_holder_one_wins(tmp_path, lease):
    with started_group(stale_holder(tmp_path, "frozen"), stdin=subprocess.PIPE) as stale:
        assert stale.stdout.readline() == "ready\n"
        racer = python(RACER, str(tmp_path))
        with started_group(racer, stdin=subprocess.PIPE) as first, started_group(
                racer, stdin=subprocess.PIPE) as second:
            said = {process.pid: process.stdout.readline() for process in (first, second)}
            winners = [pid for pid, line in said.items() if line == "took 1\n"]  # one warning
            losers = [line for line in said.values() if line.startswith("refused run directory")]
            assert len(winners) == 1 and len(losers) == 1, said
            record = record_of(tmp_path)
            assert record.pid == winners[0] and not record.flock
            assert f"in use by another job (host {os.uname().nodename} pid {winners[0]} " in losers[0]
            for process in (first, second):
                if process.pid == winners[0]:
                    process.stdin.write("\n")
                    process.stdin.flush()
                assert process.wait(10) == 0
        stale.stdin.write("\n")
        stale.stdin.flush()


def test_a_takeover_that_died_before_writing_its_record_is_itself_taken_over(tmp_path, lease):
    """A token file without a new record (its creator lost power at once): after another
    lease with no change the next token is created and the lock is taken over."""
    with started_group(stale_holder(tmp_path, "frozen"), stdin=subprocess.PIPE) as stale:
        assert stale.stdout.readline() == "ready\n"
        (tmp_path / f"{TAKEOVER_PREFIX}{'ab' * 16}").touch()
        lock = RunLock(tmp_path)
        took, caught = timed_acquire(lock)
        assert 2 * LEASE < took < 2 * (LEASE * 1.25) + 1 and len(caught) == 1
        assert (tmp_path / f"{TAKEOVER_PREFIX}{'ab' * 16}.1").exists()
        assert record_of(tmp_path).pid == os.getpid()
        lock.release()
        stale.stdin.write("\n")
        stale.stdin.flush()


def test_a_relaunch_that_loses_the_token_refuses_once_the_winner_s_record_shows(tmp_path, lease):
    """The token is taken (by a winner whose record is not written yet); the record it
    writes after this relaunch's lease ran out is seen and refused."""
    with started_group(stale_holder(tmp_path, "frozen"), stdin=subprocess.PIPE) as stale:
        assert stale.stdout.readline() == "ready\n"
        (tmp_path / f"{TAKEOVER_PREFIX}{'ab' * 16}").touch()
        winner = dataclasses.replace(foreign_record(renewals=0), holder="cd" * 16, host="node-winner")

        def write_winner() -> None:
            time.sleep(LEASE * 1.25 + 0.4)  # after the first watch, early in the second
            descriptor = os.open(tmp_path / LOCK_NAME, os.O_RDWR)
            lock_record.write(descriptor, winner)
            os.close(descriptor)

        writer = threading.Thread(target=write_winner)
        writer.start()
        start = time.monotonic()
        with pytest.raises(InvalidStateError, match="in use by another job \\(host node-winner pid 4242"):
            RunLock(tmp_path).acquire()
        assert LEASE * 1.25 < time.monotonic() - start < 2 * LEASE * 1.25
        writer.join()
        assert not (tmp_path / f"{TAKEOVER_PREFIX}{'ab' * 16}.1").exists()
        stale.stdin.write("\n")
        stale.stdin.flush()


def test_a_holder_whose_record_is_taken_over_is_lost_and_warns_once(tmp_path, lease):
    lock = RunLock(tmp_path)
    lock.acquire()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        taker = dataclasses.replace(foreign_record(), host="node-b", flock=False)
        descriptor = os.open(tmp_path / LOCK_NAME, os.O_RDWR)
        lock_record.write(descriptor, taker)  # what a takeover from another node writes
        os.close(descriptor)
        deadline = time.monotonic() + LEASE
        while not lock.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(LEASE / 2)  # no further renewal, no second warning
    assert lock.lost and not lock.held
    assert [str(w.message) for w in caught] == [
        f"run directory {tmp_path}: this process's lock was taken over by host node-b pid 4242 slurm job 77 "
        "since 2026-01-01 00:00:00, as it had not renewed it for its lease (a frozen node or storage); both "
        "jobs may now write the run directory: stop one"
    ]
    lock.release()
    assert record_of(tmp_path) == taker  # the release leaves the taker's record alone


@pytest.mark.parametrize(
    "content", [b"host node-old pid 1 slurm job - since 2025-01-01 00:00:00\n", b"\x00" * 64],
    ids=["text-record", "garbage"],
)
def test_unreadable_records(tmp_path, lease, content):
    """A record of the older text form, or garbage, cannot tell whether its holder lives on
    this machine: even with flock granted (node-local on some file systems) its lease is
    waited for, then the lock is taken over with one warning."""
    (tmp_path / LOCK_NAME).write_bytes(content)
    lock = RunLock(tmp_path)
    took, caught = timed_acquire(lock)
    assert took > LEASE and len(caught) == 1
    assert "took over its lock from" in str(caught[0].message)
    lock.release()


def test_a_bad_lease_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCKPT_LOCK_LEASE", "-3")
    with pytest.raises(ValueError, match="HPCKPT_LOCK_LEASE='-3': expected a number of seconds > 0"):
        RunLock(tmp_path).acquire()


def test_a_holder_that_exited_but_is_not_yet_reaped_is_gone(tmp_path, lease):
    """A killed job's rank may be a zombie when its relaunch starts: its files are closed, so
    the lock is taken at once."""
    exits = "import os, sys; from pathlib import Path; from hpckpt.storage.lock import RunLock\n" \
            "RunLock(Path(sys.argv[1])).acquire(); os._exit(0)"
    holder = subprocess.Popen([sys.executable, "-c", exits, str(tmp_path)])
    stat = Path(f"/proc/{holder.pid}/stat")
    deadline = time.monotonic() + 20
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the holder did not exit"
        time.sleep(0.01)
    lock = RunLock(tmp_path)
    try:
        took, caught = timed_acquire(lock)
    finally:
        holder.wait()
    lock.release()
    assert took < 0.5 and not caught
