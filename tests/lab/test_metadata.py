"""Metadata under a power loss, on the lab's nodecache model and on a real MooseFS.

A parallel file system's clients cache metadata too, and a node that dies may be the
one that renamed a step into place, deleted the previous step or replaced a step saved
again. Each trial stops rank 0 (on node1) at such a point, cuts the power of every
node, checks on the storage that every step committed before is committed and verifies,
and relaunches on fresh nodes, which must restore exactly the newest committed step.
Another node listing the run directory right after a commit sees the new step (never a
torn one) within MooseFS's directory-entry cache time.
"""

from __future__ import annotations

import json
import sys

import pytest

from hpckpt.catalog import CheckpointReader
from tests.lab.cluster import REPO
from tests.lab.helpers import heat
from tests.lab.test_power_loss import assert_lock_taken, power_loss_trial

FILESYSTEMS = ("nodecache", "moosefs")
RESAVE = str(REPO / "tests" / "jobs" / "resave.py")
# rank 0's metadata operations: (point, occurrence); 5 saves of steps 10..50 keeping 2
METADATA_POINTS = [
    ("commit.renamed", 4),  # step 40 renamed into place, the run directory not yet fsync'd
    ("save.retain", 4),  # step 40 committed, retention not yet begun
    ("retain.deleting", 2),  # step 20 renamed to step-20.deleting by retention
    ("retain.recycled", 2),  # step 20's files moved into .recycle for the next save
]
# where the second commit of a step number stops: between the two renames of a replacement
# on MooseFS (no atomic exchange through its FUSE client), after the exchange on nodecache
REPLACEMENT_POINT = {"moosefs": ("commit.set_aside", "2"), "nodecache": ("commit.exchanged", "3")}


@pytest.mark.parametrize("filesystem", FILESYSTEMS)
@pytest.mark.parametrize("point, nth", METADATA_POINTS)
def test_the_node_that_renamed_or_deleted_loses_power(lab_factory, heat_reference, filesystem, point, nth):
    lab = lab_factory(2, filesystem)
    steps = power_loss_trial(
        lab, heat_reference, "posix", "coordinated", True, 2, 0, (point, 0, nth)
    )
    assert steps[-1] == 40 if point in ("commit.renamed", "save.retain") else steps == [30, 40]


@pytest.mark.parametrize("filesystem", FILESYSTEMS)
def test_a_step_saved_again_survives_a_power_loss_during_its_replacement(lab_factory, filesystem):
    """Step 2 is committed, then saved again; rank 0 stops inside the replacement and
    the power goes. Step 2 is still committed (the old version where the new one was not
    yet in place) and the relaunch restores it."""
    lab = lab_factory(2, filesystem)
    point, version = REPLACEMENT_POINT[filesystem]
    log = lab.root / "faults.log"
    job = lab.start(
        lab.mpiexec([sys.executable, RESAVE, "ckpt"]),
        env={"HPCKPT_FAULT": f"{point}:0:stop:1", "HPCKPT_FAULT_LOG": str(log)},
    )
    stopped = job.wait_stopped()
    assert (stopped.rank, stopped.node) == (0, "node1")
    assert log.read_text().split()[:4] == [point, "0", "stop", "1"]
    lab.power_loss(rank=0, point=point)
    job.kill()
    reader = CheckpointReader(lab.disk / "ckpt")
    assert reader.steps() == [1, 2]
    assert reader.verify(2) == []
    check = lab.run(lab.mpiexec([sys.executable, RESAVE, "ckpt", "--check"]))
    assert check.returncode == 0, check.stderr[-3000:]
    assert f"resave: restored step=2 version={version}" in check.stdout
    assert_lock_taken(lab, check.stderr)


