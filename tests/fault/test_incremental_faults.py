"""SIGKILL during incremental saves that reuse recycled files, on every backend.

The job (tests/jobs/frozen_job.py) saves every step with keep=1 and incremental=3: by
its 5th save, steps have been deleted and recycled and the step being written refers to
blocks of an earlier one. Rank 1 dies at each save phase of that save; ``hpckpt run``
relaunches; the result must equal the fault-free run bit for bit, and every step left
must verify.
"""

from __future__ import annotations

import random
import re
import sys

import pytest

from hpckpt.catalog import CheckpointReader
from tests.fault.helpers import relaunched, run
from tests.fault.trials import first_attempt, newest_committed
from tests.helpers import BACKENDS

SAVE_PHASES = ("save.plan", "save.write", "save.commit", "save.retain")
DONE = re.compile(r"^frozen: done steps=(\d+) resumed_from=(\w+) checksum=([0-9a-f]{64})$", re.MULTILINE)


def frozen_job(run_dir, backend: str, ranks: int = 3, steps: int = 6) -> list[str]:
    return [
        "mpiexec", "-n", str(ranks), sys.executable, "-m", "tests.jobs.frozen_job",
        str(run_dir), backend, str(steps),
    ]


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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("phase", ["save.merge", "save.shard"])
def test_kill_of_a_leader_during_an_incremental_save_in_groups(
    tmp_path, fault_free, phase, backend, monkeypatch
):
    """Sharded from 2 ranks on: 3 ranks make the groups 0-1 and 2. Rank 2, a leader, dies
    in the 5th save (an incremental step) as it compares its group's blocks with its
    shard of step 4, or before it writes its shard of step 5: step 4 stays the newest,
    the rerun resumes from it and matches the fault-free run, and its incremental steps
    are sharded and list the step they read (step 6 writes its head, reads step 4's
    frozen array)."""
    monkeypatch.setenv("HPCKPT_MANIFEST_SHARD_RANKS", "2")
    run_dir = tmp_path / "ckpt"
    first_attempt(frozen_job(run_dir, backend), tmp_path, 3, random.Random(0), fault=f"{phase}:2:kill:5")
    assert newest_committed(run_dir) == "4"
    result = run(frozen_job(run_dir, backend))
    assert result.returncode == 0, result.stderr[-3000:]
    done = DONE.search(result.stdout)
    assert done and done.group(2) == "4" and done.group(3) == fault_free[backend], (
        result.stdout + result.stderr[-3000:]
    )
    newest = CheckpointReader(run_dir).manifest(6)
    # the frozen array, from step 4
    assert newest.shards and newest.in_steps == (4,) and newest.delta_base == 5
    verified = run([sys.executable, "-m", "hpckpt", "verify", str(run_dir)])
    assert verified.returncode == 0, verified.stdout + verified.stderr
