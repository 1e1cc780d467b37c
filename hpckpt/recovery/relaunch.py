"""``hpckpt run``: relaunch a failed job until it succeeds or the budget is spent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

ATTEMPT_ENV = "HPCKPT_ATTEMPT"
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


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


def run_with_relaunch(command: Sequence[str], *, max_restarts: int, delay: float) -> int:
    """Run ``command``; after a non-zero exit run it again, at most ``max_restarts`` times.

    Not an MPI call: it runs outside the job (``hpckpt run -- mpiexec ...``). Exports
    ``HPCKPT_ATTEMPT`` (0, 1, ...) to the command, reports each attempt on stderr, and
    returns the last attempt's status. SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 are
    passed on to the running command; after SIGTERM or SIGINT it is not relaunched.
    """
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        if signum in (signal.SIGTERM, signal.SIGINT):
            stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in _FORWARDED}
    try:
        status = 0
        attempts = max_restarts + 1
        for attempt in range(attempts):
            report(f"attempt {attempt + 1}/{attempts}: {' '.join(command)}")
            started = time.monotonic()
            child = subprocess.Popen(list(command), env={**os.environ, ATTEMPT_ENV: str(attempt)})
            status = child.wait()
            elapsed = time.monotonic() - started
            if status == 0:
                report(f"attempt {attempt + 1}/{attempts} succeeded after {elapsed:.1f} s")
                return 0
            report(f"attempt {attempt + 1}/{attempts} failed after {elapsed:.1f} s: {describe_status(status)}")
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


def report(message: str) -> None:
    """One progress line on stderr, prefixed ``hpckpt run:``."""
    print(f"hpckpt run: {message}", file=sys.stderr, flush=True)
