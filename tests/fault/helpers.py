"""Helpers of the tests that launch real ``mpiexec`` jobs of the heat solver (tests/fault)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.heat_output import Finished
from tests.processes import run_group

JOB_TIMEOUT = 50  # seconds a job may run before its whole process group is killed
SOAK_ENV = "HPCKPT_FAULT_SOAK"  # `make soak`: this many times the seeded trials of `make test`


def seeds(count: int) -> range:
    """The seeds of a seeded fault test: ``count`` of them, times ``HPCKPT_FAULT_SOAK`` (``make soak``)."""
    return range(count * int(os.environ.get(SOAK_ENV, "1")))


def heat_command(
    ranks: int, run_dir: Path, *args: str, n: int = 96, iters: int = 120, every: int = 10
) -> list[str]:
    """``mpiexec`` of the heat solver on ``ranks`` ranks, checkpointing into ``run_dir``."""
    solver = [sys.executable, "-m", "hpckpt.examples.heat", "--n", str(n), "--iters", str(iters)]
    return ["mpiexec", "-n", str(ranks), *solver, "--every", str(every), "--dir", str(run_dir), *args]


def relaunched(command: list[str], max_restarts: int = 2) -> list[str]:
    """``command`` under ``hpckpt run``, relaunched at once up to ``max_restarts`` times."""
    hpckpt_run = [sys.executable, "-m", "hpckpt", "run", "--delay", "0", "--max-restarts", str(max_restarts)]
    return [*hpckpt_run, "--", *command]


def run(command: list[str], env: dict[str, str] | None = None) -> Finished:
    """Run ``command`` in its own process group (killed after JOB_TIMEOUT), ``env`` added to ours."""
    result = run_group(command, timeout=JOB_TIMEOUT, env={**os.environ, **(env or {})})
    return Finished(result.returncode, result.stdout, result.stderr)
