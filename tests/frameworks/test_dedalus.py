"""The framework how-to's worked example (docs/examples/dedalus_rbc.py), run against a real
Dedalus with real ``mpiexec``: Dedalus's 2-D Rayleigh-Benard convection, its solver
wrapped once as an hpckpt ``Stateful``. A rank killed mid-run and relaunched by
``hpckpt run`` ends bit for bit like the run without a failure; a step saved on 2 ranks
restores on 1, and both continue alike."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fault.helpers import JOB_TIMEOUT, relaunched
from tests.processes import run_group

if importlib.util.find_spec("dedalus") is None:
    pytest.skip("Dedalus is not installed (bash tools/install-dedalus.sh)", allow_module_level=True)

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "dedalus_rbc.py"
DONE = re.compile(r"^done: iteration=(\d+) sim_time=\S+ max_b=\S+ checksum=([0-9a-f]{16})$", re.MULTILINE)
RESUMED = re.compile(r"^resumed from iteration (\d+)$", re.MULTILINE)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def rbc(ranks: int, run_dir: Path, *args: str, relaunch: bool = False) -> subprocess.CompletedProcess:
    command = ["mpiexec", "-n", str(ranks), sys.executable, str(EXAMPLE), "--ckpt", str(run_dir), *args]
    result = run_group(relaunched(command) if relaunch else command, timeout=JOB_TIMEOUT, env=ENV)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def finished(result: subprocess.CompletedProcess) -> tuple[int | None, int, str]:
    """(the iteration it resumed from or None, the last iteration, the state's checksum)."""
    resumed = [int(found) for found in RESUMED.findall(result.stdout)]
    (iteration, checksum), = DONE.findall(result.stdout)
    return (resumed[-1] if resumed else None), int(iteration), checksum


def same_step(first: Path, second: Path, step: int) -> None:
    diff = run_group(
        [sys.executable, "-m", "hpckpt", "diff", "--step", str(step), str(first), str(second)],
        timeout=JOB_TIMEOUT,
    )
    assert diff.returncode == 0 and "SAME" in diff.stdout, diff.stdout + diff.stderr


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, str]:
    """A fault-free run on 2 ranks to iteration 200: its run directory and its checksum."""
    run_dir = tmp_path_factory.mktemp("dedalus") / "reference"
    resumed, iteration, checksum = finished(rbc(2, run_dir, "--iterations", "200"))
    assert (resumed, iteration) == (None, 200)
    return run_dir, checksum


def test_a_rank_killed_mid_run_resumes_bit_for_bit(reference, tmp_path):
    reference_dir, expected = reference
    crashed = rbc(2, tmp_path / "crashed", "--iterations", "200", "--crash-at", "130", relaunch=True)
    assert "attempt 1/3 failed" in crashed.stderr and "attempt 2/3 succeeded" in crashed.stderr
    # saves every 50 iterations: 100 is the newest committed before the kill at 130
    assert finished(crashed) == (100, 200, expected)
    same_step(reference_dir, tmp_path / "crashed", 200)  # fields, clock and SBDF2 history


def test_a_step_saved_on_2_ranks_restores_on_1_bit_for_bit(reference, tmp_path):
    reference_dir, expected = reference
    one = tmp_path / "one"
    shutil.copytree(reference_dir, one)
    assert finished(rbc(1, one, "--iterations", "200")) == (200, 200, expected)
    same_step(reference_dir, one, 200)  # re-saved by 1 rank: the state it restored, as saved
    two = tmp_path / "two"
    shutil.copytree(reference_dir, two)
    _, _, continued = finished(rbc(2, two, "--iterations", "250"))
    assert finished(rbc(1, one, "--iterations", "250")) == (200, 250, continued)
    same_step(two, one, 250)
