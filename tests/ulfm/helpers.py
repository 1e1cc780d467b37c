"""Helpers of the in-job recovery tests: real `mpiexec --with-ft ulfm` jobs of the heat
solver in the ULFM environment (.venv-ulfm, Open MPI 5; `make install` builds it).

tests/ulfm/conftest.py skips the suite where that environment is missing or is not the
one running the tests: run them with its Python, `make test-ulfm`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.heat_output import Finished
from tests.processes import kill_group, run_group, started_group

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("HPCKPT_ULFM_VENV", REPO / ".venv-ulfm"))
FAILED_NOTE = Path(str(VENV) + ".failed")
MPIEXEC = VENV / "bin" / "mpiexec"
ULFM_FLAGS = ["--with-ft", "ulfm", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--oversubscribe"]
ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}  # CI runs as root
JOB_TIMEOUT = 50
STARTED = re.compile(r"^\w+: started pids=([\d,]+)$")  # the heat solver's and tests/jobs/logged_app's
RECOVERED = re.compile(r"^heat: recovered from the failure of rank\(s\) ([\d,]+) in ([\d.]+) s", re.MULTILINE)


def heat_command(
    ranks: int, run_dir: Path, *args: str, ft: bool = True, iters: int = 200, pace: float = 0.01
) -> list[str]:
    """The heat solver on ``ranks`` ranks of the ULFM environment's ``mpiexec`` (with failure
    detection and in-job recovery unless ``ft`` is false), a posix checkpoint every 20 iterations."""
    launcher = [str(MPIEXEC), *(ULFM_FLAGS if ft else ["--oversubscribe"]), "-n", str(ranks)]
    solver = [sys.executable, "-m", "hpckpt.examples.heat", "--n", "64", "--iters", str(iters)]
    checkpoints = ["--every", "20", "--backend", "posix", "--dir", str(run_dir)]
    return [*launcher, *solver, *checkpoints, "--pace", str(pace), *args]


class Job(Finished):
    """A finished job, with the process ids and recoveries it reported."""

    def pids(self, when: str) -> list[int]:
        match = re.search(rf"^heat: {when} pids=([\d,]+)$", self.stdout, re.MULTILINE)
        assert match, f"no '{when} pids' line; stdout:\n{self.stdout}"
        return [int(pid) for pid in match.group(1).split(",")]

    @property
    def recoveries(self) -> list[tuple[list[int], float]]:
        return [([int(r) for r in ranks.split(",")], float(s)) for ranks, s in RECOVERED.findall(self.stdout)]


def run_job(command: list[str], env: dict[str, str] | None = None) -> Job:
    result = run_group(command, timeout=JOB_TIMEOUT, env={**os.environ, **ENV, **(env or {})})
    return Job(result.returncode, result.stdout, result.stderr)


def run_killing(
    command: list[str],
    kills: list[tuple[int, float]],
    env: dict[str, str] | None = None,
    while_stopped: Callable[[int], None] | None = None,
) -> Job:
    """Run ``command``; SIGKILL rank ``rank``'s process ``delay`` s after the job reports its
    pids (the first kill) or its previous recovery (each next one), for each (rank, delay).
    Only original processes are killed (a replacement's pid is reported at the end).
    ``while_stopped(rank)`` runs between a SIGSTOP and the SIGKILL (to lose its node's files)."""
    with started_group(command, env={**os.environ, **ENV, **(env or {})}) as process:
        # A hung job becomes a failure, not a hung test: the whole process group is killed.
        watchdog = threading.Timer(JOB_TIMEOUT, kill_group, (process.pid,))
        watchdog.start()
        try:
            lines, pending = _kill_while_reading(process, kills, while_stopped)
            process.wait()
            stderr = process.stderr.read()
        finally:
            watchdog.cancel()
    assert not pending, f"the job ended before every kill was made; stdout:\n{''.join(lines)}"
    return Job(process.returncode, "".join(lines), stderr)


def _kill_while_reading(
    process: subprocess.Popen, kills: list[tuple[int, float]], while_stopped: Callable[[int], None] | None
) -> tuple[list[str], list[tuple[int, float]]]:
    """Read the job's stdout, making each kill when its line appears; (the lines, the kills not made)."""
    lines: list[str] = []
    pids: list[int] = []
    pending = list(kills)
    for line in process.stdout:
        lines.append(line)
        started = STARTED.match(line)
        if started:
            pids = [int(pid) for pid in started.group(1).split(",")]
        if pending and (started or line.startswith("heat: recovered")):
            rank, delay = pending.pop(0)
            time.sleep(delay)
            if while_stopped is not None:
                os.kill(pids[rank], signal.SIGSTOP)
                while_stopped(rank)
            os.kill(pids[rank], signal.SIGKILL)
    return lines, pending


