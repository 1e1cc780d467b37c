"""max_staging_bytes: the host memory of non-blocking saves stays within the budget, as the
kernel measures it (tests/jobs/staging_budget.py: the rise of each rank's peak resident
memory over the saves), and the same job without a budget shows the copies it bounds."""

import json
import sys

from hpckpt.storage.direct import BOUNCE_BYTES
from tests.processes import run_group

MIB = 1 << 20
CHUNK_KIB = BOUNCE_BYTES // 1024  # one chunk of the write path's bounce buffers


def staging(tmp_path, name: str, *args: str) -> dict:
    job = [sys.executable, "-m", "tests.jobs.staging_budget", str(tmp_path / name), *args]
    command = ["mpiexec", "-n", "2", *job]
    ran = run_group(command, timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    line = next(line for line in ran.stdout.splitlines() if line.startswith("staging: "))
    report = json.loads(line.removeprefix("staging: "))
    assert all(rank["same"] for rank in report["ranks"]), report  # the newest step restores bit for bit
    return report


def test_a_state_four_times_the_budget_is_saved_without_staging_it(tmp_path):
    unbounded = staging(tmp_path, "free", "--state-mib", "64")
    assert all(rank["rise_kib"] >= 60 * 1024 for rank in unbounded["ranks"]), unbounded  # one copy of 64 MiB
    bounded = staging(tmp_path, "budget", "--state-mib", "64", "--budget-mib", "16")
    for rank in bounded["ranks"]:
        assert rank["rise_kib"] <= 16 * 1024 + CHUNK_KIB, bounded
        assert rank["saves_over_budget"] == 1 and rank["staging_peak_bytes"] == 0
    assert bounded["steps"] == [0, 1]


def test_saves_in_flight_share_the_budget(tmp_path):
    """Three saves of 8 MiB queued at once (max_in_flight=3): three copies without a budget,
    within 12 MiB with one (each snapshot waits for the one before to give its buffers back)."""
    unbounded = staging(tmp_path, "free", "--state-mib", "8", "--in-flight", "3", "--saves", "3")
    assert all(rank["rise_kib"] >= 22 * 1024 for rank in unbounded["ranks"]), unbounded
    bounded = staging(tmp_path, "budget", "--state-mib", "8", "--budget-mib", "12", "--in-flight", "3",
                      "--saves", "3")
    for rank in bounded["ranks"]:
        assert rank["rise_kib"] <= 12 * 1024 + CHUNK_KIB, bounded
        assert rank["staging_peak_bytes"] <= 12 * MIB and rank["saves_over_budget"] == 0
    assert bounded["steps"] == [2, 3]
