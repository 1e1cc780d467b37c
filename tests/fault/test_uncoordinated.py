"""The uncoordinated protocol under real SIGKILLs: each rank rolls back to its own checkpoint.

Heat solver trials kill a random rank at a random save point (while it saves), at a
random iteration, or from outside at a random moment (messages in flight); each trial
proves its kill landed, and the next run must resume from each rank's newest committed
step and end bit for bit equal to the fault-free run. The logged-app trials add
any-source receives and collectives and check the recorded order stays consistent.
"""

from __future__ import annotations

import random
import re
import sys

import pytest

from tests.fault.helpers import JOB_TIMEOUT, heat_command, run, seeds
from tests.fault.test_heat_faults import RANKS
from tests.fault.trials import (
    MODES,
    first_attempt,
    newest_committed_per_rank,
    seeded_first_attempt,
)
from tests.helpers import BACKENDS
from tests.processes import run_group

APP_DONE = re.compile(
    r"^app: done resumed_from=(\S+) checksum=([0-9a-f]{64}) consistent=(yes|no) log_peak=(\d+)$", re.M
)


def uncoordinated(run_dir, *args: str, **kwargs) -> list[str]:
    return heat_command(RANKS, run_dir, "--protocol", "uncoordinated", *args, **kwargs)


@pytest.mark.parametrize("seed", seeds(9))
def test_random_kills_resume_from_each_ranks_newest_committed_checkpoint(seed, tmp_path, reference_checksum):
    rng = random.Random(1000 + seed)
    run_dir = tmp_path / "ckpt"
    mode = MODES[seed % 3]
    command = uncoordinated(run_dir, "--backend", BACKENDS[seed // 3 % len(BACKENDS)])
    seeded_first_attempt(
        command, tmp_path, RANKS, rng, mode, crash=("--crash-at-iter", "heat.iteration"),
        first_kill=2, first_crash=25,
    )
    newest = newest_committed_per_rank(run_dir, RANKS)
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.resumed_from == newest and result.checksum == reference_checksum
    if mode != "external":  # the kill came after every rank's second checkpoint
        # each rank its own step
        assert "none" not in newest.split(",") and len(set(newest.split(","))) > 1, newest
    assert "CheckpointFallbackWarning" not in result.stderr


def app_command(run_dir, *args: str) -> list[str]:
    return ["mpiexec", "-n", str(RANKS), sys.executable, "-m", "tests.jobs.logged_app", str(run_dir), *args]


@pytest.fixture(scope="module")
def app_reference(tmp_path_factory) -> str:
    completed = run_group(app_command(tmp_path_factory.mktemp("app") / "clean"), timeout=JOB_TIMEOUT)
    match = APP_DONE.search(completed.stdout)
    assert match and match.group(3) == "yes", completed.stdout + completed.stderr[-3000:]
    return match.group(2)


@pytest.mark.parametrize("seed", range(6))
def test_any_source_and_collectives_recover_consistently(seed, tmp_path, app_reference):
    rng = random.Random(2000 + seed)
    run_dir = tmp_path / "ckpt"
    command = app_command(run_dir, "--backend", BACKENDS[seed % len(BACKENDS)])
    if seed % 2:
        first_attempt(command, tmp_path, RANKS, rng)
    else:
        rank, iteration = rng.randrange(RANKS), rng.randint(8, 59)
        landed = first_attempt(command + ["--crash", f"{rank}:{iteration}"], tmp_path, RANKS, rng, crash=True)
        assert (landed.where, landed.rank) == (f"app.iteration.{iteration}", rank)
    newest = newest_committed_per_rank(run_dir, RANKS)
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    match = APP_DONE.search(result.stdout)
    assert match, result.stdout + result.stderr[-3000:]
    assert (match.group(1), match.group(2)) == (newest, app_reference)
    assert match.group(3) == "yes"  # the any-source order rank 0 re-executed is the one others consumed


def test_the_message_log_stays_bounded(tmp_path, reference_checksum):
    iters, every, keep, n = 400, 10, 3, 96
    result = run(uncoordinated(tmp_path / "ckpt", "--keep", str(keep), iters=iters, every=every, n=n))
    assert result.returncode == 0, result.stderr[-3000:]
    peak = int(re.search(r"^heat: message log peak (\d+) bytes", result.stdout, re.M).group(1))
    message = n * 8  # one halo row
    # A rank keeps, per neighbour, the rows sent since that neighbour's oldest kept
    # checkpoint: at most (keep + 2) * every of them (checkpoints are staggered).
    assert 0 < peak <= 2 * (keep + 2) * every * message
    assert peak < 2 * iters * message / 4  # far below an untrimmed log
