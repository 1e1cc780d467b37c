"""Hundreds of non-blocking saves between the application's own MPI calls never hang.

The bench hang (../shared/evidence/bench-hang): a background ADIOS2 save held the GIL in
an MPI gather while the application thread of the other rank held it in mpi4py's
context duplication. tests/jobs/background_stress.py makes that pattern at every save,
on every backend; a hang is a timeout, and the timeout kills the whole job.
"""

import sys

import pytest

from tests.helpers import BACKENDS
from tests.processes import run_group

SAVES = 150
STRESS_TIMEOUT = 120


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_blocking_saves_between_application_collectives_never_hang(tmp_path, backend):
    command = [
        "mpiexec", "-n", "2", sys.executable, "-m", "tests.jobs.background_stress",
        str(tmp_path / "run"), backend, str(SAVES), "7",
    ]
    result = run_group(command, timeout=STRESS_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == f"stress: {SAVES} saves, restored step {SAVES}"
