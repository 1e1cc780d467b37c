"""Running a test's job in its own process group: a timeout kills the whole group.

``subprocess.run(..., timeout=T)`` kills only the child it started; an ``mpiexec``
killed that way leaves its ranks running, spinning on the CPU the next tests need.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence


@contextlib.contextmanager
def started_group(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdin: int | None = None,
) -> Iterator[subprocess.Popen]:
    """Start ``command`` in a new session (stdout and stderr piped, as text); on leaving
    the block, SIGKILL its whole process group (whatever of it is left) and reap it."""
    process = subprocess.Popen(
        list(command),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        kill_group(process.pid)  # leftovers of a job that ended (a rank its launcher lost)
        process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def run_group(
    command: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess:
    """Run ``command`` (output captured as text) in a new session; after ``timeout``
    seconds kill its whole process group and raise ``subprocess.TimeoutExpired`` with the
    output so far."""
    with started_group(command, env=env, cwd=cwd) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process.pid)
            stdout, stderr = process.communicate()
            raise subprocess.TimeoutExpired(process.args, timeout, stdout, stderr) from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def kill_group(group: int) -> None:
    """SIGKILL every process of process group ``group`` (none left: nothing to do)."""
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
