"""An exclusive lock on a run directory: one job at a time writes it.

Rank 0 holds ``flock`` on ``<run dir>/.hpckpt.lock`` while a Checkpointer is open; the
file names the holder (host, pid, Slurm job id, since when). The kernel drops the lock
when the holding process dies, so a relaunched job takes it again at once. On file
systems without ``flock`` (some NFS setups) the lock is advisory only.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from ..errors import InvalidStateError

LOCK_NAME = ".hpckpt.lock"


class RunLock:
    """The lock of one run directory (see the module docstring). Not collective."""

    def __init__(self, root: Path) -> None:
        self.path = root / LOCK_NAME
        self._descriptor: int | None = None

    @property
    def held(self) -> bool:
        """True while this process holds the lock."""
        return self._descriptor is not None

    def acquire(self) -> None:
        """Take the lock, or raise InvalidStateError naming the job that holds it."""
        try:
            self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise InvalidStateError(
                f"cannot use run directory {self.path.parent}: {exc.strerror} ({exc.filename})"
            ) from exc
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 4096, 0).decode(errors="replace").strip() or "an unknown process"
            os.close(descriptor)
            raise InvalidStateError(
                f"run directory {self.path.parent} is in use by another job ({holder}); "
                "use another directory, or wait for that job to end"
            ) from None
        job = os.environ.get("SLURM_JOB_ID", "-")
        since = time.strftime("%Y-%m-%d %H:%M:%S")
        text = f"host {socket.gethostname()} pid {os.getpid()} slurm job {job} since {since}\n"
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, text.encode(), 0)
        self._descriptor = descriptor

    def release(self) -> None:
        """Drop the lock (the file stays)."""
        if self._descriptor is not None:
            fcntl.flock(self._descriptor, fcntl.LOCK_UN)
            os.close(self._descriptor)
            self._descriptor = None
