"""Helpers for tests that launch real ``mpiexec`` jobs of the heat solver."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.heat_output import Finished
from tests.processes import run_group

if shutil.which("mpiexec") is None:
    pytest.skip("mpiexec is not installed (run `make install`)", allow_module_level=True)

JOB_TIMEOUT = 50


def heat_command(ranks: int, run_dir: Path, *args: str, n: int = 96, iters: int = 120, every: int = 10) -> list[str]:
    return [
        "mpiexec", "-n", str(ranks), sys.executable, "-m", "hpckpt.examples.heat",
        "--n", str(n), "--iters", str(iters), "--every", str(every), "--dir", str(run_dir), *args,
    ]  # fmt: skip


def relaunched(command: list[str], max_restarts: int = 2) -> list[str]:
    return [sys.executable, "-m", "hpckpt", "run", "--delay", "0", "--max-restarts", str(max_restarts), "--", *command]


def run(command: list[str], env: dict[str, str] | None = None) -> Finished:
    result = run_group(command, timeout=JOB_TIMEOUT, env={**os.environ, **(env or {})})
    return Finished(result.returncode, result.stdout, result.stderr)


@pytest.fixture(scope="session")
def reference_checksum(tmp_path_factory) -> str:
    """The fault-free result, computed on one rank without checkpoints."""
    result = run(heat_command(1, tmp_path_factory.mktemp("reference"), every=0))
    assert result.returncode == 0, result.stderr
    return result.checksum


@pytest.fixture(scope="session")
def reference_98(tmp_path_factory) -> str:
    """The fault-free result for N = 98 (uneven rows on 3 and 4 ranks), on one rank."""
    result = run(heat_command(1, tmp_path_factory.mktemp("reference98"), n=98, every=0))
    assert result.returncode == 0, result.stderr
    return result.checksum
