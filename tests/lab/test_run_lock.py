"""The run directory's lock across nodes, on the nodecache model and on a real MooseFS.

A process on node1 holds the lock (``hpckpt.storage.lock.RunLock``, lease 2 s). A process
on node2 is refused while the holder lives (it sees the lease renewed), and takes the
lock over, with one warning, once node1 has lost power. On MooseFS the dead client's
``flock`` is still held by the master then, so the new holder holds none; nodecache's
``flock`` is node-local, so that the lease alone keeps node2 out while node1 lives.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpckpt.storage.lock import LOCK_NAME

LEASE = "2"
HOLD = (
    "import sys, time; from hpckpt.storage.lock import RunLock\n"
    "lock = RunLock(__import__('pathlib').Path(sys.argv[1])); lock.acquire(); print('held', flush=True)\n"
    "time.sleep(120)\n"
)
TAKE = (
    "import sys, time, warnings; from pathlib import Path; from hpckpt.storage.lock import RunLock\n"
    "warnings.simplefilter('always'); start = time.monotonic(); lock = RunLock(Path(sys.argv[1]))\n"
    "try:\n"
    "    lock.acquire()\n"
    "except Exception as exc:\n"
    "    print('refused', time.monotonic() - start, exc, flush=True); sys.exit(0)\n"
    "print('took', time.monotonic() - start, flush=True); lock.release()\n"
)


def in_node(lab, name: str, code: str, *args: str) -> list[str]:
    node = lab.nodes[name]
    return ["nsenter", "-t", str(node.init_pid), "--mount", "--uts", "--pid", "--",
            sys.executable, "-c", code, *args]


@pytest.mark.parametrize("filesystem", ["nodecache", "moosefs"])
def test_a_live_holder_on_another_node_is_refused_a_lost_one_taken_over(lab_factory, filesystem):
    lab = lab_factory(2, filesystem)
    run_dir = lab.pfs / "ckpt"
    env = {"HPCKPT_LOCK_LEASE": LEASE, "PATH": "/usr/bin:/bin"}
    holder = subprocess.Popen(in_node(lab, "node1", HOLD, str(run_dir)), stdout=subprocess.PIPE, text=True,
                              env=env, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = subprocess.run(in_node(lab, "node2", TAKE, str(run_dir)), capture_output=True, text=True,
                                 env=env, timeout=30)
        word, seconds, reason = refused.stdout.split(" ", 2)
        assert word == "refused" and "in use by another job (host node1" in reason, refused.stdout
        assert float(seconds) < 2 * float(LEASE)  # refused on seeing a renewal, within the lease
        lab.lose_node("node1")
        took = subprocess.run(in_node(lab, "node2", TAKE, str(run_dir)), capture_output=True, text=True,
                              env=env, timeout=30)
    finally:
        holder.kill()
        holder.wait()
    word, seconds = took.stdout.split()
    assert word == "took", took.stdout + took.stderr
    assert float(LEASE) < float(seconds) < 3 * float(LEASE)  # waited for the lease, then took it over
    assert took.stderr.count("took over its lock from host node1") == 1, took.stderr
    record = json.loads((lab.disk / "ckpt" / LOCK_NAME).read_text())
    assert record["state"] == "released"
    # MooseFS keeps the dead client's flock; nodecache's flock never left node1
    assert record["flock"] is (filesystem == "nodecache")
