"""SIGKILL a rank of a real ``mpiexec`` job at random moments: at a save point, at an
iteration, or from outside. Each trial proves its kill landed (tests/fault/trials.py),
and the next run must resume from the newest step committed before it and end with
exactly the fault-free result, never restoring a torn step."""

from __future__ import annotations

import random

import pytest

from hpckpt.catalog import CheckpointReader
from tests.fault.helpers import heat_command, relaunched, run, seeds
from tests.fault.trials import MODES, SAVE_POINTS, first_attempt, newest_committed, seeded_first_attempt
from tests.helpers import BACKENDS

RANKS = 4


@pytest.mark.parametrize("seed", seeds(9))
def test_sigkill_at_random_moments_resumes_from_the_newest_committed_step(seed, tmp_path, reference_checksum):
    rng = random.Random(seed)
    run_dir = tmp_path / "ckpt"
    backend = BACKENDS[seed // 3 % len(BACKENDS)]  # seeds 0-8: every mode x backend
    command = heat_command(RANKS, run_dir, "--backend", backend)
    seeded_first_attempt(
        command, tmp_path, RANKS, rng, MODES[seed % 3], crash=("--crash-at-iter", "heat.iteration")
    )
    newest = newest_committed(run_dir)
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.resumed_from == newest and result.checksum == reference_checksum
    assert "CheckpointFallbackWarning" not in result.stderr  # a torn step is never committed


def test_uneven_rank_counts_match_the_reference(tmp_path, reference_checksum):
    for ranks in (3, 5):
        result = run(heat_command(ranks, tmp_path / f"ckpt{ranks}", n=97))
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.checksum == run(heat_command(1, tmp_path / f"ref{ranks}", n=97, every=0)).checksum


def test_error_inside_collective_io_aborts_with_a_message_and_resumes(tmp_path, reference_checksum):
    command = relaunched(heat_command(RANKS, tmp_path / "ckpt"))
    result = run(command, env={"HPCKPT_FAULT": "save.write:1:raise:3"})
    assert result.returncode == 0 and result.checksum == reference_checksum
    assert "in phase 'save step 30: write' during collective I/O; aborting the job" in result.stderr
    assert "InjectedFault: injected fault at save.write on rank 1" in result.stderr
    assert result.resumed_from == "20" and result.failed_attempts == 1


def test_error_in_commit_on_one_rank_reaches_every_rank(tmp_path, reference_checksum):
    result = run(
        relaunched(heat_command(RANKS, tmp_path / "ckpt")), env={"HPCKPT_FAULT": "save.commit:0:raise:5"}
    )
    assert result.returncode == 0 and result.checksum == reference_checksum
    assert "phase 'save step 50: commit' failed on rank(s) 0 of 4" in result.stderr
    assert result.resumed_from == "40" and result.failed_attempts == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_resuming_on_fewer_ranks_matches_the_reference(tmp_path, reference_98, backend):
    """4 ranks for the first half, 3 ranks to 3/4, then 2 ranks to the end (all uneven rows but 2)."""
    run_dir = tmp_path / backend
    for ranks, stop in ((4, 60), (3, 90)):
        result = run(heat_command(ranks, run_dir, "--backend", backend, "--stop-at-iter", str(stop), n=98))
        assert result.returncode == 0, result.stderr
        assert f"heat: stopped at iteration {stop} on {ranks} ranks" in result.stdout
    result = run(heat_command(2, run_dir, "--backend", backend, n=98))
    assert result.returncode == 0, result.stderr
    assert result.resumed_from == "90"
    assert result.checksum == reference_98


@pytest.mark.parametrize("seed", range(4))
def test_sigkill_with_non_blocking_saves_resumes_from_the_newest_committed_step(
    seed, tmp_path, reference_checksum
):
    """Kills while the background thread writes or commits a step."""
    rng = random.Random(500 + seed)
    run_dir = tmp_path / "ckpt"
    command = heat_command(RANKS, run_dir, "--async", "--backend", BACKENDS[seed % len(BACKENDS)])
    if seed % 2 == 0:
        fault = f"{rng.choice(SAVE_POINTS[1:])}:{rng.randrange(RANKS)}:kill:{rng.randint(1, 11)}"
        first_attempt(command, tmp_path, RANKS, rng, fault=fault)
    else:
        first_attempt(command, tmp_path, RANKS, rng)
    newest = newest_committed(run_dir)
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.resumed_from == newest and result.checksum == reference_checksum
    assert "CheckpointFallbackWarning" not in result.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_of_a_shard_leader_resumes_from_the_newest_committed_step(
    backend, tmp_path, reference_checksum, monkeypatch
):
    """Sharded manifests (from 2 ranks on here): rank 2, the leader of ranks 2-3, is killed
    before it writes its shard of step 40, which is then never committed; the next run
    resumes from step 30, whose two shards were written by ranks 0 and 2."""
    monkeypatch.setenv("HPCKPT_MANIFEST_SHARD_RANKS", "2")
    run_dir = tmp_path / "ckpt"
    command = heat_command(RANKS, run_dir, "--backend", backend)
    first_attempt(command, tmp_path, RANKS, random.Random(0), fault="save.shard:2:kill:4")
    assert newest_committed(run_dir) == "30"
    shards = CheckpointReader(run_dir).manifest(30).shards
    assert [(shard.file, shard.first, shard.stop) for shard in shards] == [
        ("manifest-shard-00000.json", 0, 2),
        ("manifest-shard-00002.json", 2, 4),
    ]
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.resumed_from == "30" and result.checksum == reference_checksum
    assert "CheckpointFallbackWarning" not in result.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_of_a_leader_merging_its_groups_plans_leaves_no_step_and_the_rerun_matches(
    backend, tmp_path, reference_checksum, monkeypatch
):
    """Plans merged in groups (from 2 ranks on here): rank 2, the leader of ranks 2-3, is
    killed before it merges their plans for step 10, the run's first save; nothing is
    committed, and the next run, whose first save merges in groups again, matches."""
    monkeypatch.setenv("HPCKPT_MANIFEST_SHARD_RANKS", "2")
    run_dir = tmp_path / "ckpt"
    command = heat_command(RANKS, run_dir, "--backend", backend)
    first_attempt(command, tmp_path, RANKS, random.Random(0), fault="save.merge:2:kill:1")
    assert newest_committed(run_dir) == "none"
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.resumed_from == "none" and result.checksum == reference_checksum
    # the rerun's saves were sharded
    assert CheckpointReader(run_dir).manifest(int(newest_committed(run_dir))).shards
