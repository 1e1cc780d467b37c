"""SIGKILL during incremental saves that reuse recycled files, on every backend.

The job (tests/jobs/frozen_job.py) saves every step with keep=1 and incremental=3: by
its 5th save, steps have been deleted and recycled and the step being written refers to
blocks of an earlier one. Rank 1 dies at each save phase of that save; ``hpckpt run``
relaunches; the result must equal the fault-free run bit for bit, and every step left
must verify.
"""

from __future__ import annotations

import re
import sys

import pytest

from tests.fault.conftest import relaunched, run

BACKENDS = ("hdf5", "adios2", "posix")
SAVE_PHASES = ("save.plan", "save.write", "save.commit", "save.retain")
DONE = re.compile(r"^frozen: done steps=(\d+) resumed_from=(\w+) checksum=([0-9a-f]{64})$", re.MULTILINE)


def frozen_job(run_dir, backend: str, ranks: int = 3, steps: int = 6) -> list[str]:
    return ["mpiexec", "-n", str(ranks), sys.executable, "-m", "tests.jobs.frozen_job", str(run_dir), backend, str(steps)]


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory) -> dict[str, str]:
    checksums = {}
    for backend in BACKENDS:
        result = run(frozen_job(tmp_path_factory.mktemp(f"free-{backend}"), backend))
        assert result.returncode == 0, result.stderr[-3000:]
        checksums[backend] = DONE.search(result.stdout).group(3)
    assert len(set(checksums.values())) == 1  # the backend does not change the result
    return checksums


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("phase", SAVE_PHASES)
def test_kill_during_an_incremental_save_into_recycled_files(tmp_path, fault_free, phase, backend):
    run_dir = tmp_path / "ckpt"
    result = run(relaunched(frozen_job(run_dir, backend)), env={"HPCKPT_FAULT": f"{phase}:1:kill:5"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.failed_attempts == 1
    done = DONE.search(result.stdout)
    assert done, result.stdout + result.stderr[-3000:]
    assert done.group(2) in ("4", "5")  # resumed from the newest committed step
    assert done.group(3) == fault_free[backend]
    verified = run([sys.executable, "-m", "hpckpt", "verify", str(run_dir)])
    assert verified.returncode == 0, verified.stdout + verified.stderr
