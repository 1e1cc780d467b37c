"""Fixtures of the lab tests: a fresh set of simulated nodes per test (tests/lab/cluster.py);
their helpers are in tests/lab/helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.heat_output import DONE
from tests.lab.cluster import Lab
from tests.lab.helpers import heat, labs_under
from tests.processes import run_group


@pytest.fixture
def lab_factory(tmp_path):
    """Start labs of N nodes under tmp_path; all are destroyed after the test."""
    with labs_under(tmp_path) as make:
        yield make


@pytest.fixture
def lab(lab_factory) -> Lab:
    """Two lab nodes."""
    return lab_factory(2)


@pytest.fixture
def moosefs_lab(lab_factory) -> Lab:
    """Two lab nodes on a real MooseFS (tests/lab/moosefs.py): a master, two chunkservers
    keeping every chunk twice, a client per node."""
    return lab_factory(2, "moosefs")


@pytest.fixture(scope="session")
def heat_reference(tmp_path_factory) -> str:
    """The fault-free result of :func:`tests.lab.helpers.heat` with its defaults, on one rank,
    without checkpoints."""
    directory: Path = tmp_path_factory.mktemp("lab-reference")
    result = run_group(heat(str(directory / "c"), every=0), timeout=60)
    assert result.returncode == 0, result.stderr
    return DONE.search(result.stdout).group(3)
