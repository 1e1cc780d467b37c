"""Committed steps survive a power loss of every node, on every backend and protocol.

Each trial runs the heat solver on 2 lab nodes (2 ranks each, so every save writes from
two nodes' caches into shared files), stops one rank at a seeded save point, cuts the
power of both nodes (their caches and unsynced writes are lost), checks what the disk
holds, relaunches on fresh nodes and checks the result. Asserted every time: the fault
landed (the rank, its node, the point and the occurrence the fault log names); every
step committed before the fault is still committed and verifies block by block on the
disk; the relaunch restores exactly the newest of them, with no fallback, and ends bit
for bit equal to the fault-free run.

The same matrix runs on a real distributed file system, MooseFS (tests/lab/moosefs.py):
there the power loss kills the nodes' clients with their write caches, and in one trial
per backend also a chunkserver with what it had not fsync'd. The run directory's lock
is held by a dead client's session there. On both, the relaunch on fresh nodes waits out
the lock's lease (a short one in the lab, ``HPCKPT_LOCK_LEASE``) and takes it over.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

from hpckpt.catalog import CheckpointReader
from hpckpt.storage.commit import RunDirectory
from tests.heat_output import Finished
from tests.helpers import BACKENDS
from tests.lab.helpers import heat

RANKS = 4
# Save points where the power may go: every phase of a save, and inside rank 0's commit.
POINTS = ("save.plan", "save.write", "save.sync", "save.commit", "commit.rename", "save.retain")
RANK0_POINTS = {"commit.rename"}


def run_dirs(disk: Path, protocol: str) -> dict[str, Path]:
    """The run directories of a heat job: one, or one per rank (uncoordinated)."""
    root = disk / "ckpt"
    if protocol == "coordinated":
        return {"all": root}
    return {str(rank): root / f"rank-{rank:05d}" for rank in range(RANKS)}


def committed(disk: Path, protocol: str) -> dict[str, list[int]]:
    return {key: RunDirectory(path).committed_steps() for key, path in run_dirs(disk, protocol).items()}


def expected_resume(steps: dict[str, list[int]], protocol: str) -> str:
    newest = [str(found[-1]) if found else "none" for found in steps.values()]
    return newest[0] if protocol == "coordinated" else ",".join(newest)


def fault_of(seed: int, protocol: str, keep: int = 100) -> tuple[str, int, int]:
    """A seeded fault: (point, rank, occurrence). With ``keep=2`` it comes at the 4th save
    or later, once saves write into the files recycled from deleted steps."""
    rng = random.Random(seed)
    point = rng.choice(POINTS)
    rank = 0 if point in RANK0_POINTS else rng.randrange(RANKS)
    first = 4 if keep == 2 else 2 if protocol == "coordinated" else 3  # something committed everywhere before
    return point, rank, rng.randint(first, 5)


CASES = [
    pytest.param(
        backend,
        protocol,
        blocking,
        keep,
        id=f"{backend}-{protocol}-{'blocking' if blocking else 'async'}-keep{keep}",
    )
    for backend in BACKENDS
    for protocol in ("coordinated", "uncoordinated")
    for blocking in (True, False)
    for keep in (2, 100)  # 2: later saves write into recycled files; 100: always new files
    if not (protocol == "uncoordinated" and not blocking)  # the uncoordinated protocol saves blocking only
]


SOAK = int(os.environ.get("HPCKPT_LAB_SOAK", "0"))  # `make soak`: more seeded trials
# `make test` runs a third of the matrix on MooseFS, per backend: coordinated blocking into
# recycled files, uncoordinated into new files, and non-blocking (into new files on posix,
# into recycled ones on the others, which also lose chunkserver 1); `make soak` all of it
MOOSEFS_IN_MAKE_TEST = {
    *(f"{backend}-{case}" for backend in BACKENDS
      for case in ("coordinated-blocking-keep2", "uncoordinated-blocking-keep100")),
    "posix-coordinated-async-keep100", "hdf5-coordinated-async-keep2", "adios2-coordinated-async-keep2",
}
MOOSEFS_CASES = [
    pytest.param(*case.values, case.values[0] == "posix" or case.id.endswith("async-keep2"), id=case.id)
    for case in CASES
    if SOAK or case.id in MOOSEFS_IN_MAKE_TEST
]


@pytest.mark.parametrize("backend, protocol, blocking, keep, lose_server", MOOSEFS_CASES)
def test_committed_steps_survive_a_power_loss_on_moosefs(
    moosefs_lab, heat_reference, backend, protocol, blocking, keep, lose_server
):
    """The matrix on MooseFS; with ``lose_server`` chunkserver 1 loses power too (every
    chunk has a second copy on chunkserver 2)."""
    seed = sum(map(ord, f"moosefs{backend}{protocol}{blocking}{keep}"))
    power_loss_trial(
        moosefs_lab, heat_reference, backend, protocol, blocking, keep, seed,
        lose_server=lose_server,
    )



@pytest.mark.parametrize("backend, protocol, blocking, keep", CASES)
def test_committed_steps_survive_a_power_loss(lab, heat_reference, backend, protocol, blocking, keep):
    seed = sum(map(ord, f"{backend}{protocol}{blocking}{keep}"))
    power_loss_trial(lab, heat_reference, backend, protocol, blocking, keep, seed)


if SOAK:  # collected only for `make soak`

    @pytest.mark.parametrize("trial", range(SOAK))
    def test_soak_power_loss(lab, heat_reference, trial):
        """``make soak``: seeded trials over the whole matrix."""
        case = random.Random(trial).choice(CASES).values
        power_loss_trial(lab, heat_reference, *case, seed=10_000 + trial)


# shards of ranks 0-1 (written on node1) and 2-3 (by rank 2, on node2)
SHARDED = {"HPCKPT_MANIFEST_SHARD_RANKS": "2"}


@pytest.mark.parametrize(
    "backend, blocking", [("hdf5", True), ("adios2", True), ("posix", True), ("posix", False)]
)
def test_sharded_manifests_survive_a_power_loss(lab, heat_reference, backend, blocking):
    """Rank 2, the leader of node2's ranks, stops before writing its shard of the third
    save; the two committed steps' second shards went through node2's cache only."""
    steps = power_loss_trial(
        lab, heat_reference, backend, "coordinated", blocking, 100, 0, ("save.shard", 2, 3), SHARDED
    )
    reader = CheckpointReader(lab.disk / "ckpt")
    assert steps == [10, 20] and all(
        [shard.file for shard in reader.manifest(step).shards]
        == ["manifest-shard-00000.json", "manifest-shard-00002.json"]
        for step in steps
    )


def power_loss_trial(
    lab,
    heat_reference,
    backend: str,
    protocol: str,
    blocking: bool,
    keep: int,
    seed: int,
    fault: tuple[str, int, int] | None = None,
    env: dict[str, str] | None = None,
    lose_server: bool = False,
) -> list[int]:
    """One trial (see the module docstring), with a seeded ``fault`` unless one is given;
    the steps committed before the fault (of rank 0's directory when uncoordinated).
    With ``lose_server``, MooseFS chunkserver 1 loses power with the nodes."""
    point, rank, nth = fault or fault_of(seed, protocol, keep)
    options = ["--backend", backend, "--protocol", protocol, "--keep", str(keep)]
    options += [] if blocking else ["--async"]
    log = lab.root / "faults.log"
    job = lab.start(
        lab.mpiexec(heat("ckpt", *options)),
        env={**(env or {}), "HPCKPT_FAULT": f"{point}:{rank}:stop:{nth}", "HPCKPT_FAULT_LOG": str(log)},
    )
    stopped = job.wait_stopped()
    assert (stopped.rank, stopped.node) == (rank, f"node{rank // 2 + 1}")
    assert log.read_text().split() == [point, str(rank), "stop", str(nth), str(stopped.node_pid)]
    before = committed(lab.disk, protocol)
    lab.power_loss(rank=rank, point=point)
    if lose_server:
        lab.lose_data_server(1)
    job.kill()
    after = committed(lab.disk, protocol)
    assert [event.kind for event in lab.events] == ["power loss"] + ["data server loss"] * lose_server
    for key, steps in before.items():
        assert steps, f"the fault came before any step was committed ({key}): it tests nothing"
        if keep == 2:
            assert steps[0] > 10, f"no step was deleted yet, so no recycled files were written into: {steps}"
        assert set(steps) <= set(after[key]), (
            f"committed steps were lost by the power loss: {before} -> {after}"
        )
        if protocol == "coordinated":
            # Nobody commits while a rank is stopped before the sync phase's agreement. Past
            # it (a rank stopped at save.commit), every rank's data is durable and rank 0
            # commits alone: the step being saved may be committed after `before` was read.
            newer = sorted(set(after[key]) - set(steps))
            may_commit = point == "save.commit" and rank != 0
            assert newer == [] or (may_commit and len(newer) == 1 and newer[0] > steps[-1]), (
                f"a step was committed while rank {rank} was stopped at {point}: {before} -> {after}"
            )
    for key, path in run_dirs(lab.disk, protocol).items():
        reader = CheckpointReader(path)
        for step in after[key]:
            assert reader.verify(step) == [], (
                f"committed step {step} of {path} is damaged after the power loss"
            )

    relaunch = lab.run(lab.mpiexec(heat("ckpt", *options)), env=env)
    result = Finished(relaunch.returncode, relaunch.stdout, relaunch.stderr)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.resumed_from == expected_resume(after, protocol)
    assert "CheckpointFallbackWarning" not in result.stderr
    assert result.checksum == heat_reference
    assert_lock_taken(lab, result.stderr)
    return next(iter(before.values()))


def assert_lock_taken(lab, stderr: str) -> None:
    """The relaunch after a power loss took rank 0's lock (at the run directory's root for
    both protocols) without anyone's help. MooseFS keeps the dead client's flock: the lease
    is waited out and the lock taken over with one warning. On nodecache the fresh node's
    PID namespace may have the dead one's identity (the kernel reuses its inode number),
    where the holder's process is provably gone and the lock is taken at once."""
    takeovers = stderr.count("took over its lock")
    assert takeovers == 1 if lab.moosefs is not None else takeovers <= 1, stderr[-3000:]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_killed_rank_is_relaunched_from_the_newest_committed_step(lab, heat_reference, backend):
    """A rank SIGKILLed at a seeded save point; ``hpckpt run`` relaunches the job once."""
    point, rank, nth = fault_of(sum(map(ord, f"kill{backend}")), "coordinated")
    log = lab.root / "faults.log"
    command = [
        sys.executable, "-m", "hpckpt", "run", "--delay", "0", "--max-restarts", "1", "--",
        *lab.mpiexec(heat("ckpt", "--backend", backend)),
    ]
    job = lab.start(command, env={"HPCKPT_FAULT": f"{point}:{rank}:stop:{nth}", "HPCKPT_FAULT_LOG": str(log)})
    stopped = job.wait_stopped()
    assert (stopped.rank, stopped.node) == (rank, f"node{rank // 2 + 1}")
    assert log.read_text().split() == [point, str(rank), "stop", str(nth), str(stopped.node_pid)]
    newest = committed(lab.disk, "coordinated")["all"][-1]
    job.kill_rank(stopped, point=point)
    job.finish(90)
    result = Finished(job.returncode, job.stdout, job.stderr)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.failed_attempts == 1
    assert result.resumed_from == str(newest)
    assert "CheckpointFallbackWarning" not in result.stderr
    assert result.checksum == heat_reference
