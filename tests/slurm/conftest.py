"""A real Slurm cluster for the session; the helpers that submit jobs to it are in
tests/slurm/helpers.py."""

from __future__ import annotations

import pytest

from tests.slurm.cluster import SlurmCluster, unavailable


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> SlurmCluster:
    """A Slurm cluster on this machine for the whole session; skips where Slurm cannot run."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()