@pytest.mark.parametrize("filesystem", FILESYSTEMS)
def test_a_step_saved_again_right_after_its_commit_is_replaced_whole(lab_factory, filesystem):
    """Saving step 2 again right after committing it: node2's client may still resolve
    the old temporary directory's name to the committed step (MooseFS caches directory
    entries for 1 s), so the second save writes under a new name; step 2 ends intact,
    the second version throughout."""
    lab = lab_factory(2, filesystem)
    save = lab.run(lab.mpiexec([sys.executable, RESAVE, "ckpt"]))
    assert save.returncode == 0 and "resave: done" in save.stdout, save.stderr[-3000:]
    assert CheckpointReader(lab.disk / "ckpt").verify(2) == []
    check = lab.run(lab.mpiexec([sys.executable, RESAVE, "ckpt", "--check"]))
    assert "resave: restored step=2 version=3" in check.stdout, check.stderr[-3000:]


# a listing on a node: waits (10 s at most) until the newest committed step is argv[2] or
# later; prints how long that took, the steps and what verifying the newest one found
LISTING = (
    "import json, os, sys, time; from hpckpt.catalog import CheckpointReader\n"
    "start, steps = time.monotonic(), []\n"
    "while time.monotonic() - start < 10:\n"
    "    reader = CheckpointReader(sys.argv[1]) if os.path.isdir(sys.argv[1]) else None\n"
    "    steps = reader.steps() if reader else []\n"
    "    if steps and steps[-1] >= int(sys.argv[2]): break\n"
    "    time.sleep(0.01)\n"
    "print(json.dumps([time.monotonic() - start, steps, reader.verify(steps[-1]) if steps else None]))\n"
)


@pytest.mark.parametrize("filesystem", FILESYSTEMS)
def test_another_node_lists_the_run_directory_right_after_a_commit(lab_factory, filesystem):
    """node2 lists the run directory before (its client caches the listing); rank 0
    stops right after committing step 30. node2 then sees step 30, which verifies, within
    its client's directory-entry cache time (MooseFS: 1 s); hpckpt itself never relies on
    another node's listing (rank 0 lists and shares the result)."""
    lab = lab_factory(2, filesystem)
    log = lab.root / "faults.log"
    job = lab.start(
        lab.mpiexec(heat("ckpt", "--backend", "posix", "--keep", "100")),
        env={"HPCKPT_FAULT": "save.retain:0:stop:3", "HPCKPT_FAULT_LOG": str(log)},
    )
    node2 = lab.nodes["node2"]

    def listing(newest: int) -> list:
        done = node2.run([sys.executable, "-c", LISTING, str(lab.pfs / "ckpt"), str(newest)],
                         capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert listing(20)[1][-1] >= 20  # node2's client has listed the directory
    stopped = job.wait_stopped()
    assert (stopped.rank, log.read_text().split()[:4]) == (0, ["save.retain", "0", "stop", "3"])
    delay, steps, problems = listing(30)
    job.kill()
    assert (steps, problems) == ([10, 20, 30], []), (steps, problems)
    print(f"{filesystem}: node2 saw step 30 {delay:.3f} s after it looked")
    assert delay < 2.0


@pytest.mark.parametrize("filesystem", FILESYSTEMS)
def test_a_cached_directory_entry_leads_to_the_renamed_directory(lab_factory, filesystem):
    """What the new temporary name of a step saved again guards against, on MooseFS and as
    nodecache models it: node2 lists and looks up ``d.tmp``; node1 renames it to ``d`` and
    makes a new ``d.tmp``; node2, within its cache time, writes ``d.tmp/f``: into ``d``."""
    lab = lab_factory(2, filesystem)
    work = lab.pfs / "work"

    def on(node: str, script: str) -> None:
        done = lab.nodes[node].run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr

    on("node1", f"mkdir -p {work}/d.tmp && sync")
    on("node2", f"ls {work} > /dev/null && stat {work}/d.tmp > /dev/null")
    on("node1", f"mv {work}/d.tmp {work}/d && mkdir {work}/d.tmp")
    on("node2", f"echo x > {work}/d.tmp/f && sync {work}/d.tmp/f")
    assert sorted(path.name for path in (lab.disk / "work" / "d").iterdir()) == ["f"]
    assert list((lab.disk / "work" / "d.tmp").iterdir()) == []
