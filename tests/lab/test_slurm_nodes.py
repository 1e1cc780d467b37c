"""Slurm across lab nodes: one slurmd per node; a 2-node job loses a node and is requeued.

The heat job (``jobs/heat.sbatch``, ``srun --mpi=pmi2``, ``#SBATCH --requeue``) runs
2 ranks on each of 2 lab nodes. Rank 3 (node2) stops at its 3rd save; node2 is lost
(its processes, its slurmd, its cache); slurmctld declares it DOWN and the job
NODE_FAIL, and requeues it; a fresh node2 with a new slurmd returns to service; the
requeued job restores the newest step committed before the loss and ends bit for bit.
On MooseFS node1 is lost instead, with rank 0 and the run lock: the master keeps the
dead client's ``flock``, and the requeued job takes the lock over after its lease.
"""

from __future__ import annotations

import json
import time

import pytest

from hpckpt.storage.commit import RunDirectory
from hpckpt.storage.lock import LOCK_NAME
from tests.lab.cluster import UCX_NO_DISCONNECT
from tests.slurm.cluster import unavailable
from tests.slurm.helpers import heat_reference, submit

PACED = ("--n", "96", "--iters", "300", "--every", "20", "--pace", "0.02")


@pytest.fixture
def lab_slurm(lab_factory, tmp_path, filesystem):
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    from tests.lab.slurm import LabSlurm

    lab = lab_factory(2, filesystem)
    cluster = LabSlurm(lab, tmp_path / "slurm").start()
    yield lab, cluster
    cluster.stop()


@pytest.mark.parametrize("filesystem, victim", [("nodecache", "node2"), ("moosefs", "node1")])
def test_a_lost_node_fails_the_job_which_is_requeued_and_ends_bit_for_bit(
    lab_slurm, tmp_path, filesystem, victim
):
    lab, cluster = lab_slurm
    rank = 3 if victim == "node2" else 1
    reference = heat_reference(tmp_path / "reference", *PACED[:4])
    log = tmp_path / "faults.log"
    env = {
        "HPCKPT_RUN_DIR": str(lab.pfs / "ckpt"),
        "HEAT_ARGS": " ".join(PACED + ("--backend", "posix")),
        "UCX_TLS": "tcp",
        "UCX_NET_DEVICES": "lo",
        "LD_PRELOAD": str(UCX_NO_DISCONNECT),
        "HPCKPT_FAULT": f"save.plan:{rank}:stop:3",
        "HPCKPT_LOCK_LEASE": "3",
        "HPCKPT_FAULT_LOG": str(log),
    }
    job = submit(
        cluster, "heat.sbatch", tmp_path / "work", "-N", "2", "--ntasks-per-node", "2", "--requeue", env=env
    )
    deadline = time.monotonic() + 60
    while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert log.read_text().split()[:4] == ["save.plan", str(rank), "stop", "3"], job.report()
    newest = RunDirectory(lab.disk / "ckpt").committed_steps()[-1]
    assert newest == 40
    lab.lose_node(victim, rank=rank, point="save.plan")
    job.wait_until(lambda fields: int(fields["Restarts"]) >= 1, 60, "requeued")
    cluster.start_slurmd(victim)
    job.wait_completed(120)
    controller_log = (cluster.root / "log" / "slurmctld.log").read_text()
    assert f"requeue job JobId={job.job_id} due to failure of node {victim}" in controller_log, job.report()
    assert job.show()["Restarts"] == "1"
    resumed_from, checksum = job.heat_done()
    assert resumed_from == str(newest)
    assert checksum == reference
    # the requeued job's lock: taken over (no flock: MooseFS's master kept the dead client's)
    # or taken at once where rank 0's node lived on
    record = json.loads((lab.disk / "ckpt" / LOCK_NAME).read_text())
    assert (record["state"], record["flock"]) == ("released", filesystem == "nodecache")
