"""An exclusive lock on a run directory: one job at a time writes it, and a relaunch after
its holder's node lost power takes it over without anyone's help.

Rank 0 takes the lock while a Checkpointer is open; nothing here is collective. The lock
is ``<run dir>/.hpckpt.lock``: its holder holds ``flock`` on it where it can, and writes in
it a record (``hpckpt.storage.lock_record``) naming itself: host, boot id, PID
namespace, PID and process start time, Slurm job, since when. The record is a lease: a
thread of the holder rewrites it every quarter of ``HPCKPT_LOCK_LEASE`` seconds (default
30), counting its renewals, and flushes it so that other nodes see it.

Taking the lock:

- a record that is released or empty is taken at once, and so is one whose ``flock`` is
  granted and whose holder is provably gone from this machine (no process with its PID
  and start time under the same host, boot and PID namespace); a granted ``flock`` alone
  proves nothing about another node's holder, since ``flock`` is node-local on some file
  systems (Lustre's ``localflock``, NFS without ``lockd``, FUSE file systems);
- a holder that is provably alive on this machine (same host, boot and PID namespace, a
  live process with its PID and start time) is refused, naming it, once it has had a
  second to exit (a job killed just before its relaunch);
- otherwise (a holder on another node, whose ``flock`` a distributed file system may keep
  for minutes after that node lost power) the record is watched for its holder's lease and
  a quarter more: a renewal means the holder is alive and is refused; no renewal means it
  is gone, and the lock is taken over with one ``RuntimeWarning`` naming it.

Two processes replacing the same record race for a token file created with ``O_EXCL``
(``.hpckpt.lock.takeover-<holder>``): one wins, the other sees the winner's record and
refuses. A holder whose record another process has taken over (its renewals stopped
for a whole lease: a frozen node or storage) notices at its next renewal: ``RunLock.lost``
becomes True, with one ``RuntimeWarning``.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import sys
import threading
import time
import warnings
from pathlib import Path

from ..errors import InvalidStateError
from . import lock_record
from .lock_record import Record, alive_here, describe, identity, parse, read_raw

LOCK_NAME = ".hpckpt.lock"
TAKEOVER_PREFIX = f"{LOCK_NAME}.takeover-"
LEASE_ENV = "HPCKPT_LOCK_LEASE"
DEFAULT_LEASE_S = 30.0
EXIT_GRACE_S = 1.0  # how long a holder alive on this machine is given to end before a refusal
LONGEST_LEASE_S = 3600.0  # a foreign record's lease is believed up to this (or our own, if longer)


def lease_seconds() -> float:
    """The lease this process takes (``HPCKPT_LOCK_LEASE``, default 30 s).

    Raises
    ------
    ValueError
        When the variable is not a number of seconds > 0.
    """
    text = os.environ.get(LEASE_ENV)
    if not text:
        return DEFAULT_LEASE_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ValueError(f"{LEASE_ENV}={text!r}: expected a number of seconds > 0")
    return value


def _try_flock(descriptor: int) -> bool:
    """Whether ``flock`` was granted (False when held elsewhere or unsupported by the file system)."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _alive_after_grace(record: Record) -> bool:
    """Whether the holder is alive on this machine, given a second to end (a job killed just
    before its relaunch may still be exiting).
    """
    deadline = time.monotonic() + EXIT_GRACE_S
    while alive_here(record):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


def _free(raw: bytes, flocked: bool) -> bool:
    """Whether the lock the record ``raw`` describes may be taken at once."""
    record = parse(raw)
    if not raw.strip() or (record is not None and record.state == "released"):
        return True
    # a granted flock proves a holder gone only on this machine: where flock is node-local
    # (Lustre's localflock, NFS without lockd, FUSE file systems) another node's holder may live
    return flocked and record is not None and alive_here(record) is False


