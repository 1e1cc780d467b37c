"""Saving a step number again (after a fallback) is atomic: step N is committed at every moment.

The newest step is damaged, so the relaunch falls back to the one before and saves step
N again; that commit exchanges the new directory with the committed one
(``renameat2(RENAME_EXCHANGE)``). A kill right before and right after the exchange
leaves step N committed: the damaged old one before, the new one after.
"""

from __future__ import annotations

import json

import pytest

from hpckpt.catalog import CheckpointReader
from hpckpt.storage.commit import RunDirectory
from tests.fault.helpers import heat_command, run

STEP = 60


def damage(run_dir, step: int) -> None:
    """Flip one byte inside a block of rank 1's file."""
    path = RunDirectory(run_dir).step_path(step) / "data-00001.bin"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("point, committed_is_new", [("commit.rename", False), ("commit.exchanged", True)])
def test_a_kill_around_the_exchange_leaves_step_n_committed(
    tmp_path, reference_checksum, point, committed_is_new
):
    run_dir = tmp_path / "run"
    first = run(heat_command(2, run_dir, "--backend", "posix", "--stop-at-iter", str(STEP)))
    assert first.returncode == 0, first.stderr
    damage(run_dir, STEP)
    old_committed = json.loads(RunDirectory(run_dir).read_manifest(STEP))["committed"]
    log = tmp_path / "faults.log"
    killed = run(
        heat_command(2, run_dir, "--backend", "posix"),
        env={"HPCKPT_FAULT": f"{point}:0:kill:1", "HPCKPT_FAULT_LOG": str(log)},
    )
    assert killed.returncode != 0
    assert "CheckpointFallbackWarning: checkpoint step 60 is corrupt" in killed.stderr  # the re-save's cause
    assert log.read_text().split()[:4] == [point, "0", "kill", "1"]
    steps = RunDirectory(run_dir).committed_steps()
    assert STEP in steps and steps[-1] == STEP, f"step {STEP} was not committed at the kill: {steps}"
    is_new = json.loads(RunDirectory(run_dir).read_manifest(STEP))["committed"] != old_committed
    assert is_new is committed_is_new
    # the old one is the damaged one
    assert (CheckpointReader(run_dir).verify(STEP) == []) is committed_is_new

    final = run(heat_command(2, run_dir, "--backend", "posix"))
    assert final.returncode == 0, final.stderr
    assert final.checksum == reference_checksum
    assert final.resumed_from == (str(STEP) if committed_is_new else "50")
    assert ("CheckpointFallbackWarning" in final.stderr) is not committed_is_new
