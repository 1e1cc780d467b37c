"""Multi-level checkpoints under simulated node loss (HPCKPT_RANKS_PER_NODE=2).

A job is killed, the node-local directory of one (or two) simulated nodes is deleted,
and the job is run again: it must end with the fault-free checksum, from the copies
kept on other nodes (partner, XOR) or, when a whole group is gone, from the newest step
flushed to the file system. Nodes of unequal rank counts keep working copies (or are
refused on every rank), and a job of another rank count or node layout never takes the
node-local steps of the job before it.
"""

from __future__ import annotations

import shutil
import sys

import pytest

from tests.fault.helpers import heat_command, relaunched, run
from tests.processes import run_group

NODE = {"HPCKPT_RANKS_PER_NODE": "2"}


def levels(ranks: int, tmp_path, redundancy: str, flush_every: int, *extra: str) -> list[str]:
    return heat_command(
        ranks, tmp_path / "pfs", "--local", str(tmp_path / "local"), "--redundancy", redundancy,
        "--flush-every", str(flush_every), *extra,
    )


def crash_then_lose(tmp_path, ranks: int, redundancy: str, flush_every: int, nodes: list[int]) -> None:
    crashed = run(
        levels(ranks, tmp_path, redundancy, flush_every, "--crash-at-iter", "75", "--crash-rank", "1"),
        env=NODE,
    )
    assert crashed.returncode != 0
    for node in nodes:
        shutil.rmtree(tmp_path / "local" / f"node-{node:04d}")


@pytest.mark.parametrize(("redundancy", "ranks"), [("partner", 4), ("xor", 6)])
def test_a_lost_node_is_rebuilt_from_other_nodes(tmp_path, reference_checksum, redundancy, ranks):
    crash_then_lose(tmp_path, ranks, redundancy, flush_every=0, nodes=[0])
    result = run(levels(ranks, tmp_path, redundancy, 0), env=NODE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "heat: resumed from step 70 (iteration 70) from the node-local level" in result.stdout
    assert result.checksum == reference_checksum
    assert not list((tmp_path / "pfs").glob("step-*"))  # no file-system flush was taken


@pytest.mark.parametrize(("redundancy", "ranks"), [("partner", 4), ("xor", 6)])
def test_losing_two_nodes_of_a_group_falls_back_to_the_flushed_step(
    tmp_path, reference_checksum, redundancy, ranks
):
    crash_then_lose(tmp_path, ranks, redundancy, flush_every=3, nodes=[0, 1])
    result = run(levels(ranks, tmp_path, redundancy, 3), env=NODE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "heat: resumed from step 60 (iteration 60) from the file system level" in result.stdout
    assert result.checksum == reference_checksum


def test_a_kill_during_a_background_flush_keeps_the_previous_flushed_step(tmp_path, reference_checksum):
    # On rank 1, save.write is reached by local saves 10, 20, the flush of 20, local 30,
    # local 40, then the flush of 40 (the 6th time), in the background thread.
    command = levels(4, tmp_path, "none", 2)
    crashed = run(command, env={**NODE, "HPCKPT_FAULT": "save.write:1:kill:6"})
    assert crashed.returncode != 0
    assert sorted(p.name for p in (tmp_path / "pfs").glob("step-*")) == ["step-00000020", "step-00000040.tmp"]
    verified = run_group([sys.executable, "-m", "hpckpt", "verify", str(tmp_path / "pfs")], timeout=60)
    assert verified.returncode == 0 and verified.stdout.startswith("step 20: OK")
    result = run(relaunched(command), env=NODE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.checksum == reference_checksum


@pytest.mark.parametrize(
    ("before", "after", "layouts"),
    [
        ((4, "1"), (3, "1"), "written by 4 ranks on 4 nodes and this job has 3 ranks on 3 nodes"),
        ((4, "1"), (4, "2"), "written by 4 ranks on 4 nodes and this job has 4 ranks on 2 nodes"),
    ],
    ids=["4-to-3-ranks", "4-to-2-nodes"],
)
def test_node_local_steps_of_another_layout_are_not_restored(
    tmp_path, reference_checksum, before, after, layouts
):
    """A one-rank node-local step is that rank's part for the job that wrote it: a job of
    another rank count (or node layout) restores the flushed step 40, not step 60, and says why."""
    (ranks, per_node), (new_ranks, new_per_node) = before, after
    stopped = run(levels(ranks, tmp_path, "partner", 4, "--stop-at-iter", "60"),
                  env={"HPCKPT_RANKS_PER_NODE": per_node})
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    result = run(levels(new_ranks, tmp_path, "partner", 4), env={"HPCKPT_RANKS_PER_NODE": new_per_node})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "heat: resumed from step 40 (iteration 40) from the file system level" in result.stdout
    assert result.stderr.count(f"CheckpointFallbackWarning: node-local steps up to 60 were {layouts}") == 1
    assert result.checksum == reference_checksum


@pytest.mark.parametrize(
    ("redundancy", "ranks", "lost"),
    [("partner", 3, 0), ("partner", 3, 1), ("partner", 5, 2), ("xor", 5, 0)],
    ids=["partner-2+1-lose-0", "partner-2+1-lose-1", "partner-2+2+1-lose-2", "xor-2+2+1-lose-0"],
)
def test_nodes_of_unequal_rank_counts_rebuild_a_lost_node(
    tmp_path, reference_checksum, redundancy, ranks, lost
):
    """Two ranks per node, the last node with one: its rank holds the partner copies of
    both ranks of the node before it; every save and restore ends (JOB_TIMEOUT kills a hang)."""
    crash_then_lose(tmp_path, ranks, redundancy, flush_every=0, nodes=[lost])
    result = run(levels(ranks, tmp_path, redundancy, 0), env=NODE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "heat: resumed from step 70 (iteration 70) from the node-local level" in result.stdout
    assert result.checksum == reference_checksum


def test_xor_without_a_group_for_every_rank_is_refused_on_every_rank(tmp_path):
    """3 ranks on nodes of 2 and 1: rank 1 has no rank of its index on another node."""
    result = run(levels(3, tmp_path, "xor", 0), env=NODE)
    assert result.returncode != 0
    refusal = ("ValueError: redundancy='xor' needs, for every rank, a rank of the same index on another "
               "node; the nodes have [2, 1] ranks, so rank 1 (index 1 on node 0) has none")
    assert result.stderr.count(refusal) == 3, result.stderr[-3000:]