class RunLock:
    """The lock of one run directory (see the module docstring). Not collective.

    Parameters
    ----------
    root
        The run directory.
    """

    def __init__(self, root: Path) -> None:
        self.path = root / LOCK_NAME
        self._descriptor: int | None = None
        self._record: Record | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._lost = False

    @property
    def held(self) -> bool:
        """True while this process holds the lock."""
        return self._descriptor is not None and not self._lost

    @property
    def lost(self) -> bool:
        """True when another process took the lock over while this one held it."""
        return self._lost

    def acquire(self) -> None:
        """Take the lock: at once, or after watching a holder that may be gone for its lease.

        Raises
        ------
        InvalidStateError
            Naming the holder, when a live job holds the lock; naming the error, when the
            run directory cannot be used.
        ValueError
            When ``HPCKPT_LOCK_LEASE`` is not a number of seconds > 0.
        """
        lease = lease_seconds()
        self.release()  # a lost holding's descriptor
        try:
            self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise self._unusable(exc) from exc
        try:
            self._take(descriptor, lease)
        except OSError as exc:
            os.close(descriptor)
            raise self._unusable(exc) from exc
        except BaseException:
            os.close(descriptor)
            raise

    def _take(self, descriptor: int, lease: float) -> None:
        flocked = _try_flock(descriptor)
        raw = read_raw(self.path)
        record = parse(raw)
        if record is not None and record.state == "held" and _alive_after_grace(record):
            raise self._in_use(raw)
        quiet, attempt, silent_since = _free(raw, flocked), 0, time.monotonic()
        while True:
            if not quiet:
                raw, flocked, quiet = self._watch(descriptor, raw, flocked, lease, contested=attempt > 0)
            if self._claim(raw, attempt):
                break
            attempt += 1  # another process is replacing this record: its record will show
            quiet = False
        age = time.monotonic() - silent_since
        current = read_raw(self.path)
        if current != raw:  # replaced while we claimed: its new holder is alive
            raise self._in_use(current)
        self._record = lock_record.new_record(lease, flocked)
        lock_record.write(descriptor, self._record)
        self._descriptor, self._lost, self._stop = descriptor, False, threading.Event()
        self._remove_tokens(keep=None if quiet else self._token(raw, attempt))
        if not quiet:
            warnings.warn(
                f"run directory {self.path.parent}: took over its lock from {describe(raw)}, which had not "
                f"renewed it for {self._age(age):.0f} s; that job is taken to be gone (its node lost power "
                "or hung) and its lock left behind", RuntimeWarning, stacklevel=3)
        self._renewer = threading.Thread(target=self._renew, args=(descriptor, lease / 4),
                                         name=f"hpckpt lock {self.path.parent}", daemon=True)
        self._renewer.start()

    def _watch(
        self, descriptor: int, raw: bytes, flocked: bool, lease: float, contested: bool
    ) -> tuple[bytes, bool, bool]:
        """Watch the record ``raw`` for its lease and a quarter; refuse when it changes.

        Returns the record to replace, whether ``flock`` is held, and whether the lock
        became free meanwhile (else the holder is gone). ``contested``: another process
        claimed ``raw`` first, so only a new record counts as free (its own, released).
        """
        record = parse(raw)
        theirs = record.lease_s if record is not None and record.lease_s is not None else lease
        period = 1.25 * min(theirs, max(lease, LONGEST_LEASE_S))
        print(f"hpckpt: run directory {self.path.parent}: its lock is held by {describe(raw)}, which has "
              f"not renewed it for {self._age(0):.0f} s; waiting up to {period:.0f} s to see whether it is "
              "alive", file=sys.stderr, flush=True)
        deadline = time.monotonic() + period
        while time.monotonic() < deadline:
            time.sleep(period / 10)
            flocked = flocked or _try_flock(descriptor)
            current = read_raw(self.path)
            if _free(current, flocked) and not (contested and current == raw):
                return current, flocked, True
            if current != raw:
                raise self._in_use(current)
        return raw, flocked, False

    def _token(self, raw: bytes, attempt: int) -> Path:
        return self.path.parent / f"{TAKEOVER_PREFIX}{identity(raw)}{f'.{attempt}' if attempt else ''}"

    def _claim(self, raw: bytes, attempt: int) -> bool:
        """Create the token file of replacing ``raw``; False when another process has."""
        try:
            os.close(os.open(self._token(raw, attempt), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            return False
        return True

    def _remove_tokens(self, keep: Path | None) -> None:
        """Remove the token files of earlier replacements (all but ``keep``), best-effort."""
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.path.parent):
                if entry.name.startswith(TAKEOVER_PREFIX) and (keep is None or entry.name != keep.name):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)

    def _renew(self, descriptor: int, interval: float) -> None:
        """The renewal thread: rewrite the record every ``interval`` s until released or lost."""
        record = self._record
        assert record is not None
        while not self._stop.wait(interval):
            try:
                raw = read_raw(self.path)
                current = parse(raw)
                if current is not None and current.holder != record.holder:
                    self._lost = True
                    warnings.warn(
                        f"run directory {self.path.parent}: this process's lock was taken over by "
                        f"{describe(raw)}, as it had not renewed it for its lease (a frozen node or "
                        "storage); both jobs may now write the run directory: stop one",
                        RuntimeWarning, stacklevel=1)
                    return
                record.flock = record.flock or _try_flock(descriptor)
                record.renewals += 1
                lock_record.write(descriptor, record)
            except OSError:
                continue  # the storage may be frozen for a while: the next tick tries again

    def release(self) -> None:
        """Mark the record released, stop renewing, and drop the lock (the file stays)."""
        descriptor = self._descriptor
        if descriptor is None:
            return
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        if not self._lost and self._record is not None:
            self._record.state = "released"
            with contextlib.suppress(OSError):  # a failed write leaves the lease to run out
                lock_record.write(descriptor, self._record)
        with contextlib.suppress(OSError):
            fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)
        self._descriptor = None

    def _age(self, at_least: float) -> float:
        """Seconds since the lock file was last written (at least ``at_least``)."""
        try:
            return max(at_least, time.time() - self.path.stat().st_mtime)
        except OSError:
            return at_least

    def _in_use(self, raw: bytes) -> InvalidStateError:
        return InvalidStateError(
            f"run directory {self.path.parent} is in use by another job ({describe(raw)}); "
            "use another directory, or wait for that job to end")

    def _unusable(self, exc: OSError) -> InvalidStateError:
        where = self.path.parent
        return InvalidStateError(f"cannot use run directory {where}: {exc.strerror} ({exc.filename})")
