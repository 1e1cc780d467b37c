"""A lost lab node is rebuilt from the other nodes' node-local copies (partner, XOR).

Each trial saves to node-local storage only (``--local default``: each node's own
``/dev/shm``; ``--flush-every 0``: nothing on the shared file system), stops one rank of
the last node when its 5th save starts (so steps up to the 4th are committed on every
node), loses that whole node (processes, ``/dev/shm``, cache), and relaunches the job on
a fresh node of the same name whose ``/dev/shm`` is empty. The relaunch must restore the
4th step from the node-local level and end bit for bit equal to the fault-free run.
"""

from __future__ import annotations

import re
import sys

import pytest

from tests.fault.test_train import TRAIN_DONE
from tests.heat_output import Finished
from tests.lab.helpers import heat
from tests.processes import run_group

LEVELS = ["--local", "default", "--flush-every", "0"]


def train(*args: str) -> list[str]:
    """The training example's command line; later options override the defaults."""
    return [
        sys.executable, "-m", "hpckpt.examples.train",
        "--steps", "60", "--every", "10", "--dir", "ckpt", *args,
    ]


@pytest.fixture(scope="module")
def train_reference(tmp_path_factory):
    """The fault-free training result on N ranks (data-parallel: it depends on N), cached."""
    results: dict[int, str] = {}

    def reference(ranks: int) -> str:
        if ranks not in results:
            directory = tmp_path_factory.mktemp("train-reference")
            command = ["mpiexec", "-n", str(ranks), *train("--every", "0", "--dir", str(directory))]
            result = run_group(command, timeout=60)
            assert result.returncode == 0, result.stderr
            results[ranks] = TRAIN_DONE.search(result.stdout).group(4)
        return results[ranks]

    return reference


CASES = [
    pytest.param("heat", "partner", 2, 2, id="heat-partner-2nodes-2ranks"),
    pytest.param("heat", "partner", 4, 1, id="heat-partner-4nodes-1rank"),
    pytest.param("heat", "xor", 3, 1, id="heat-xor-3nodes-1rank"),
    pytest.param("heat", "xor", 3, 2, id="heat-xor-3nodes-2ranks"),
    pytest.param("train", "partner", 2, 2, id="train-partner-2nodes-2ranks"),
    pytest.param("train", "xor", 3, 1, id="train-xor-3nodes-1rank"),
]


@pytest.mark.parametrize("program, redundancy, nodes, per_node", CASES)
def test_a_lost_node_is_rebuilt_and_the_job_resumes_on_a_fresh_node(
    lab_factory, heat_reference, train_reference, program, redundancy, nodes, per_node
):
    lab = lab_factory(nodes)
    ranks = nodes * per_node
    victim_rank, victim_node = ranks - 1, f"node{nodes}"
    options = [*LEVELS, "--redundancy", redundancy]
    command = heat("ckpt", *options) if program == "heat" else train(*options)
    log = lab.root / "faults.log"
    job = lab.start(
        lab.mpiexec(command, ranks_per_node=per_node),
        env={"HPCKPT_FAULT": f"save.plan:{victim_rank}:stop:5", "HPCKPT_FAULT_LOG": str(log)},
    )
    stopped = job.wait_stopped()
    assert (stopped.rank, stopped.node) == (victim_rank, victim_node)
    assert log.read_text().split()[:4] == ["save.plan", str(victim_rank), "stop", "5"]
    lab.lose_node(victim_node, rank=victim_rank, point="save.plan")
    job.kill()
    fresh = lab.nodes[victim_node].run(["ls", "-A", "/dev/shm"], capture_output=True, text=True)
    assert fresh.returncode == 0 and fresh.stdout == "", (
        f"the replacement node's /dev/shm is not empty: {fresh.stdout}"
    )
    assert not list((lab.disk / "ckpt").glob("step-*")), "nothing was to reach the shared file system"

    relaunch = lab.run(lab.mpiexec(command, ranks_per_node=per_node))
    assert relaunch.returncode == 0, relaunch.stderr[-3000:]
    assert "CheckpointFallbackWarning" not in relaunch.stderr
    if program == "heat":
        result = Finished(relaunch.returncode, relaunch.stdout, relaunch.stderr)
        assert "heat: resumed from step 40 (iteration 40) from the node-local level" in relaunch.stdout
        assert result.checksum == heat_reference
    else:
        assert "train: resumed from step 40 from the node-local level" in relaunch.stdout
        done = TRAIN_DONE.search(relaunch.stdout)
        assert done and done.group(2) == "40" and done.group(4) == train_reference(ranks)
    assert re.search(rf"\b{victim_node}\b", " ".join(event.node for event in lab.events))
