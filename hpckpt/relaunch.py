"""``hpckpt run``: relaunch a failed job until it succeeds or the budget is spent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from ._hooks import ATTEMPT_ENV, FINISHED_FILE_ENV
from .slurm import READY_FILE_ENV, STOP_FILE_ENV, STOPPED_EXIT_CODE

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
_HELD = (signal.SIGUSR1, signal.SIGUSR2)
LAUNCHERS = ("srun", "mpiexec", "mpirun")  # what `hpckpt run --launch` starts a command on the ranks with
READY_WAIT = 60.0  # seconds a held SIGUSR1/SIGUSR2 waits for the ranks to be ready


def launched(launcher: str, ranks: int | None, command: Sequence[str]) -> list[str]:
    """``command`` started on the ranks by ``launcher`` (one of :data:`LAUNCHERS`): srun
    with PMI-2 that ends the job step when a rank fails, or ``mpiexec``/``mpirun -n
    ranks`` (``ranks`` defaults to ``$SLURM_NTASKS``). ValueError when mpiexec has no rank count.
    """
    if launcher == "srun":
        return ["srun", "--mpi=pmi2", "--kill-on-bad-exit=1", *(["-n", str(ranks)] if ranks else []),
                *command]
    count = ranks or os.environ.get("SLURM_NTASKS")
    if not count:
        raise ValueError(f"--launch {launcher} needs --ranks N outside a Slurm job (SLURM_NTASKS is not set)")
    return [launcher, "-n", str(count), *command]


def describe_status(status: int) -> str:
    """Say what a ``subprocess`` return code means (negative: killed by a signal)."""
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    if status > 128 and status - 128 in signal.Signals._value2member_map_:
        return f"exit status {status} ({signal.Signals(status - 128).name})"
    return f"exit status {status}"


def exit_code(status: int) -> int:
    """The shell convention for a return code: 128 + N for death by signal N."""
    return 128 - status if status < 0 else status


def run_with_relaunch(
    command: Sequence[str], *, max_restarts: int, delay: float, requeue: bool = False
) -> int:
    """Run ``command``; after a non-zero exit run it again, at most ``max_restarts`` times.

    Not an MPI call: it runs outside the job (``hpckpt run -- mpiexec ...``). Exports
    ``HPCKPT_ATTEMPT`` (0, 1, ...) to the command, reports each attempt on stderr, and
    returns the last attempt's status. SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 are passed
    on to the running command; after SIGTERM or SIGINT it is not relaunched. SIGUSR1 and
    SIGUSR2 wait until the command's ranks can take them (:class:`hpckpt.slurm.JobControl`
    reports it through ``HPCKPT_READY_FILE``), or at most ``READY_WAIT`` seconds.

    An attempt whose job called :meth:`hpckpt.Checkpointer.finish` (it creates the file
    named in ``HPCKPT_FINISHED_FILE``) is not relaunched, whatever its exit status: its
    work is done. An attempt that exits with :data:`~hpckpt.slurm.STOPPED_EXIT_CODE` stopped on
    purpose after a checkpoint: it is not relaunched, and with ``requeue`` inside a
    Slurm job (unless SIGTERM or SIGINT came here) the job is requeued with
    ``scontrol requeue $SLURM_JOB_ID``. So is an attempt that exits with 0 after its
    :class:`~hpckpt.slurm.JobControl` told the ranks to stop (it writes the reason into
    the file named in ``HPCKPT_STOP_FILE``) without :meth:`~hpckpt.Checkpointer.finish`:
    the launcher lost the ranks' status 75 (MPICH's mpiexec can, after it passes on a
    signal), and the work is not done.
    """
    stopping = False
    held: list[int] = []  # SIGUSR1/SIGUSR2 not yet passed on (shared with the running attempt)
    attempt_process: _Attempt | None = None

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        if signum in (signal.SIGTERM, signal.SIGINT):
            stopping = True
        if attempt_process is not None:
            attempt_process.signal(signum)
        elif signum in _HELD:
            held.append(signum)

    previous = {signum: signal.signal(signum, on_signal) for signum in _FORWARDED}
    try:
        status = 0
        attempts = max_restarts + 1
        for attempt in range(attempts):
            if stopping:
                report("stopped by a signal before the attempt started")
                return exit_code(status) or 128 + signal.SIGTERM
            report(f"attempt {attempt + 1}/{attempts}: {' '.join(command)}")
            started = time.monotonic()
            attempt_process = _Attempt(command, attempt, held)
            if stopping:  # SIGTERM or SIGINT came while it started
                attempt_process.signal(signal.SIGTERM)
            status = attempt_process.wait()
            finished, stop_reason = attempt_process.finished, attempt_process.stop_reason
            attempt_process = None
            elapsed = time.monotonic() - started
            if status == 0 and stop_reason is not None and not finished:
                report(f"attempt {attempt + 1}/{attempts} exited with status 0, "
                       f"but its ranks were told to stop ({stop_reason}) and to exit {STOPPED_EXIT_CODE}: "
                       "the launcher lost their exit status; taking it as stopped with a checkpoint")
                status = STOPPED_EXIT_CODE
            if status == 0:
                report(f"attempt {attempt + 1}/{attempts} succeeded after {elapsed:.1f} s")
                return 0
            if finished:
                report(f"attempt {attempt + 1}/{attempts} finished its work (Checkpointer.finish) "
                       f"but then exited with {describe_status(status)} after {elapsed:.1f} s; "
                       "not relaunching")
                return exit_code(status)
            if status == STOPPED_EXIT_CODE:
                report(f"attempt {attempt + 1}/{attempts} stopped with a checkpoint after {elapsed:.1f} s "
                       f"(exit status {status}); not relaunching")
                if requeue and not stopping:
                    requeue_slurm_job()
                return status
            report(f"attempt {attempt + 1}/{attempts} failed after {elapsed:.1f} s: "
                   f"{describe_status(status)}")
            if stopping:
                report("stopped by a signal; not relaunching")
                break
            if attempt + 1 < attempts:
                report(f"relaunching in {delay:g} s")
                time.sleep(delay)
        else:
            report(f"giving up after {attempts} attempt(s)")
        return exit_code(status)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _Attempt:
    """One run of the command, holding back SIGUSR1/SIGUSR2 until its ranks are ready."""

    def __init__(self, command: Sequence[str], attempt: int, held: list[int]) -> None:
        self.ready_file = _unused_path(".hpckpt-ready-")
        self.finished_file = _unused_path(".hpckpt-finished-")
        self.stop_file = _unused_path(".hpckpt-stop-")
        self.finished = False  # the job called Checkpointer.finish (known after wait)
        self.stop_reason: str | None = None  # why JobControl told the ranks to stop (known after wait)
        self.started = time.monotonic()
        self.held = held  # the caller's list: a signal arriving while this starts is kept
        env = {**os.environ, ATTEMPT_ENV: str(attempt), READY_FILE_ENV: str(self.ready_file),
               FINISHED_FILE_ENV: str(self.finished_file), STOP_FILE_ENV: str(self.stop_file)}
        self.process = subprocess.Popen(list(command), env=env)

    def ready(self) -> bool:
        return self.ready_file.exists() or time.monotonic() - self.started > READY_WAIT

    def signal(self, signum: int) -> None:
        if signum in _HELD and not self.ready():
            self.held.append(signum)
        elif self.process.poll() is None:
            self.process.send_signal(signum)

    def wait(self) -> int:
        try:
            while True:
                try:
                    return self.process.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
                while self.held and self.ready():
                    self.process.send_signal(self.held.pop(0))
        finally:
            self.finished = self.finished_file.exists()
            if self.stop_file.exists():
                self.stop_reason = self.stop_file.read_text().strip()
            for marker in (self.ready_file, self.finished_file, self.stop_file):
                marker.unlink(missing_ok=True)


def _unused_path(prefix: str) -> Path:
    """A file name no other file has, in the working directory (on a cluster the ranks'
    nodes see it too) or else the temporary directory; the file itself is not there.
    """
    try:
        fd, name = tempfile.mkstemp(prefix=prefix, dir=os.getcwd())
    except OSError:
        fd, name = tempfile.mkstemp(prefix=prefix)
    os.close(fd)
    os.unlink(name)
    return Path(name)


def requeue_slurm_job() -> None:
    """Ask Slurm to requeue this job (``scontrol requeue``); report what happened."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        report("--requeue: not inside a Slurm job (no SLURM_JOB_ID); run the command again to continue")
        return
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        report(f"scontrol requeue {job} failed: {exc}; resubmit the job to continue")
        return
    if result.returncode == 0:
        report(f"requeued Slurm job {job}: it continues from the checkpoint when it starts again")
    else:
        report(f"scontrol requeue {job} failed: {result.stderr.strip()}; resubmit the job to continue")


def report(message: str) -> None:
    """One progress line on stderr, prefixed ``hpckpt run:``."""
    print(f"hpckpt run: {message}", file=sys.stderr, flush=True)
