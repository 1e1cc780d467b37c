"""The fault matrix: SIGKILL of rank 1 at every named phase, every backend, both protocols.

Save phases: rank 1 dies the second time it reaches the point (a checkpoint exists by
then). Restore: a stopped run leaves checkpoints, and the next run's rank 1 dies while
reading them. Every case is relaunched by ``hpckpt run`` and must end bit for bit equal
to the fault-free run.
"""

from __future__ import annotations

import pytest

from tests.fault.helpers import heat_command, relaunched, run
from tests.helpers import BACKENDS

PROTOCOLS = ("coordinated", "uncoordinated")
SAVE_PHASES = ("save.plan", "save.write", "save.commit", "save.retain")


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("phase", SAVE_PHASES)
def test_kill_at_a_save_phase(tmp_path, reference_checksum, phase, backend, protocol):
    command = heat_command(4, tmp_path / "ckpt", "--backend", backend, "--protocol", protocol, "--keep", "2")
    result = run(relaunched(command), env={"HPCKPT_FAULT": f"{phase}:1:kill:2"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.failed_attempts == 1
    assert result.checksum == reference_checksum


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_while_restoring(tmp_path, reference_checksum, backend, protocol):
    command = heat_command(4, tmp_path / "ckpt", "--backend", backend, "--protocol", protocol)
    assert run(command + ["--stop-at-iter", "60"]).returncode == 0
    result = run(relaunched(command), env={"HPCKPT_FAULT": "restore.read:1:kill"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.failed_attempts == 1
    assert result.checksum == reference_checksum
