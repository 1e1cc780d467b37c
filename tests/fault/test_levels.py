"""Multi-level checkpoints under simulated node loss (HPCKPT_RANKS_PER_NODE=2).

A job is killed, the node-local directory of one (or two) simulated nodes is deleted,
and the job is run again: it must end with the fault-free checksum, from the copies
kept on other nodes (partner, XOR) or, when a whole group is gone, from the newest step
flushed to the file system.
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
