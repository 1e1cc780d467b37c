"""Stop cleanly before Slurm (or anything else) ends the job: signals and the wall-time limit.

A :class:`JobControl` watches for two things, and :meth:`JobControl.should_stop` tells
every rank the same answer once per step:

- a stop signal: SIGTERM (Slurm sends it on ``scancel``, ``scontrol requeue``,
  preemption and at the time limit, ``KillWait`` seconds before SIGKILL) and one more,
  SIGUSR1 by default (``#SBATCH --signal=B:USR1@300`` sends it 300 s before the limit;
  ``scancel --signal=USR1 --batch JOBID`` by hand);
- the wall-time limit: the job's end time is read once from ``SLURM_JOB_END_TIME`` or,
  where Slurm does not set it, ``squeue -h -j $SLURM_JOB_ID -o %L``. Stop when less
  than ``margin`` plus twice the longest step (measured between calls, saves included)
  is left, so a checkpoint is taken before the limit even when no signal comes.

The application then saves a checkpoint and exits with :data:`STOPPED_EXIT_CODE` (75,
``EX_TEMPFAIL``: "stopped early with a checkpoint, run me again"). ``hpckpt run`` never
relaunches on that status; with ``--requeue`` it asks Slurm to requeue the job, unless
the stop came from a SIGTERM that ``hpckpt run`` itself received (then Slurm is already
cancelling or requeueing the job). ``SLURM_RESTART_COUNT`` is kept in
:attr:`JobControl.restart_count`.

Settings by environment (arguments win): ``HPCKPT_STOP_SIGNAL`` (the extra signal's
name, default ``USR1``), ``HPCKPT_STOP_MARGIN`` (seconds, default 60),
``HPCKPT_END_TIME`` (the job's end as a Unix time, for launchers other than Slurm).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from ._comm import share_phase

if TYPE_CHECKING:
    from mpi4py import MPI

#: The exit status of a job that stopped early with a checkpoint (``EX_TEMPFAIL``).
STOPPED_EXIT_CODE = 75
READY_FILE_ENV = "HPCKPT_READY_FILE"
STOP_FILE_ENV = "HPCKPT_STOP_FILE"  # set by `hpckpt run`; rank 0 writes the stop reason into it
DEFAULT_MARGIN = 60.0
_TIME_LEFT = re.compile(r"^(?:(?:(\d+)-)?(\d+):)?(\d+):(\d+)$")


def parse_time_left(text: str) -> float | None:
    """Seconds in squeue's ``%L`` (``[[days-]hours:]minutes:seconds``); None when unlimited."""
    text = text.strip()
    match = _TIME_LEFT.match(text)
    if match is None:
        if text in ("UNLIMITED", "NOT_SET", "INVALID", ""):
            return None
        raise ValueError(f"cannot read the time left from squeue: {text!r}")
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def job_end_time() -> float | None:
    """The job's end as a Unix time, or None when there is no limit or no way to know.

    Not collective; runs ``squeue`` when Slurm does not export ``SLURM_JOB_END_TIME``.
    """
    for name in ("HPCKPT_END_TIME", "SLURM_JOB_END_TIME"):
        if os.environ.get(name):
            try:
                return float(os.environ[name])
            except ValueError:
                raise ValueError(f"{name}={os.environ[name]!r} is not a Unix time") from None
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        result = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%L"], capture_output=True, text=True, timeout=30, check=True
        )
        left = parse_time_left(result.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        print(f"hpckpt: cannot read job {job}'s time limit ({exc}); stopping on signals only",
              file=sys.stderr)
        return None
    return None if left is None else time.time() + left


def signal_number(name: str) -> signal.Signals:
    """``"USR1"``, ``"SIGUSR1"`` or ``"10"`` as a signal."""
    text = name.strip().upper()
    try:
        if text.isdigit():
            return signal.Signals(int(text))
        return signal.Signals[text if text.startswith("SIG") else "SIG" + text]
    except (KeyError, ValueError):
        raise ValueError(f"unknown signal {name!r}; expected a name such as USR1 or TERM") from None


class JobControl:
    """Agree on when to stop: on a stop signal or before the wall-time limit.

    Parameters
    ----------
    comm
        The application's communicator. Construction is collective over it (it installs
        the handlers on every rank, then tells ``hpckpt run`` the job is ready for
        signals); so is :meth:`should_stop`.
    stop_signal
        The signal that asks for a checkpoint-and-stop besides SIGTERM (default
        ``HPCKPT_STOP_SIGNAL`` or SIGUSR1).
    margin
        Seconds to keep free before the end time (default ``HPCKPT_STOP_MARGIN`` or 60);
        twice the longest step is added.
    end_time
        The job's end as a Unix time (default: read from Slurm, see :func:`job_end_time`).
    """

    def __init__(
        self,
        comm: MPI.Comm,
        *,
        stop_signal: str | int | None = None,
        margin: float | None = None,
        end_time: float | None = None,
    ) -> None:
        self.comm = comm
        name = stop_signal if stop_signal is not None else os.environ.get("HPCKPT_STOP_SIGNAL", "USR1")
        extra = signal.Signals(name) if isinstance(name, int) else signal_number(name)
        self.signals = (signal.SIGTERM, extra) if extra != signal.SIGTERM else (signal.SIGTERM,)
        self.margin = (float(os.environ.get("HPCKPT_STOP_MARGIN", DEFAULT_MARGIN)) if margin is None
                       else margin)
        if not self.margin >= 0:
            raise ValueError(f"the stop margin must be >= 0 seconds, got {self.margin}")
        #: How many times Slurm has restarted the job (``SLURM_RESTART_COUNT``, 0 the first time).
        self.restart_count = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        self.job_id = os.environ.get("SLURM_JOB_ID")
        #: Why :meth:`should_stop` said True (a signal, the wall-time limit); None until then.
        self.stop_reason: str | None = None
        self._received: int = 0
        self._longest_step = 0.0
        self._last_call: float | None = None
        if end_time is None:  # rank 0 asks; a bad HPCKPT_END_TIME then fails on every rank, no rank waits
            end_time = share_phase(comm, "read the job's end time",
                                   lambda: job_end_time() if comm.rank == 0 else None)
        self.end_time: float | None = end_time
        self._previous = {signum: signal.signal(signum, self._on_signal) for signum in self.signals}
        comm.Barrier()  # every rank's handlers are in place
        ready = os.environ.get(READY_FILE_ENV)
        if ready and comm.rank == 0:
            Path(ready).touch()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if not self._received:
            self._received = signum

    def seconds_left(self) -> float | None:
        """Wall time left before the end time, by this rank's clock; None when unlimited."""
        return None if self.end_time is None else self.end_time - time.time()

    def should_stop(self) -> bool:
        """Whether to save and stop now; the same answer on every rank.

        Collective over ``comm``: call it once per step on every rank (one small
        all-reduce). Once it returns True, :attr:`stop_reason` says why.
        """
        import numpy as np
        from mpi4py import MPI

        now = time.monotonic()
        if self._last_call is not None:
            self._longest_step = max(self._longest_step, now - self._last_call)
        self._last_call = now
        left = self.seconds_left()
        late = left is not None and left <= self.margin + 2 * self._longest_step
        agreed = np.zeros(2, dtype=np.int64)
        self.comm.Allreduce(np.array([self._received, late], dtype=np.int64), agreed, op=MPI.MAX)
        signum, any_late = int(agreed[0]), bool(agreed[1])
        if signum:
            self.stop_reason = f"{signal.Signals(signum).name} received"
        elif any_late:
            self.stop_reason = f"wall-time limit near ({max(left or 0.0, 0.0):.0f} s left)"
        if self.stop_reason is not None:
            self._tell_hpckpt_run(self.stop_reason)
        return self.stop_reason is not None

    def _tell_hpckpt_run(self, reason: str) -> None:
        """Write the stop reason on rank 0 into ``HPCKPT_STOP_FILE``: ``hpckpt run`` then
        knows the ranks were told to stop with a checkpoint even where the launcher loses
        their exit status 75 (MPICH's mpiexec can report 0 after it passes on a signal).
        """
        stop_file = os.environ.get(STOP_FILE_ENV)
        if stop_file and self.comm.rank == 0:
            Path(stop_file).write_text(reason + "\n")

    def describe(self) -> str:
        """One line for the job's log: Slurm job id, restart count, wall time left."""
        parts = [f"Slurm job {self.job_id}, restart {self.restart_count}" if self.job_id
                 else "not under Slurm"]
        left = self.seconds_left()
        parts.append("no time limit known" if left is None else f"{left:.0f} s of wall time left")
        names = " or ".join(signal.Signals(s).name for s in self.signals)
        parts.append(f"stops on {names} or {self.margin:g} s (+2 steps) before the limit")
        return "; ".join(parts)

    def close(self) -> None:
        """Put the previous signal handlers back. Not collective."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def __enter__(self) -> JobControl:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

