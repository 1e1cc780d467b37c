"""In-job recovery: ranks of a running heat solver are SIGKILLed; the survivors repair the
communicator, a replacement takes each lost rank's place, and the job ends with the
fault-free checksum, the survivors' processes unchanged."""

from __future__ import annotations

import random
import shutil

import pytest

from tests.ulfm.helpers import heat_command, run_job, run_killing


def assert_recovered(job, reference: str, killed: list[int]) -> None:
    output = f"exit status {job.returncode}; stdout:\n{job.stdout}\nstderr:\n{job.stderr[-3000:]}"
    assert job.returncode == 0, output
    assert job.checksum == reference, output
    assert [ranks for ranks, _ in job.recoveries] == [[rank] for rank in killed], output
    started, finished = job.pids("started"), job.pids("finished")
    for rank, (before, after) in enumerate(zip(started, finished)):
        if rank in killed:
            assert after != before  # a replacement process
        else:
            assert after == before  # the survivors were never restarted


@pytest.mark.parametrize("seed", range(10))
def test_sigkill_at_a_random_moment_recovers_in_job_bit_for_bit(seed, tmp_path, reference_checksum):
    rng = random.Random(seed)
    rank, delay = rng.randrange(3), rng.uniform(0.05, 1.2)
    job = run_killing(heat_command(3, tmp_path / "run", "--recovery", "ulfm"), [(rank, delay)])
    assert_recovered(job, reference_checksum, [rank])


def test_two_failures_in_one_run(tmp_path, reference_checksum):
    job = run_killing(heat_command(3, tmp_path / "run", "--recovery", "ulfm"), [(2, 0.3), (0, 0.4)])
    assert_recovered(job, reference_checksum, [2, 0])


@pytest.mark.parametrize(
    "fault", ["save.plan:0:kill:2", "save.write:1:kill:3", "save.commit:0:kill:2", "save.retain:2:kill:4"]
)
def test_a_failure_during_a_checkpoint(fault, tmp_path, reference_checksum):
    job = run_job(
        heat_command(3, tmp_path / "run", "--recovery", "ulfm", pace=0.002), env={"HPCKPT_FAULT": fault}
    )
    rank = int(fault.split(":")[1])
    assert_recovered(job, reference_checksum, [rank])


def test_a_failure_before_the_first_checkpoint_starts_over(tmp_path, reference_checksum):
    job = run_job(
        heat_command(3, tmp_path / "run", "--recovery", "ulfm", "--crash-at-iter", "7", "--crash-rank", "1")
    )
    assert_recovered(job, reference_checksum, [1])
    assert "resumed from step None (iteration 0)" in job.stdout


def test_without_failure_detection_the_job_stops_with_a_clear_error(tmp_path):
    job = run_job(heat_command(2, tmp_path / "run", "--recovery", "ulfm", ft=False, iters=5))
    assert job.returncode != 0
    assert "UlfmUnavailableError: recovery='ulfm': Open MPI's failure detection is off; start the job with " \
        "`mpiexec --with-ft ulfm" in job.stderr


def test_a_lost_node_is_restored_from_the_partner_copy(tmp_path, reference_checksum):
    """Each rank is its own node (HPCKPT_RANKS_PER_NODE=1) with a partner copy of its
    node-local checkpoints on the next node. Rank 1's node-local files are deleted while it
    is stopped, then it is killed: its replacement gets its step from rank 2's copy."""
    local = tmp_path / "local"

    def lose_node(rank: int) -> None:
        shutil.rmtree(local / f"node-{rank:04d}")

    command = heat_command(
        3, tmp_path / "run", "--recovery", "ulfm", "--local", str(local), "--redundancy", "partner"
    )
    job = run_killing(command, [(1, 0.6)], env={"HPCKPT_RANKS_PER_NODE": "1"}, while_stopped=lose_node)
    assert_recovered(job, reference_checksum, [1])
    assert "from the node-local level" in job.stdout.split("heat: recovered", 1)[1].splitlines()[0]


def assert_only_the_lost_rank_rolled_back(job, killed: int) -> None:
    resumed = job.resumed_from.split(",")
    assert [value for rank, value in enumerate(resumed) if rank != killed] == ["none", "none"], job.stdout
    assert "the survivors went on at iteration" in job.stdout


@pytest.mark.parametrize("seed", range(5))
def test_uncoordinated_only_the_lost_rank_rolls_back(seed, tmp_path, reference_checksum):
    """Uncoordinated protocol: the survivors repair inside the logged communicator and go
    on where they were (they never restore); the replacement restores its own newest
    checkpoint, and the survivors replay the logged messages it lacks."""
    rng = random.Random(100 + seed)
    rank, delay = rng.randrange(3), rng.uniform(0.05, 1.2)
    command = heat_command(3, tmp_path / "run", "--recovery", "ulfm", "--protocol", "uncoordinated")
    job = run_killing(command, [(rank, delay)])
    assert_recovered(job, reference_checksum, [rank])
    assert_only_the_lost_rank_rolled_back(job, rank)


def test_uncoordinated_failure_during_a_rank_checkpoint(tmp_path, reference_checksum):
    command = heat_command(
        3, tmp_path / "run", "--recovery", "ulfm", "--protocol", "uncoordinated", pace=0.002
    )
    job = run_job(command, env={"HPCKPT_FAULT": "save.write:2:kill:3"})
    assert_recovered(job, reference_checksum, [2])
    assert_only_the_lost_rank_rolled_back(job, 2)


def test_uncoordinated_two_failures(tmp_path, reference_checksum):
    command = heat_command(3, tmp_path / "run", "--recovery", "ulfm", "--protocol", "uncoordinated")
    job = run_killing(command, [(0, 0.3), (2, 0.4)])
    assert_recovered(job, reference_checksum, [0, 2])
    assert job.resumed_from.split(",")[1] == "none"  # rank 1 survived both
