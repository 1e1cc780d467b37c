"""Every logged operation through an in-job repair (uncoordinated protocol, 4 ranks):
tests/jobs/logged_app.py runs Sendrecv, Isend/Irecv with Waitall, any-source receives
(recorded determinants), Bcast, Allreduce, Reduce and Barrier each iteration. A rank is
SIGKILLed; only it goes back to its own checkpoint, and the job ends with the checksum
of a run without failures and a consistent any-source history."""

from __future__ import annotations

import random
import re
import sys

import pytest

from tests.ulfm.helpers import MPIEXEC, ULFM_FLAGS, run_job, run_killing

APP_DONE = re.compile(
    r"^app: done resumed_from=(\S+) checksum=([0-9a-f]{64}) consistent=(yes|no) log_peak=(\d+)$", re.M
)


def app_command(run_dir, *args: str, ft: bool = True) -> list[str]:
    launcher = [str(MPIEXEC), *(ULFM_FLAGS if ft else ["--oversubscribe"]), "-n", "4"]
    return [*launcher, sys.executable, "-m", "tests.jobs.logged_app", str(run_dir), "--iters", "60", *args]


@pytest.fixture(scope="module")
def app_reference(tmp_path_factory) -> str:
    job = run_job(app_command(tmp_path_factory.mktemp("app") / "clean", ft=False))
    match = APP_DONE.search(job.stdout)
    assert job.returncode == 0 and match and match.group(3) == "yes", job.stdout + job.stderr[-2000:]
    return match.group(2)


@pytest.mark.parametrize("seed", range(4))
def test_every_logged_operation_survives_a_kill_in_job(seed, tmp_path, app_reference):
    rng = random.Random(200 + seed)
    rank = seed % 4  # rank 0 is the any-source receiver
    job = run_killing(
        app_command(tmp_path / "run", "--ulfm", "--pace", "0.02"), [(rank, rng.uniform(0.1, 0.8))]
    )
    match = APP_DONE.search(job.stdout)
    output = f"exit status {job.returncode}; stdout:\n{job.stdout}\nstderr:\n{job.stderr[-3000:]}"
    assert job.returncode == 0 and match, output
    assert match.group(2) == app_reference, output
    assert match.group(3) == "yes", output
    resumed = match.group(1).split(",")
    assert [value for index, value in enumerate(resumed) if index != rank] == ["none"] * 3, output
