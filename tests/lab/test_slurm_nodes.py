"""Slurm across lab nodes: one slurmd per node; a 2-node job loses a node and is requeued.

The heat job (``jobs/heat.sbatch``, ``srun --mpi=pmi2``, ``#SBATCH --requeue``) runs
2 ranks on each of 2 lab nodes. Rank 3 (node2) stops at its 3rd save; node2 is lost
(its processes, its slurmd, its cache); slurmctld declares it DOWN and the job
NODE_FAIL, and requeues it; a fresh node2 with a new slurmd returns to service; the
requeued job restores the newest step committed before the loss and ends bit for bit.
"""

from __future__ import annotations

import time

import pytest

from hpckpt.storage.commit import RunDirectory
from tests.lab.cluster import UCX_NO_DISCONNECT
from tests.slurm.cluster import unavailable
from tests.slurm.helpers import heat_reference, submit

PACED = ("--n", "96", "--iters", "300", "--every", "20", "--pace", "0.02")


@pytest.fixture
def lab_slurm(lab_factory, tmp_path):
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    from tests.lab.slurm import LabSlurm

    lab = lab_factory(2)
    cluster = LabSlurm(lab, tmp_path / "slurm").start()
    yield lab, cluster
    cluster.stop()


def test_a_lost_node_fails_the_job_which_is_requeued_and_ends_bit_for_bit(lab_slurm, tmp_path):
    lab, cluster = lab_slurm
    reference = heat_reference(tmp_path / "reference", *PACED[:4])
    log = tmp_path / "faults.log"
    env = {
        "HPCKPT_RUN_DIR": str(lab.pfs / "ckpt"),
        "HEAT_ARGS": " ".join(PACED + ("--backend", "posix")),
        "UCX_TLS": "tcp",
        "UCX_NET_DEVICES": "lo",
        "LD_PRELOAD": str(UCX_NO_DISCONNECT),
        "HPCKPT_FAULT": "save.plan:3:stop:3",
        "HPCKPT_FAULT_LOG": str(log),
    }
    job = submit(
        cluster, "heat.sbatch", tmp_path / "work", "-N", "2", "--ntasks-per-node", "2", "--requeue", env=env
    )
    deadline = time.monotonic() + 60
    while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert log.read_text().split()[:4] == ["save.plan", "3", "stop", "3"], job.report()
    newest = RunDirectory(lab.disk / "ckpt").committed_steps()[-1]
    assert newest == 40
    lab.lose_node("node2", rank=3, point="save.plan")
    job.wait_until(lambda fields: int(fields["Restarts"]) >= 1, 60, "requeued")
    cluster.start_slurmd("node2")
    job.wait_completed(120)
    controller_log = (cluster.root / "log" / "slurmctld.log").read_text()
    assert f"requeue job JobId={job.job_id} due to failure of node node2" in controller_log, job.report()
    assert job.show()["Restarts"] == "1"
    resumed_from, checksum = job.heat_done()
    assert resumed_from == str(newest)
    assert checksum == reference
